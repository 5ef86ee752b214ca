"""stepledger: a durable ledger for coding-agent steps.

Every transition of every step is an immutable event in one SQLite WAL file,
appended atomically with its journal (idempotency) key; projections give each
step's current state and can be rebuilt from the events at any time.

    from ledger import Ledger, Planned

    with Ledger.init("ws/.stepledger/ledger.db") as ledger:
        ledger.append(Planned(step="fetch", attempt=1))
        print(ledger.step("fetch").state)        # planned
"""

from .errors import (
    CorruptLedger,
    EnvironmentFailure,
    HeadMismatch,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LedgerBusy,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    NotALedger,
    ProtocolRefused,
    ReadOnlyLedger,
    StorageFailure,
    UnknownStep,
)
from .events import (
    Acked,
    AppliedWrite,
    BlobCollected,
    BlobPinned,
    BlobStored,
    Compensated,
    Event,
    Fenced,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    ManifestEntry,
    ManifestPublished,
    Planned,
    PlannedWrite,
    RecordedEvent,
    Rejected,
    Restored,
    StepEvent,
    WorkspaceAdded,
    WorkspaceRestored,
    journal_key,
)
from .ledger import DEFAULT_PATH, Ledger
from .log import Head
from .projections import StepRow
from .verify import Finding, VerifyReport

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PATH",
    "Acked",
    "AppliedWrite",
    "BlobCollected",
    "BlobPinned",
    "BlobStored",
    "Compensated",
    "CorruptLedger",
    "EnvironmentFailure",
    "Event",
    "Fenced",
    "Finding",
    "Head",
    "HeadMismatch",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidInput",
    "LeaseAcquired",
    "LeaseReleased",
    "LeaseRenewed",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "LedgerNotFound",
    "LedgerTooNew",
    "ManifestEntry",
    "ManifestPublished",
    "NotALedger",
    "Planned",
    "PlannedWrite",
    "ProtocolRefused",
    "ReadOnlyLedger",
    "RecordedEvent",
    "Rejected",
    "Restored",
    "StepEvent",
    "StepRow",
    "StorageFailure",
    "UnknownStep",
    "VerifyReport",
    "WorkspaceAdded",
    "WorkspaceRestored",
    "journal_key",
]
