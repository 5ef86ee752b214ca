"""An agmi (agent-memory-integrity) adapter for a steptrail ledger.

agmi measures whether a store notices edits made behind its back (T1-T9, see
``agmi.attacks.at_rest``). It drives every store through ``agmi.adapters.base.
MemoryAdapter``; this module is that adapter for steptrail. It is test-only: nothing
in ``ledger/`` imports agmi.

What a record is
    One event, appended through the public API (``Ledger.append``): a
    ``Planned(step="agmi-A-<i>", run="agmi-ctx-A", artifacts=("notes/agmi-A-<i>.md",))``.
    The *context* (agmi's owner: thread, user, session) is the event's ``run``; the
    second context T6 needs is ``run="agmi-ctx-B"`` in the same ledger (one chain).
    A record's *slot* (identity) is its ``seq``; its *content* is the ``payload`` column.
    ``Record.seq`` is the ordinal of the row among context A's rows, as agmi expects.

How the store is attacked (the attacker holds the ledger's files, not its witness)
    Every edit goes through a raw apsw connection on the ledger file, exactly as
    ``tests/conftest.py::tamper`` does: drop the append-only triggers, edit ``events``,
    recreate the triggers with their exact SQL (so the schema allow-list still accepts
    the file). The attacker is careful: after the edit it re-derives the projection
    tables from the edited events (the tool's own fold, opened without the witness, which
    the attacker does not have), so the derived tables do not give the edit away; when
    the fold refuses the edited log (T6, T7 leave a step planned twice) they are left as
    they were. Integrity material is copied the way agmi's other adapters copy it and is
    never recomputed: a moved or replayed row carries its own ``hash``/``prev_hash``, a
    forged row copies its template's (see ``tests/log/test_tamper_evidence.py`` for the attacker who
    does recompute the keyless chain).

    T1 tamper     the payload of A's middle row: an artifact path renamed (still a
                  valid, decodable event; the columns still agree with it).
    T2 truncate   DELETE A's last two rows.
    T3 delete     DELETE A's middle row.
    T4 reorder    swap two adjacent rows' columns (everything but ``seq``).
    T5 forge      INSERT a new well-formed event after the tail: ``seq`` = head + 1,
                  its template's time (so it reads as part of the last commit) and chain
                  columns.
    T6 replay     copy B's newest row (payload, kind, step, hash, ...) onto A's newest,
                  keeping A's ``seq``, ``run``, ``workspace`` and ``journal_key`` (the
                  UNIQUE key cannot be duplicated).
    T7 rollback   the same with A's oldest row as the donor.
    T8 metadata   ``time_ns`` of A's middle row set to 2030 (content untouched).
    T9 snapshot   close the ledger, copy its directory (file and blobs), append one more
                  event through the API (the witness sees it), restore the old copy.

Where detection happens
    ``reload()`` closes the ledger and opens it as the application would: read-write,
    with the witness when configured (``Ledger.open`` fails closed with
    ``WitnessMismatch`` on a ledger behind or off its witness). The bytes of the
    ledger's directory and of the witness are hashed before and after that open (a
    ``-shm`` left out), so a refusal can be shown to have written nothing. ``verify()``
    returns False when the open was refused or ``Ledger.verify()`` has findings; after a
    refusal the findings come from a read-only open with ``witness_check=False``, which
    reports instead of refusing. ``outcome`` keeps both for the test to assert on, and
    ``detection_point`` is "read" for a cell refused at open (agmi: REJECTED) and
    "audit" for one only ``verify`` named (agmi: REPORTED).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
from agmi.adapters.base import MemoryAdapter, Record

from ledger import Ledger, Planned
from ledger.errors import LedgerError
from ledger.events import (
    EVENT_VERSION,
    Envelope,
    chain_hash,
    encode,
    envelope,
    genesis_hash,
    journal_key,
    kind_of,
)
from ledger.witness import WitnessMismatch

CTX = "agmi-ctx-A"
OTHER = "agmi-ctx-B"
COLUMNS = ("seq", "time_ns", "workspace", "run", "step", "attempt", "epoch", "rev",
           "journal_key", "kind", "v", "payload", "prev_hash", "hash")
#: What a replay keeps of the victim row: its slot, its owner, its (UNIQUE) journal key.
REPLAY_KEEPS = ("seq", "run", "workspace", "journal_key")
META_TAMPERED_NS = 1_900_000_000_000_000_000  # 2030-03-17


class _Clock:
    """Strictly increasing nanoseconds, shared across reopenings of one store."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def event_for(ctx: str, label: str) -> Planned:
    prefix = "A" if ctx == CTX else "B"
    return Planned(step=f"agmi-{prefix}-{label}", attempt=1, run=ctx,
                   artifacts=(f"notes/agmi-{prefix}-{label}.md",))


