"""Hostile inputs: every bad input gets a typed error naming the problem, and writes nothing.

The issue's corpus, run in CI (docs/design.md "Bad input"):
artifact and workspace paths with ``..``, absolute paths, NUL and control bytes;
symlinks in the workspace and at every level of the blob store; digests of the wrong
length, case or alphabet; a planted blob with the right name and the wrong bytes; foreign
SQLite files with planted triggers and views; hundreds of seeded byte-level mutants of a
real ledger file; oversized payloads and step ids; malformed JSON to every JSON-reading
input (`step plan FILE|-`, `step publish --receipt FILE|-`); a witnessed ledger whose
whole directory (blob store included) is rolled back under an intact witness, or whose
witness is deleted, emptied or zero-filled (section 12).

Every case goes through the library and through the CLI (in-process, `CliRunner`). A
refused call must raise a `LedgerError` (the CLI: exit 2, or 1 where the protocol says
no, one `steptrail: error:` line, never a traceback), and every file under the test's
root — ledger, ``-wal``/``-shm``, blob store, workspace, the "outside" directory symlinks
point to — must be identical afterwards: path, kind, mode, size, mtime, sha256, symlink
target (`tree`).

Mutants run in worker processes (fresh interpreters, one per CPU, at most 4), each mutant
under its own `alarm()`, so a hang or a crash inside SQLite's C code kills only a worker and
is reported (the next worker resumes after it).
Default: 300 mutants (seeded, reproducible: `mutate`); STEPTRAIL_HOSTILE_FULL=1 runs 5,000.
The run prints the mutant table and "hostile inputs tried: N (per category)"; N counts every
(hostile input, entry point) call, each mutant once per surface probed.

The defects this corpus found are kept in section 11 as regression tests (each was a
strict xfail until its fix in ledger/).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import apsw
import pytest
from click.testing import CliRunner, Result
from conftest import CLEAN_ENV, FakeClock, damage_witness, error_output_problem, tamper

import ledger as ledger_pkg
from ledger import (
    BlobPinned,
    BlobStored,
    CorruptLedger,
    InvalidInput,
    Ledger,
    LedgerError,
    ManifestEntry,
    ManifestPublished,
    PathEscapes,
    Planned,
    StaleEpoch,
)
from ledger.store.sqlite import database as dbmod
from ledger.workspace import places as places_mod
from ledger.cli import cli
from ledger.errors import BlobCorrupt, BlobNotFound
from ledger.step.values import TTL_MAX_S, Write
from ledger.runner import run_step
from ledger.witness import AnchorRefused, WitnessMismatch, WitnessMissing

FULL = os.environ.get("STEPTRAIL_HOSTILE_FULL") == "1"
MUTANTS = 5_000 if FULL else 300
MUTANT_SEED0 = 20_240_601
MUTANT_TIMEOUT_S = 10
HANG_TIMEOUT_S = 2
LEDGER_DIR = os.path.dirname(os.path.abspath(ledger_pkg.__file__)) + os.sep

#: hostile inputs tried, per category (every library call or CLI run counts once)
TALLY: collections.Counter[str] = collections.Counter()


def tried(category: str, n: int = 1) -> None:
    TALLY[category] += n


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> Iterator[None]:
    start = time.perf_counter()
    yield
    total = sum(v for k, v in TALLY.items() if k != "ledger-file mutants")
    parts = ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items()))
    line = (f"hostile inputs tried: {total} ({parts}) in {time.perf_counter() - start:.1f}s"
            f"{' [FULL]' if FULL else ''}")
    report_line(request, line)


def report_line(request: pytest.FixtureRequest, line: str) -> None:
    """Write a line to the terminal, past output capture (shown without -s too)."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:  # pragma: no cover
        print(line)
        return
    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
        reporter.write("\n")
        reporter.write_line(line)


# --- helpers: file trees, deadlines, CLI checks --------------------------------------------


def sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry below `root`: kind, mode, size, mtime and sha256 (files), target (links).

    Symlinks are recorded, never followed. Directory mtimes are left out (a temporary file
    created and removed again is not a change), and so are SQLite's lock files, a regular
    ``-shm`` (the shared-memory index: even a read updates it) and an empty ``-wal``: any
    open of an accepted ledger, read-only ones included, creates them and the last
    writer's close removes them. A refused file's are checked by the mutant sweep."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode) and (name.endswith("-shm") or (
                    name.endswith("-wal") and st.st_size == 0)):
                continue
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode)
            else:
                out[rel] = ("other", st.st_mode)
    return out


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    for k in sorted(before.keys() | after.keys()):
        a, b = before.get(k), after.get(k)
        if a != b:
            out.append(f"{k}: {'created' if a is None else 'removed' if b is None else 'changed'}")
    return out


class Hang(BaseException):
    """Raised by `deadline` (a BaseException: neither click nor CliRunner swallows it)."""


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Interrupt a call blocked in a syscall (a FIFO open, a read) after `seconds`."""

    def ring(signum: int, frame: Any) -> None:
        raise Hang(f"still blocked after {seconds}s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def where(exc: BaseException) -> str:
    """The innermost frame of the ledger package an exception passed through."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(LEDGER_DIR)]
    if not frames:
        return "?"
    f = frames[-1]
    return f"ledger/{f.filename[len(LEDGER_DIR):]}:{f.name}"


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """Call fn(*args, **kwargs): 'ok', 'typed:<LedgerError subclass>' or
    'UNTYPED:<type>@<where>' (any other exception)."""
    try:
        fn(*args, **kwargs)
    except LedgerError as exc:
        return f"typed:{type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001 — what the corpus looks for
        return f"UNTYPED:{type(exc).__name__}@{where(exc)}"
    return "ok"


def invoke(db: Path | str, *args: str, input: bytes | str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--ledger", str(db), *args], input=input, env=CLEAN_ENV)


def cli_problem(r: Result, codes: tuple[int, ...]) -> str | None:
    """What is wrong with a CLI run (None: a clean answer with one of `codes`)."""
    exc = r.exception
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(exc))
        return f"untyped {type(exc).__name__} @ {where(exc)} (a traceback for the user):\n{tb[-1500:]}"
    text = r.stdout + r.stderr
    if "Traceback" in text:
        return f"traceback in the output:\n{text[-1500:]}"
    if r.exit_code not in codes:
        return f"exit {r.exit_code}, expected {codes}; stderr: {r.stderr[-500:]!r}"
    if r.stderr.startswith("steptrail: error:") and r.stderr.count("\n") != 1:
        return f"the error is not one line: {r.stderr!r}"
    if r.exit_code in (2, 3):  # click's own usage errors too: one line, UsageError
        if not r.stderr.startswith("steptrail: error:"):
            return f"exit {r.exit_code} without a 'steptrail: error:' line: {r.stderr!r}"
        problem = error_output_problem(r.exit_code, r.stdout, r.stderr)
        if problem is not None:
            return problem
    return None


def run_cli(db: Path | str, *args: str, codes: tuple[int, ...] = (2,), input: bytes | str | None = None,
            match: str | None = None, category: str | None = None, tag: str = "") -> Result:
    if category is not None:  # (a BUG test counts its inputs itself)
        tried(category)
    r = invoke(db, *args, input=input)
    problem = cli_problem(r, codes)
    assert problem is None, f"{tag}steptrail {' '.join(map(repr, args))[:200]}: {problem}"
    if match is not None:
        assert match in r.stderr + r.stdout, (args, match, r.stderr)
    return r


_ids = itertools.count()


def uid(prefix: str) -> str:
    """A fresh step id (a retried admission of a known step is not re-validated)."""
    return f"{prefix}-{next(_ids)}"


# --- the world: a real ledger with inline and file blobs, a workspace, an outside --------

V0, V1, V2 = b"v0\n", b"v1\n" * 40, b"v2\n"
BIG, OPEN_BYTES, SMALL = b"B" * 300, b"y" * 100, b"small"
INLINE_MAX = 64  # below it inline rows, above it blob files


@dataclass
class World:
    root: Path
    epoch: int = 0

    @property
    def db(self) -> Path:
        return self.root / "led" / "ledger.db"

    @property
    def blobs(self) -> Path:
        return self.root / "led" / "blobs"

    @property
    def ws(self) -> Path:
        return self.root / "ws"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def inputs(self) -> Path:
        return self.root / "in"

    @property
    def witness(self) -> Path:
        """Where a witnessed world's witness is (`build_world(witnessed=True)`): outside
        the ledger's directory, inside the root every check compares."""
        return self.root / "vol" / "ledger.witness"

    big = sha256(BIG)  # committed artifact of art-file, a blob file
    post1 = sha256(V1)  # committed post-image of s1 (app.py), a blob file
    open_ = sha256(OPEN_BYTES)  # in-flight artifact of step "open", a blob file, pinned
    small = sha256(SMALL)  # committed artifact of art-inline, an inline row
    file_blobs = (big, post1, open_)

    def snap(self) -> dict[str, tuple[Any, ...]]:
        return tree(self.root)

    def open(self, readonly: bool = False) -> Ledger:
        return Ledger.open(self.db, readonly=readonly, inline_max_bytes=INLINE_MAX)

    def blob_path(self, digest: str) -> Path:
        return self.blobs / digest[:2] / digest


def build_world(root: Path, clock: Callable[[], int] | None = None,
                witnessed: bool = False) -> World:
    """A closed ledger: two committed artifact steps (inline and file blobs), workspace w
    with a live lease (7 days), s1 committed (a file post-image and a new file in a new
    directory), s2 applied but not published, "open" storing an artifact (in flight).
    `witnessed`: the ledger records its witness at `World.witness` from the start."""
    w = World(root)
    w.ws.mkdir(parents=True)
    (w.ws / "app.py").write_bytes(V0)
    w.outside.mkdir()
    (w.outside / "secret").write_bytes(b"secret\n")
    (w.outside / "sub").mkdir()
    (w.outside / "sub" / "deep").write_bytes(b"deep\n")
    w.inputs.mkdir()
    (w.inputs / "in.txt").write_bytes(b"an input file\n")
    options: dict[str, Any] = {"inline_max_bytes": INLINE_MAX}
    if clock is not None:
        options["clock"] = clock
    if witnessed:
        w.witness.parent.mkdir()
        options["witness"] = w.witness
    with Ledger.init(w.db, **options) as led:
        run_step(led, "art-inline", {"out/a.txt": SMALL})
        run_step(led, "art-file", {"out/big.bin": BIG, "out/s.txt": b"tiny"})
        led.workspaces.add("w", str(w.ws))
        w.epoch = led.workspaces.acquire("w", "agent", TTL_MAX_S).epoch
        led.workspaces.plan_step("s1", workspace="w", epoch=w.epoch,
                      writes=[Write("app.py", V1, sha256(V0)), Write("new/x.txt", b"x", None)])
        applied = led.workspaces.apply("s1", epoch=w.epoch)
        assert applied.verdict == "applied", applied
        led.publish("s1", receipt=applied.receipt)
        led.ack("s1")
        led.workspaces.plan_step("s2", workspace="w", epoch=w.epoch, writes=[Write("app.py", V2, sha256(V1))])
        assert led.workspaces.apply("s2", epoch=w.epoch).verdict == "applied"
        row = led.plan("open", artifacts=["o.txt"])
        led.store("open", row.attempt, "o.txt", OPEN_BYTES)
    assert not os.path.exists(str(w.db) + "-wal")
    for digest in w.file_blobs:
        assert w.blob_path(digest).is_file(), digest
    return w


