"""steptrail: a durable ledger for coding-agent steps.

Every transition of every step is an immutable event in one SQLite WAL file,
appended atomically with its journal (idempotency) key; projections give each
step's current state and can be rebuilt from the events at any time.

    from ledger import Ledger, Planned

    with Ledger.init("ws/.steptrail/ledger.db") as ledger:
        ledger.append(Planned(step="fetch", attempt=1))
        print(ledger.step("fetch").state)        # planned
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker sees; at run time, __getattr__ below
    from .errors import (
        AccessDenied,
        AnchorRefused,
        ArchiveInvalid,
        ArchiveMissing,
        BackupIncomplete,
        BackupInvalid,
        BlobCorrupt,
        BlobNotFound,
        CollectorBusy,
        CompensationConflict,
        CompensationWindowClosed,
        ContentChanged,
        ContentFileEscapes,
        CorruptLedger,
        EnvironmentFailure,
        GcRefused,
        HeadMismatch,
        IdempotencyConflict,
        IllegalTransition,
        IllegalWorkspaceTransition,
        InvalidInput,
        LeaseHeld,
        LedgerBusy,
        LedgerError,
        LedgerNotFound,
        LedgerTooNew,
        ManifestConflict,
        NotALedger,
        NotSealable,
        OperatorOnly,
        PathEscapes,
        PathForbidden,
        PlanConflict,
        ProtocolRefused,
        ReadOnlyLedger,
        ReplanRefused,
        StaleEpoch,
        StepRejected,
        StepSealed,
        StorageFailure,
        UnknownStep,
        UnknownWorkspace,
        Unsettled,
        WitnessElsewhere,
        WitnessMismatch,
        WitnessMissing,
        WorkspaceMoved,
        WorkspaceOverlap,
    )
    from .events import (
        Acked,
        AppliedWrite,
        BlobCollected,
        BlobPinned,
        BlobStored,
        Compensated,
        Compensating,
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
        WitnessAnchored,
        WorkspaceAdded,
        WorkspaceRebound,
        WorkspaceRestored,
        journal_key,
    )
    from .workspace import (
        ApplyResult,
        Compensation,
        FileRead,
        Lease,
        Receipt,
        SettleConflict,
        StepPlan,
        Workspaces,
        Write,
        settle_conflicts,
    )
    from .ledger import DEFAULT_PATH, Ledger
    from .log import Head
    from .plans import Plan, check_settled, load_plan
    from .projections import StepRow
    from .projections.workspaces import WsRow
    from .runner import (
        FencedOutcome,
        PathConflict,
        RejectReason,
        StepReader,
        StepStatus,
        run_fenced_step,
    )
    from .store import Location, locate, shown_location, unmapped_error
    from .verify import Finding, VerifyReport
    from .witness import WitnessStatus

__version__ = "0.1.0"

#: Each public name -> the submodule it is imported from, on first use (PEP 562): `import
#: ledger.cli` or `import ledger.errors` does not import the whole library.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "errors": ("AccessDenied", "AnchorRefused", "ArchiveInvalid", "ArchiveMissing",
        "BackupIncomplete",
        "BackupInvalid", "BlobCorrupt", "BlobNotFound", "CollectorBusy",
        "CompensationConflict", "CompensationWindowClosed", "ContentChanged",
        "ContentFileEscapes", "CorruptLedger", "DatabaseUnavailable", "EnvironmentFailure", "GcRefused",
        "HeadMismatch", "IdempotencyConflict", "IllegalTransition",
        "IllegalWorkspaceTransition", "InvalidInput", "LeaseHeld", "LedgerBusy",
        "LedgerError", "LedgerNotFound", "LedgerTooNew", "ManifestConflict", "NotALedger",
        "NotSealable", "OperatorOnly", "PathEscapes", "PathForbidden", "PlanConflict", "ProtocolRefused",
        "ReadOnlyLedger", "ReplanRefused", "StaleEpoch", "StepRejected", "StepSealed", "StorageFailure",
        "UnknownStep", "UnknownWorkspace", "Unsettled", "WitnessElsewhere",
        "WitnessMismatch", "WitnessMissing", "WorkspaceMoved", "WorkspaceOverlap"),
    "events": ("Acked", "AppliedWrite", "BlobCollected", "BlobPinned", "BlobStored", "Compensated",
        "Compensating", "Event", "Fenced", "LeaseAcquired", "LeaseReleased", "LeaseRenewed",
        "ManifestEntry", "ManifestPublished", "Planned", "PlannedWrite", "RecordedEvent",
        "Rejected", "Restored", "StepEvent", "WitnessAnchored", "WorkspaceAdded",
        "WorkspaceRebound", "WorkspaceRestored", "journal_key"),
    "workspace": ("ApplyResult", "Compensation", "FileRead", "Lease", "Receipt", "SettleConflict",
        "StepPlan", "Workspaces", "Write", "settle_conflicts"),
    "ledger": ("DEFAULT_PATH", "Ledger"),
    "log": ("Head",),
    "plans": ("Plan", "check_settled", "load_plan"),
    "projections": ("StepRow",),
    "projections.workspaces": ("WsRow",),
    "runner": ("FencedOutcome", "PathConflict", "RejectReason", "StepReader", "StepStatus",
               "run_fenced_step"),
    "store": ("Location", "locate", "shown_location", "unmapped_error"),
    "verify": ("Finding", "VerifyReport"),
    "witness": ("WitnessStatus",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "run_fenced_step",
    "StepStatus",
    "StepReader",
    "RejectReason",
    "PathConflict",
    "FencedOutcome",
    "Compensating",
    "AccessDenied",
    "Acked",
    "AnchorRefused",
    "ArchiveInvalid",
    "ArchiveMissing",
    "AppliedWrite",
    "ApplyResult",
    "BackupIncomplete",
    "BackupInvalid",
    "BlobCollected",
    "BlobCorrupt",
    "BlobNotFound",
    "BlobPinned",
    "BlobStored",
    "CollectorBusy",
    "Compensated",
    "Compensation",
    "CompensationConflict",
    "CompensationWindowClosed",
    "ContentChanged",
    "ContentFileEscapes",
    "CorruptLedger",
    "DEFAULT_PATH",
    "EnvironmentFailure",
    "Event",
    "Fenced",
    "FileRead",
    "Finding",
    "GcRefused",
    "Head",
    "HeadMismatch",
    "IdempotencyConflict",
    "IllegalTransition",
    "IllegalWorkspaceTransition",
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
    "ManifestConflict",
    "ManifestEntry",
    "ManifestPublished",
    "NotALedger",
    "NotSealable",
    "OperatorOnly",
    "PathEscapes",
    "PathForbidden",
    "PlanConflict",
    "Plan",
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
    "StepRejected",
    "StepSealed",
    "StepRow",
    "StorageFailure",
    "DatabaseUnavailable",
    "UnknownStep",
    "UnknownWorkspace",
    "Unsettled",
    "VerifyReport",
    "WitnessAnchored",
    "WitnessElsewhere",
    "WitnessMismatch",
    "WitnessMissing",
    "WitnessStatus",
    "WorkspaceAdded",
    "WorkspaceMoved",
    "WorkspaceOverlap",
    "WorkspaceRebound",
    "WorkspaceRestored",
    "Write",
    "Workspaces",
    "WsRow",
    "check_settled",
    "journal_key",
    "load_plan",
    "settle_conflicts",
    "Location",
    "locate",
    "shown_location",
    "unmapped_error",
]
