"""Projections: the inline `steps` table equals a rebuild and an independent model.

The reference model below is written from docs/design.md's lifecycle, not from
`ledger.projections.steps.fold`, so a bug in the fold shows up as a disagreement.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import hypothesis
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FakeClock, LedgerAt, commit_events, digest_of, lock_files_aside, snapshot_dir
from ledger import (
    Acked,
    CorruptLedger,
    BlobPinned,
    BlobStored,
    Compensated,
    Fenced,
    IdempotencyConflict,
    IllegalTransition,
    Ledger,
    ManifestEntry,
    ManifestPublished,
    Planned,
    Rejected,
    StepRow,
    WorkspaceAdded,
)
from ledger import projections as proj
from ledger.store import FOLLOWS
from ledger.projections import steps as steps_mod

COLUMNS = StepRow.COLUMNS


def table(ledger: Ledger) -> list[tuple[Any, ...]]:
    """The `steps` table as stored, ordered by step id."""
    return ledger._store.db.conn.execute(
        f"SELECT {', '.join(COLUMNS)} FROM steps ORDER BY step_id"
    ).fetchall()


def table_of(path: Path | str) -> tuple[list[tuple[Any, ...]], tuple[int, int] | None]:
    """The `steps` rows and the checkpoint of a closed ledger file, read without writing."""
    conn = apsw.Connection(f"file:{path}?immutable=1",
                           flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM steps ORDER BY step_id").fetchall()
        cp = conn.execute(
            "SELECT last_seq, version FROM projection_checkpoint WHERE name = 'steps'"
        ).fetchone()
        return rows, (None if cp is None else tuple(cp))
    finally:
        conn.close()


def as_rows(steps: list[StepRow]) -> list[tuple[Any, ...]]:
    return sorted(s.as_tuple() for s in steps)


def stored(ledger: Ledger, step: str, attempt: int, data: bytes) -> BlobStored:
    """Put `data` into the ledger's blob store; the blob-stored event that may follow."""
    digest = ledger.blobs.put(data).digest
    return BlobStored(step=step, attempt=attempt, digest=digest, size=len(data))


def raw_sql(path: Path | str, *statements: str) -> None:
    conn = apsw.Connection(str(path))
    try:
        with conn:
            for sql in statements:
                conn.execute(sql)
    finally:
        conn.close()


# --- the reference model ---------------------------------------------------------------

OPEN = frozenset({"planned", "fenced", "blob-stored", "manifest-published", "acked"})
ENDED = frozenset({"compensated", "rejected"})


class Refused(Exception):
    def __init__(self, error: type[Exception], why: str) -> None:
        super().__init__(why)
        self.error, self.why = error, why


def model_key(e: Any) -> tuple[Any, ...]:
    """docs/design.md: (step, attempt, kind[, digest]); publish and ack add the manifest rev."""
    if isinstance(e, WorkspaceAdded):
        return ("workspace-added", e.workspace)
    kind = type(e).__struct_config__.tag
    if isinstance(e, BlobStored):  # event version 2: by path and digest
        return (e.step, e.attempt, kind, e.path, e.digest)
    if isinstance(e, BlobPinned):
        return (e.step, e.attempt, kind, e.digest)
    if isinstance(e, ManifestPublished | Acked):
        return (e.step, e.attempt, kind, e.manifest_rev)
    return (e.step, e.attempt, kind)


def model_refuses(row: dict[str, Any] | None, e: Any) -> str | None:
    """Why docs/design.md's lifecycle refuses `e` after `row` (None: it is legal)."""
    if isinstance(e, Planned):
        if row is None:
            return None if e.attempt == 1 else "first attempt is not 1"
        if row["state"] not in ENDED:
            return "new attempt while in flight"
        return None if e.attempt == row["attempt"] + 1 else "attempt skips"
    if row is None:
        return "never planned"
    if e.attempt != row["attempt"]:
        return "not the latest attempt"
    if e.workspace != row["workspace"]:
        return "another workspace than the attempt's"
    now = row["state"]
    if isinstance(e, Fenced | Rejected):
        return None if now == "planned" else f"{type(e).__name__} after {now}"
    if isinstance(e, Acked):
        if now != "manifest-published":
            return f"acked after {now}"
        return None if e.manifest_rev == row["manifest_rev"] else "acked wrong rev"
    if isinstance(e, BlobPinned | BlobStored | Compensated):
        return None if now in OPEN else f"{type(e).__name__} after {now}"
    if isinstance(e, ManifestPublished):
        if now not in OPEN:
            return f"publish after {now}"
        if e.manifest_rev != row["manifest_rev"] + 1:
            return "publish wrong rev"
        if e.expected_rev == -1:  # create: only without a live manifest
            if row["live"]:
                return "create while live"
            return None if e.supersedes is None else "create supersedes"
        if not row["live"]:
            return "supersede nothing live"
        if e.expected_rev != row["manifest_rev"]:
            return "supersede stale rev"
        return None if e.supersedes == row["manifest_digest"] else "supersede wrong digest"
    raise AssertionError(e)