def _scratch_root() -> str | None:
    """/dev/shm when writable (fsync is nearly free there), else the system temp dir."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="hostile-", dir=_scratch_root()))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def world(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    w = build_world(scratch / "world")
    monkeypatch.chdir(w.inputs)  # `step store` names artifacts by their relative paths
    return w


# === 1. paths: artifact and workspace paths ===============================================

BAD_PATHS: list[tuple[str, object]] = [
    ("empty", ""),
    ("dotdot", ".."),
    ("dotdot-prefix", "../x"),
    ("dotdot-deep", "a/../../etc/passwd"),
    ("absolute", "/etc/passwd"),
    ("root", "/"),
    ("nul", "a\x00b"),
    ("nul-suffix", "a.txt\x00.png"),
    ("backslash", "a\\b"),
    ("backslash-dotdot", "..\\..\\x"),
    ("double-slash", "a//b"),
    ("dot", "./a"),
    ("dot-middle", "a/./b"),
    ("trailing-slash", "a/"),
    ("newline", "a\nb"),
    ("tab", "a\tb"),
    ("del", "a\x7fb"),
    ("escape", "\x1b[2Jx"),
    ("too-long", "a/" * 2048 + "b"),
    ("int", 5),
    ("bytes", b"a"),
    ("none", None),
]


def _path_apis(w: World) -> dict[str, Callable[[Ledger, Any], Any]]:
    manifest = sha256(b"m")
    return {
        "store": lambda led, p: led.store("open", 1, p, b"x"),
        "plan-artifacts": lambda led, p: led.plan(uid("pa"), artifacts=[p]),
        "plan_step-write": lambda led, p: led.workspaces.plan_step(
            uid("pw"), workspace="w", epoch=w.epoch, writes=[Write(p, b"x", None)]),
        "plan_step-artifact": lambda led, p: led.workspaces.plan_step(
            uid("pr"), workspace="w", epoch=w.epoch, artifacts=[p]),
        "snapshot": lambda led, p: led.workspaces.snapshot("w", p),
        "append-planned": lambda led, p: led.append(Planned(step=uid("ap"), attempt=1, artifacts=(p,))),
        "append-blob-stored": lambda led, p: led.append(BlobStored(
            step="open", attempt=1, digest=w.open_, size=len(OPEN_BYTES), path=p)),
        "append-manifest": lambda led, p: led.append(ManifestPublished(
            step="open", attempt=1, manifest_rev=0, digest=manifest,
            artifacts=(ManifestEntry(path=p, digest=w.open_, size=len(OPEN_BYTES)),))),
    }


API_NAMES = list(_path_apis(World(Path("."))))


@pytest.mark.parametrize("api", API_NAMES)
def test_bad_paths_are_refused_by_the_library(world: World, api: str) -> None:
    fn = _path_apis(world)[api]
    failures = []
    with world.open() as led:
        for name, path in BAD_PATHS:
            if path is None and api == "append-blob-stored":
                continue  # a blob-stored event may name no path
            tried("paths")
            failures += _refused(world, name, lambda: fn(led, path), path, ("path",))
    assert not failures, "\n".join(failures)


def _refused(world: World, label: str, call: Callable[[], object], bad: object,
             names: tuple[str, ...]) -> list[str]:
    """What is wrong with how `call` met `bad`: it must raise InvalidInput naming one of
    `names`, and write nothing."""
    out = []
    before = world.snap()
    try:
        call()
    except InvalidInput as exc:
        if not any(w in str(exc) for w in names):
            out.append(f"{label}: the error does not name the {names[0]}: {exc}")
    except Exception as exc:  # noqa: BLE001 — the table reports every miss
        out.append(f"{label}: {type(exc).__name__} @ {where(exc)}: {exc}")
    else:
        out.append(f"{label}: {bad!r} was accepted")
    diff = changes(before, world.snap())
    if diff:
        out.append(f"{label}: wrote {diff}")
    return out


def test_bad_paths_are_refused_by_the_cli(world: World) -> None:
    db = world.db
    # `step store FILE`: the artifact is named by the path as given
    for name in ("a\\b", "a\nb", "tab\there", "\x1b[2J"):
        (world.inputs / name).write_bytes(b"hostile name\n")
    before = world.snap()
    for arg in ("a\\b", "a\nb", "tab\there", "\x1b[2J", "../outside/secret",
                str(world.outside / "secret")):
        run_cli(db, "step", "store", uid("st"), arg, match="artifact path", category="paths")
    assert changes(before, world.snap()) == []
    # `workspace snapshot PATH`
    for _, path in BAD_PATHS:
        if isinstance(path, str) and path:
            run_cli(db, "--workspace", "w", "workspace", "snapshot", path, match="path",
                    category="paths")
    # a plan's write paths and artifact paths
    for name, path in BAD_PATHS:
        for doc in ({"step": uid("jp"), "writes": [{"path": path, "pre_hash": None, "content": "x"}]},
                    {"step": uid("ja"), "artifacts": [path]}):
            if isinstance(path, bytes):
                continue  # not JSON
            run_cli(db, "--workspace", "w", "step", "plan", "--epoch", str(world.epoch), "-",
                    input=json.dumps(doc), match="path" if isinstance(path, str) else "$.",
                    category="paths")
    assert changes(before, world.snap()) == []


# === 2. symlinks (and other non-files) inside the workspace ===============================


def _plant_workspace(w: World) -> None:
    ws, out = w.ws, w.outside
    os.symlink(out, ws / "linkdir")
    os.symlink(out / "secret", ws / "linkfile")
    os.symlink(w.root / "nowhere", ws / "dangling")
    os.symlink("../outside", ws / "rel")
    os.symlink(out, ws / "new" / "inner")  # a symlink one level down
    os.mkfifo(ws / "fifo")
    (ws / "adir").mkdir()
    (ws / "afile").write_bytes(b"a file, not a directory\n")


#: (path, what the planner believes is there)
#: Targets that are themselves a symlink, a FIFO or a directory where the plan expects a
#: regular file: a conflict (the step is refused, and the refusal recorded: issue 36),
#: never written through. The others cross a symlink or a file on the way: PathEscapes,
#: nothing recorded.
SWAPPED_KIND = frozenset({"linkfile", "dangling", "fifo", "adir"})
WS_TARGETS = [
    ("linkdir/x", None),
    ("linkdir/secret", sha256(b"secret\n")),
    ("linkdir/sub/deep", sha256(b"deep\n")),
    ("linkfile", sha256(b"secret\n")),
    ("dangling", None),
    ("dangling/x", None),
    ("rel/secret", sha256(b"secret\n")),
    ("new/inner/secret", sha256(b"secret\n")),
    ("new/inner/fresh", None),
    ("fifo", None),
    ("adir", None),
    ("afile/x", None),
]


def test_workspace_symlinks_are_never_followed_by_the_library(world: World) -> None:
    _plant_workspace(world)
    failures = []
    with world.open() as led, deadline(30):
        for path, pre in WS_TARGETS:
            tried("workspace-symlinks", 2)
            before = world.snap()
            try:
                led.workspaces.snapshot("w", path)
                failures.append(f"snapshot {path}: accepted")
            except PathEscapes:
                pass
            step = uid("sym")
            led.workspaces.plan_step(step, workspace="w", epoch=world.epoch,
                          writes=[Write(path, b"EVIL\n", pre)])
            planned = world.snap()
            try:
                result = led.workspaces.apply(step, epoch=world.epoch)
                if path not in SWAPPED_KIND or result.verdict != "rejected:pre_hash" \
                        or "not the regular file" not in result.detail:
                    failures.append(f"apply {path}: {result.verdict}")
            except PathEscapes as exc:
                if path in SWAPPED_KIND:
                    failures.append(f"apply {path}: PathEscapes, not a conflict outcome")
                if path.split("/")[0] not in str(exc):
                    failures.append(f"apply {path}: the error does not name the path: {exc}")
            diff = changes(planned, world.snap())
            if path in SWAPPED_KIND:  # the refusal is recorded: the ledger's files change
                diff = [d for d in diff if not d.startswith("led/")]
            if diff:
                failures.append(f"apply {path}: wrote {diff}")
            outside_ledger = [k for k in changes(before, planned) if not k.startswith("led/")]
            if outside_ledger:
                failures.append(f"plan {path}: wrote {outside_ledger}")
    assert not failures, "\n".join(failures)
    assert (world.outside / "secret").read_bytes() == b"secret\n"


def test_workspace_symlinks_are_refused_by_the_cli(world: World) -> None:
    _plant_workspace(world)
    db, epoch = world.db, str(world.epoch)
    with deadline(30):
        for path, pre in WS_TARGETS:
            before = world.snap()
            run_cli(db, "--workspace", "w", "workspace", "snapshot", path,
                    match="escapes workspace", category="workspace-symlinks")
            step = uid("csym")
            doc = {"step": step, "writes": [{"path": path, "pre_hash": pre, "content": "EVIL"}]}
            run_cli(db, "--workspace", "w", "step", "plan", "--epoch", epoch, "-",
                    input=json.dumps(doc), codes=(0,), category="workspace-symlinks")
            planned = world.snap()
            if path in SWAPPED_KIND:  # a conflict, recorded: StepRejected, exit 1
                run_cli(db, "step", "apply", step, "--epoch", epoch, codes=(1,),
                        match="is not the regular file", category="workspace-symlinks")
                assert [k for k in changes(planned, world.snap())
                        if not k.startswith("led/")] == [], path
                continue
            run_cli(db, "step", "apply", step, "--epoch", epoch, match="escapes workspace",
                    category="workspace-symlinks")
            assert changes(planned, world.snap()) == [], path
            assert [k for k in changes(before, planned) if not k.startswith("led/")] == []


def test_compensation_never_writes_through_a_symlink_planted_after_apply(world: World) -> None:
    """The fence protects the pre-image: a symlink at the path (or at a parent directory)
    is a conflict, and the symlink's target outside the workspace is never written."""
    ws = world.ws
    with world.open() as led:
        led.workspaces.plan_step("c1", workspace="w", epoch=world.epoch,
                      writes=[Write("app.py", b"c1\n", sha256(V2)), Write("cdir/f.txt", b"f\n", None)])
        assert led.workspaces.apply("c1", epoch=world.epoch).verdict == "applied"
        (ws / "app.py").unlink()
        os.symlink(world.outside / "secret", ws / "app.py")
        shutil.rmtree(ws / "cdir")
        (world.outside / "cdir").mkdir()
        (world.outside / "cdir" / "f.txt").write_bytes(b"f\n")  # the post-image, outside
        os.symlink(world.outside / "cdir", ws / "cdir")
        outside_before, ws_before = tree(world.outside), tree(ws)
        tried("workspace-symlinks")
        c = led.workspaces.compensate("c1", epoch=world.epoch, reason="hostile")
        assert sorted(r.path for r in c.conflicts) == ["app.py", "cdir/f.txt"], c
    assert tree(world.outside) == outside_before
    assert tree(ws) == ws_before


# === 3. the blob store: symlinks and non-files at every level =============================


def _all_fans(w: World) -> list[Path]:
    return sorted({w.blobs / d[:2] for d in w.file_blobs})


def _root_symlink(w: World) -> None:
    shutil.move(w.blobs, w.outside / "blobs")
    os.symlink(w.outside / "blobs", w.blobs)


def _root_file(w: World) -> None:
    shutil.rmtree(w.blobs)
    w.blobs.write_bytes(b"not a directory\n")


def _fan_symlink(w: World) -> None:
    for fan in _all_fans(w):
        shutil.move(fan, w.outside / fan.name)
        os.symlink(w.outside / fan.name, fan)


def _fan_file(w: World) -> None:
    for fan in _all_fans(w):
        shutil.rmtree(fan)
        fan.write_bytes(b"not a directory\n")


def _tmp_symlink(w: World) -> None:
    shutil.rmtree(w.blobs / "tmp", ignore_errors=True)
    os.symlink(w.outside, w.blobs / "tmp")


def _blob_symlink(w: World) -> None:
    """Each blob file moved outside (right bytes) and reached through a symlink."""
    for d in w.file_blobs:
        p = w.blob_path(d)
        shutil.move(p, w.outside / d)
        os.symlink(w.outside / d, p)


def _blob_dangling(w: World) -> None:
    for d in w.file_blobs:
        p = w.blob_path(d)
        p.unlink()
        os.symlink(w.root / "nowhere" / d, p)


def _blob_fifo(w: World) -> None:
    for d in w.file_blobs:
        p = w.blob_path(d)
        p.unlink()
        os.mkfifo(p)


def _blob_dir(w: World) -> None:
    for d in w.file_blobs:
        p = w.blob_path(d)
        p.unlink()
        p.mkdir()


def _stray_entries(w: World) -> None:
    """Names that are not blobs: they must be skipped or refused, never followed."""
    (w.blobs / "README").write_bytes(b"x")
    (w.blobs / "zz").mkdir()
    fan = w.blobs / w.big[:2]
    (fan / "junk").write_bytes(b"j")
    os.symlink("/etc/passwd", fan / (w.big[:2] + "0" * 62))


