"""A LangGraph checkpoint saver on the ledger (the ``[langgraph]`` extra).

    from ledger import Ledger
    from ledger.langgraph import LedgerSaver

    with Ledger.init(".steptrail/ledger.db") as ledger:
        graph = builder.compile(checkpointer=LedgerSaver(ledger))

Every checkpoint and every pending write is one artifact-only step, committed in one
transaction; channel values are content-addressed blobs, so a value that did not change
between checkpoints is stored once. Deleting and pruning end steps (events, never a
DELETE), and `ledger.gc.collect` reclaims what they released. A worker that `claim`s a
thread writes under an epoch: after a takeover its writes are refused inside the append
transaction (`StaleEpoch`). docs/langgraph.md has the mapping and why.

Nothing else in the package imports this module: `import ledger` stays LangGraph-free.
"""

try:
    from .saver import LedgerSaver, Ownership
except ModuleNotFoundError as _exc:
    if (_exc.name or "").split(".")[0] not in ("langgraph", "langchain_core"):
        raise
    from ..extras import missing_extra

    raise ModuleNotFoundError(missing_extra("langgraph", _exc.name), name=_exc.name) from None

__all__ = ["LedgerSaver", "Ownership"]