def model_fold(row: dict[str, Any] | None, e: Any, seq: int, t: int) -> dict[str, Any]:
    if isinstance(e, Planned):
        if row is None:
            row = dict(step_id=e.step, manifest_rev=-1, manifest_digest=None, live=False,
                       committed_bytes=0, first_seq=seq)
        row.update(run=e.run, workspace=e.workspace, state="planned", attempt=e.attempt,
                   epoch=e.epoch, rev=e.rev, stored_bytes=0, last_seq=seq, updated_ns=t)
        return row
    assert row is not None
    row.update(last_seq=seq, updated_ns=t)
    if e.epoch and not isinstance(e, Compensated):  # a settler's epoch is not the attempt's
        row["epoch"] = e.epoch
    if isinstance(e, Fenced):
        row.update(state="fenced", rev=e.rev)
    elif isinstance(e, BlobStored):
        row["stored_bytes"] += e.size
        if row["state"] in ("planned", "fenced", "blob-stored"):
            row["state"] = "blob-stored"
    elif isinstance(e, ManifestPublished):
        size = sum(x.size for x in e.writes) + sum(x.size for x in e.artifacts)
        row.update(state="manifest-published", manifest_rev=e.manifest_rev, live=True,
                   manifest_digest=e.digest, committed_bytes=size)
    elif isinstance(e, Acked):
        row["state"] = "acked"
    elif isinstance(e, Compensated):
        row.update(state="compensated", live=False, manifest_digest=None, committed_bytes=0)
        if e.rev:
            row["rev"] = e.rev
    elif isinstance(e, Rejected):
        row["state"] = "rejected"
    return row  # blob-pinned: only the bookkeeping above


@dataclass
class Model:
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[tuple[Any, ...], tuple[Any, int]] = field(default_factory=dict)
    seq: int = 0

    def append(self, events: list[Any], time_ns: int) -> tuple[Model, list[tuple[int, bool]]]:
        """The model after the batch and each event's (seq, deduped); raises Refused."""
        new = Model({k: dict(v) for k, v in self.steps.items()}, dict(self.keys), self.seq)
        out = []
        for e in events:
            key = model_key(e)
            if key in new.keys:
                original, seq = new.keys[key]
                if original != e:
                    raise Refused(IdempotencyConflict, "conflict")
                out.append((seq, True))
                continue
            if not isinstance(e, WorkspaceAdded):
                row = new.steps.get(e.step)
                why = model_refuses(row, e)
                if why is not None:
                    raise Refused(IllegalTransition, why)
                new.steps[e.step] = model_fold(row, e, new.seq + 1, time_ns)
            new.seq += 1
            new.keys[key] = (e, new.seq)
            out.append((new.seq, False))
        return new, out

    def rows(self) -> list[tuple[Any, ...]]:
        return sorted(tuple(int(r[c]) if c == "live" else r[c] for c in COLUMNS)
                      for r in self.steps.values())


# --- generating events -----------------------------------------------------------------

STEP_IDS = ("a", "b")
CONTENTS = (b"", b"x" * 10, b"y" * 250)  # the blobs the generated events may name
BLOBS = tuple(digest_of(c) for c in CONTENTS)
SIZE = {digest_of(c): len(c) for c in CONTENTS}
MANIFESTS = tuple(digest_of(f"manifest-{i}") for i in range(3))


KINDS = ("planned", "fenced", "blob-pinned", "blob-stored", "manifest-published", "acked",
         "compensated", "rejected", "workspace-added")
