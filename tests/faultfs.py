"""The test suite's name for `ledger.faults`, the fault-injection harness.

The harness ships in the package so that ``stepledger chaos --power-loss`` and
``--io-errors`` can run it on a user's own machine; the tests import it as `faultfs`.
"""

import sys

from ledger import faults as _faults

sys.modules[__name__] = _faults
