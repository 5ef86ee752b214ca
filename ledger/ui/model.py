"""What the UI reads, and how: every page's data from the public API of a ledger opened
read-only, in bounded work.

- `Pool`: read-only `Ledger`s, one per request at a time (a `Ledger` is not shared
  between threads), opened on demand and kept for the next request.
- `Job`: a figure too slow for a request on a large ledger (verify, stats with its
  audit), computed in a child process on a `Ledger` of its own; a page shows
  "verifying…" / "computing…" until it is done. Verify runs once, at start; the stats
  again when the head moved and they are older than `STATS_REFRESH_S`.
- Scans (a run's or a workspace's timeline, a path's history, a workspace as of a
  step) read one kind of event at a time through `Ledger.read(after_seq, kind=...)`,
  in bounded batches, keep only what the page shows, and stop after `SCAN_BUDGET_S`
  with a link to go on: memory follows the page, never the log.
"""

from __future__ import annotations

import contextlib
import heapq
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ledger.errors import BlobCorrupt, BlobNotFound

from . import text

if TYPE_CHECKING:
    from ledger import Ledger, RecordedEvent

#: How many idle read-only ledgers the pool keeps.
POOL_IDLE: Final = 4
#: The stats are recomputed at most this often (and only when the head moved).
STATS_REFRESH_S: Final = 15.0
#: A scan stops after this long and offers to go on from where it stopped.
SCAN_BUDGET_S: Final = 2.0
#: Steps waiting for a command: in flight, or committed and not acked.
IN_FLIGHT: Final = ("planned", "fenced", "blob-stored", "compensating")
UNACKED: Final = "manifest-published"
#: Every step state, as the projection names them (a copy: the UI sees the public API
#: only; tests/cli/test_cli_fast.py holds it equal to the library's).
STATES: Final = ("planned", "fenced", "blob-stored", "manifest-published", "acked",
                 "compensating", "compensated", "rejected", "sealed")


def open_readonly(location: str, immutable: bool = False) -> Ledger:
    """The ledger at `location`, read-only: it never writes the ledger nor takes its
    write lock. Forensic (a ledger verify would fail still opens, so the UI can name
    the findings) and without the witness check (reported, not refused). `immutable`:
    SQLite's immutable read, nothing created beside the file (`Ledger.open`)."""
    from ledger import Ledger

    return Ledger.open(location, readonly=True, forensic=True, witness_check=False,
                       immutable=immutable)


class Pool:
    """Read-only ledgers, each used by one request at a time."""

    def __init__(self, location: str, opener: Callable[[str], Ledger] | None = None, *,
                 immutable: bool = False) -> None:
        self.location = location
        self.immutable = immutable
        self._opener = opener or (lambda where: open_readonly(where, immutable))
        self._idle: queue.SimpleQueue[Ledger] = queue.SimpleQueue()
        self._closed = False

    @contextlib.contextmanager
    def ledger(self) -> Iterator[Ledger]:
        try:
            led = self._idle.get_nowait()
        except queue.Empty:
            led = self._opener(self.location)
        try:
            yield led
        except BaseException:
            led.close()  # whatever went wrong, the next request opens afresh
            raise
        if self._closed or self._idle.qsize() >= POOL_IDLE:
            led.close()
        else:
            self._idle.put(led)

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


def child_main() -> None:
    """A job's body in its own interpreter (`Job._work` starts it): reads (job name,
    location) pickled from stdin, opens the ledger read-only, runs the job and writes
    ("ok", result) or ("failed", one line) pickled to stdout."""
    import pickle
    import sys

    name, location, immutable = pickle.load(sys.stdin.buffer)
    try:
        led = open_readonly(location, immutable)
        try:
            out: tuple[str, Any] = ("ok", JOBS[name](led))
        finally:
            led.close()
    except Exception as exc:  # noqa: BLE001 - shown on the page, one line
        out = ("failed", f"{type(exc).__name__}: {exc}")
    pickle.dump(out, sys.stdout.buffer)
    sys.stdout.buffer.flush()


