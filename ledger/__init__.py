"""steptrail: a durable ledger for coding-agent steps.

Every transition of every step is an immutable event (in a SQLite file, or a
PostgreSQL database many machines share), appended atomically with its journal
(idempotency) key; projections give each step's current state and can be rebuilt
from the events at any time. A workspace's writes go through `ledger.workspaces`.

    from ledger import Ledger, Planned

    with Ledger.init("ws/.steptrail/ledger.db") as ledger:
        ledger.append(Planned(step="fetch", attempt=1))
        print(ledger.step("fetch").state)        # planned

Start here: `Ledger` (open, init; `Ledger.workspaces`, the `Workspaces` protocol:
add, acquire, read_file, admit, apply, compensate), `run_fenced_step` (a workspace
step's whole protocol in one call, its `FencedOutcome` and `StepStatus`), `run_step`
(an artifact step's, its `StepResult`). Then the events (`Planned`, `Fenced`, ...), the
errors by family (`InvalidInput`: exit 2; `ProtocolRefused`: exit 1;
`EnvironmentFailure`: exit 3, retry), and the rest by role.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the one list of public names; at run time each is imported from
    # its module on first use (PEP 562, `__getattr__` below reads this block)
    from .aio import (
        AsyncLedger as AsyncLedger,
    )
    from .blobs import (
        BlobStore as BlobStore,
        digest_of as digest_of,
    )
    from .errors import (
        AccessDenied as AccessDenied,
        AnchorRefused as AnchorRefused,
        ArchiveInvalid as ArchiveInvalid,
        ArchiveMissing as ArchiveMissing,
        BackupIncomplete as BackupIncomplete,
        BackupInvalid as BackupInvalid,
        BlobCorrupt as BlobCorrupt,
        BlobNotFound as BlobNotFound,
        CollectorBusy as CollectorBusy,
        CompensationConflict as CompensationConflict,
        CompensationWindowClosed as CompensationWindowClosed,
        ContentChanged as ContentChanged,
        ContentFileEscapes as ContentFileEscapes,
        CorruptLedger as CorruptLedger,
        DatabaseUnavailable as DatabaseUnavailable,
        EnvironmentFailure as EnvironmentFailure,
        GcRefused as GcRefused,
        HeadMismatch as HeadMismatch,
        IdempotencyConflict as IdempotencyConflict,
        IllegalTransition as IllegalTransition,
        IllegalWorkspaceTransition as IllegalWorkspaceTransition,
        InvalidInput as InvalidInput,
        LeaseHeld as LeaseHeld,
        LedgerBusy as LedgerBusy,
        LedgerMoved as LedgerMoved,
        LedgerError as LedgerError,
        LedgerNotFound as LedgerNotFound,
        ForeignLedger as ForeignLedger,
        LedgerTooNew as LedgerTooNew,
        ManifestConflict as ManifestConflict,
        NotALedger as NotALedger,
        NotSealable as NotSealable,
        OperatorOnly as OperatorOnly,
        PathEscapes as PathEscapes,
        PathForbidden as PathForbidden,
        PlanConflict as PlanConflict,
        ProtocolRefused as ProtocolRefused,
        ReadOnlyLedger as ReadOnlyLedger,
        ReplanRefused as ReplanRefused,
        StaleEpoch as StaleEpoch,
        StepRejected as StepRejected,
        StepSealed as StepSealed,
        StorageFailure as StorageFailure,
        UnknownStep as UnknownStep,
        UnknownWorkspace as UnknownWorkspace,
        UnsafeRename as UnsafeRename,
        Unsettled as Unsettled,
        WitnessElsewhere as WitnessElsewhere,
        WitnessMismatch as WitnessMismatch,
        WitnessMissing as WitnessMissing,
        WorkspaceMoved as WorkspaceMoved,
        WorkspaceOverlap as WorkspaceOverlap,
    )
    from .events import (
        Acked as Acked,
        AppliedWrite as AppliedWrite,
        BlobCollected as BlobCollected,
        BlobPinned as BlobPinned,
        BlobStored as BlobStored,
        Compensated as Compensated,
        Compensating as Compensating,
        Event as Event,
        Fenced as Fenced,
        journal_key as journal_key,
        LeaseAcquired as LeaseAcquired,
        LeaseReleased as LeaseReleased,
        LeaseRenewed as LeaseRenewed,
        ManifestEntry as ManifestEntry,
        ManifestPublished as ManifestPublished,
        Held as Held,
        HoldReleased as HoldReleased,
        HistoryReleased as HistoryReleased,
        ReleasedVersion as ReleasedVersion,
        NotCaptured as NotCaptured,
        Observed as Observed,
        Planned as Planned,
        PlannedWrite as PlannedWrite,
        RecordedEvent as RecordedEvent,
        Rejected as Rejected,
        Restored as Restored,
        StepEvent as StepEvent,
        WitnessAnchored as WitnessAnchored,
        WorkspaceAdded as WorkspaceAdded,
        WorkspaceRebound as WorkspaceRebound,
        WorkspaceRestored as WorkspaceRestored,
    )
    from .ledger import (
        DEFAULT_PATH as DEFAULT_PATH,
        Ledger as Ledger,
    )
    from .log import (
        Head as Head,
    )
    from .plans import (
        load_plan as load_plan,
        Plan as Plan,
    )
    from .projections import (
        StepRow as StepRow,
    )
    from .projections.workspaces import (
        WsRow as WsRow,
    )
    from .runner import (
        FencedOutcome as FencedOutcome,
        PathConflict as PathConflict,
        RejectReason as RejectReason,
        run_fenced_step as run_fenced_step,
        run_step as run_step,
        StepReader as StepReader,
        StepResult as StepResult,
        StepStatus as StepStatus,
    )
    from .store import (
        BlobIndex as BlobIndex,
        locate as locate,
        Location as Location,
        ReadView as ReadView,
        shown_location as shown_location,
        unmapped_error as unmapped_error,
    )
    from .verify import (
        Finding as Finding,
        VerifyReport as VerifyReport,
    )
    from .witness import (
        WitnessStatus as WitnessStatus,
    )
    from .step.values import (
        ApplyResult as ApplyResult,
        Compensation as Compensation,
        FileRead as FileRead,
        Lease as Lease,
        Receipt as Receipt,
        settle_conflicts as settle_conflicts,
        SettleConflict as SettleConflict,
        StepPlan as StepPlan,
        Write as Write,
    )
    from .workspaces import (
        Workspaces as Workspaces,
        check_settled as check_settled,
    )
    from .step.observe import Observation as Observation
    from .step.rewind import Rewind as Rewind, RewindChange as RewindChange
    from .step.fork import Fork as Fork
    from .workspace.watch import Watcher as Watcher

__version__ = "0.1.0"


#: Each public name -> the submodule it is imported from on first use (so that
#: `import ledger.cli` or `import ledger.errors` does not import the whole library). The
#: TYPE_CHECKING block above lists the same names for type checkers;
#: tests/architecture/test_architecture.py holds the two equal.
_WHERE: dict[str, str] = {
    "AsyncLedger": "aio",
    "BlobStore": "blobs", "digest_of": "blobs",
    "AccessDenied": "errors", "AnchorRefused": "errors", "ArchiveInvalid": "errors",
    "ArchiveMissing": "errors", "BackupIncomplete": "errors", "BackupInvalid": "errors",
    "BlobCorrupt": "errors", "BlobNotFound": "errors", "CollectorBusy": "errors",
    "CompensationConflict": "errors", "CompensationWindowClosed": "errors",
    "ContentChanged": "errors", "ContentFileEscapes": "errors", "CorruptLedger": "errors",
    "DatabaseUnavailable": "errors", "EnvironmentFailure": "errors", "ForeignLedger": "errors",
    "GcRefused": "errors", "HeadMismatch": "errors", "IdempotencyConflict": "errors",
    "IllegalTransition": "errors", "IllegalWorkspaceTransition": "errors",
    "InvalidInput": "errors", "LeaseHeld": "errors", "LedgerBusy": "errors",
    "LedgerError": "errors", "LedgerMoved": "errors", "LedgerNotFound": "errors",
    "LedgerTooNew": "errors", "ManifestConflict": "errors", "NotALedger": "errors",
    "NotSealable": "errors", "OperatorOnly": "errors", "PathEscapes": "errors",
    "PathForbidden": "errors", "PlanConflict": "errors", "ProtocolRefused": "errors",
    "ReadOnlyLedger": "errors", "ReplanRefused": "errors", "StaleEpoch": "errors",
    "StepRejected": "errors", "StepSealed": "errors", "StorageFailure": "errors",
    "UnknownStep": "errors", "UnknownWorkspace": "errors", "UnsafeRename": "errors",
    "Unsettled": "errors", "WitnessElsewhere": "errors", "WitnessMismatch": "errors",
    "WitnessMissing": "errors", "WorkspaceMoved": "errors", "WorkspaceOverlap": "errors",
    "Acked": "events", "AppliedWrite": "events", "BlobCollected": "events",
    "BlobPinned": "events", "BlobStored": "events", "Compensated": "events",
    "Compensating": "events", "Event": "events", "Fenced": "events", "journal_key": "events",
    "LeaseAcquired": "events", "LeaseReleased": "events", "LeaseRenewed": "events",
    "ManifestEntry": "events", "ManifestPublished": "events", "Planned": "events",
    "NotCaptured": "events", "Observed": "events", "Held": "events",
    "HoldReleased": "events", "HistoryReleased": "events", "ReleasedVersion": "events",
    "Observation": "step.observe", "Rewind": "step.rewind", "RewindChange": "step.rewind",
    "Fork": "step.fork",
    "Watcher": "workspace.watch",
    "PlannedWrite": "events", "RecordedEvent": "events", "Rejected": "events",
    "Restored": "events", "StepEvent": "events", "WitnessAnchored": "events",
    "WorkspaceAdded": "events", "WorkspaceRebound": "events", "WorkspaceRestored": "events",
    "DEFAULT_PATH": "ledger", "Ledger": "ledger",
    "Head": "log",
    "check_settled": "workspaces", "load_plan": "plans", "Plan": "plans",
    "StepRow": "projections",
    "WsRow": "projections.workspaces",
    "FencedOutcome": "runner", "PathConflict": "runner", "RejectReason": "runner",
    "run_fenced_step": "runner", "run_step": "runner", "StepReader": "runner",
    "StepResult": "runner", "StepStatus": "runner",
    "ApplyResult": "step.values", "Compensation": "step.values", "FileRead": "step.values",
    "Lease": "step.values", "Receipt": "step.values", "settle_conflicts": "step.values",
    "SettleConflict": "step.values", "StepPlan": "step.values", "Write": "step.values",
    "BlobIndex": "store", "locate": "store", "Location": "store", "ReadView": "store",
    "shown_location": "store", "unmapped_error": "store",
    "Finding": "verify", "VerifyReport": "verify",
    "WitnessStatus": "witness",
    "Workspaces": "workspaces",
}


def __getattr__(name: str) -> object:
    if name == "__all__":
        value: object = sorted(_WHERE)
    else:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module 'ledger' has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
