"""steptrail's test machinery, shipped so that it runs on a user's own machine.

- `faults`: power loss, I/O errors and disk full under a ledger (one simulated disk
  under the SQLite files and the blob store), the crash and fault sweeps behind
  ``steptrail chaos --power-loss`` / ``--io-errors`` and the test suite's fault tests;
  the SQLite half of it (the fault VFS) is the SQLite store's,
  `ledger.store.sqlite.faultvfs`.
- `chaos`: ``steptrail chaos``, a real process SIGKILLed at every operation of a step.
- `fuzz`: ``steptrail fuzz``, the interleaving search over the fence protocol, its
  checkers and its shrinker.
- `pgserver`: a throwaway PostgreSQL server from the machine's binaries (a temporary data
  directory, a private socket; as root, run as the ``postgres`` user), for the tests, the
  benchmarks and ``python -m ledger.testing.pgserver start DIR`` (the README's demo).

The runtime never imports this package: the library works without it, and only the
``chaos`` and ``fuzz`` commands import it, inside their functions
(tests/test_architecture.py checks both).
"""