def rechain(conn: apsw.Connection) -> None:
    """Recompute every row's prev_hash and hash, as anyone holding the file can: the chain
    is keyless sha256 seeded by the ledger id, which the file's own meta table holds.
    Not one of agmi's edits (they never recompute integrity material); the stronger
    attacker of tests/log/test_tamper_evidence.py."""
    ledger_id = conn.execute("SELECT value FROM meta WHERE key = 'ledger_id'").fetchone()[0]
    prev = genesis_hash(ledger_id)
    rows = conn.execute("SELECT seq, time_ns, workspace, run, step, attempt, epoch, rev,"
                        " journal_key, kind, v, payload FROM events ORDER BY seq").fetchall()
    for seq, time_ns, ws, run, step, attempt, epoch, rev, key, kind, v, payload in rows:
        digest = chain_hash(prev, seq, time_ns, Envelope(ws, run, step, attempt, epoch, rev),
                            key, kind, v, bytes(payload))
        conn.execute("UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?",
                     (prev, digest, seq))
        prev = digest


def tree_digest(*dirs: Path) -> dict[str, str]:
    """sha256 of every file under `dirs` (a -shm, SQLite's WAL index, left out)."""
    out = {}
    for d in dirs:
        for p in sorted(d.rglob("*")):
            if p.is_file() and not p.name.endswith("-shm"):
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@dataclass
class Outcome:
    """What the ledger said about the store at the last reload + verify."""

    refused: str | None = None  # the typed error the checked read-write open raised
    refused_type: type | None = None
    refused_readonly: type | None = None  # the same files opened read-only (inspection)
    untouched: bool | None = None  # files byte-identical across the refused open
    findings: list[tuple[str, int, str]] = field(default_factory=list)
    projections_rederived: bool | None = None  # the attacker's fold after the edit

    @property
    def checks(self) -> set[str]:
        return {c for c, _, _ in self.findings}


