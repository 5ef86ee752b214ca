"""The witness as an open ledger keeps it: `WitnessKeeper` — found (the one given, else
the one the ledger records), checked against the chain when the ledger opens (fail
closed), kept up to date by a writer (`attach`), asked about (`status`, `check`,
`findings` for verify); and `anchor_witness`, the operator's way to start a new one.
The witness file itself, its anchors and the re-anchoring check are `ledger.witness`.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Sequence
from typing import Any

from .errors import (
    AnchorRefused,
    InvalidInput,
    WitnessElsewhere,
    WitnessMismatch,
    WitnessMissing,
)
from .events import (
    ITEMS_MAX,
    TEXT_MAX,
    Envelope,
    Event,
    RecordedEvent,
    WitnessAnchored,
    chain_hash,
)
from .log import EventLog, Head
from .store import EventQuery, Store, Tx
from .verify import Finding, verify
from .workspace.core import OwnFiles
from .witness import (
    AnchorCheck,
    Witness,
    Witnessed,
    WitnessStatus,
    anchor_problems,
    newest_anchor_seq,
    recorded_anchor,
    same_location,
    witness_path,
)


class WitnessKeeper:
    """An open ledger's witness (see the module): where it is, whether the ledger
    records that it is witnessed, how far the ledger is ahead of it."""

    def __init__(self, path: str, ledger_id: Callable[[], str], log: EventLog, store: Store,
                 *, readonly: bool, given: str | os.PathLike[str] | None, check: bool,
                 own: OwnFiles | None = None) -> None:
        self.path, self._ledger_id, self.log, self.store = path, ledger_id, log, store
        #: The ledger's own files: the witness is one of them (no workspace may hold it).
        self.own = own
        self.readonly = readonly
        #: The re-anchoring check every write transaction runs before COMMIT.
        self.anchor = AnchorCheck(path, log)
        #: Whether the ledger records that it is witnessed (a `witness-anchored` event, or
        #: the witness tag of a ledger witnessed before locations were recorded).
        self.witnessed = False
        #: Commits the ledger is ahead of its witness (1: an honest crash).
        self.lag = 0
        #: Witnessed, but where is recorded nowhere.
        self.unknown = False
        self.given = None if given is None else witness_path(given)
        self.check_on = check

    @property
    def witness(self) -> Witness | None:
        """The witness in use (the one given, else the one the ledger records); the
        re-anchoring check tags each commit with its key."""
        return self.anchor.witness

    @witness.setter
    def witness(self, witness: Witness | None) -> None:
        self.anchor.witness = witness
        if self.own is not None:
            self.own.witness = None if witness is None else witness.path

    @property
    def ledger_id(self) -> str:
        return self._ledger_id()

    def head(self) -> Head:
        with self.store.read():
            return self.log.head()

    def attach(self) -> None:
        """Find the witness (the one given, else the one recorded), check the chain against
        it (fail closed), and on a writer keep it updated; a writer given a witness for a
        ledger that records none records it (`witness-anchored`), so later openers use it.

        Refusals: a given witness that is not the recorded one (`WitnessElsewhere`); a
        witnessed ledger whose witness is missing, blank or unknown (`WitnessMissing`);
        a ledger behind its witness or off its chain (`WitnessMismatch`).
        """
        with self.store.read() as view:
            found = recorded_anchor(view, self.path)
            legacy = found is None and view.meta("witness_tag") is not None
        self.anchor.seq = found[0] if found is not None else 0
        self.witnessed = found is not None or legacy
        given, path = self.given, self.given
        if found is not None:
            seq, anchored = found
            if given is not None and not same_location(given, anchored.witness):
                raise WitnessElsewhere(self.path, given, anchored.witness, seq)
            path = anchored.witness
        elif legacy and given is None:
            if self.check_on:
                raise WitnessMissing(self.path, None, "witnessed by an older steptrail")
            self.unknown = True
        if not self.readonly:
            self.log.before_commit = self.anchor.before_commit
        if path is None:
            return
        witness = self.witness = Witness(path, self.ledger_id)
        if self.check_on:
            self.lag = self.check()
        if self.readonly:
            return
        self.log.on_commit = witness.record
        if self.lag:
            # An honest crash left the ledger ahead of its witness, and check_witness
            # proved the tail was written under it: catch the witness up now, so a crash
            # of this writer between its own COMMIT and witness write leaves one commit
            # ahead again, never two.
            head = self.head()
            witness.write(head.seq, head.hash)
        if found is None:
            # First use (or a ledger witnessed before locations were recorded): start
            # the witness from here if it is blank, and record where it is.
            seen = witness.read()
            head = self.head()
            if seen is None:
                witness.write(head.seq, head.hash)
            self.append_anchor(WitnessAnchored(
                witness=path, head_seq=head.seq, head_hash=head.hash.hex(),
                previous_state="ok" if legacy else "none"))

    def append_anchor(self, event: WitnessAnchored | Callable[[Tx, int], Sequence[Event]]
                       ) -> RecordedEvent:
        """Append this process's own `witness-anchored` event (which the re-anchoring
        check, `AnchorCheck`, lets through)."""
        self.anchor.anchoring = True
        try:
            recorded = self.log.append(event if callable(event) else [event])[0]
        finally:
            self.anchor.anchoring = False
        self.anchor.seq = recorded.seq
        return recorded

    def status(self) -> WitnessStatus:
        """Where the witness is and what it says about this ledger. Read-only; reports,
        never refuses (open with ``witness_check=False`` to ask about a refused ledger)."""
        head = self.head()
        out = WitnessStatus(witnessed=self.witnessed, anchored_seq=self.anchor.seq,
                            head_seq=head.seq, state="none")
        if self.unknown:
            out.state, out.problem = "unknown", "the ledger does not record where its witness is"
        if self.witness is None:
            return out
        out.witness = self.witness.path
        out.state, seen, out.problem = self.witness.state()
        if seen is not None:
            out.witnessed_seq = seen.seq
            try:
                out.lag = self.check()
            except WitnessMismatch as exc:
                out.state, out.problem = "mismatch", exc.why
        elif not self.witnessed and out.state != "damaged":
            out.state, out.problem = "none", ""  # given, not started yet: nothing to check
        return out

    def check(self) -> int:
        """Raise WitnessMismatch unless the chain contains the witnessed head; return how
        many commits the ledger is ahead of it (0, or 1 after an honest crash)."""
        assert self.witness is not None
        try:
            seen = self.witness.read()
        except WitnessMismatch as exc:  # damaged: name this ledger
            raise WitnessMismatch(self.path, self.witness.path, exc.why) from None
        if seen is None:
            if self.witnessed:
                raise WitnessMissing(self.path, self.witness.path, self.witness.state()[2])
            return 0

        def refuse(why: str) -> WitnessMismatch:
            assert self.witness is not None
            return WitnessMismatch(self.path, self.witness.path, why)

        with self.store.read() as view:
            head = view.head()
            if head.seq < seen.seq:
                raise refuse(f"the ledger ends at event #{head.seq}, its witness recorded"
                             f" #{seen.seq}")
            # The witnessed row and every row after it are re-hashed from their columns,
            # not taken from their hash column: a tail edit cannot keep its old hash.
            prev = self.log.genesis if seen.seq == 0 else None
            expected = max(seen.seq, 1)
            commits: set[object] = set()  # events of one append share their time
            for row in view.events(EventQuery(after_seq=expected - 1)):
                (seq, time_ns, ws, run, step, attempt, epoch, rev, key, kind, v, payload,
                 prev_hash, digest) = row
                if seq != expected or (prev is not None and bytes(prev_hash) != prev):
                    raise refuse(f"event #{expected} does not follow the witnessed chain")
                env = Envelope(ws, run, step, attempt, epoch, rev)
                if chain_hash(bytes(prev_hash), seq, time_ns, env, key, kind, v,
                              bytes(payload)) != bytes(digest):
                    raise refuse(f"event #{seq} does not match its hash (edited after the"
                                 " witness saw it)")
                if seq == seen.seq and bytes(digest) != seen.hash:
                    raise refuse(f"event #{seq} is not the one the witness recorded"
                                 " (history rewritten)")
                if seq > seen.seq:
                    commits.add(time_ns)
                prev, expected = bytes(digest), seq + 1
            if head.seq > seen.seq:
                # Ahead of the witness: an honest crash between COMMIT and the witness
                # write leaves a tail tagged with the witness's key; a forged tail cannot.
                tag = view.meta_all().get("witness_tag")
                if tag is None or not hmac.compare_digest(
                        str(tag), self.witness.tag(head.seq, head.hash)):
                    raise refuse(f"events #{seen.seq + 1}-#{head.seq} after the witnessed head"
                                 " were not written under this witness (forged, or written"
                                 " by a process without --witness)")
            # the commits after the witness
            return len(commits)

    def findings(self) -> tuple[list[Finding], Witnessed | None]:
        """What verify reports about the witness (what opening with the check on would
        refuse, a tail written without it, the recorded anchors), and the head it holds."""
        with self.store.read() as view:
            extra = [Finding("witness", seq, message) for seq, message in anchor_problems(view)]
        if self.unknown:
            extra.append(Finding("witness", 0, "the ledger is witnessed but records no witness"
                                 " location (witnessed by an older steptrail): pass its"
                                 " witness with --witness PATH"))
        if self.witness is None:
            return extra, None
        state, seen, why = self.witness.state()
        if state == "damaged" or (state != "ok" and self.witnessed):
            extra.append(Finding("witness", 0, f"{why}: a witnessed ledger is not opened"
                                 " without its witness; restore it, or re-anchor it"
                                 " (Ledger.anchor_witness, 'steptrail witness anchor')"
                                 if state != "damaged" else why))
        if seen is not None:
            try:
                lag = self.check()
            except WitnessMismatch as exc:
                lag = 0
                extra.append(Finding("witness", seen.seq, exc.why))
            if lag > 1:
                extra.append(Finding("witness", seen.seq, f"the ledger is {lag} commits ahead"
                                     " of its witness: written without the witness, or a"
                                     " forged tail"))
        return extra, seen


def anchor_witness(
    opener: Callable[..., Any],
    path: str | os.PathLike[str],
    witness: str | os.PathLike[str] | None = None,
    *,
    force: bool = False,
    clock: Callable[[], int] | None = None,
    vfs: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RecordedEvent:
    """`Ledger.anchor_witness`, given `opener` (`Ledger.open`)."""

    target = None if witness is None else witness_path(witness)
    with opener(path, readonly=True, clock=clock, vfs=vfs, witness_check=False,
                  _witness_resolve=False) as ro:
        with ro.storage.read() as view:
            found = recorded_anchor(view, ro.path)
            legacy = found is None and view.meta("witness_tag") is not None
        old = found[1].witness if found is not None else (target if legacy else None)
        if target is None:
            if old is None:
                raise InvalidInput(f"ledger {ro.path} records no witness to replace; name"
                                   " the new one with --witness /absolute/path")
            target = old
        problems: list[str] = []
        state: Any = "none"
        if old is not None:
            ro.witness, ro._witness.witnessed = Witness(old, ro.ledger_id), True
            state, seen, why = ro.witness.state()
            if seen is not None:
                try:
                    ro.check_witness()
                except WitnessMismatch as exc:
                    state = "mismatch"
                    problems.append(f"the witness {old} says: {exc.why}")
        if not os.path.isdir(os.path.dirname(target)):
            raise InvalidInput(f"the witness directory {os.path.dirname(target)} does not"
                               " exist; create it (on another volume) first")
        if not (old is not None and same_location(target, old)):
            # Never overwrite a file that is not a witness of this ledger.
            tstate, _seen, twhy = Witness(target, ro.ledger_id).state()
            if tstate == "damaged":
                raise InvalidInput(f"{target} is not a witness of ledger {ro.path} ({twhy});"
                                   " name a new file, or remove that one first")
        report = verify(ro.storage, ro.log, progress=progress, blob_check=ro.blob_problem)
        with ro.storage.read() as view:
            problems.extend(message for _seq, message in anchor_problems(view))
        problems.extend(f"[{f.check}] {f.message}" for f in report.findings)
        if problems and not force:
            raise AnchorRefused(ro.path, problems)
        verified = Head(report.head_seq, bytes.fromhex(report.head_hash))
        anchor_seq = found[0] if found is not None else 0
    led = opener(path, clock=clock, vfs=vfs, _witness_resolve=False)
    try:
        new = Witness(target, led.ledger_id)

        def build(tx: Tx, _time_ns: int) -> list[Event]:
            head = tx.head()
            if head != verified or newest_anchor_seq(tx) != anchor_seq:
                raise AnchorRefused(led.path, [
                    f"the ledger changed while it was verified (head #{head.seq}, verified"
                    f" #{verified.seq}): run the anchor again"])
            new.start(head.seq, head.hash)
            return [WitnessAnchored(
                witness=target, head_seq=head.seq, head_hash=head.hash.hex(),
                previous=old or "", previous_state=state, forced=bool(force and problems),
                overridden=tuple(p[:TEXT_MAX] for p in problems[:ITEMS_MAX]) if force else ())]

        led.witness, led._witness.witnessed, led._witness.anchor.seq = new, True, anchor_seq
        led.log.before_commit = led._witness.anchor.before_commit
        led.log.on_commit = new.record
        return led._witness.append_anchor(build)
    finally:
        led.close()


__all__ = ["WitnessKeeper", "anchor_witness"]
