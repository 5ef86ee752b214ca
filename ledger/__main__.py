"""`python -m ledger` is the `steptrail` command."""

from .cli import main

main()