BLOB_LEVELS: dict[str, tuple[Callable[[World], None], bool]] = {
    # name: (plant, the referenced blobs become unreadable)
    "root-symlink": (_root_symlink, True),
    "root-file": (_root_file, True),
    "fan-symlink": (_fan_symlink, True),
    "fan-file": (_fan_file, True),
    "tmp-symlink": (_tmp_symlink, False),
    "blob-symlink": (_blob_symlink, True),
    "blob-dangling-symlink": (_blob_dangling, True),
    "blob-fifo": (_blob_fifo, True),
    "blob-directory": (_blob_dir, True),
    "stray-entries": (_stray_entries, False),
}


@pytest.mark.parametrize("level", list(BLOB_LEVELS))
def test_hostile_blob_store_read_side_library(world: World, level: str, scratch: Path) -> None:
    plant, breaks = BLOB_LEVELS[level]
    plant(world)
    before = world.snap()
    target = scratch / "restored"
    failures = []
    with world.open() as led, deadline(30):
        def check(name: str, fn: Callable[[], Any]) -> Any:
            tried("blob-store")
            try:
                return fn()
            except LedgerError as exc:
                return exc
            except Exception as exc:  # noqa: BLE001
                failures.append(f"{name}: untyped {type(exc).__name__} @ {where(exc)}: {exc}")
                return exc

        report = check("verify", led.verify)
        if breaks and not isinstance(report, BaseException) and report.ok:
            failures.append("verify: ok, though committed blobs are unreadable")
        for digest, size in ((world.big, len(BIG)), (world.post1, len(V1)), (world.open_, len(OPEN_BYTES))):
            got = check("read_blob", functools.partial(led.read_blob, digest, size=size))
            if breaks and not isinstance(got, (BlobCorrupt, BlobNotFound)):
                failures.append(f"read_blob {digest[:8]}: served {type(got).__name__}")
            problem = check("blob_problem", functools.partial(led.blob_problem, digest, size))
            if breaks and problem is None:
                failures.append(f"blob_problem {digest[:8]}: None")
        verdict = check("classify", lambda: led.classify("art-file"))
        if breaks and verdict == "committed":
            failures.append("classify: committed, though its blob is unreadable")
        check("blob_list", led.blob_list)
        check("steps", led.steps)
        if breaks:
            got = check("restore", lambda: led.workspaces.restore("w", target, force=True))
            if not isinstance(got, LedgerError):
                failures.append(f"restore: {got!r}")
            if target.exists():
                failures.append("restore: created its target although it refused")
    assert not failures, "\n".join(failures)
    assert changes(before, world.snap()) == []


@pytest.mark.parametrize("level", list(BLOB_LEVELS))
def test_hostile_blob_store_read_side_cli(world: World, level: str, scratch: Path) -> None:
    plant, breaks = BLOB_LEVELS[level]
    plant(world)
    before = world.snap()
    no = (1, 2) if breaks else (0, 1, 2)
    with deadline(60):
        run_cli(world.db, "verify", codes=no, category="blob-store")
        run_cli(world.db, "audit", "--deep", codes=no, category="blob-store")
        run_cli(world.db, "audit", codes=(0, 1, 2), category="blob-store")
        run_cli(world.db, "blobs", codes=(0, 1, 2), category="blob-store")
        run_cli(world.db, "gc", "--dry-run", codes=(0, 1), category="blob-store")
        run_cli(world.db, "show", "art-file", codes=(0,), category="blob-store")
        if breaks:
            run_cli(world.db, "--workspace", "w", "restore", "--to", str(scratch / "r"), "--force",
                    codes=(1, 2), category="blob-store")
            assert not (scratch / "r").exists()
    assert changes(before, world.snap()) == []


def _new_blob_levels(w: World, digest: str) -> dict[str, Callable[[], None]]:
    """Hostile levels on the path a *new* blob file would take."""
    fan = w.blobs / digest[:2]

    def fan_symlink() -> None:
        (w.outside / "fan").mkdir()
        os.symlink(w.outside / "fan", fan)

    def fan_file() -> None:
        fan.write_bytes(b"x")

    return {"root-symlink": lambda: _root_symlink(w), "root-file": lambda: _root_file(w),
            "fan-symlink": fan_symlink, "fan-file": fan_file, "tmp-symlink": lambda: _tmp_symlink(w)}


NEW = b"N" * (70 * 1024)  # a blob file for the CLI's default inline limit too


@pytest.mark.parametrize("level", ["root-symlink", "root-file", "fan-symlink", "fan-file", "tmp-symlink"])
def test_hostile_blob_store_write_side(world: World, level: str) -> None:
    """A put that would have to cross a symlink (or a file where a directory belongs) is
    refused with a typed error and writes nothing outside the store, nor into it."""
    _new_blob_levels(world, sha256(NEW))[level]()
    (world.inputs / "new.bin").write_bytes(NEW)
    outside, store = tree(world.outside), tree(world.blobs) if world.blobs.is_dir() else None
    with world.open() as led:
        tried("blob-store")
        with pytest.raises(BlobCorrupt, match="symlink or not a directory"):
            led.store("open", 1, "o2.bin", NEW)
        tried("blob-store")
        with pytest.raises(BlobCorrupt):
            led.blobs.put(NEW)
    run_cli(world.db, "step", "store", "open", "new.bin", codes=(1,), match="symlink",
            category="blob-store")
    assert tree(world.outside) == outside
    if store is not None and not world.blobs.is_symlink():
        # no file or link appears or changes (directories are compared only where they
        # existed; test_refused_blob_store_write_leaves_a_pin checks the whole tree)
        after = {k: v for k, v in tree(world.blobs).items() if v[0] != "dir" or k in store}
        assert after == store


# === 4. digests of the wrong length, case or alphabet =====================================

BAD_DIGESTS: list[tuple[str, object]] = [
    ("empty", ""),
    ("short", "a" * 63),
    ("long", "a" * 65),
    ("upper", "A" * 64),
    ("mixed-case", "aA" * 32),
    ("non-hex", "g" * 64),
    ("trailing-newline", "a" * 64 + "\n"),
    ("leading-space", " " + "a" * 63),
    ("md5-length", "a" * 32),
    ("path", "../" + "a" * 61),
    ("slash", "aa/" + "a" * 61),
    ("nul", "\x00" * 64),
    ("arabic-digits", "\u0660" * 64),
    ("fullwidth", "\uff41" * 64),
    ("int", 7),
    ("bytes", b"a" * 64),
]


def _digest_apis(w: World) -> dict[str, Callable[[Ledger, Any], Any]]:
    return {
        "read_blob": lambda led, d: led.read_blob(d),
        "check_blob": lambda led, d: led.check_blob(d, 1),
        "blob_problem": lambda led, d: led.blob_problem(d, 1),
        "pin": lambda led, d: led.pin("open", 1, d),
        "blobs.size": lambda led, d: led.blobs.size(d),
        "blobs.stat": lambda led, d: led.blobs.stat(d),
        "blobs.read": lambda led, d: led.blobs.read(d),
        "blobs.check": lambda led, d: led.blobs.check(d),
        "blobs.delete": lambda led, d: led.blobs.delete(d),
        "blobs.put": lambda led, d: led.blobs.put(b"x", d),
        "plan_step pre_hash": lambda led, d: led.workspaces.plan_step(
            uid("dg"), workspace="w", epoch=w.epoch, writes=[Write("app.py", b"x", d)]),
        "append blob-stored": lambda led, d: led.append(
            BlobStored(step="open", attempt=1, digest=d, size=1)),
        "append blob-pinned": lambda led, d: led.append(BlobPinned(step="open", attempt=1, digest=d)),
        "append manifest": lambda led, d: led.append(ManifestPublished(
            step="open", attempt=1, manifest_rev=0, digest=d)),
        "manifest entry": lambda led, d: led.append(ManifestPublished(
            step="open", attempt=1, manifest_rev=0, digest=sha256(b"m"),
            artifacts=(ManifestEntry(path="o.txt", digest=d, size=1),))),
    }


def test_bad_digests_are_refused_by_the_library(world: World) -> None:
    failures = []
    with world.open() as led:
        for api, fn in _digest_apis(world).items():
            for name, digest in BAD_DIGESTS:
                tried("digests")
                failures += _refused(world, f"{api} {name}", lambda: fn(led, digest), digest,
                                     ("digest", "pre_hash"))
    assert not failures, "\n".join(failures)


def test_bad_digests_are_refused_by_the_cli(world: World) -> None:
    db, epoch = world.db, str(world.epoch)
    receipt = json.loads(invoke(db, "step", "apply", "s2", "--epoch", epoch, "--json").stdout)["receipt"]
    assert receipt is not None
    with world.open(readonly=True) as led:
        head = led.head()
    before = world.snap()
    for name, digest in BAD_DIGESTS:
        if isinstance(digest, bytes):
            continue
        doc = {"step": uid("cd"), "writes": [{"path": "app.py", "pre_hash": digest, "content": "x"}]}
        run_cli(db, "--workspace", "w", "step", "plan", "--epoch", epoch, "-", input=json.dumps(doc),
                match="pre_hash", category="digests")
        bad = {**receipt, "writes": [{**receipt["writes"][0], "post_hash": digest}]}
        run_cli(db, "step", "publish", "s2", "--receipt", "-", input=json.dumps(bad),
                match="receipt", category="digests")
        if isinstance(digest, str) and name not in ("upper", "mixed-case", "trailing-newline"):
            # (a head may be in either case, and surrounding whitespace is stripped)
            run_cli(db, "verify", "--expect-head", f"{head.seq}:{digest}", match="SEQ:HASH",
                    category="digests")
    assert changes(before, world.snap()) == []


# === 5. a planted blob with the right name and the wrong bytes ============================


PLANTS: dict[str, Callable[[int], bytes]] = {
    "same-size": lambda n: b"b" * n, "shorter": lambda n: b"evil", "longer": lambda n: b"e" * (n + 1),
    "empty": lambda n: b"",
}


@pytest.mark.parametrize("planted", list(PLANTS))
def test_planted_blob_is_never_served_library(world: World, planted: str, scratch: Path) -> None:
    for d in world.file_blobs:
        p = world.blob_path(d)
        os.chmod(p, 0o644)
        p.write_bytes(PLANTS[planted](p.stat().st_size))
    before = world.snap()
    with world.open() as led:
        tried("planted-blobs", 7)
        report = led.verify()
        assert not report.ok and any(f.check == "durability" for f in report.findings), report
        with pytest.raises(BlobCorrupt):
            led.read_blob(world.big)
        with pytest.raises(BlobCorrupt):
            led.check_blob(world.big, len(BIG))
        assert led.classify("art-file").startswith("VIOLATION")
        assert led.classify("s1").startswith("VIOLATION")
        with pytest.raises(BlobCorrupt):
            led.workspaces.restore("w", scratch / "r", force=True)
        assert not (scratch / "r").exists()
        with pytest.raises(BlobCorrupt):  # the publish guard re-hashes: nothing is committed
            led.publish("open")
    assert changes(before, world.snap()) == []


def test_planted_blob_is_never_served_cli(world: World, scratch: Path) -> None:
    for d in world.file_blobs:
        p = world.blob_path(d)
        os.chmod(p, 0o644)
        p.write_bytes(b"b" * p.stat().st_size)
    before = world.snap()
    r = run_cli(world.db, "verify", codes=(1,), category="planted-blobs")
    assert "VIOLATION" in r.stdout and "corrupt" in r.stdout
    r = run_cli(world.db, "audit", "--deep", codes=(1,), category="planted-blobs")
    assert "corrupt" in r.stdout
    run_cli(world.db, "blobs", codes=(0,), category="planted-blobs")
    run_cli(world.db, "--workspace", "w", "restore", "--to", str(scratch / "r"), "--force",
            codes=(1,), match="corrupt", category="planted-blobs")
    run_cli(world.db, "step", "publish", "open", codes=(1,), match="corrupt", category="planted-blobs")
    assert not (scratch / "r").exists()
    assert changes(before, world.snap()) == []