@dataclass
class Job:
    """A computation over the whole ledger — verify, the stats — in a child process (its
    own interpreter, so a minute of verify never holds the server's GIL while pages are
    asked for), waited for by a background thread: its state and result. `stop` ends
    the child with the server. The location goes to it through a pipe, never its command
    line (a PostgreSQL URL may carry a password)."""

    name: str
    run: Callable[[Ledger], Any]
    state: str = "idle"  # idle, running, done, failed
    result: Any = None
    error: str = ""
    started: float = 0.0
    finished: float = 0.0
    head_seq: int = -1
    lock: threading.Lock = field(default_factory=threading.Lock)
    process: Any = None

    def stop(self) -> None:
        """End a running child (the server is stopping)."""
        with self.lock:
            child = self.process
        if child is not None and child.poll() is None:
            child.kill()

    def start(self, pool: Pool, head_seq: int) -> bool:
        with self.lock:
            if self.state == "running":
                return False
            self.state, self.started, self.head_seq = "running", time.time(), head_seq
        threading.Thread(target=self._work, args=(pool,), name=f"steptrail-ui-{self.name}",
                         daemon=True).start()
        return True

    def _work(self, pool: Pool) -> None:
        import os
        import pickle
        import subprocess
        import sys

        import ledger

        # A fresh interpreter running `child_main` (not multiprocessing's spawn, which
        # re-imports the parent's __main__: a server started from a notebook or stdin
        # would break it); it finds this same `ledger` package first on its path.
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(ledger.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:
            child = subprocess.Popen(
                # -P: not the current directory first on its path — `steptrail ui` is run
                # inside workspaces agents write, and a planted ledger/ or pickle.py there
                # would be imported by the child
                [sys.executable, "-P", "-c",
                 "from ledger.ui.model import child_main; child_main()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            with self.lock:
                self.process = child
            out, err = child.communicate(pickle.dumps((self.name, pool.location,
                                                       pool.immutable)))
            if child.returncode == 0 and out:
                state, value = pickle.loads(out)  # our own child's answer
            else:
                last = (err.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
                state, value = "failed", (f"the {self.name} process ended (exit code"
                                          f" {child.returncode}){': ' + last if last else ''}")
        except Exception as exc:  # noqa: BLE001 - shown on the page, one line
            state, value = "failed", f"{type(exc).__name__}: {exc}"
        if state == "ok":
            self._end("done", value, "")
        else:
            self._end("failed", None, value)

    def _end(self, state: str, result: Any, error: str) -> None:
        with self.lock:
            if state == "done" or self.result is None:
                self.result = result
            self.state, self.error, self.finished = state, error, time.time()

    def seconds(self) -> float:
        return (self.finished or time.time()) - self.started if self.started else 0.0


def _verify(led: Ledger) -> dict[str, Any]:
    report = led.verify()
    return {"ok": report.ok, "events": report.events, "head_seq": report.head_seq,
            "findings": [(f.check, f.seq, f.message) for f in report.findings],
            "warnings": [str(w) for w in getattr(report, "warnings", [])]}


def _stats(led: Ledger) -> dict[str, Any]:
    from ledger.stats import stats

    from ledger.attention import attention

    # by hour: a night's ledger is one or two days, where daily bars say nothing; the
    # charts add the hours up into days for a longer one
    report = stats(led, by="hour", top=0)  # every run: the runs page lists them
    gc = last_collection(led)
    # what needs a person (one definition with status and MCP): computed here, in the
    # background with the stats, so the overview stays one page of reads
    items = attention(led, limit=2**62)
    return {"report": report, "gc": gc, "attention": items[:2000],
            "attention_open": sum(1 for i in items if not i.resolved)}


def last_collection(led: Ledger) -> dict[str, Any]:
    """The last garbage collection the ledger recorded (`blob-collected` events)."""
    last: dict[str, Any] | None = None
    blobs = nbytes = 0
    for r in led.read(kind="blob-collected"):
        ev: Any = r.event
        blobs, nbytes = blobs + 1, nbytes + ev.size
        if last is None or last["collection"] != ev.collection:
            last = {"collection": ev.collection, "blobs": 0, "bytes": 0}
        last.update(time_ns=r.time_ns, seq=r.seq)
        last["blobs"] += 1
        last["bytes"] += ev.size
    return {"last": last, "blobs": blobs, "bytes": nbytes}


#: The jobs a child runs, by name (`child_main`).
JOBS: Final[dict[str, Callable[[Ledger], Any]]] = {"verify": _verify, "stats": _stats}


class Jobs:
    """The background figures of one served ledger."""

    def __init__(self, pool: Pool, *, verify: bool = True) -> None:
        self.pool = pool
        self.verify = Job("verify", _verify)
        self.stats = Job("stats", _stats)
        self._verify_on = verify

    def stop(self) -> None:
        """End the running children (the server is stopping)."""
        self.verify.stop()
        self.stats.stop()

    def start(self, head_seq: int) -> None:
        if self._verify_on:
            self.verify.start(self.pool, head_seq)
        self.stats.start(self.pool, head_seq)

    def refresh(self, head_seq: int) -> None:
        """Recompute the stats if the head moved since and they are not fresh."""
        s = self.stats
        # at most every STATS_REFRESH_S, and never more than a fifth of the time: on a
        # large ledger a pass takes seconds of the process's time
        wait = max(STATS_REFRESH_S, 4 * s.seconds())
        if (s.state in ("done", "failed") and s.head_seq != head_seq
                and time.time() - s.finished > wait):
            s.start(self.pool, head_seq)


# -- reading blobs -----------------------------------------------------------------------


@dataclass
class Content:
    """A blob's bytes as a page shows them: `data` (None when not shown: `why`)."""

    digest: str | None
    data: bytes | None
    size: int | None
    why: str = ""


def read_content(led: Ledger, digest: str | None, *, limit: int = text.TEXT_MAX,
                 size: int | None = None) -> Content:
    """The bytes of blob `digest` (None: the file was absent), read up to `limit`."""
    if digest is None:
        return Content(None, None, None, "absent")
    if size is not None and size > limit:
        return Content(digest, None, size, f"larger than {limit:,} bytes")
    got: list[bytes] = []
    n = 0
    try:
        chunks = led.blob_chunks(digest)
        try:
            for piece in chunks:
                got.append(piece)
                n += len(piece)
                if n > limit:
                    return Content(digest, None, None, f"larger than {limit:,} bytes")
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
    except BlobNotFound:
        return Content(digest, None, size, "not in the ledger (never stored, or collected)")
    except BlobCorrupt as exc:
        return Content(digest, None, size, f"CORRUPT: {exc}")
    return Content(digest, b"".join(got), n)


# -- scans ------------------------------------------------------------------------------


@dataclass
class Scan:
    """What a bounded scan found: `items` and where it stopped (`next_after`: go on
    after this seq; None: it reached the head)."""

    items: list[Any]
    next_after: int | None
    scanned_to: int
    complete: bool


def read_page(led: Ledger, kind: str, *, after: int, want: int, **filters: str) -> Scan:
    """One page of `kind` events after seq `after` matching `filters` (`run`,
    `workspace`: the store filters them, a run's through its index): no scan budget."""
    items = list(led.read(after, kind=kind, limit=want + 1, **filters))
    more = len(items) > want
    items = items[:want]
    last = items[-1].seq if items else after
    return Scan(items, last if more else None, last, not more)


def _window(led: Ledger, kinds: tuple[str, ...], match: Callable[[RecordedEvent], Any],
            lo: int, hi: int, filters: dict[str, str]) -> list[tuple[int, Any]]:
    """(seq, item) for each event of `kinds` in (lo, hi] that `match` keeps, per kind in
    seq order (the caller sorts the kinds together); each read closed when left early."""
    found: list[tuple[int, Any]] = []
    for kind in kinds:
        events = led.read(lo, kind=kind, **filters)
        try:
            for r in events:
                if r.seq > hi:
                    break
                got = match(r)
                if got is not None:
                    found.append((r.seq, got))
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
    return found


def scan_forward(led: Ledger, kinds: tuple[str, ...], match: Callable[[RecordedEvent], Any],
                 *, after: int, want: int, until: int | None = None,
                 budget_s: float = SCAN_BUDGET_S, **filters: str) -> Scan:
    """Events of `kinds` after seq `after` (up to `until`), in seq order, that `match`
    (it returns the item to keep, or None): at most `want`, within `budget_s`. `filters`
    (`run`, `workspace`) go to the store, so rows that cannot match are not decoded."""
    head = led.head().seq if until is None else until
    deadline = time.monotonic() + budget_s
    items: list[Any] = []
    lo = after
    window = 8192
    while lo < head:
        hi = min(head, lo + window)
        found = _window(led, kinds, match, lo, hi, filters)
        found.sort(key=lambda x: x[0])
        for seq, got in found:
            items.append(got)
            if len(items) >= want:
                return Scan(items, seq, seq, False)
        lo = hi
        window = min(window * 4, 1 << 16)
        if lo < head and time.monotonic() > deadline:
            return Scan(items, lo, lo, False)
    return Scan(items, None, head, True)


def scan_backward(led: Ledger, kinds: tuple[str, ...], match: Callable[[RecordedEvent], Any],
                  *, before: int | None, want: int, budget_s: float = SCAN_BUDGET_S,
                  **filters: str) -> Scan:
    """Events of `kinds` before seq `before` (None: the head), newest first, that
    `match`: at most `want`, scanning back in growing windows within `budget_s`."""
    hi = led.head().seq if before is None else before - 1
    deadline = time.monotonic() + budget_s
    items: list[Any] = []
    window = 4096
    while hi > 0:
        lo = max(0, hi - window)
        found = _window(led, kinds, match, lo, hi, filters)
        found.sort(key=lambda x: -x[0])
        for seq, got in found:
            items.append(got)
            if len(items) >= want:
                return Scan(items, seq, seq, seq <= 1)
        hi = lo
        window = min(window * 4, 1 << 16)
        if hi > 0 and time.monotonic() > deadline:
            return Scan(items, hi + 1, hi + 1, False)
    return Scan(items, None, 0, True)


class Holders:
    """Who held each (workspace, epoch): read from `lease-acquired` events once, then
    only the new ones (memory follows the number of epochs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = 0
        self._holders: dict[tuple[str, int], str] = {}

    def get(self, led: Ledger, workspace: str, epoch: int) -> str | None:
        if not epoch:
            return None
        key = (workspace, epoch)
        with self._lock:
            if key not in self._holders:
                self._catch_up(led)
            return self._holders.get(key)

    def _catch_up(self, led: Ledger) -> None:
        head = led.head().seq
        for r in led.read(self._seen, kind="lease-acquired"):
            ev: Any = r.event
            self._holders[(ev.workspace, ev.epoch)] = ev.holder
            self._seen = r.seq
        self._seen = max(self._seen, head)


def first_of(led: Ledger, kind: str, **filters: Any) -> RecordedEvent | None:
    """The first event of `kind` matching `filters` (`step`: the step index), or None;
    the read closed at once."""
    events = led.read(kind=kind, limit=1, **filters)
    try:
        return next(iter(events), None)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


def holds_covering(led: Ledger, *, run: str = "", step: str = "") -> list[Any]:
    """The holds in force (`Ledger.holds`, oldest first) a page covers: a step's page
    (`step`, and `run` its run) its own hold and its run's; a run's page (`run` only) the
    run's hold and those of its steps. Few: a person places them."""
    out = []
    for h in led.holds():
        if h.scope == "run":
            hit = bool(run) and h.target == run
        elif step:
            hit = h.target == step
        else:
            row = led.find_step(h.target) if run else None
            hit = row is not None and row.run == run
        if hit:
            out.append(h)
    return out


@dataclass(frozen=True)
class Origin:
    """Where a fork came from: workspace `fork` was forked from `source` as of seq `seq`
    (its baseline observation, `observed_seq`, asked by ``fork:<source>@<seq>``, says
    so; `label` is that observation's)."""

    fork: str
    source: str
    seq: int
    label: str
    observed_seq: int


def origin_of(workspace: str, by: str, label: str, observed_seq: int) -> Origin | None:
    """The fork's origin its baseline observation names (`by` ``fork:<source>@<seq>``),
    or None when it names none. `by` is cut at 255 characters when recorded: a seq the
    cut shortened is read whole from the label (``... (#<seq>)`` or ``... as of #<seq>``),
    whose digits it begins."""
    if not by.startswith("fork:"):
        return None
    source, at, digits = by[len("fork:"):].rpartition("@")
    if not (source and at and digits.isascii() and digits.isdigit() and len(digits) <= 19):
        return None
    whole = re.search(r"(?:\(#|as of #)([0-9]{1,19})\)?$", label)
    seq = whole.group(1) if whole and whole.group(1).startswith(digits) else digits
    return Origin(workspace, source, int(seq), label, observed_seq)


def step_at(led: Ledger, origin: Origin | None) -> str | None:
    """The step whose writes are the fork's origin: the step of the origin's `fenced`
    event at its seq (a fork as of a step is as of that step's latest `fenced`); None for
    a fork as of a seq that is no apply of the source workspace."""
    if origin is None or origin.seq < 1:
        return None
    events = led.read(origin.seq - 1, limit=1)
    try:
        r = next(iter(events), None)
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
    if r is None or r.seq != origin.seq or r.kind != "fenced" \
            or getattr(r.event, "workspace", None) != origin.source:
        return None
    return str(r.event.step)


class Lineage:
    """Which workspace is a fork of which (docs/time-travel.md "Fork"): each
    workspace's first observation (its baseline) read once from the `observed` events,
    then only the new ones — memory follows the number of workspaces, never the
    observations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = 0
        self._baselined: set[str] = set()
        self._origins: dict[str, Origin] = {}
        self._forks: dict[str, list[Origin]] = {}

    def origin(self, led: Ledger, workspace: str) -> Origin | None:
        """Where `workspace` was forked from (None: it is no fork)."""
        with self._lock:
            self._catch_up(led)
            return self._origins.get(workspace)

    def forks(self, led: Ledger, workspace: str) -> list[Origin]:
        """The forks of `workspace`, oldest first."""
        with self._lock:
            self._catch_up(led)
            return list(self._forks.get(workspace, ()))

    def _catch_up(self, led: Ledger) -> None:
        head = led.head().seq
        events = led.read(self._seen, kind="observed")
        try:
            for r in events:
                ev: Any = r.event
                self._seen = r.seq
                if ev.workspace in self._baselined:
                    continue
                self._baselined.add(ev.workspace)
                got = origin_of(ev.workspace, ev.by, ev.label, r.seq)
                if got is not None:
                    self._origins[ev.workspace] = got
                    self._forks.setdefault(got.source, []).append(got)
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        self._seen = max(self._seen, head)


@dataclass
class Tree:
    """What `workspace_as_of` folded: `paths` (path -> (rev, digest (None: deleted),
    the seq that wrote it, the step)) from the writes after seq `after` up to
    `scanned_to`; `complete` when that reached the seq asked for."""

    paths: dict[str, tuple[int, str | None, int, str]]
    after: int
    scanned_to: int
    complete: bool


def workspace_as_of(led: Ledger, workspace: str, seq: int, *, after: int = 0,
                    budget_s: float | None = None) -> Tree:
    """What each path of workspace `workspace` held after the writes of events
    (`after`, `seq`]: folded from the writes that change a file — applies (`fenced`),
    undos (`compensated`) and a refused apply's undo (`rejected`'s `undone`) — within
    `budget_s` (None: `SCAN_BUDGET_S`, read when called).

    One pass: the three kinds' events of the workspace (the store filters them), each
    read once in bounded batches, merged in seq order; the clock is looked at after
    each event, so where it stops every write up to `scanned_to` was folded and none
    after. With `after` 0 and `complete`, the workspace as of `seq`; stopped early, the
    workspace as of `scanned_to`, and going on ``after=scanned_to`` gives the paths
    written since. Memory follows the workspace's paths, time the budget."""
    deadline = time.monotonic() + (SCAN_BUDGET_S if budget_s is None else budget_s)
    paths: dict[str, tuple[int, str | None, int, str]] = {}
    streams = [led.read(after, kind=kind, workspace=workspace)
               for kind in ("fenced", "compensated", "rejected")]
    scanned_to, complete = after, True
    try:
        for r in heapq.merge(*streams, key=lambda r: r.seq):
            if r.seq > seq:
                break
            ev: Any = r.event
            if ev.workspace == workspace:
                if r.kind == "fenced":
                    changes = [(w.path, w.rev, w.post_hash) for w in ev.writes]
                else:
                    changes = [(x.path, x.rev, x.digest) for x in
                               (ev.restored if r.kind == "compensated" else ev.undone)
                               if x.outcome != "conflict"]
                for path, rev, digest in changes:  # in seq order: the latest write wins
                    paths[path] = (rev, digest, r.seq, ev.step)
            scanned_to = r.seq
            if scanned_to < seq and time.monotonic() > deadline:
                complete = False
                break
    finally:
        for events in streams:
            close = getattr(events, "close", None)
            if close is not None:
                close()
    return Tree(paths, after, seq if complete else scanned_to, complete)


__all__ = ["Content", "Holders", "IN_FLIGHT", "Job", "Jobs", "Lineage", "Origin", "Pool", "Scan",
           "Tree", "UNACKED", "first_of", "holds_covering", "open_readonly", "origin_of",
           "read_content", "scan_backward", "scan_forward", "step_at", "workspace_as_of"]