# What usually comes next, to steer the generator towards long legal runs. Only a bias:
# every kind stays possible in every state, and the model alone judges legality.
LIKELY_NEXT = {
    None: ("planned",),
    "planned": ("fenced", "blob-pinned", "blob-stored", "manifest-published", "rejected",
                "compensated"),
    "fenced": ("blob-pinned", "blob-stored", "manifest-published", "compensated"),
    "blob-stored": ("blob-stored", "manifest-published", "compensated"),
    "manifest-published": ("acked", "acked", "compensated", "manifest-published",
                           "manifest-published"),
    "acked": ("manifest-published", "manifest-published", "compensated", "blob-stored"),
    "compensated": ("planned",),
    "rejected": ("planned",),
}


def mostly(natural: Any, others: Sequence[Any]) -> st.SearchStrategy[Any]:
    """`natural` at least three times in four, else one of `others` (a single draw)."""
    return st.sampled_from([natural] * (3 * len(others)) + list(others))


# Envelope fields vary only to make redeliveries with another payload (conflicts).
# An epoch > 0 on a workspace needs a live lease (test_fences); here epochs vary only
# on steps without a workspace, where no lease is checked.
ENVELOPES = [dict(run=r, workspace=w, epoch=e)
             for r in ("", "run-1") for w, e in (("", 0), ("", 0), ("", 1), ("", 2),
                                                  ("ws", 0), ("ws", 0))]


@st.composite
def step_event(draw: st.DrawFn, model: Model) -> Any:
    step = draw(st.sampled_from(STEP_IDS))
    row = model.steps.get(step)
    now = row["state"] if row else None
    likely = LIKELY_NEXT[now]
    kind = draw(st.sampled_from(list(likely) * (3 * len(KINDS)) + list(KINDS) * len(likely)))
    if kind == "workspace-added":
        ws, root = draw(st.sampled_from([(w, r) for w in ("ws", "ws2") for r in ("/r1", "/r2")]))
        return WorkspaceAdded(workspace=ws, root=root)
    cur = row["attempt"] if row else 0
    natural = (cur + 1 if kind == "planned" else cur) or 1
    cur_rev = row["manifest_rev"] if row else -1
    live = row["manifest_digest"] if row and row["live"] else None
    common = dict(step=step, attempt=draw(mostly(natural, range(1, 5))),
                  **draw(st.sampled_from(ENVELOPES)))
    if kind == "planned":
        return Planned(**common, rev=draw(st.sampled_from([0, 3])))
    if kind in ("fenced", "compensated"):
        # workspace revisions have their own fold and tests (test_fences); here these
        # events carry no workspace so only the step lifecycle judges them
        common["workspace"] = ""
    if kind == "fenced":
        return Fenced(**common, rev=draw(st.sampled_from([0, 1, 7])))
    if kind == "blob-pinned":
        return BlobPinned(**common, digest=draw(st.sampled_from(BLOBS)))
    if kind == "blob-stored":
        digest = draw(st.sampled_from(BLOBS))
        return BlobStored(**common, digest=digest, size=SIZE[digest],
                          path=draw(st.sampled_from([None, "a.txt"])))
    if kind == "manifest-published":
        entries = [
            ManifestEntry(path=path, digest=digest, size=SIZE[digest])
            for path, digest in draw(st.lists(st.tuples(
                st.sampled_from(["a.txt", "b/c.txt"]), st.sampled_from(BLOBS)), max_size=2))
        ]
        mode = draw(st.sampled_from(
            ["natural", "natural", "create", "supersede", "supersede-wrong", "random"]))
        if mode == "natural":  # what a correct client sends
            expected, supersedes = (cur_rev, live) if live else (-1, None)
        elif mode == "create":  # a create, whether or not one is live
            expected, supersedes = -1, None
        elif mode == "supersede":  # a supersede, whether or not one is live
            expected = cur_rev
            supersedes = live or draw(st.sampled_from(MANIFESTS))
        elif mode == "supersede-wrong":  # the right revision, the wrong digest
            expected = cur_rev
            supersedes = draw(st.sampled_from([m for m in (None, *MANIFESTS) if m != live]))
        else:
            expected = draw(st.integers(-1, 2))
            supersedes = draw(st.sampled_from((None, live, *MANIFESTS)))
        return ManifestPublished(
            **common,
            manifest_rev=draw(mostly(cur_rev + 1, range(4))),
            expected_rev=expected,
            digest=draw(st.sampled_from(MANIFESTS)),
            supersedes=supersedes,
            artifacts=tuple(entries[:1]), writes=tuple(entries[1:]),
        )
    if kind == "acked":
        return Acked(**common, manifest_rev=draw(mostly(max(cur_rev, 0), range(4))))
    if kind == "compensated":
        return Compensated(**common, reason=draw(st.sampled_from(["", "undo"])),
                           rev=draw(st.sampled_from([0, 0, 9])))
    return Rejected(**common, reason=draw(st.sampled_from(["stale_rev", "pre_hash"])))