def test_planted_inline_row_is_never_served(world: World) -> None:
    conn = apsw.Connection(str(world.db))  # blob_data has no triggers: any tool can do this
    conn.execute("UPDATE blob_data SET data = ? WHERE digest = ?", (b"EVIL!", world.small))
    conn.close()
    before = world.snap()
    with world.open(readonly=True) as led:
        tried("planted-blobs", 3)
        with pytest.raises(BlobCorrupt):
            led.read_blob(world.small)
        assert led.classify("art-inline").startswith("VIOLATION")
        assert not led.verify().ok
    r = run_cli(world.db, "verify", codes=(1,), category="planted-blobs")
    assert "corrupt" in r.stdout
    assert changes(before, world.snap()) == []


# === 6. foreign SQLite files, planted triggers and views ==================================


def _raw(path: Path, *statements: str) -> None:
    conn = apsw.Connection(str(path))
    for sql in statements:
        conn.execute(sql).fetchall()
    conn.close()


def _copy_ledger(w: World, d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(w.db, d / "ledger.db")
    return d / "ledger.db"


_LAG = "UPDATE projection_checkpoint SET version = 0"  # tempts a read-write open to catch up
FOREIGN: dict[str, Callable[[World, Path], Path]] = {
    "text-file": lambda w, d: _write(d / "notes.db", b"not a database\n" * 50),
    "empty": lambda w, d: _write(d / "empty.db", b""),
    "sqlite-magic-only": lambda w, d: _write(d / "m.db", dbmod.SQLITE_MAGIC + bytes(200)),
    "plain-sqlite": lambda w, d: _sqlite(d / "app.db", "CREATE TABLE notes(x)", "INSERT INTO notes VALUES (1)"),
    "our-id-foreign-schema": lambda w, d: _sqlite(
        d / "impostor.db", f"PRAGMA application_id={dbmod.APPLICATION_ID}", "PRAGMA user_version=1",
        "CREATE TABLE events(x)"),
    "planted-trigger-on-events": lambda w, d: _planted(
        w, d, "CREATE TABLE loot(what TEXT)",
        "CREATE TRIGGER evil AFTER INSERT ON events BEGIN INSERT INTO loot VALUES ('events'); END"),
    "planted-trigger-on-steps": lambda w, d: _planted(
        w, d, "CREATE TABLE loot(what TEXT)",
        "CREATE TRIGGER evil AFTER INSERT ON steps BEGIN INSERT INTO loot VALUES ('steps'); END"),
    "planted-trigger-calls-a-function": lambda w, d: _planted(
        w, d, "CREATE TRIGGER evil BEFORE INSERT ON meta BEGIN SELECT load_extension('/tmp/evil'); END"),
    "planted-view": lambda w, d: _planted(w, d, "CREATE VIEW evil AS SELECT * FROM events"),
    "planted-index": lambda w, d: _planted(w, d, "CREATE INDEX evil ON events(kind)"),
    "analyze-stat-table": lambda w, d: _planted(w, d, "ANALYZE"),
    "dropped-append-only-triggers": lambda w, d: _planted(
        w, d, "DROP TRIGGER events_no_update", "DROP TRIGGER events_no_delete"),
    "replaced-append-only-trigger": lambda w, d: _planted(
        w, d, "DROP TRIGGER events_no_update",
        "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN SELECT 1; END"),
    "too-new": lambda w, d: _planted(w, d, f"PRAGMA user_version={dbmod.SCHEMA_VERSION + 1}"),
    "wal-is-a-directory": lambda w, d: _with_sidecar(w, d, "-wal", "dir"),
    "wal-is-a-symlink": lambda w, d: _with_sidecar(w, d, "-wal", "link"),
    "directory": lambda w, d: _mkdir(d / "ledger.db"),
}


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True)
    return p


