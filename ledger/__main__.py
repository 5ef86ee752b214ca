"""`python -m ledger` is the `stepledger` command."""

from .cli import main

main()