class SteptrailAdapter(MemoryAdapter):
    """steptrail without a witness: the chain and `verify` alone."""

    name = "steptrail"
    use_witness = False
    supports_replay = True
    supports_metadata = True
    supports_snapshot = True

    def __init__(self) -> None:
        self._root: Path | None = None
        self.ledger: Ledger | None = None
        self.outcome = Outcome()
        #: One Outcome per setup(), i.e. per attack run, in run order.
        self.history: list[Outcome] = []

    # --- paths ----------------------------------------------------------------------

    @property
    def store(self) -> Path:
        assert self._root is not None
        return self._root / "store"

    @property
    def path(self) -> Path:
        return self.store / "ledger.db"

    @property
    def witness_dir(self) -> Path:
        assert self._root is not None
        return self._root / "other-volume"

    @property
    def witness(self) -> Path | None:
        return self.witness_dir / "ledger.witness" if self.use_witness else None

    @property
    def detection_point(self) -> str:
        return "read" if self.outcome.refused is not None else "audit"

    # --- lifecycle ------------------------------------------------------------------

    def setup(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="agmi-steptrail-"))
        self.store.mkdir()
        self.witness_dir.mkdir()
        self._clock = _Clock()
        self.outcome = Outcome()
        self.history.append(self.outcome)
        self.ledger = Ledger.init(self.path, clock=self._clock, witness=self.witness)

    def teardown(self) -> None:
        self._close()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()
            self.ledger = None

    def _open(self) -> Ledger:
        return Ledger.open(self.path, clock=self._clock, witness=self.witness)

    # --- the tool's own write path --------------------------------------------------

    def _seed_ctx(self, ctx: str, n: int) -> None:
        assert self.ledger is not None
        for i in range(n):
            self.ledger.append(event_for(ctx, str(i)))

    def seed(self, n: int) -> None:
        self._seed_ctx(CTX, n)

    def seed_other(self, n: int) -> None:
        if self.ledger is None:
            self.ledger = self._open()
        self._seed_ctx(OTHER, n)

    def append_genuine(self) -> None:
        if self.ledger is None:
            self.ledger = self._open()
        self.ledger.append(event_for(CTX, "late"))

    # --- raw access: the attacker's connection --------------------------------------

    def _raw(self) -> apsw.Connection:
        return apsw.Connection(os.fspath(self.path))

    def _read_ctx(self, ctx: str) -> list[Record]:
        conn = self._raw()
        try:
            rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM events WHERE run = ?"
                                " ORDER BY seq", (ctx,)).fetchall()
        finally:
            conn.close()
        return [Record(seq=i, fields=dict(zip(COLUMNS, row))) for i, row in enumerate(rows)]

    def read_all_raw(self) -> list[Record]:
        return self._read_ctx(CTX)

    def read_other_raw(self) -> list[Record]:
        return self._read_ctx(OTHER)

    def _slot(self, ordinal: int) -> int | None:
        recs = self.read_all_raw()
        return int(recs[ordinal].fields["seq"]) if ordinal < len(recs) else None

    def edit(self, fn) -> None:
        """Run `fn(conn)` with the append-only triggers dropped, recreate them with
        their exact SQL, then re-derive the projections the way a careful attacker
        would (the tool's own fold, opened without the witness)."""
        conn = self._raw()
        try:
            triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger'"
                                    " ORDER BY name").fetchall()
            with conn:
                for name, _ in triggers:
                    conn.execute(f"DROP TRIGGER {name}")
                fn(conn)
                for _, sql in triggers:
                    conn.execute(sql)
        finally:
            conn.close()
        self._rederive_projections()

    def _rederive_projections(self) -> None:
        try:
            # The attacker has no witness; steptrail would use the one the ledger records
            # (and refuse the cut tail), so the attacker's fold does not resolve it at all.
            with Ledger.open(self.path, clock=self._clock, _witness_resolve=False) as attacker:
                attacker.rebuild()
        except LedgerError:
            self.outcome.projections_rederived = False
        else:
            self.outcome.projections_rederived = True

    @staticmethod
    def _update(conn: apsw.Connection, seq: int, fields: dict[str, Any]) -> None:
        key = fields.get("journal_key")
        if key is not None:
            # journal_key is UNIQUE: park the row that holds it (a swap's second write
            # gives that row its new key).
            conn.execute("UPDATE events SET journal_key = 'agmi-parked:' || journal_key"
                         " WHERE journal_key = ? AND seq != ?", (key, seq))
        cols = [c for c in fields if c != "seq"]
        conn.execute(f"UPDATE events SET {', '.join(c + ' = ?' for c in cols)} WHERE seq = ?",
                     (*(fields[c] for c in cols), seq))

    def write_raw(self, record: Record) -> None:
        slot = self._slot(record.seq)
        fields = dict(record.fields)

        def change(conn: apsw.Connection) -> None:
            if slot is None:  # past the tail: an insertion
                if fields.get("seq") is None:
                    fields["seq"] = conn.execute("SELECT max(seq) + 1 FROM events").fetchone()[0]
                conn.execute(f"INSERT INTO events({', '.join(COLUMNS)}) VALUES"
                             f" ({', '.join('?' for _ in COLUMNS)})",
                             tuple(fields[c] for c in COLUMNS))
            else:
                self._update(conn, slot, {c: v for c, v in fields.items() if c != "seq"})

        self.edit(change)

    def delete_raw(self, seq: int) -> None:
        slot = self._slot(seq)
        if slot is None:
            return
        self.edit(lambda conn: conn.execute("DELETE FROM events WHERE seq = ?", (slot,)))

    def replay_onto(self, victim_seq: int, donor: Record) -> None:
        slot = self._slot(victim_seq)
        if slot is None:
            raise RuntimeError("no victim row at that position")
        moved = {c: v for c, v in donor.fields.items() if c not in REPLAY_KEEPS}
        self.edit(lambda conn: self._update(conn, slot, moved))

    def read_meta(self, seq: int) -> dict:
        f = self.read_all_raw()[seq].fields
        return {"time_ns": f["time_ns"], "run": f["run"], "workspace": f["workspace"]}

    def write_meta(self, seq: int, meta: dict) -> None:
        slot = self._slot(seq)
        if slot is None:
            raise RuntimeError("no row at that position")
        ts = META_TAMPERED_NS if meta.get("agmi_meta_tampered") else meta["time_ns"]
        self.edit(lambda conn: conn.execute("UPDATE events SET time_ns = ? WHERE seq = ?",
                                             (ts, slot)))

    @staticmethod
    def row_of(event: Planned, *, seq: int, time_ns: int) -> dict[str, Any]:
        """An `events` row for `event`, with empty chain columns (`rechain` fills them)."""
        env = envelope(event)
        return {"seq": seq, "time_ns": time_ns, "workspace": env.workspace, "run": env.run,
                "step": env.step, "attempt": env.attempt, "epoch": env.epoch, "rev": env.rev,
                "journal_key": journal_key(event), "kind": kind_of(event),
                "v": EVENT_VERSION, "payload": encode(event), "prev_hash": b"", "hash": b""}

    # --- content hooks --------------------------------------------------------------

    def mutate_payload(self, record: Record) -> Record:
        payload = bytes(record.fields["payload"])
        tampered = payload.replace(b'.md"', b'.TAMPERED.md"', 1)
        if tampered == payload:
            raise RuntimeError("no artifact path in the payload to tamper with")
        record.fields["payload"] = tampered
        return record

    def forge_record(self, template: Record) -> Record:
        event = event_for(CTX, "forged")
        fields = dict(template.fields)
        fields.update(seq=None, step=event.step, journal_key=journal_key(event),
                      payload=encode(event))
        return Record(seq=template.seq + 1, fields=fields)

    def identity_of(self, record: Record) -> str:
        return str(record.fields["seq"])

    def payload_of(self, record: Record) -> str:
        return bytes(record.fields["payload"]).decode()

    def owner_of(self, record: Record) -> str | None:
        return str(record.fields["run"])

    # --- T9: the ledger's directory is the store; the witness is elsewhere ----------

    def snapshot_store(self) -> str:
        self._close()
        token = tempfile.mkdtemp(prefix="agmi-steptrail-snap-")
        shutil.copytree(self.store, token, dirs_exist_ok=True)
        return token

    def restore_store(self, token: object) -> None:
        self._close()
        shutil.rmtree(self.store)
        shutil.copytree(str(token), self.store)
        shutil.rmtree(str(token), ignore_errors=True)

    # --- reload + verify: the ledger's own answer -----------------------------------

    def reload(self) -> None:
        self._close()
        before = tree_digest(self.store, self.witness_dir)
        outcome = self.outcome
        outcome.refused = outcome.refused_type = outcome.untouched = None
        outcome.refused_readonly = None
        try:
            self.ledger = self._open()
        except LedgerError as exc:
            outcome.refused, outcome.refused_type = f"{type(exc).__name__}: {exc}", type(exc)
            try:  # an inspection of the same files must be refused too
                Ledger.open(self.path, readonly=True, clock=self._clock,
                            witness=self.witness).close()
            except LedgerError as ro_exc:
                outcome.refused_readonly = type(ro_exc)
            outcome.untouched = tree_digest(self.store, self.witness_dir) == before

    def verify(self) -> bool:
        self.verify_detail = None
        outcome = self.outcome
        if self.ledger is not None:
            report = self.ledger.verify()
        else:
            # Refused at open: what does verify report about the same files?
            with Ledger.open(self.path, readonly=True, clock=self._clock,
                             witness=self.witness, witness_check=False) as led:
                report = led.verify()
        outcome.findings = [(f.check, f.seq, f.message) for f in report.findings]
        if outcome.refused is None and report.ok:
            return True
        parts = []
        if outcome.refused is not None:
            why = outcome.refused
            if isinstance(outcome.refused_type, type) and issubclass(outcome.refused_type,
                                                                     WitnessMismatch):
                why = why.split(". Its history")[0]
            parts.append(f"open refused: {why}")
        if outcome.findings:
            parts.append("verify: " + ", ".join(sorted(outcome.checks)))
        self.verify_detail = "; ".join(parts)[:300]
        return False


class SteptrailWitnessAdapter(SteptrailAdapter):
    """steptrail with a witness on another directory: the head kept outside the store."""

    name = "steptrail+witness"
    use_witness = True