def _sqlite(p: Path, *statements: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    _raw(p, *statements)
    return p


def _planted(w: World, d: Path, *statements: str) -> Path:
    p = _copy_ledger(w, d)
    _raw(p, _LAG, *statements)
    return p


def _with_sidecar(w: World, d: Path, suffix: str, kind: str) -> Path:
    p = _copy_ledger(w, d)
    side = Path(str(p) + suffix)
    if kind == "dir":
        side.mkdir()
    else:
        (d / "victim").write_bytes(b"victim\n")
        os.symlink(d / "victim", side)
    return p


FOREIGN_COMMANDS: list[tuple[str, ...]] = [
    ("verify",), ("steps",), ("events",), ("head",), ("export",), ("blobs",), ("audit",),
    ("init",), ("rebuild",), ("step", "store", "x", "in.txt"), ("workspace", "add", "w2", "."),
    ("gc", "--dry-run"), ("--workspace", "w", "lease", "acquire", "--holder", "h", "--force"),
]


#: A ledger whose schema differs only outside its tables: `verify` examines it (read-only,
#: triggers and views never run) and reports the change (exit 1); the rest refuse it.
SCHEMA_FINDINGS: Final = frozenset({"planted-trigger-calls-a-function", "planted-view",
                                    "planted-index", "replaced-append-only-trigger",
                                    "dropped-append-only-triggers"})


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_foreign_files_are_refused_untouched_by_every_command(world: World, kind: str) -> None:
    d = world.root / "foreign"
    path = FOREIGN[kind](world, d)
    before = world.snap()
    for argv in FOREIGN_COMMANDS:
        if kind == "empty" and argv == ("init",):
            continue  # init adopts an empty file (a crash inside init)
        if kind in SCHEMA_FINDINGS and argv == ("verify",):
            r = run_cli(path, *argv, codes=(1,), match="VIOLATION [schema]", category="foreign-sqlite")
            assert changes(before, world.snap()) == [], (kind, argv)
            continue
        r = run_cli(path, *argv, match=str(path), category="foreign-sqlite")
        assert changes(before, world.snap()) == [], (kind, argv)
        assert "not" in r.stderr or "newer" in r.stderr or "schema version" in r.stderr
    for how in ("readonly", "readwrite", "init"):
        if kind == "empty" and how == "init":
            continue
        tried("foreign-sqlite")
        with pytest.raises(LedgerError) as info:
            if how == "init":
                Ledger.init(path)
            else:
                Ledger.open(path, readonly=how == "readonly")
        assert str(path) in str(info.value)
        assert changes(before, world.snap()) == [], (kind, how)


# === 7. malformed JSON to every JSON-reading input ========================================

PLAN_BODIES: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("whitespace", b"  \n\t "),
    ("bom", b"\xef\xbb\xbf{\"step\": \"a\"}"),
    ("utf-16", '{"step": "a"}'.encode("utf-16")),
    ("binary", b"\xff\xfe\x00\x01"),
    ("invalid-utf8-in-string", b'{"step": "\xff\xfe"}'),
    ("null", b"null"),
    ("array", b"[]"),
    ("number", b"1"),
    ("string", b'"plan"'),
    ("true", b"true"),
    ("open-brace", b"{"),
    ("truncated", b'{"steps": [{"step": "a", "writes": [{"path": "a",'),
    ("bad-array", b'{"steps": [}'),
    ("trailing-garbage", b'{"step": "a"} x'),
    ("two-documents", b'{"step": "a"}{"step": "b"}'),
    ("nan", b'{"step": "a", "plan_rev": NaN}'),
    ("infinity", b'{"step": "a", "plan_rev": Infinity}'),
    ("single-quotes", b"{'step': 'a'}"),
    ("comment", b'{"step": "a" /* hi */}'),
    ("steps-empty", b'{"steps": []}'),
    ("steps-object", b'{"steps": {}}'),
    ("steps-number", b'{"steps": [1]}'),
    ("steps-null-item", b'{"steps": [null]}'),
    ("step-number", b'{"step": 1}'),
    ("step-null", b'{"step": null}'),
    ("step-list", b'{"step": ["a"]}'),
    ("step-missing", b'{"writes": []}'),
    ("writes-string", b'{"step": "a", "writes": "x"}'),
    ("writes-number-item", b'{"step": "a", "writes": [1]}'),
    ("write-empty", b'{"step": "a", "writes": [{}]}'),
    ("write-no-pre-hash", b'{"step": "a", "writes": [{"path": "a", "content": "x"}]}'),
    ("base-rev-negative", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "base_rev": -1}]}'),
    ("base-rev-float", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "base_rev": 1.5}]}'),
    ("base-rev-bool", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "base_rev": true}]}'),
    ("base-rev-string", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "base_rev": "1"}]}'),
    ("base-rev-1e999", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "base_rev": 1e999}]}'),
    ("content-number", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": 1}]}'),
    ("content-list", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": ["x"]}]}'),
    ("content-b64-invalid", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_b64": "!!!"}]}'),
    ("content-b64-padding", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_b64": "YQ"}]}'),
    ("content-file-missing", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_file": "missing"}]}'),
    ("content-file-directory", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_file": "."}]}'),
    ("content-file-empty-name", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_file": ""}]}'),
    ("content-file-absolute", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_file": "/etc/passwd"}]}'),
    ("content-file-dotdot", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content_file": "../../../../etc/passwd"}]}'),
    ("fence-none", b'{"step": "a", "fence": "none"}'),
    ("fence-plan-batch", b'{"steps": [{"step": "a"}], "fence": "plan"}'),
    ("journal-off", b'{"step": "a", "journal": false}'),
    ("two-contents", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "content_b64": "eA=="}]}'),
    ("no-content", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null}]}'),
    ("delete-string", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "delete": "yes"}]}'),
    ("unknown-field-top", b'{"step": "a", "evil": 1}'),
    ("unknown-field-write", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x", "mode": 777}]}'),
    ("unknown-field-batch", b'{"steps": [{"step": "a"}], "evil": 1}'),
    ("unknown-field-batch-step", b'{"steps": [{"step": "a", "evil": 1}]}'),
    ("fence-unknown", b'{"step": "a", "fence": "sometimes"}'),
    ("fence-number", b'{"step": "a", "fence": 1}'),
    ("journal-string", b'{"step": "a", "journal": "yes"}'),
    ("plan-rev-negative", b'{"step": "a", "plan_rev": -1}'),
    ("run-number", b'{"steps": [{"step": "a"}], "run": 5}'),
    ("irreversible-string", b'{"step": "a", "irreversible": "no"}'),
    ("artifacts-string", b'{"step": "a", "artifacts": "x"}'),
    ("artifacts-number-item", b'{"step": "a", "artifacts": [1]}'),
    ("duplicate-step", b'{"steps": [{"step": "a"}, {"step": "a"}]}'),
    ("same-path-twice", b'{"step": "a", "writes": [{"path": "a", "pre_hash": null, "content": "x"}, {"path": "a", "pre_hash": null, "content": "y"}]}'),
]


def _receipt_bodies(receipt: dict[str, Any]) -> list[tuple[str, bytes, tuple[int, ...]]]:
    def j(x: Any) -> bytes:
        return json.dumps(x).encode()

    w0 = receipt["writes"][0]
    return [
        ("empty", b"", (2,)),
        ("whitespace", b" \n ", (2,)),
        ("not-json", b"HTTP/1.1 200 OK", (2,)),
        ("bom", b"\xef\xbb\xbf" + j(receipt), (2,)),
        ("utf-16", json.dumps(receipt).encode("utf-16"), (2,)),
        ("binary", b"\x00\xff\xfe", (2,)),
        ("null", b"null", (2,)),
        ("array", b"[]", (2,)),
        ("number", b"200", (2,)),
        ("string", b'"ok"', (2,)),
        ("object-empty", b"{}", (2,)),
        ("truncated", j(receipt)[:-5], (2,)),
        ("trailing-garbage", j(receipt) + b" x", (2,)),
        ("missing-seq", j({k: v for k, v in receipt.items() if k != "seq"}), (2,)),
        ("seq-string", j({**receipt, "seq": str(receipt["seq"])}), (2,)),
        ("seq-float", j({**receipt, "seq": receipt["seq"] + 0.5}), (2,)),
        ("seq-2^64", j({**receipt, "seq": 2**64}), (1, 2)),
        ("writes-object", j({**receipt, "writes": {}}), (2,)),
        ("write-path-escapes", j({**receipt, "writes": [{**w0, "path": "../../etc/passwd"}]}), (2,)),
        ("write-path-absolute", j({**receipt, "writes": [{**w0, "path": "/etc/passwd"}]}), (2,)),
        ("write-rev-negative", j({**receipt, "writes": [{**w0, "rev": -1}]}), (2,)),
        ("workspace-number", j({**receipt, "workspace": 1}), (2,)),
        ("apply-doc-null-receipt", j({"verdict": "rejected:pre_hash", "receipt": None}), (2,)),
        ("apply-doc-string-receipt", j({"verdict": "applied", "receipt": "yes"}), (2,)),
        ("apply-doc-list-receipt", j({"verdict": "applied", "receipt": [receipt]}), (2,)),
        ("rev-edited", j({**receipt, "rev": receipt["rev"] + 1}), (1,)),
        ("seq-edited", j({**receipt, "seq": receipt["seq"] + 1}), (1,)),
        ("epoch-edited", j({**receipt, "epoch": receipt["epoch"] + 1}), (1,)),
        ("post-hash-edited", j({**receipt, "writes": [{**w0, "post_hash": sha256(b"evil")}]}), (1,)),
        ("other-step", j({**receipt, "step": "s1"}), (1, 2)),
        ("extra-write", j({**receipt, "writes": [w0, {**w0, "path": "b"}]}), (1,)),
        ("no-writes", j({**receipt, "writes": []}), (1,)),
    ]


def test_malformed_plans_are_exit_2_and_write_nothing(world: World) -> None:
    db, epoch = world.db, str(world.epoch)
    before = world.snap()
    for name, body in PLAN_BODIES:
        for via in ("stdin", "file"):
            tag = f"[{name} via {via}] "
            if via == "stdin":
                r = run_cli(db, "--workspace", "w", "step", "plan", "--epoch", epoch, "-", input=body,
                            category="json", tag=tag)
            else:
                f = world.root / "plan.json"
                f.write_bytes(body)
                r = run_cli(db, "--workspace", "w", "step", "plan", "--epoch", epoch, str(f),
                            category="json", tag=tag)
                f.unlink()
            assert r.stderr.startswith("steptrail: error:"), (name, r.stderr)
            assert changes(before, world.snap()) == [], (name, via)


def test_malformed_receipts_are_refused_and_write_nothing(world: World) -> None:
    db, epoch = world.db, str(world.epoch)
    receipt = json.loads(invoke(db, "step", "apply", "s2", "--epoch", epoch, "--json").stdout)["receipt"]
    before = world.snap()
    for name, body, codes in _receipt_bodies(receipt):
        for via in ("stdin", "file"):
            tag = f"[{name} via {via}] "
            if via == "stdin":
                r = run_cli(db, "step", "publish", "s2", "--receipt", "-", input=body, codes=codes,
                            category="json", tag=tag)
            else:
                f = world.root / "receipt.json"
                f.write_bytes(body)
                r = run_cli(db, "step", "publish", "s2", "--receipt", str(f), codes=codes,
                            category="json", tag=tag)
                f.unlink()
            assert "receipt" in r.stderr, (name, r.stderr)
            assert changes(before, world.snap()) == [], (name, via)
    # the library refuses the same documents (bytes: a receipt, never an apply document)
    with world.open() as led:
        for name, body, _codes in _receipt_bodies(receipt):
            tried("json")
            got = outcome(led.publish, "s2", receipt=body)
            assert got.startswith("typed:"), (name, got)
    assert changes(before, world.snap()) == []


# === 8. oversized payloads, step ids and names ============================================


def test_oversized_inputs_are_refused_by_the_library(world: World) -> None:
    long_id, huge_id = "s" * 257, "s" * 1_000_000
    cases: list[tuple[str, Callable[[Ledger], Any]]] = [
        ("step id 257", lambda led: led.plan(long_id)),
        ("step id 1M", lambda led: led.plan(huge_id)),
        ("step id 1M lookup", lambda led: led.step(huge_id)),
        ("run 257", lambda led: led.plan(uid("o"), run="r" * 257)),
        ("holder 257", lambda led: led.workspaces.acquire("w", "h" * 257, 60, force=True)),
        ("workspace 257", lambda led: led.workspaces.add("w" * 257, str(world.ws))),
        ("reason 4097", lambda led: led.workspaces.compensate("open", reason="r" * 4097)),
        ("artifact path 4097", lambda led: led.store("open", 1, "p" * 4097, b"x")),
        ("10001 artifacts", lambda led: led.plan(uid("o"), artifacts=[f"a{i}" for i in range(10_001)])),
        ("10001 writes", lambda led: led.workspaces.plan_step(uid("o"), workspace="w", epoch=world.epoch,
                                                    writes=[Write(f"f{i}", b"", None) for i in range(10_001)])),
        ("ttl 8 days", lambda led: led.workspaces.acquire("w", "h", 8 * 86400, force=True)),
        ("ttl zero", lambda led: led.workspaces.acquire("w", "h", 0, force=True)),
        ("ttl nan", lambda led: led.workspaces.acquire("w", "h", float("nan"), force=True)),
        ("ttl inf", lambda led: led.workspaces.acquire("w", "h", float("inf"), force=True)),
        ("epoch zero", lambda led: led.workspaces.plan_step(uid("o"), workspace="w", epoch=0)),
        ("expected_rev -2", lambda led: led.publish("open", expected_rev=-2)),
    ]
    before = world.snap()
    failures = []
    with world.open() as led:
        for name, fn in cases:
            tried("oversized")
            got = outcome(fn, led)
            if got != "typed:InvalidInput":
                failures.append(f"{name}: {got}")
    assert not failures, "\n".join(failures)
    assert changes(before, world.snap()) == []


def test_oversized_inputs_are_refused_by_the_cli(world: World) -> None:
    db, epoch = world.db, str(world.epoch)
    before = world.snap()
    long_id = "s" * 257
    for argv in (("step", "store", long_id, "in.txt"), ("show", long_id), ("events", "--step", long_id),
                 ("--workspace", long_id, "lease", "show"),
                 ("--workspace", "w", "lease", "acquire", "--holder", "h" * 257, "--force"),
                 ("--workspace", "w", "lease", "acquire", "--holder", "h", "--ttl", "8d", "--force"),
                 ("step", "compensate", "open", "--reason", "r" * 4097),
                 ("workspace", "add", long_id, ".")):
        run_cli(db, *argv, category="oversized")
    for doc in ({"step": long_id}, {"step": "o", "artifacts": [f"a{i}" for i in range(10_001)]},
                {"step": "o", "writes": [{"path": f"f{i}", "pre_hash": None, "content": ""}
                                         for i in range(10_001)]},
                {"step": "o", "writes": [{"path": "p" * 4097, "pre_hash": None, "content": ""}]},
                {"steps": [{"step": "o", "run": "r" * 257}]}):
        run_cli(db, "--workspace", "w", "step", "plan", "--epoch", epoch, "-", input=json.dumps(doc),
                category="oversized")
    assert changes(before, world.snap()) == []


# === 9. --expect-head, and tampered events ================================================

BAD_HEADS = ["", "x", "1", "1:", ":" + "a" * 64, "1:" + "a" * 63, "1:" + "a" * 65, "-1:" + "a" * 64,
             "+1:" + "a" * 64, "1:" + "g" * 64, "1 :" + "a" * 64, "0x1:" + "a" * 64, "1_0:" + "a" * 64,
             "\uff11:" + "a" * 64, "\u0661:" + "a" * 64, "1:" + "a" * 64 + ":x", "1:" + " a" * 32]


def test_expect_head_must_be_seq_colon_hash(world: World) -> None:
    before = world.snap()
    with world.open(readonly=True) as led:
        head = led.head()
        for text in BAD_HEADS:
            tried("head")
            with pytest.raises(InvalidInput, match="SEQ:HASH"):
                led.verify(expect_head=text)
    for text in BAD_HEADS:
        run_cli(world.db, "verify", "--expect-head", text, match="SEQ:HASH", category="head")
    # well formed, but not this ledger's history: the answer is no (exit 1), not bad input
    for text in (f"{head.seq}:{'0' * 64}", f"{head.seq + 7}:{head.hash.hex()}", f"1:{head.hash.hex()}"):
        r = run_cli(world.db, "verify", "--expect-head", text, codes=(1,), category="head")
        assert "VIOLATION [head]" in r.stdout
    assert changes(before, world.snap()) == []


def test_a_tampered_event_path_never_escapes_on_restore(world: World, scratch: Path) -> None:
    """Paths are validated again when events are decoded: an edited `fenced` event naming
    ../../escape cannot make restore write outside its target."""

    def edit(conn: apsw.Connection) -> None:
        for seq, payload in conn.execute("SELECT seq, payload FROM events WHERE kind = 'fenced'").fetchall():
            conn.execute("UPDATE events SET payload = ? WHERE seq = ?",
                         (bytes(payload).replace(b"new/x.txt", b"../../escape"), seq))

    tamper(world.db, edit)
    before = world.snap()
    with world.open() as led:
        tried("tampered", 3)
        with pytest.raises(CorruptLedger, match="cannot be decoded"):
            led.workspaces.restore("w", scratch / "r", force=True)
        report = led.verify()
        assert not report.ok and any(f.check == "row" for f in report.findings)
    run_cli(world.db, "--workspace", "w", "restore", "--to", str(scratch / "r"), "--force",
            match="cannot be decoded", category="tampered")
    run_cli(world.db, "verify", codes=(1,), category="tampered")
    assert not (scratch / "r").exists() and not (scratch / "escape").exists()
    assert not (world.root / "escape").exists()
    assert changes(before, world.snap()) == []


# === 10. seeded mutants of a real ledger file =============================================

MUTATIONS = ("flip-header", "flip-schema-page", "flip-anywhere", "set-bytes", "truncate",
             "truncate-at-page", "zero-page", "copy-page", "append-garbage")
MUTATION_WEIGHTS = (2, 2, 8, 3, 1, 1, 1, 1, 1)


def mutate(data: bytes, seed: int) -> tuple[str, bytes]:
    """One seeded mutant: 1-8 flipped bits or set bytes (in the 100-byte header, in page 1
    (the schema), or anywhere), a truncation, a zeroed or duplicated page, or appended
    garbage. Reproduce one with `mutate(open(db, 'rb').read(), seed)`."""
    rng = random.Random(seed)
    kind = rng.choices(MUTATIONS, MUTATION_WEIGHTS)[0]
    buf = bytearray(data)
    page = int.from_bytes(data[16:18], "big") or 4096
    pages = max(1, len(buf) // page)
    n = rng.randint(1, 8)
    if kind == "flip-header":
        for _ in range(n):
            buf[rng.randrange(100)] ^= 1 << rng.randrange(8)
    elif kind == "flip-schema-page":
        for _ in range(n):
            buf[rng.randrange(100, min(page, len(buf)))] ^= 1 << rng.randrange(8)
    elif kind == "flip-anywhere":
        for _ in range(n):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == "set-bytes":
        for _ in range(n):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf)):]
    elif kind == "truncate-at-page":
        del buf[page * rng.randrange(pages):]
    elif kind == "zero-page":
        p = rng.randrange(1, pages) if pages > 1 else 0
        buf[p * page:(p + 1) * page] = bytes(page)
    elif kind == "copy-page":
        a, b = rng.sample(range(pages), 2) if pages > 1 else (0, 0)
        buf[b * page:(b + 1) * page] = data[a * page:(a + 1) * page]
    else:
        buf += rng.randbytes(rng.choice((1, 100, page, 3 * page)))
    if bytes(buf) == data:  # a set byte to its own value, a page copied onto an equal one
        buf[rng.randrange(100, len(buf))] ^= 0x01
    return kind, bytes(buf)


LIB_SURFACES: dict[str, Callable[[Ledger], Any]] = {
    "verify": lambda led: "ok" if led.verify().ok else "findings",
    "steps": lambda led: led.steps(),
    "read": lambda led: list(led.read()),
    "head": lambda led: led.head(),
    "workspaces": lambda led: led.workspaces.list(),
    "blob_list": lambda led: led.blob_list(),
    "classify": lambda led: [led.classify(s) for s in ("art-file", "s1")],
    "stats": lambda led: _stats(led),
}


def _stats(led: Ledger) -> Any:
    from ledger.stats import stats
    return stats(led)
CLI_SURFACES: list[tuple[str, ...]] = [
    ("verify",), ("events", "--json"), ("steps", "--json"), ("export",), ("show", "s1"),
    ("audit", "--deep"), ("stats", "--json"),
]


def _probe_mutant(path: str) -> dict[str, str]:
    """Every read-only surface on one mutant (runs in a forked child)."""
    out: dict[str, str] = {}
    led = None
    try:
        led = Ledger.open(path, readonly=True)
        out["open"] = "ok"
    except LedgerError as exc:
        out["open"] = f"typed:{type(exc).__name__}"
    except Exception as exc:  # noqa: BLE001
        out["open"] = f"UNTYPED:{type(exc).__name__}@{where(exc)}"
    if led is not None:
        try:
            for name, fn in LIB_SURFACES.items():
                res: list[Any] = []
                got = outcome(lambda f, r: r.append(f(led)), fn, res)
                out[name] = res[0] if got == "ok" and isinstance(res[0], str) else got
        finally:
            with contextlib.suppress(Exception):
                led.close()
    for argv in CLI_SURFACES:
        r = invoke(path, *argv)
        exc = r.exception
        if exc is not None and not isinstance(exc, SystemExit):
            out["cli " + " ".join(argv)] = f"UNTYPED:{type(exc).__name__}@{where(exc)}"
        else:
            problem = cli_problem(r, (0, 1, 2))
            out["cli " + " ".join(argv)] = f"exit {r.exit_code}" + (" BAD-OUTPUT" if problem else "")
    return out


def _mutant_worker(data: bytes, seeds: list[int], workdir: Path, out_fd: int,
                   timeout_s: int = MUTANT_TIMEOUT_S, hang_seed: int | None = None) -> None:
    """Probe each seed's mutant under alarm() and report one JSON line per seed on out_fd.
    SIGALRM's default action kills the worker even inside SQLite's C code."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    target = workdir / "ledger.db"
    with os.fdopen(out_fd, "w", buffering=1) as out:
        for seed in seeds:
            kind, mutant = mutate(data, seed)
            for extra in set(os.listdir(workdir)) - {"blobs"}:
                os.unlink(workdir / extra)
            target.write_bytes(mutant)
            signal.alarm(timeout_s)
            if seed == hang_seed:  # the harness's self-test: a probe that never returns
                signal.pause()
            result = _probe_mutant(str(target))
            signal.alarm(0)
            # An accepted file is read under SQLite's locks (an empty -wal and a -shm may
            # appear beside it): by an open, or by verify's forensic one (a schema changed
            # outside its tables); a file every surface refused gets nothing at all.
            names = set(os.listdir(workdir)) - {"blobs", "ledger.db"}
            if result["open"] == "ok" or result["cli verify"] in ("exit 0", "exit 1"):
                names -= {"ledger.db-shm"}
                if (workdir / "ledger.db-wal").exists() and not (workdir / "ledger.db-wal").stat().st_size:
                    names -= {"ledger.db-wal"}
            changed = target.read_bytes() != mutant or bool(names)
            out.write(json.dumps({"seed": seed, "kind": kind, "result": result, "changed": changed}) + "\n")


def _worker_main() -> None:  # pragma: no cover — runs in a worker process
    """Entry point of a mutant worker: the job (template path, seeds, workdir) on stdin."""
    job = json.loads(sys.stdin.read())
    _mutant_worker(Path(job["template"]).read_bytes(), job["seeds"], Path(job["workdir"]),
                   int(sys.argv[1]), job["timeout_s"], job["hang_seed"])


_HERE = os.path.dirname(os.path.abspath(__file__))
_WORKER_CODE = (f"import sys; sys.path[:0] = [{_HERE!r}, {os.path.dirname(_HERE)!r}];"  # conftest
                " import test_hostile; test_hostile._worker_main()")


def run_mutants(template: Path, seeds: list[int], blobs: Path, root: Path, workers: int, *,
                timeout_s: int = MUTANT_TIMEOUT_S, hang_seed: int | None = None,
                ) -> Iterator[tuple[int, str, dict[str, Any] | None, bool | str]]:
    """Probe every seed's mutant of the ledger file `template` in `workers` fresh Python
    processes (not forks of the test process: no inherited locks or threads). Yields
    (seed, kind, result, changed) per seed; for a seed whose worker died, result is None
    and changed is "hang" (SIGALRM) or "signal N"; a new worker continues after it."""
    import selectors
    import subprocess

    data = template.read_bytes()
    sel = selectors.DefaultSelector()
    pending: dict[int, list[int]] = {}  # read fd -> its seeds not reported yet
    procs: dict[int, subprocess.Popen[bytes]] = {}
    buffers: dict[int, bytes] = {}
    dirs: dict[int, Path] = {}

    def spawn(chunk: list[int], workdir: Path) -> None:
        if not chunk:
            return
        r, w = os.pipe()
        proc = subprocess.Popen([sys.executable, "-c", _WORKER_CODE, str(w)], stdin=subprocess.PIPE,
                                pass_fds=(w,), env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        os.close(w)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"template": str(template), "seeds": chunk, "workdir": str(workdir),
                                     "timeout_s": timeout_s, "hang_seed": hang_seed}).encode())
        proc.stdin.close()
        pending[r], procs[r], buffers[r], dirs[r] = list(chunk), proc, b"", workdir
        sel.register(r, selectors.EVENT_READ)

    try:
        for i in range(workers):
            workdir = root / f"worker-{i}"
            workdir.mkdir()
            shutil.copytree(blobs, workdir / "blobs", symlinks=True)
            spawn(seeds[i::workers], workdir)
        while pending:
            for key, _ in sel.select():
                fd = key.fd
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    buffers[fd] += chunk
                    *lines, buffers[fd] = buffers[fd].split(b"\n")
                    for line in lines:
                        rec = json.loads(line)
                        pending[fd].remove(rec["seed"])
                        yield rec["seed"], rec["kind"], rec["result"], rec["changed"]
                    continue
                sel.unregister(fd)
                os.close(fd)
                code = procs.pop(fd).wait()
                rest, workdir = pending.pop(fd), dirs.pop(fd)
                buffers.pop(fd)
                if rest:  # the worker died on rest[0]
                    why = ("hang" if code == -signal.SIGALRM else f"signal {-code}" if code < 0
                           else f"exit {code}")
                    yield rest[0], mutate(data, rest[0])[0], None, why
                    spawn(rest[1:], workdir)
    finally:
        for fd, proc in procs.items():
            proc.kill()
            proc.wait()
            os.close(fd)
        sel.close()


@dataclass
class Sweep:
    mutants: int = 0
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    by_surface: dict[str, collections.Counter[str]] = field(default_factory=dict)
    untyped: dict[str, list[int]] = field(default_factory=dict)  # "surface: outcome" -> seeds
    hangs: list[int] = field(default_factory=list)
    crashes: list[tuple[int, str]] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    store_changed: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def table(self) -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.kinds.items()))
        lines = [(f"{self.mutants} mutants ({kinds}) in {self.elapsed_s:.1f}s; hangs {len(self.hangs)},"
                  f" crashes {len(self.crashes)}, files changed {len(self.changed)}")]
        for surface, counts in self.by_surface.items():
            shown = ", ".join(f"{k} {v}" for k, v in counts.most_common())
            lines.append(f"  {surface:<20} {shown}")
        return "\n".join(lines)

    def untyped_report(self, cli: bool) -> list[str]:
        return [f"{k} (seeds {', '.join(map(str, v[:5]))}{' …' if len(v) > 5 else ''}; {len(v)} in all)"
                for k, v in sorted(self.untyped.items()) if k.startswith("cli ") == cli]


#: The template's workspace lives at a fixed path: its root is recorded in the ledger.
TEMPLATE_WS_HOME = Path("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()) / "steptrail-hostile-template"


def build_mutant_template(root: Path) -> World:
    """A world built on a fake clock, with a fixed ledger id and workspace path: the same
    bytes every run, so a seed names the same mutant every run (for the same code). The
    ledger and blobs land in `root`; builds are serialized by a lock file."""
    import fcntl

    fixed_ns = 1_700_000_000_000_000_000
    TEMPLATE_WS_HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(str(TEMPLATE_WS_HOME) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(TEMPLATE_WS_HOME, ignore_errors=True)
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(dbmod.uuid, "uuid4", lambda: uuid.UUID(int=0x5354_4C47))
                mp.setattr(dbmod.time, "time_ns", lambda: fixed_ns)
                # the root's device and inode differ per build: record fixed ones, and
                # check none while building (the template's workspace is removed after)
                mp.setattr(places_mod, "identity_of", lambda st: (1, 1))
                mp.setattr(places_mod.Registration, "identity", property(lambda self: None))
                # and the ledger directory's identity, recorded with the registration: a
                # rebuilt directory's inode is whatever the file system hands out (the
                # same one when nothing else ran in between, another under load)
                from ledger.workspace import core as core_mod

                mp.setattr(core_mod.OwnFiles, "place", lambda self: (
                    os.path.realpath(self._dir), 1, 1) if self._dir else None)
                w = build_world(TEMPLATE_WS_HOME, clock=FakeClock(fixed_ns))
            root.mkdir(parents=True)
            shutil.copytree(w.db.parent, root / "led", symlinks=True)
        finally:
            shutil.rmtree(TEMPLATE_WS_HOME, ignore_errors=True)
    return World(root, w.epoch)


@pytest.fixture(scope="module")
def sweep() -> Iterator[Sweep]:
    root = Path(tempfile.mkdtemp(prefix="hostile-mutants-", dir=_scratch_root()))
    try:
        template = build_mutant_template(root / "template")
        store_before = tree(template.blobs)
        workers = max(1, min(4, os.cpu_count() or 1))
        out = Sweep()
        start = time.perf_counter()
        seeds = list(range(MUTANT_SEED0, MUTANT_SEED0 + MUTANTS))
        for seed, kind, result, changed in run_mutants(template.db, seeds, template.blobs, root, workers):
            out.mutants += 1
            out.kinds[kind] += 1
            tried("ledger-file mutants")
            if changed == "hang":
                out.hangs.append(seed)
            elif isinstance(changed, str):
                out.crashes.append((seed, changed))
            else:
                if changed:
                    out.changed.append(seed)
                assert result is not None
                tried("mutant probes", len(result))
                for surface, got in result.items():
                    out.by_surface.setdefault(surface, collections.Counter())[
                        got.split("@")[0] if got.startswith("UNTYPED") else got] += 1
                    if got.startswith("UNTYPED") or "BAD-OUTPUT" in got:
                        out.untyped.setdefault(f"{surface}: {got}", []).append(seed)
        out.elapsed_s = time.perf_counter() - start
        for i in range(workers):
            out.store_changed += changes(store_before, tree(root / f"worker-{i}" / "blobs"))
        yield out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_mutant_harness_catches_a_hang(scratch: Path) -> None:
    """The harness is not vacuous: a probe that never returns is killed, reported as a hang
    of its seed, and a new worker carries on with the seeds after it."""
    template = build_mutant_template(scratch / "t")
    seeds = [7, 8, 9]
    got = {seed: (result is not None, changed) for seed, _, result, changed in run_mutants(
        template.db, seeds, template.blobs, scratch, 1, timeout_s=1, hang_seed=8)}
    assert got == {7: (True, False), 8: (False, "hang"), 9: (True, False)}


def test_mutant_template_is_deterministic(scratch: Path) -> None:
    """Seeds are only reproducible if the template has the same bytes every run."""
    a = build_mutant_template(scratch / "a").db.read_bytes()
    b = build_mutant_template(scratch / "b").db.read_bytes()
    assert a == b


def test_mutants_never_hang_crash_or_write(sweep: Sweep, request: pytest.FixtureRequest) -> None:
    """Every mutant: no hang, no signal, the file byte-identical with no -wal/-shm created,
    the blob store beside it untouched; every outcome is a typed error, a clean verify or a
    report with findings (untyped errors are pinned by the BUG tests below)."""
    report_line(request, "\nmutant sweep: " + sweep.table())
    assert sweep.mutants == MUTANTS
    assert sweep.hangs == [], f"hung (killed after {MUTANT_TIMEOUT_S}s): seeds {sweep.hangs}"
    assert sweep.crashes == [], sweep.crashes
    assert sweep.changed == [], f"a read-only open changed the file: seeds {sweep.changed}"
    assert sweep.store_changed == []
    # the sweep is not vacuous: many mutants open, many are refused, verify finds damage
    lib = sweep.by_surface["open"]
    assert lib["ok"] > MUTANTS // 10 and sum(v for k, v in lib.items() if k.startswith("typed")) > MUTANTS // 10
    assert sweep.by_surface["verify"]["findings"] > 0
    for surface, counts in sweep.by_surface.items():
        if surface.startswith("cli "):  # never exit 3: a damaged file is not an environment failure
            assert all(k in ("exit 0", "exit 1", "exit 2") or k.startswith(("UNTYPED", "exit 0 BAD",
                       "exit 1 BAD", "exit 2 BAD")) for k in counts), (surface, counts)


def test_mutants_raise_only_typed_errors(sweep: Sweep) -> None:
    bad = sweep.untyped_report(cli=False)
    assert not bad, "untyped exceptions from the library:\n" + "\n".join(bad)


def test_mutants_cli_never_traceback(sweep: Sweep) -> None:
    bad = sweep.untyped_report(cli=True)
    assert not bad, "tracebacks from the CLI:\n" + "\n".join(bad)


# === 11. defects found by this corpus (once strict xfails, fixed since) ====================


def _corrupt_text(column: str) -> Callable[[World], None]:
    """Store invalid UTF-8 in a TEXT cell (SQLite never validates it; STRICT checks only the
    storage class). `events` goes through `tamper` (its triggers refuse UPDATE)."""
    table, col, where_sql = {
        "events.step": ("events", "step", "seq = 1"),
        "steps.state": ("steps", "state", "step_id = 'art-file'"),
        "manifest_entries.path": ("manifest_entries", "path", "step = 'art-file' AND path = 'out/big.bin'"),
        "workspaces.root": ("workspaces", "root", "name = 'w'"),
        "meta.ledger_id": ("meta", "value", "key = 'ledger_id'"),
    }[column]
    sql = f"UPDATE {table} SET {col} = CAST(X'C328FFFE' AS TEXT) WHERE {where_sql}"

    def plant(w: World) -> None:
        if table == "events":
            tamper(w.db, [(sql, ())])
        else:
            _raw(w.db, sql)

    return plant


def _payload_not_json(w: World) -> None:
    tamper(w.db, [("UPDATE events SET payload = X'7B7B7B' WHERE seq = 1", ())])


def _meta_not_a_number(w: World) -> None:
    """Ledger.__init__ reads meta 'compensation_window_s' with a bare float()."""
    _raw(w.db, "INSERT OR REPLACE INTO meta(key, value) VALUES ('compensation_window_s', '864Q0.0')")


CORRUPT_ROWS = {
    **{c: _corrupt_text(c) for c in ("events.step", "steps.state", "manifest_entries.path",
                                      "workspaces.root", "meta.ledger_id")},
    "events.payload-not-json": _payload_not_json,
    "meta.compensation_window_s-not-a-number": _meta_not_a_number,
}


def test_corrupt_rows_are_reported_not_raised(world: World) -> None:
    failures = []
    for name, plant in CORRUPT_ROWS.items():
        w = build_world(world.root / f"c-{name}")
        plant(w)
        before = w.snap()
        try:
            led = w.open(readonly=True)
        except LedgerError:
            led = None
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name}: open: untyped {type(exc).__name__} @ {where(exc)}")
            led = None
        if led is not None:
            with led:
                for surface, fn in LIB_SURFACES.items():
                    tried("corrupt-rows")
                    got = outcome(fn, led)
                    if got.startswith("UNTYPED"):
                        failures.append(f"{name}: {surface}: {got}")
        for argv in [*CLI_SURFACES, ("blobs",), ("workspace", "show", "w"), ("metrics",)]:
            tried("corrupt-rows")
            problem = cli_problem(invoke(w.db, *argv), (0, 1, 2))
            if problem:
                failures.append(f"{name}: steptrail {' '.join(argv)}: {problem.splitlines()[0]}")
        if changes(before, w.snap()):
            failures.append(f"{name}: a read changed files")
    assert not failures, "\n".join(failures)


def test_corrupt_rows_never_change_the_file(world: World) -> None:
    """What holds already for the same damaged rows: no command rewrites the file."""
    for name, plant in CORRUPT_ROWS.items():
        w = build_world(world.root / f"c-{name}")
        plant(w)
        before = w.snap()
        for argv in [*CLI_SURFACES, ("blobs",), ("metrics",)]:
            tried("corrupt-rows")
            invoke(w.db, *argv)
        assert changes(before, w.snap()) == [], name


def test_rejected_apply_leaves_created_directories(world: World) -> None:
    with world.open() as led:
        led.workspaces.plan_step("rj", workspace="w", epoch=world.epoch,
                      writes=[Write("deep/new/f.txt", b"f\n", None), Write("app.py", b"rj\n", sha256(V2))])
        (world.ws / "app.py").write_bytes(b"a human edit\n")
        before = tree(world.ws)
        tried("workspace-fence")
        assert led.workspaces.apply("rj", epoch=world.epoch).verdict == "rejected:pre_hash"
    assert changes(before, tree(world.ws)) == []


def test_zombie_apply_creates_directories(world: World) -> None:
    with world.open() as led:
        led.workspaces.plan_step("zb", workspace="w", epoch=world.epoch, writes=[Write("zdir/sub/g.txt", b"g\n", None)])
        led.workspaces.release("w", world.epoch)
        before = tree(world.ws)
        tried("workspace-fence")
        with pytest.raises(StaleEpoch):
            led.workspaces.apply("zb", epoch=world.epoch)
    assert changes(before, tree(world.ws)) == []


@pytest.mark.parametrize("level", ["fan-symlink", "tmp-symlink"])
def test_refused_blob_store_write_leaves_a_pin(world: World, level: str) -> None:
    _new_blob_levels(world, sha256(NEW))[level]()
    before = world.snap()
    with world.open() as led:
        n = led.count()
        tried("blob-store")
        with pytest.raises(BlobCorrupt):
            led.store("open", 1, "o2.bin", NEW)
        assert led.count() == n
    assert changes(before, world.snap()) == []


def test_foreign_wal_is_refused_but_creates_shm(world: World) -> None:
    other = world.root / "other.db"
    conn = apsw.Connection(str(other))
    conn.execute("PRAGMA journal_mode=WAL").fetchall()
    conn.execute("PRAGMA wal_autocheckpoint=0").fetchall()
    conn.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
    shutil.copyfile(str(other) + "-wal", str(world.db) + "-wal")
    conn.close()
    other.unlink()
    before = world.snap()
    tried("foreign-sqlite")
    run_cli(world.db, "verify", match="-wal")
    assert changes(before, world.snap()) == []


def _ledger_symlink(w: World) -> None:
    real = w.root / "real.db"
    os.rename(w.db, real)
    os.symlink(real, w.db)


def _shm_symlink(w: World) -> None:
    (w.root / "victim").write_bytes(b"victim\n")
    os.symlink(w.root / "victim", str(w.db) + "-shm")


@pytest.mark.parametrize("plant", [_ledger_symlink, _shm_symlink], ids=["ledger-symlink", "shm-symlink"])
def test_symlinked_ledger_write_is_a_disk_failure(world: World, plant: Callable[[World], None]) -> None:
    plant(world)
    before = world.snap()
    tried("foreign-sqlite")
    run_cli(world.db, "--workspace", "w", "lease", "heartbeat", "--epoch", str(world.epoch),
            match="symlink")
    assert changes(before, world.snap()) == []


def test_fifo_as_ledger_hangs(world: World) -> None:
    fifo = world.root / "fifo.db"
    os.mkfifo(fifo)
    tried("foreign-sqlite")
    with deadline(HANG_TIMEOUT_S):
        run_cli(fifo, "steps", match="not")


@pytest.mark.parametrize("via", ["step-store", "plan-content-file"])
def test_non_regular_input_file_hangs(world: World, via: str) -> None:
    os.mkfifo(world.inputs / "fifo")
    tried("json")
    with deadline(HANG_TIMEOUT_S):
        if via == "step-store":
            run_cli(world.db, "step", "store", "sx", "fifo", match="fifo")
        else:
            doc = {"step": "sx", "writes": [{"path": "a", "pre_hash": None, "content_file": "fifo"}]}
            (world.inputs / "plan.json").write_text(json.dumps(doc))
            run_cli(world.db, "--workspace", "w", "step", "plan", "--epoch", str(world.epoch),
                    "plan.json", match="content_file")


SURROGATE_ARGVS: list[tuple[str, ...]] = [
    ("show", "\udcff"),
    ("step", "ack", "s\udcff"),
    ("events", "--step", "\udcff"),
    ("--workspace", "\udcff", "lease", "show"),
    ("--workspace", "w", "lease", "acquire", "--holder", "\udcff", "--force"),
    ("step", "compensate", "open", "--reason", "\udcff"),
    ("--workspace", "w", "workspace", "snapshot", "a\udcff"),
    ("step", "store", "\udcff", "in.txt"),
    ("step", "store", "sx", "\udcff.txt"),
]


@pytest.mark.parametrize("argv", SURROGATE_ARGVS, ids=lambda a: " ".join(a)[:40].encode("ascii", "backslashreplace").decode())
def test_non_utf8_argument_is_a_traceback(world: World, argv: tuple[str, ...]) -> None:
    (world.inputs / "\udcff.txt").write_bytes(b"x")
    before = world.snap()
    tried("encoding")
    run_cli(world.db, *argv)
    assert changes(before, world.snap()) == []


def test_lone_surrogates_are_untyped_in_the_library(world: World) -> None:
    cases: list[tuple[str, Callable[[Ledger], Any]]] = [
        ("plan", lambda led: led.plan("\ud800")),
        ("step", lambda led: led.step("s\udcff")),
        ("timeline", lambda led: led.timeline("\udcff")),
        ("workspace", lambda led: led.workspaces.get("\udcff")),
        ("acquire holder", lambda led: led.workspaces.acquire("w", "\udcff", 60, force=True)),
        ("snapshot path", lambda led: led.workspaces.snapshot("w", "a\udcff")),
        ("store path", lambda led: led.store("open", 1, "a\udcff", b"x")),
        ("plan artifacts", lambda led: led.plan(uid("u"), artifacts=["a\udcff"])),
        ("plan_step write", lambda led: led.workspaces.plan_step(uid("u"), workspace="w", epoch=world.epoch,
                                                      writes=[Write("a\udcff", b"x", None)])),
    ]
    failures = []
    with world.open() as led:
        for name, fn in cases:
            tried("encoding")
            got = outcome(fn, led)
            if got != "typed:InvalidInput":
                failures.append(f"{name}: {got}")
    assert not failures, "\n".join(failures)


HUGE = str(10**30)


@pytest.mark.parametrize("argv", [
    ("events", "--after", HUGE),
    ("--workspace", "w", "lease", "settle", "--epoch", HUGE),
    ("step", "apply", "p3", "--epoch", HUGE),
    ("--workspace", "w", "step", "plan", "--epoch", HUGE, "plan.json"),
    ("audit", "--grace", "9" * 400),
    ("gc", "--dry-run", "--grace", "9" * 400),
], ids=["events-after", "lease-settle-epoch", "step-apply-epoch", "step-plan-epoch", "audit-grace",
        "gc-grace"])
def test_huge_integer_option_is_a_traceback(world: World, argv: tuple[str, ...]) -> None:
    with world.open() as led:
        led.workspaces.plan_step("p3", workspace="w", epoch=world.epoch, writes=[Write("p3.txt", b"p\n", None)])
    (world.inputs / "plan.json").write_text(json.dumps({"step": "p4"}))
    before = world.snap()
    tried("oversized")
    run_cli(world.db, *argv, codes=(1, 2))
    assert changes(before, world.snap()) == []


@pytest.mark.parametrize("what", ["plan", "receipt"])
def test_deeply_nested_json_is_a_traceback(world: World, what: str) -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    before = world.snap()
    tried("json")
    if what == "plan":
        run_cli(world.db, "--workspace", "w", "step", "plan", "--epoch", str(world.epoch), "-", input=body)
    else:
        run_cli(world.db, "step", "publish", "s2", "--receipt", "-", input=body)
    assert changes(before, world.snap()) == []


@pytest.mark.parametrize("case", ["snapshot-lib", "snapshot-cli", "apply-lib", "restore-lib", "restore-cli"])
def test_os_errors_from_bad_paths_are_untyped(world: World, case: str) -> None:
    long = "x" * 256
    (world.root / "afile").write_bytes(b"x")
    target = str(world.root / "afile" / "sub")
    tried("paths")
    if case == "snapshot-lib":
        with world.open() as led, pytest.raises(InvalidInput):
            led.workspaces.snapshot("w", long)
    elif case == "snapshot-cli":
        run_cli(world.db, "--workspace", "w", "workspace", "snapshot", long)
    elif case == "apply-lib":
        with world.open() as led:
            before = tree(world.ws)
            with pytest.raises(LedgerError):  # refused at plan (check_relpath), or at apply
                led.workspaces.plan_step("nl", workspace="w", epoch=world.epoch, writes=[Write("d/" + long, b"x", None)])
                led.workspaces.apply("nl", epoch=world.epoch)
            assert changes(before, tree(world.ws)) == []
    elif case == "restore-lib":
        with world.open() as led, pytest.raises(InvalidInput):
            led.workspaces.restore("w", target, force=True)
    else:
        run_cli(world.db, "--workspace", "w", "restore", "--to", target, "--force")


def test_oversized_event_is_an_untyped_TooBigError(world: World) -> None:
    n = 10_000  # ITEMS_MAX artifacts and writes of PATH_MAX characters: about 82 MB of JSON
    event = Planned(step=uid("big"), attempt=1,
                    artifacts=tuple(f"{i:05d}/" + "/".join(["a" * 254] * 16) for i in range(n)),
                    writes=tuple(ledger_pkg.PlannedWrite(path=f"{i:05d}/" + "/".join(["b" * 254] * 16),
                                                         base_rev=0)
                                 for i in range(n)))
    before = world.snap()
    tried("oversized")
    with world.open() as led:
        try:
            led.append(event)
        except InvalidInput:
            pass
    assert changes(before, world.snap()) == []


def test_wrong_typed_library_arguments_are_untyped(world: World) -> None:
    cases: list[tuple[str, Callable[[Ledger], Any]]] = [
        ("store data str", lambda led: led.store("open", 1, "o.txt", "text")),  # type: ignore[arg-type]
        ("store data None", lambda led: led.store("open", 1, "o.txt", None)),  # type: ignore[arg-type]
        ("check_receipt list", lambda led: led.workspaces.check_receipt([1])),  # type: ignore[arg-type]
        ("check_receipt int", lambda led: led.workspaces.check_receipt(5)),  # type: ignore[arg-type]
        ("verify expect_head int", lambda led: led.verify(expect_head=5)),  # type: ignore[arg-type]
        ("read after 2**100", lambda led: list(led.read(2**100))),
        ("unsettled huge epoch", lambda led: led.workspaces.unsettled("w", 2**100)),
        ("settle huge epoch", lambda led: led.workspaces.settle("w", 2**100)),
        ("delete_temp None", lambda led: led.blobs.delete_temp(None)),  # type: ignore[arg-type]
        ("append run bytes", lambda led: led.append(Planned(step=uid("t"), attempt=1, run=b"r"))),  # type: ignore[arg-type]
        ("plan_step base_rev str", lambda led: led.workspaces.plan_step(
            uid("t"), workspace="w", epoch=world.epoch, writes=[Write("q", b"q", None, "1")])),  # type: ignore[arg-type]
    ]
    failures = []
    before = world.snap()
    with world.open() as led:
        for name, fn in cases:
            tried("types")
            got = outcome(fn, led)
            if not got.startswith("typed:"):
                failures.append(f"{name}: {got}")
    assert changes(before, world.snap()) == []
    assert not failures, "\n".join(failures)


RETRIED_WRITES: dict[str, list[Write]] = {
    "path-escapes": [Write("../../etc/passwd", b"x", None)],
    "bad-pre-hash": [Write("app.py", b"x", "A" * 64)],
    "same-path-twice": [Write("a", b"x", None), Write("a", b"y", None)],
}


@pytest.mark.parametrize("case", ["lib-path-escapes", "lib-bad-pre-hash", "lib-same-path-twice",
                                  "cli-path-escapes", "cli-same-path-twice"])
def test_a_retried_plan_is_not_validated(world: World, case: str) -> None:
    via, _, name = case.partition("-")
    writes = RETRIED_WRITES[name]
    before = world.snap()
    if via == "lib":
        with world.open() as led:
            for step in (uid("fresh"), "s2"):  # s2 is in flight (applied, not published)
                tried("json")
                with pytest.raises(InvalidInput):
                    led.workspaces.plan_step(step, workspace="w", epoch=world.epoch, writes=writes)
    else:
        argv = ("--workspace", "w", "step", "plan", "--epoch", str(world.epoch), "-")
        for step in (uid("fresh"), "s2"):
            doc = {"step": step, "writes": [{"path": w.path, "pre_hash": w.pre_hash,
                                             "content": (w.content or b"").decode()} for w in writes]}
            run_cli(world.db, *argv, input=json.dumps(doc), category="json")
    assert changes(before, world.snap()) == []


def test_error_message_spans_many_lines(world: World) -> None:
    conn = apsw.Connection(str(world.db))
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("UPDATE sqlite_schema SET sql = replace(sql, 'epoch INTEGER', '`och INTEGER')"
                 " WHERE name = 'events'")
    conn.close()
    before = world.snap()
    tried("foreign-sqlite")
    run_cli(world.db, "verify", match="malformed")
    assert changes(before, world.snap()) == []


def test_regression_a_schema_row_whose_name_is_not_text_is_a_finding(world: World) -> None:
    """Found by the 5,000-mutant sweep (seed 20,245,483, a flipped bit in sqlite_schema):
    a trigger's name stored as a BLOB made `verify` sort TEXT against BLOB keys — an
    untyped TypeError, a traceback, and the -shm left behind. Now it is a schema finding
    naming the row; nothing on disk changes."""
    conn = apsw.Connection(str(world.db))
    conn.execute("PRAGMA writable_schema=ON")
    conn.execute("UPDATE sqlite_schema SET name = CAST(name AS BLOB) WHERE name = 'events_no_delete'")
    conn.close()
    before = world.snap()
    tried("foreign-sqlite")
    r = run_cli(world.db, "verify", codes=(1,), match="trigger <bytes b'events_no_delete'> was added")
    assert changes(before, world.snap()) == []


# === 12. the witness taken away, the ledger rolled back ====================================
# tests/log/test_witness.py covers a rolled-back ledger file whose witness is also taken
# away. Here the rest, on a full world (blobs, a workspace): the whole ledger directory,
# blob store included, put back from an older copy under an intact witness; and the witness
# deleted, emptied or zero-filled under a ledger that was not rolled back. Every library
# entry point and every command refuses (typed; the CLI one line, exit 1, naming the way
# back); `verify` reports it; every file under the root, the witness's included, unchanged.

WITNESS_ATTACKS = ["rolled-back", "witness-deleted", "witness-empty", "witness-zeros"]


@pytest.fixture
def witnessed(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    w = build_world(scratch / "world", witnessed=True)
    monkeypatch.chdir(w.inputs)
    return w


def _attack_witness(w: World, attack: str, scratch: Path) -> None:
    if attack == "rolled-back":
        backup = scratch / "backup"  # the ledger's directory as it was: closed, no -wal
        shutil.copytree(w.db.parent, backup, symlinks=True)
        with w.open() as led:
            run_step(led, "newer", {"out/newer.bin": BIG + b"newer"})  # a new blob file
        shutil.rmtree(w.db.parent)
        shutil.copytree(backup, w.db.parent, symlinks=True)
    else:
        damage_witness(w.witness, attack.removeprefix("witness-"))


WITNESS_COMMANDS: list[tuple[str, ...]] = [
    *FOREIGN_COMMANDS, ("--witness", "{witness}", "events"),
    ("--workspace", "w", "workspace", "snapshot", "app.py"),
    ("--workspace", "w", "step", "plan", "--epoch", "{epoch}", "-"),
]


@pytest.mark.parametrize("attack", WITNESS_ATTACKS)
def test_a_witness_taken_away_or_a_rolled_back_directory_is_refused_by_the_library(
        witnessed: World, scratch: Path, attack: str) -> None:
    w = witnessed
    _attack_witness(w, attack, scratch)
    error = WitnessMismatch if attack == "rolled-back" else WitnessMissing
    ways: dict[str, Callable[[], object]] = {
        "open read-only": lambda: Ledger.open(w.db, readonly=True),
        "open": lambda: Ledger.open(w.db),
        "open --witness": lambda: Ledger.open(w.db, witness=w.witness),
        "open read-only --witness": lambda: Ledger.open(w.db, readonly=True, witness=w.witness),
        "init": lambda: Ledger.init(w.db),
        "init --witness": lambda: Ledger.init(w.db, witness=w.witness),
    }
    before = w.snap()
    failures = []
    for way, call in ways.items():
        tried("witness")
        got = outcome(call)
        if got != f"typed:{error.__name__}":
            failures.append(f"{way}: {got}, expected {error.__name__}")
    if attack == "rolled-back":  # the witness says history was lost: only --force anchors
        tried("witness")
        with pytest.raises(AnchorRefused, match="force=True"):
            Ledger.anchor_witness(w.db)
    with Ledger.open(w.db, readonly=True, witness_check=False) as led:
        report = led.verify()
    assert not report.ok and "witness" in {f.check for f in report.findings}, report.findings
    assert not failures, "\n".join(failures)
    assert changes(before, w.snap()) == []


@pytest.mark.parametrize("attack", WITNESS_ATTACKS)
def test_a_witness_taken_away_or_a_rolled_back_directory_is_refused_by_the_cli(
        witnessed: World, scratch: Path, attack: str) -> None:
    w = witnessed
    _attack_witness(w, attack, scratch)
    before = w.snap()
    plan = json.dumps({"step": uid("late"), "writes": [{"path": "late.txt", "pre_hash": None,
                                                         "content": "x"}]})
    commands = [tuple(a.format(witness=w.witness, epoch=w.epoch) for a in argv)
                for argv in WITNESS_COMMANDS]
    if attack == "rolled-back":
        commands.append(("witness", "anchor"))  # refused without --force (AnchorRefused)
    for argv in commands:
        r = run_cli(w.db, *argv, codes=(1,), category="witness",
                    input=plan if argv[-1] == "-" else None)
        if argv == ("verify",):
            assert "witness" in r.stdout, r.stdout
        elif argv == ("witness", "anchor"):
            assert "AnchorRefused" in r.stderr and "--force" in r.stderr, r.stderr
        else:  # the error names the witness and the way back
            assert "Witness" in r.stderr and "witness anchor" in r.stderr, (argv, r.stderr)
        assert changes(before, w.snap()) == [], argv
    r = run_cli(w.db, "witness", "show", "--json", codes=(0,), category="witness")
    state = "mismatch" if attack == "rolled-back" else attack.removeprefix("witness-").replace(
        "deleted", "missing").replace("empty", "blank").replace("zeros", "blank")
    assert json.loads(r.stdout)["state"] == state, r.stdout
    assert changes(before, w.snap()) == []


def test_regression_a_verify_that_cannot_build_its_scratch_copy_reports_it(scratch: Path) -> None:
    """Two mutants of the full sweep (a flipped bit, set bytes: a trigger changed and a
    page malformed): the forensic open accepted them, verify's scratch copy could not be
    made (SQLite: 'database disk image is malformed'), and verify raised CorruptLedger
    (exit 2) instead of reporting it — leaving the -wal/-shm of the accepted open beside a
    file it then refused. Now a finding (exit 1), like every other unreadable part."""
    template = build_mutant_template(scratch / "t")
    # 20241540 replaces 20242251 since schema v4 (sealed runs) moved the file's bytes:
    # the same mutant class (set bytes: the events_no_delete trigger changed, a page
    # malformed), found again by the same criteria on the new template.
    for seed, _kind, result, changed in run_mutants(template.db, [20241344, 20241540],
                                                    template.blobs, scratch, 1):
        assert result is not None and result["cli verify"] == "exit 1", (seed, result)
        assert changed is False, seed