def draw_batch(data: st.DataObject, model: Model, n: int) -> list[Any]:
    """n events, each steered by the model as it would be if the ones before it landed."""
    events, scratch = [], model
    for _ in range(n):
        e = data.draw(step_event(scratch))
        events.append(e)
        try:
            scratch, _ = scratch.append([e], 0)
        except Refused:
            pass
    return events


@pytest.fixture(scope="module")
def blob_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One blob store holding CONTENTS, shared by every generated ledger (no fsyncs per example)."""
    root = tmp_path_factory.mktemp("shared") / "blobs"
    with Ledger.init(root.parent / "seed.db", clock=FakeClock(), blob_root=root) as led:
        for content in CONTENTS:
            led.blobs.put(content)
    return root


@pytest.mark.sqlite_only
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_inline_projection_equals_rebuild_and_model(blob_root: Path, data: st.DataObject) -> None:
    """Random legal and illegal step events, appended singly and in batches.

    After every append the ledger's answer (which refusal, which seqs, which dedupes)
    matches the model's, and the inline `steps` table equals the model; at the end a
    rebuild and a read agree with both, and verify finds nothing.
    """
    outcomes = {"ok": 0, IllegalTransition: 0, IdempotencyConflict: 0}
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        with Ledger.init(Path(tmp) / "l.db", clock=clock, synchronous="OFF",
                         blob_root=blob_root) as ledger:
            model = Model()
            for _ in range(data.draw(st.integers(4, 30), label="appends")):
                single = data.draw(st.integers(0, 2), label="single") > 0
                n = 1 if single else data.draw(st.integers(1, 4), label="batch size")
                events = draw_batch(data, model, n)
                head = ledger.head()
                try:
                    if single:
                        got = [ledger.append(events[0])]
                    else:
                        got = ledger.append_batch(events)
                except (IllegalTransition, IdempotencyConflict) as exc:
                    with pytest.raises(Refused) as predicted:
                        model.append(events, 0)
                    assert type(exc) is predicted.value.error
                    outcomes[type(exc)] += 1
                    hypothesis.event(f"refused: {predicted.value.why}")
                    assert ledger.head() == head
                else:
                    model, expected = model.append(events, clock.last)  # type: ignore[arg-type]
                    assert [(r.seq, r.deduped) for r in got] == expected
                    assert all(r.time_ns == clock.last for r in got if not r.deduped)
                    outcomes["ok"] += 1
                assert ledger.count() == model.seq
                assert table(ledger) == model.rows()  # the inline table, after every append
            assert as_rows(ledger.steps()) == model.rows()
            assert ledger.rebuild() == len(model.steps)
            assert table(ledger) == model.rows()
            assert proj.checkpoint(ledger._store.view) == proj.Checkpoint(model.seq, steps_mod.VERSION)
            assert ledger.verify().ok
    for outcome, count in outcomes.items():
        hypothesis.event(f"{getattr(outcome, '__name__', outcome)}: {min(count, 5)}+")
    # Steer the search towards deep histories (superseded manifests, later attempts).
    hypothesis.target(float(sum(r["manifest_rev"] + r["attempt"] for r in model.steps.values())),
                      label="depth")
    for row in model.steps.values():
        hypothesis.event(f"a step ended {row['state']}")
        hypothesis.event(f"a step reached attempt {min(row['attempt'], 3)}")
        hypothesis.event(f"a step reached manifest rev {min(row['manifest_rev'], 2)}")


# --- lagging projections ---------------------------------------------------------------


def _busy_ledger(path: Path) -> tuple[list[tuple[Any, ...]], int]:
    """A closed ledger with finished, open, retried and superseded steps."""
    with Ledger.init(path, clock=FakeClock()) as led:
        for i in range(5):
            led.append_batch(commit_events(f"done-{i}", ledger=led))
        led.append_batch([Planned(step="retried", attempt=1),
                          Compensated(step="retried", attempt=1, reason="x"),
                          Planned(step="retried", attempt=2),
                          stored(led, "retried", 2, b"retried")])
        led.append(Planned(step="open", attempt=1))
        first = commit_events("super", ledger=led)
        led.append_batch(first)
        led.append_batch(commit_events("super", ledger=led, manifest_rev=1, expected_rev=0,
                                       supersedes=first[2].digest, content=b"v2")[1:])
        rows, head = table(led), led.head().seq
    return rows, head


@pytest.mark.parametrize("lag", [
    pytest.param(("DELETE FROM steps", "UPDATE projection_checkpoint SET last_seq = 0"),
                 id="emptied"),
    pytest.param(("UPDATE projection_checkpoint SET version = 0",), id="old-version"),
    pytest.param(("DELETE FROM steps", "UPDATE projection_checkpoint SET version = 0"),
                 id="old-version-emptied"),
    pytest.param(("DELETE FROM projection_checkpoint", "DELETE FROM steps"), id="no-checkpoint"),
    pytest.param(("UPDATE projection_checkpoint SET last_seq = 3",), id="rows-ahead-of-checkpoint"),
])
@pytest.mark.sqlite_only
def test_lagging_projection_is_read_without_writing_then_caught_up(
    tmp_path: Path, ledger_at: LedgerAt, lag: tuple[str, ...]
) -> None:
    path = ledger_at(tmp_path / "ledger.db")
    expected, head = _busy_ledger(path)
    raw_sql(path, *lag)
    assert table_of(path) != (expected, (head, steps_mod.VERSION))  # it does lag
    before = snapshot_dir(tmp_path)
    with Ledger.open(path, readonly=True, clock=FakeClock()) as led:
        assert as_rows(led.steps()) == expected
        assert [s.step_id for s in led.steps()][:2] == ["done-0", "done-1"]  # first_seq order
        assert [s.step_id for s in led.steps(state="acked")] == [
            "done-0", "done-1", "done-2", "done-3", "done-4", "super"]
        assert led.step("retried").stored_bytes == 7  # the tail is never folded twice
        assert led.step("super").manifest_rev == 1
        report = led.verify()
        assert report.ok, report.findings
    assert lock_files_aside(snapshot_dir(tmp_path)) == before  # read-only: not a byte written
    with Ledger.open(path, clock=FakeClock()) as led:  # read-write: catches the tables up
        assert table(led) == expected
        assert proj.checkpoint(led._store.view) == proj.Checkpoint(head, steps_mod.VERSION)
        assert led.verify().projection_lag == 0
    assert table_of(path) == (expected, (FOLLOWS, steps_mod.VERSION))  # caught up: follows


@pytest.mark.sqlite_only
def test_partially_lagging_projection(tmp_path: Path, ledger_at: LedgerAt) -> None:
    """The tables hold the state of seq k (as an older version left them); the log is ahead."""
    path = ledger_at(tmp_path / "ledger.db")
    with Ledger.init(path, clock=FakeClock()) as led:
        led.append_batch(commit_events("early", ledger=led))
        led.append_batch([Planned(step="mid", attempt=1),
                          stored(led, "mid", 1, b"mid-1")])
        k, at_k = led.head().seq, table(led)
        led.append_batch(commit_events("mid", ledger=led)[1:])
        led.append(stored(led, "mid", 1, b"mid-22"))
        led.append(Compensated(step="early", attempt=1))
        led.append_batch(commit_events("late", ledger=led))
        expected, head = table(led), led.head().seq
    placeholders = ", ".join("?" * len(COLUMNS))

    def rewind(conn: apsw.Connection) -> None:
        conn.execute("DELETE FROM steps")
        conn.executemany(f"INSERT INTO steps VALUES ({placeholders})", at_k)
        conn.execute("UPDATE projection_checkpoint SET last_seq = ?", (k,))

    conn = apsw.Connection(str(path))
    with conn:
        rewind(conn)
    conn.close()
    before = snapshot_dir(tmp_path)
    with Ledger.open(path, readonly=True, clock=FakeClock()) as led:
        assert as_rows(led.steps()) == expected
        assert led.step("mid").stored_bytes == 5 + 6 + len(b"artifact of mid")
        assert led.step("early").state == "compensated"
        assert [s.step_id for s in led.steps(state="compensated")] == ["early"]
        assert [s.step_id for s in led.steps(state="planned")] == []
        assert led.verify().projection_lag == head - k
    assert lock_files_aside(snapshot_dir(tmp_path)) == before
    with Ledger.open(path, clock=FakeClock()):
        pass
    assert table_of(path) == (expected, (FOLLOWS, steps_mod.VERSION))  # caught up: follows


# --- rebuild ---------------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_rebuild_of_a_large_ledger(tmp_path: Path, ledger_at: LedgerAt) -> None:
    clock = FakeClock()
    with Ledger.init(ledger_at(tmp_path / "big.db"), clock=clock, synchronous="OFF") as led:
        batch: list[Any] = []
        for i in range(4_990):
            batch += commit_events(f"step-{i:05d}", content=b"x" * (i % 7), ledger=led)
            if len(batch) >= 4_000:
                led.append_batch(batch)
                batch = []
        for i in range(10):  # unfinished steps stay in the rebuild's working set
            batch += [Planned(step=f"open-{i}", attempt=1)]
        led.append_batch(batch)
        for i in range(30):  # a finished step re-opened later: looked up again
            led.append(Compensated(step=f"step-{i:05d}", attempt=1, reason="revert"))
        total = led.count()
        assert total == 4_990 * 4 + 40 and total >= 20_000
        before = table(led)
        calls: list[tuple[int, int]] = []
        assert led.rebuild(progress=lambda done, of: calls.append((done, of))) == 5_000
        assert table(led) == before
        assert calls[-1] == (total, total)
        assert all(of == total for _, of in calls)
        assert [d for d, _ in calls] == sorted(d for d, _ in calls)
        assert (10_000, total) in calls
        assert proj.checkpoint(led._store.view).last_seq == total
        assert led.step("step-00007").state == "compensated"


@pytest.mark.sqlite_only
@pytest.mark.parametrize("working_set", [1, 2, 5])
def test_rebuild_with_a_small_working_set(ledger: Ledger, monkeypatch, working_set: int) -> None:
    """Evicting unfinished steps mid-rebuild must not lose or double-count anything."""
    steps = [f"s{i}" for i in range(8)]
    for s in steps:
        ledger.append(Planned(step=s, attempt=1))
    for s in steps:
        ledger.append(stored(ledger, s, 1, s.encode() + b"-"))
    for s in steps[::2]:
        ledger.append_batch(commit_events(s, ledger=ledger)[1:])
        ledger.append(Compensated(step=s, attempt=1))
        ledger.append(Planned(step=s, attempt=2))
    for s in steps[1::2]:
        ledger.append(stored(ledger, s, 1, s.encode() + b"-2-"))
    before = table(ledger)
    monkeypatch.setattr(proj, "WORKING_SET_MAX", working_set)
    assert ledger.rebuild() == len(steps)
    assert table(ledger) == before
    assert ledger.step("s1").stored_bytes == len(b"s1-") + len(b"s1-2-")


@pytest.mark.sqlite_only
def test_rebuild_of_an_empty_ledger(ledger: Ledger) -> None:
    calls: list[tuple[int, int]] = []
    assert ledger.rebuild(progress=lambda d, t: calls.append((d, t))) == 0
    assert calls == [(0, 0)]
    assert table(ledger) == []


@pytest.mark.sqlite_only
def test_rebuild_repairs_an_edited_projection(ledger: Ledger, tmp_path: Path) -> None:
    ledger.append_batch(commit_events("s", ledger=ledger) + [Planned(step="t", attempt=1)])
    good = table(ledger)
    ledger.close()
    raw_sql(ledger.path, "UPDATE steps SET state = 'acked', live = 1 WHERE step_id = 't'",
            "DELETE FROM steps WHERE step_id = 's'")
    with Ledger.open(ledger.path, clock=FakeClock()) as led:
        assert not led.verify().ok
        assert table(led) != good
        led.rebuild()
        assert table(led) == good
        assert led.verify().ok


@pytest.mark.sqlite_only
def test_catch_up_refolds_pins_and_manifests(tmp_path, ledger_at) -> None:
    """A lagging checkpoint makes the next read-write open refold the tail into the ref
    tables too (pins taken and released, manifests published), even over rows that are
    already there, and the result equals a fresh rebuild."""
    import apsw

    from ledger import Ledger
    from ledger.runner import run_step

    path = ledger_at(tmp_path / "lag.db")
    with Ledger.init(path) as lg:
        run_step(lg, "done", {"a": b"first"})
        mark = lg.head().seq
        run_step(lg, "later", {"b": b"second"})
        row = lg.plan("open", artifacts=["c"])
        lg.store("open", row.attempt, "c", b"third")  # pinned, not released
    raw = apsw.Connection(str(path))
    # pretend everything after `mark` was never folded; the "done" rows stay (ahead)
    raw.execute("DELETE FROM pins; DELETE FROM manifests WHERE step != 'done';"
                " DELETE FROM manifest_entries WHERE step != 'done';"
                " DELETE FROM steps WHERE step_id != 'done'")
    raw.execute("UPDATE projection_checkpoint SET last_seq = ?", (mark - 3,))
    raw.close()
    with Ledger.open(path) as lg:
        report = lg.verify()
        assert report.ok and report.projection_lag == 0, report.findings
        pins = [(b["digest"] is not None, b["pinned"]) for b in lg.blob_list()]
        assert pins.count((True, True)) == 1  # only the open attempt's blob is pinned
        assert lg.manifest("later") is not None and lg.step("open").state == "blob-stored"


# --- fold-only decoding (projections.lite) ---------------------------------------------


def _edit_payload(path: Path | str, seq: int, payload: bytes) -> None:
    """Rewrite one event's payload behind the ledger's back (its triggers dropped)."""
    conn = apsw.Connection(str(path))
    try:
        triggers = conn.execute(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND tbl_name = 'events'"
        ).fetchall()
        with conn:
            for name, _ in triggers:
                conn.execute(f'DROP TRIGGER "{name}"')
            conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (payload, seq))
            for _, sql in triggers:
                conn.execute(sql)
    finally:
        conn.close()


@pytest.mark.parametrize("payload", [
    # the step's own blob-stored payload under the row's kind `acked`: a blob-stored may
    # follow a publish, so only the check of the payload's kind against the row's
    # catches it (without it the fold would count the bytes twice, silently)
    None,
    # a planned event's payload under the row's kind `acked`
    b'{"kind":"planned","step":"s","attempt":1,"run":"","workspace":"","epoch":0}',
    # the right kind, a field of the wrong type
    b'{"kind":"acked","step":"s","attempt":"one","run":"","workspace":"","epoch":0,'
    b'"manifest_rev":0}',
    b'not json',
])
@pytest.mark.sqlite_only
def test_rebuild_refuses_a_payload_the_fold_cannot_read(
        tmp_path: Path, ledger_at: LedgerAt, payload: bytes | None) -> None:
    """The slim decoder of the hot kinds still refuses a payload of another kind than its
    row, or of the wrong types: rebuild raises CorruptLedger and writes nothing."""
    path = ledger_at(tmp_path / "l.db")
    with Ledger.init(path, clock=FakeClock()) as led:
        led.append_batch(commit_events("s", ledger=led))
        acked = next(r.seq for r in led.read(kind="acked"))
        if payload is None:
            payload = msgspec.json.encode(next(r.event for r in led.read(kind="blob-stored")))
        before = table(led)
    _edit_payload(path, acked, payload)
    with Ledger.open(path, clock=FakeClock()) as led:
        with pytest.raises(CorruptLedger, match=f"event #{acked}"):
            led.rebuild()
        assert table(led) == before
        assert not led.verify().ok


@pytest.mark.sqlite_only
def test_rebuild_skips_constraints_verify_still_checks_them(
        tmp_path: Path, ledger_at: LedgerAt) -> None:
    """Fold-only decoding reads the hot kinds without their field constraints (they were
    checked at append); an edited payload that breaks one (an upper-case digest) is
    folded by rebuild, and verify — the full decoder and the hash chain — reports it."""
    path = ledger_at(tmp_path / "l.db")
    with Ledger.init(path, clock=FakeClock()) as led:
        led.append_batch(commit_events("s", ledger=led))
        rec = next(r for r in led.read(kind="manifest-published"))
    edited = msgspec.json.encode(rec.event).replace(
        rec.event.digest.encode(), rec.event.digest.upper().encode())
    _edit_payload(path, rec.seq, edited)
    with Ledger.open(path, clock=FakeClock()) as led:
        led.rebuild()
        assert led.step("s").manifest_digest == rec.event.digest.upper()
        report = led.verify()
        assert not report.ok
        assert any(f.seq == rec.seq for f in report.findings), report.findings


#: The tests that take `ledger_at` (or `ledger`, `ledger_location`) run on SQLite and on
#: PostgreSQL (tests/conftest.py).
BOTH_STORES = True
