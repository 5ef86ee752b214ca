"""Epoch leases on a workspace: `Leases` — a new epoch begun (`begin`), renewed,
released; the live epoch checked in a transaction and before each landing; the steps an
older epoch left in flight (`unsettled`); this process's threads working one workspace
in turn (`workspace_lock`). Settling what an older epoch left is the step lifecycle's
(`ledger.step.undo.settle_all`)."""

from __future__ import annotations

import builtins  # (annotations: `Workspaces.list` shadows the builtin in the class)
import contextlib
import threading
from collections.abc import Iterator
from typing import Any


from ..errors import InvalidInput, LeaseHeld, LedgerError, StaleEpoch, UnknownWorkspace
from ..events import (
    Event,
    LeaseAcquired,
    LeaseReleased,
    LeaseRenewed,
    RecordedEvent,
    check_int,
    check_step_id,
)
from .core import Core
from ..projections.workspaces import WsRow
from ..store import Scope, Tx
from ..step.values import TTL_MAX_S, Lease
from .places import Places


class Leases:
    """The leases of the ledger's workspaces (see the module)."""

    def __init__(self, core: Core, places: Places) -> None:
        self.core = core
        self.places = places
        #: workspace -> [its lock, its users]: `workspace_lock`
        self._ws_locks: dict[str, builtins.list[Any]] = {}
        self._locks_lock = threading.Lock()

    def lease(self, workspace: str) -> Lease:
        row = self.places.get(workspace)
        now = self.core.clock()
        return Lease(workspace=workspace, epoch=row.epoch, holder=row.holder,
                     expires_ns=row.expires_ns, live=row.live_epoch(now) is not None,
                     released=row.released)


    def begin(
        self, workspace: str, holder: str, ttl_s: float = 60, *, force: bool = False,
        bare: bool = False, resume: bool = False,
    ) -> LeaseAcquired:
        """Start a new epoch (previous + 1) on the workspace and return its event; the
        older epochs' settling is the caller's (`Workspaces.acquire` says what it
        promises)."""
        check_step_id(holder)
        ttl_ns = _check_ttl(ttl_s)
        if type(bare) is not bool:
            raise InvalidInput("bare is a boolean")
        moved = None if bare else self.places.ledger_moved(workspace)  # (UnknownWorkspace too)
        if moved is not None:
            raise moved  # its settling would put files back in the registered root

        def build(tx: Tx, now: int) -> list[Event]:
            row = tx.workspace(workspace)
            if row is None:
                if not bare:
                    raise UnknownWorkspace(workspace)
                return [LeaseAcquired(workspace=workspace, epoch=1, holder=holder,
                                      expires_ns=now + ttl_ns, bare=True)]
            live = row.live_epoch(now)
            if live is not None and not force and not (resume and row.holder == holder):
                raise LeaseHeld(workspace, row.epoch, row.holder, row.expires_ns)
            return [LeaseAcquired(workspace=workspace, epoch=row.epoch + 1, holder=holder,
                                  expires_ns=now + ttl_ns, forced=live is not None)]

        event = self.core.log.append(build, scope=Scope(workspace))[0].event
        assert isinstance(event, LeaseAcquired)
        return event

    def append_fenced(self, events: list[Event], epochs: dict[str, int],
                      small: dict[str, bytes]) -> list[RecordedEvent]:
        """`Ledger.append_batch` under `epochs` (lease name -> epoch; 0: no lease may be
        live): the events decided in the transaction, after the leases are read at its
        time (nothing can move between the check and them)."""
        def build(tx: Tx, now: int) -> list[Event]:
            for name, epoch in sorted(epochs.items()):
                row = tx.workspace(name)
                live = None if row is None else row.live_epoch(now)
                if epoch == 0 and live is not None:
                    assert row is not None
                    raise LeaseHeld(name, row.epoch, row.holder, row.expires_ns)
                if epoch > 0 and live != epoch:
                    raise StaleEpoch(name, epoch, live, latest=None if row is None else
                                     row.epoch, holder="" if row is None else row.holder)
            return events

        # One lease named by the events and the fence alike: that workspace's transaction
        # (its lock, on a store that has one); else the whole ledger's.
        names = {getattr(e, "workspace", "") for e in events}
        (only,) = names if len(names) == 1 else ("",)
        scope = Scope(only) if only and set(epochs) == names else Scope()
        return self.core.log.append(build, guard=self.core.guard(), scope=scope, inline=small)

    def heartbeat(self, workspace: str, epoch: int, ttl_s: float = 60) -> Lease:
        """Extend the live lease; an expired one is never revived (StaleEpoch)."""
        ttl_ns = _check_ttl(ttl_s)

        def build(tx: Tx, now: int) -> list[Event]:
            row = tx.workspace(workspace)
            if row is None:
                raise UnknownWorkspace(workspace)
            live = row.live_epoch(now)
            if live != epoch:
                raise StaleEpoch(workspace, epoch, live, latest=row.epoch, holder=row.holder)
            return [LeaseRenewed(workspace=workspace, epoch=epoch,
                                 expires_ns=max(row.expires_ns, now + ttl_ns))]

        self.core.log.append(build, scope=Scope(workspace))
        return self.lease(workspace)

    def release(self, workspace: str, epoch: int) -> Lease:
        """Give the lease up (idempotent for the same epoch)."""

        def build(tx: Tx, now: int) -> list[Event]:
            row = tx.workspace(workspace)
            if row is None:
                raise UnknownWorkspace(workspace)
            if row.epoch != epoch:
                raise StaleEpoch(workspace, epoch, row.live_epoch(now), latest=row.epoch,
                                 holder=row.holder)
            return [LeaseReleased(workspace=workspace, epoch=epoch)]

        self.core.log.append(build, scope=Scope(workspace))
        return self.lease(workspace)

    def live_epoch(self, tx: Tx, workspace: str, epoch: int, now: int) -> WsRow:
        row = tx.workspace(workspace)
        if row is None:
            raise UnknownWorkspace(workspace)
        live = row.live_epoch(now)
        if live != epoch:
            raise StaleEpoch(workspace, epoch, live, latest=row.epoch, holder=row.holder)
        return row

    def unsettled(self, workspace: str, epoch: int) -> builtins.list[str]:
        """Steps of the workspace whose latest attempt, of an epoch before `epoch`, is
        still in flight (planned, fenced, blob-stored)."""
        check_int(epoch, "epoch")
        with self.core.storage.read() as view:
            return [step for step, _attempt in view.steps_in_flight(workspace, epoch,
                                                                    oldest_first=True)]

    def check_epoch(self, workspace: str, epoch: int, now: int | None = None) -> None:
        """Before each landing, with no store lock held: StaleEpoch unless `epoch` is the
        workspace's live one at `now` (None: the clock's now) in the latest commit (one
        read)."""
        row = self.places.get(workspace)
        live = row.live_epoch(self.core.clock() if now is None else now)
        if live != epoch:
            raise StaleEpoch(workspace, epoch, live, latest=row.epoch, holder=row.holder)

    def epoch_live(self, workspace: str, epoch: int) -> bool | None:
        """Whether `epoch` is the workspace's live one now (None: the store cannot say)."""
        try:
            self.check_epoch(workspace, epoch)
        except StaleEpoch:
            return False
        except LedgerError:
            return None
        return True

    def stale(self, workspace: str, epoch: int) -> StaleEpoch:
        row = self.places.get(workspace)
        return StaleEpoch(workspace, epoch, row.live_epoch(self.core.clock()),
                          latest=row.epoch, holder=row.holder)

    @contextlib.contextmanager
    def workspace_lock(self, workspace: str) -> Iterator[None]:
        """The threads of this process apply and undo in one workspace in turn, from
        their checks to their commit — as they did when the store's write lock covered
        the file work (docs/design.md "Epochs and leases"): one step's checks never see
        another's landing that is not recorded yet. A lock of this process only: a
        thread is never frozen alone, and a takeover from another process needs none."""
        with self._locks_lock:
            entry = self._ws_locks.setdefault(workspace, [threading.RLock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._locks_lock:
                entry[1] -= 1
                if not entry[1]:
                    self._ws_locks.pop(workspace, None)


def _check_ttl(ttl_s: float) -> int:
    if not isinstance(ttl_s, int | float) or not 0 < ttl_s <= TTL_MAX_S:
        raise InvalidInput(f"lease ttl {ttl_s!r}s must be > 0 and at most {TTL_MAX_S}s (7 days)")
    return int(ttl_s * 1_000_000_000)


__all__ = ["Leases"]
