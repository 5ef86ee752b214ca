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
    CompensationWindowClosed,
    CorruptLedger,
    EnvironmentFailure,
    HeadMismatch,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LedgerBusy,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    NotALedger,
    PathEscapes,
    ProtocolRefused,
    ReadOnlyLedger,
    ReplanRefused,
    StaleEpoch,
    StorageFailure,
    UnknownStep,
    UnknownWorkspace,
    Unsettled,
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
from .fences import ApplyResult, Compensation, Lease, Receipt, SettleConflict, StepPlan, Write
from .ledger import DEFAULT_PATH, Ledger
from .log import Head
from .projections import StepRow
from .verify import Finding, VerifyReport

__version__ = "0.1.0"

__all__ = [
    "Acked",
    "AppliedWrite",
    "ApplyResult",
    "BlobCollected",
    "BlobPinned",
    "BlobStored",
    "Compensated",
    "Compensation",
    "CompensationWindowClosed",
    "CorruptLedger",
    "DEFAULT_PATH",
    "EnvironmentFailure",
    "Event",
    "Fenced",
    "Finding",
    "Head",
    "HeadMismatch",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidInput",
    "Lease",
    "LeaseAcquired",
    "LeaseHeld",
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
    "PathEscapes",
    "Planned",
    "PlannedWrite",
    "ProtocolRefused",
    "ReadOnlyLedger",
    "Receipt",
    "RecordedEvent",
    "Rejected",
    "ReplanRefused",
    "Restored",
    "SettleConflict",
    "StaleEpoch",
    "StepEvent",
    "StepPlan",
    "StepRow",
    "StorageFailure",
    "UnknownStep",
    "UnknownWorkspace",
    "Unsettled",
    "VerifyReport",
    "WorkspaceAdded",
    "WorkspaceRestored",
    "Write",
    "journal_key",
]
