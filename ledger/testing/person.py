"""The person injector: a person with an editor and a shell at every file operation of
a step, and the checker that says whether anything they did was lost (issue 36, "Proof
by exhaustion, not by races").

Races are samples; this enumerates. The ledger's file-operation seam
(``Ledger.open(path, on_op=f)``: ``f(name)`` before each file operation) names every
workspace operation ``ws-...`` (``ws-write``, ``ws-rename``, ``ws-unlink``, and
whatever a later version adds: ``ws-exchange``, ``ws-link``, ...). Each call whose name
starts with ``ws-`` is a *point*; nothing else counts. For a small multi-path step
(`WORKLOAD`: an edit, a create, a delete, a swap of two files, a move between
directories, a mode change) and each of the `SCENARIOS` through which its bytes move —
an apply that commits, an apply refused at its last path (every landed path taken
back), an undo of the committed step, a crash at a point and the next epoch's settling,
a person during that settling or during the step run again, an undo crashed at a point
— the runner

1. counts the scenario's points with no person (`Runner.count_points`: each point's
   name and the step path it is about to touch, read from the workspace code's frames
   where they say so: `guess_target`);
2. for every point i and every person action a of `ACTIONS` (on the path point i is
   about to touch, or on each of the step's paths when that cannot be told: `targets`),
   runs the scenario again from the same starting state with a done at point i, and
   lets it finish (or refuse, or crash and recover: the crashed ledger is abandoned,
   reopened without the hook, and a new epoch force-acquired, which settles the old
   one's attempts; a step still in flight after that is settled once more);
3. hands what happened to `check`, a pure function over the person's recorded actions,
   the disk before and after, the ledger's account and the returned outcomes.

Every byte a person writes is unique (``person:<action>:<point>:<n>``) and recorded.
The predicate (`check`), per issue 36 — losses:

(1) every byte string a person wrote last to a name (and every name the person made)
    is at a visible path at the end (a steptrail temporary is not visible: `temp_stamp`
    of a component is not None), or the outcome and the ledger both name where it is;
    never only in a hidden temporary;
(2) a name the person deleted stays deleted unless the ledger's record of the step put
    it there by plan;
(3) a person's chmod is kept, or reported (by the outcome and the ledger);
(4) a directory the person renamed: every file of it at a visible path under the new
    name, and for each step path in it the digest the ledger says at its new place, or
    reported;
(7) content the step moved between paths (a move: deleted at one, created at another)
    that the ledger's verdict puts on disk is at a visible path, unless the person saved over it themselves (an
    undo of a move does not delete the destination while the source cannot take the
    content back: issue 36, 4);

accounting: (4) a directory the person moved away is not recreated (one that did not
exist before the step, which the step's own plan makes, may be made again); (5) every step
path the person did not touch holds the digest the ledger's account says (or the
outcome and the ledger report the digest it holds); (6) no temporary holds bytes that
neither the ledger nor a visible path holds, and the ledger verifies.

Two modes (`exchange_mode`): with the exchange call (renameat2) and without it
(``exchange._CALL = None``, the fallback); the fallback may leave a name absent for a
moment, nothing else, so the predicate is the same.

Run it: ``python -m ledger.testing.person [--full] [--mode M] [--scenario S]
[--sweep N]`` prints the table (mode x scenario x action: runs, not applicable, runs
with a loss, runs with an accounting problem, runs where the operation raised instead of
answering, runs settled a second time, seconds) and the failing runs grouped.
tests/workspace/test_person_injector.py runs a slice (`SLICE`) in ``make test``, and the whole
table and a seeded random sweep with ``STEPTRAIL_FAULTS_FULL=1``.

The standard library and the ledger only; the runtime never imports this module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import random
import shutil
import stat
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..errors import LedgerError
from ..workspace import directory as _directory
from ..workspace import exchange
from ..workspace.names import temp_stamp
from .faults import scratch_root

#: A call of the seam whose name starts with this is a point; nothing else counts.
POINT_PREFIX: Final = "ws-"
WORKSPACE: Final = "w"
STEP: Final = "person-step"
SEED: Final = "seed"
MODES: Final = ("exchange", "fallback")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def short(digest: str | None) -> str:
    """A digest as a person reads it in a problem line."""
    if digest is None:
        return "absent"
    if digest.startswith("symlink:") or digest.startswith("<"):
        return digest
    return digest[:10]


# -- the workload ------------------------------------------------------------------------


@dataclass(frozen=True)
class PathWrite:
    """One write of the workload step: `pre` on disk before (None: absent), `post` after
    (None: deleted); `mode` for a mode change; `kind` what it is part of."""

    path: str
    pre: bytes | None
    post: bytes | None
    kind: str
    mode: int | None = None


#: The step: an edit, a create, a delete, a swap, a move between directories, a mode
#: change — in this order (the mode change last: `refuse` makes it the path that fails).
WORKLOAD: Final = (
    PathWrite("src/app.py", b"app v0\n", b"app v1\n", "edit"),
    PathWrite("src/new.py", None, b"new v1\n", "create"),
    PathWrite("src/old.py", b"old v0\n", None, "delete"),
    PathWrite("pair/a.txt", b"A v0\n", b"B v0\n", "swap"),
    PathWrite("pair/b.txt", b"B v0\n", b"A v0\n", "swap"),
    PathWrite("src/m.txt", b"moved v0\n", None, "move"),
    PathWrite("dst/m.txt", None, b"moved v0\n", "move"),
    PathWrite("bin/run.sh", b"#!/bin/sh\necho v0\n", b"#!/bin/sh\necho v0\n", "mode", 0o755),
)
#: The mode every seeded file has (not the umask's: runs compare modes).
SEED_MODE: Final = 0o644


def workload_writes(workload: Sequence[PathWrite]) -> list[Any]:
    from ..step.values import Write

    return [Write(w.path, w.post, None if w.pre is None else sha(w.pre), mode=w.mode)
            for w in workload]


# -- the disk ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One name on disk: `kind` file / dir / symlink / other; `digest` (a file's sha256,
    ``symlink:TARGET``, None for a directory); `mode` (permission bits)."""

    kind: str
    digest: str | None
    mode: int


NOT_A_FILE: Final = "<not a regular file>"


def snapshot(root: Path) -> dict[str, Entry]:
    """Every name below `root` (relative, '/'-separated), never following a symlink."""
    out: dict[str, Entry] = {}

    def walk(d: Path, rel: str) -> None:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return
        for name in names:
            p = d / name
            r = f"{rel}{name}"
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[r] = Entry("symlink", "symlink:" + os.readlink(p), mode)
            elif stat.S_ISDIR(st.st_mode):
                out[r] = Entry("dir", None, mode)
                walk(p, r + "/")
            elif stat.S_ISREG(st.st_mode):
                try:
                    data = p.read_bytes()
                except OSError:
                    out[r] = Entry("other", NOT_A_FILE, mode)
                    continue
                out[r] = Entry("file", sha(data), mode)
            else:
                out[r] = Entry("other", NOT_A_FILE, mode)

    walk(root, "")
    return out


def visible(path: str) -> bool:
    """A name a person sees: no component of it is a steptrail temporary."""
    return all(temp_stamp(part) is None for part in path.split("/"))


def digest_at(disk: Mapping[str, Entry], path: str) -> str | None:
    e = disk.get(path)
    if e is None:
        return None
    return e.digest if e.kind in ("file", "symlink") else NOT_A_FILE


# -- the person --------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    """One thing a person did, as the checker reads it.

    `what`: ``wrote`` (bytes `digest` to `path`), ``made`` (a name `path` holding
    existing content `digest`: a file moved aside, a hard link), ``deleted``, ``chmod``
    (`mode`), ``swapped`` (a symlink or directory now at `path`), ``renamed-dir``
    (`path` renamed to `to`, `entries` what it held then: relative name -> Entry).
    `replaced`: the content the action took off the name (a save over a file, a write
    in place, a delete): the person's to lose, not the step's."""

    what: str
    path: str
    action: str
    point: int
    digest: str | None = None
    mode: int | None = None
    to: str = ""
    entries: Mapping[str, Entry] = field(default_factory=dict)
    replaced: str | None = None

    def line(self) -> str:
        return f"{self.action}@{self.point}"


ACTIONS: Final = ("rename-save", "in-place", "second-save", "delete", "create", "chmod",
                  "rename-parent", "symlink", "directory", "hard-link")


@dataclass(frozen=True)
class Action:
    """Person action `name` at point `point` (1-based: the point-th ``ws-`` call) on
    step path `target`."""

    name: str
    point: int
    target: str

    def label(self) -> str:
        return f"{self.name}@{self.point}:{self.target}"


class Person:
    """A person acting on a workspace from outside, as with an editor and a shell; every
    action is recorded (`effects`) and every byte written is unique."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.effects: list[Effect] = []
        self.n = 0

    def data(self, action: str, point: int) -> bytes:
        self.n += 1
        return f"person:{action}:{point}:{self.n}\n".encode()

    def _lstat(self, rel: str) -> os.stat_result | None:
        try:
            return os.lstat(self.root / rel)
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _is_file(self, rel: str) -> bool:
        st = self._lstat(rel)
        return st is not None and stat.S_ISREG(st.st_mode)

    def _parent_ok(self, rel: str) -> bool:
        parent = rel.rpartition("/")[0]
        if not parent:
            return True
        st = self._lstat(parent)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def _content(self, rel: str) -> str | None:
        """The digest of the regular file at `rel` now (None: none)."""
        if not self._is_file(rel):
            return None
        with contextlib.suppress(OSError):
            return sha((self.root / rel).read_bytes())
        return None

    def _record(self, what: str, path: str, action: str, point: int, **kw: Any) -> None:
        self.effects.append(Effect(what, path, action, point, **kw))

    def act(self, name: str, point: int, target: str) -> bool:
        """Do `name` on `target` now; False when it does not apply (nothing done)."""
        try:
            return getattr(self, "do_" + name.replace("-", "_"))(target, point, name)
        except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError):
            return False  # the world moved under the person (a step's rename): not done

    def do_rename_save(self, rel: str, point: int, action: str) -> bool:
        """Write a temporary beside the file and rename it over the file (editors)."""
        if not self._parent_ok(rel):
            return False
        st = self._lstat(rel)
        if st is not None and stat.S_ISDIR(st.st_mode):
            return False
        data = self.data(action, point)
        old = self._content(rel)
        tmp = self.root / (rel + ".person-save~")
        tmp.write_bytes(data)
        try:
            os.rename(tmp, self.root / rel)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        self._record("wrote", rel, action, point, digest=sha(data), replaced=old)
        return True

    do_second_save = do_rename_save  # at point i and again at point i + 1 (the runner)

    def do_in_place(self, rel: str, point: int, action: str) -> bool:
        """open(O_WRONLY|O_TRUNC) and write: the same inode, new bytes."""
        if not self._is_file(rel):
            return False
        data = self.data(action, point)
        old = self._content(rel)
        fd = os.open(self.root / rel, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._record("wrote", rel, action, point, digest=sha(data), replaced=old)
        return True

    def do_delete(self, rel: str, point: int, action: str) -> bool:
        if not self._is_file(rel):
            return False
        old = self._content(rel)
        os.unlink(self.root / rel)
        self._record("deleted", rel, action, point, replaced=old)
        return True

    def do_create(self, rel: str, point: int, action: str) -> bool:
        """A new file where none is (O_CREAT|O_EXCL)."""
        if self._lstat(rel) is not None or not self._parent_ok(rel):
            return False
        data = self.data(action, point)
        fd = os.open(self.root / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                     SEED_MODE)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._record("wrote", rel, action, point, digest=sha(data))
        return True

    def do_chmod(self, rel: str, point: int, action: str) -> bool:
        st = self._lstat(rel)
        if st is None or not stat.S_ISREG(st.st_mode):
            return False
        mode = 0o600 if stat.S_IMODE(st.st_mode) != 0o600 else 0o640
        os.chmod(self.root / rel, mode)
        self._record("chmod", rel, action, point, mode=mode,
                     digest=sha((self.root / rel).read_bytes()))
        return True

    def do_rename_parent(self, rel: str, point: int, action: str) -> bool:
        """``git mv src src-renamed``: the target's parent directory, renamed."""
        parent = rel.rpartition("/")[0]
        if not parent:
            return False
        st = self._lstat(parent)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return False
        new = parent + "-renamed"
        if self._lstat(new) is not None:
            return False
        entries = snapshot(self.root / parent)
        os.rename(self.root / parent, self.root / new)
        self._record("renamed-dir", parent, action, point, to=new, entries=entries)
        return True

    def _aside(self, rel: str, action: str, point: int) -> None:
        """Move what is at `rel` to a name of the person's (kept, visible)."""
        st = self._lstat(rel)
        if st is None:
            return
        aside = rel + f".person-aside-{point}"
        os.rename(self.root / rel, self.root / aside)
        e = snapshot_one(self.root / aside)
        self._record("made", aside, action, point, digest=e.digest if e else None)

    def do_symlink(self, rel: str, point: int, action: str) -> bool:
        """The target replaced by a symlink to a file of the person's (the old file kept
        aside under a name of the person's)."""
        st = self._lstat(rel)
        if (st is not None and not stat.S_ISREG(st.st_mode)) or not self._parent_ok(rel):
            return False
        data = self.data(action, point)
        leaf = rel.rpartition("/")[2]
        real = rel + f".person-real-{point}"
        (self.root / real).write_bytes(data)
        self._record("wrote", real, action, point, digest=sha(data))
        self._aside(rel, action, point)
        link = leaf + f".person-real-{point}"
        os.symlink(link, self.root / rel)
        self._record("swapped", rel, action, point, digest="symlink:" + link)
        return True

    def do_directory(self, rel: str, point: int, action: str) -> bool:
        """The target replaced by a directory holding a file of the person's (the old file
        kept aside)."""
        st = self._lstat(rel)
        if (st is not None and not stat.S_ISREG(st.st_mode)) or not self._parent_ok(rel):
            return False
        self._aside(rel, action, point)
        os.mkdir(self.root / rel)
        data = self.data(action, point)
        (self.root / rel / "person.txt").write_bytes(data)
        self._record("swapped", rel, action, point)
        self._record("wrote", rel + "/person.txt", action, point, digest=sha(data))
        return True

    def do_hard_link(self, rel: str, point: int, action: str) -> bool:
        """A second name for the target's file (``ln FILE FILE.person-link``)."""
        if not self._is_file(rel):
            return False
        link = rel + f".person-link-{point}"
        os.link(self.root / rel, self.root / link)
        self._record("made", link, action, point, digest=sha((self.root / rel).read_bytes()))
        return True


def snapshot_one(path: Path) -> Entry | None:
    """The one name `path` as `snapshot` sees it (None: nothing there)."""
    return snapshot(path.parent).get(path.name) if os.path.lexists(path) else None


# -- what the ledger says ----------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """Something an outcome or the ledger says about a path: that it holds `digest`
    (None: absent), in words `text`. `attention`: it tells a person to look (a conflict,
    a path left as found, a kept file, a refusal's facts), not that the step did what it
    planned (``restored``, ``already``)."""

    path: str
    digest: str | None
    text: str = ""
    attention: bool = True


@dataclass(frozen=True)
class Evidence:
    """Everything `check` judges (pure data: the tests build it by hand too).

    `person`: the person's effects in order; `start`/`disk`: every name below the root
    before the scenario's first operation and at the end; `plan`: each step path ->
    (pre digest, post digest); `account`: each step path -> the digest the ledger says
    it holds (None: absent); `account_by`: the step whose record set it ('' none);
    `intended`: each step path -> what the ledger's verdict on the step means it holds
    had nobody touched it (post when committed, pre otherwise); `reports` /
    `ledger_reports`: what the returned outcomes / the ledger's records of the step say
    of paths (a report counts when both say it); `text` / `ledger_text`: the same as
    text (a kept file's name must be in both); `held`: digests the ledger's store holds;
    `step`: the step's id; `verify_ok`: the ledger's `verify`."""

    person: Sequence[Effect]
    start: Mapping[str, Entry]
    disk: Mapping[str, Entry]
    plan: Mapping[str, tuple[str | None, str | None]]
    account: Mapping[str, str | None]
    account_by: Mapping[str, str] = field(default_factory=dict)
    intended: Mapping[str, str | None] = field(default_factory=dict)
    reports: Sequence[Report] = ()
    ledger_reports: Sequence[Report] = ()
    text: str = ""
    ledger_text: str = ""
    held: frozenset[str] = frozenset()
    step: str = STEP
    verify_ok: bool = True


@dataclass(frozen=True)
class Problem:
    """One thing the checker found: a ``loss`` (rules 1-4, 7) or an ``accounting``
    problem (rules 4: a directory recreated or a path half-applied in it, 5, 6)."""

    kind: str
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.rule}): {self.text}"


def _under(path: str, d: str) -> bool:
    return path.startswith(d + "/")


def touched_paths(person: Sequence[Effect], plan_paths: Iterable[str]) -> set[str]:
    """The step paths a person touched: wrote, deleted, chmodded, swapped, or moved with
    their directory (a hard link or a file of the person's elsewhere touches nothing)."""
    paths = list(plan_paths)
    out: set[str] = set()
    for e in person:
        if e.what in ("wrote", "deleted", "chmod", "swapped"):
            out.add(e.path)
        elif e.what == "made" and e.action != "hard-link":
            # an aside: the target it was moved from
            out.update(p for p in paths if e.path.startswith(p + ".person-aside-"))
        elif e.what == "renamed-dir":
            out.update(p for p in paths if _under(p, e.path) or _under(p, e.to))
    return out


def check(ev: Evidence) -> list[Problem]:
    """The predicate of issue 36 over one run (see the module): [] when it holds."""
    out: list[Problem] = []

    def loss(rule: str, text: str) -> None:
        out.append(Problem("loss", rule, text))

    def acct(rule: str, text: str) -> None:
        out.append(Problem("accounting", rule, text))

    disk = ev.disk
    where: dict[str, list[str]] = defaultdict(list)
    for p, e in disk.items():
        if e.digest is not None:
            where[e.digest].append(p)
    seen = {d for d, ps in where.items() if any(visible(p) for p in ps)}

    def hidden_at(d: str | None) -> list[str]:
        return [p for p in where.get(d or "", []) if not visible(p)]

    def named(p: str) -> bool:  # a hidden location the outcome and the ledger name
        leaf = p.rpartition("/")[2]
        return leaf in ev.text and leaf in ev.ledger_text

    def reported(path: str, digest: object = ...) -> bool:
        """The outcome and the ledger both tell a person to look at `path` (holding
        `digest`, when given)."""
        return all(any(r.path == path and r.attention and (digest is ... or r.digest == digest)
                       for r in reports) for reports in (ev.reports, ev.ledger_reports))

    def whereabouts(d: str | None) -> str:
        hid = hidden_at(d)
        if hid:
            return "only in hidden temporar" + ("y " if len(hid) == 1 else "ies ") + \
                ", ".join(hid)
        vis = [p for p in where.get(d or "", []) if visible(p)]
        return ("at " + ", ".join(vis)) if vis else "nowhere on disk"

    touched = touched_paths(ev.person, ev.plan)
    direct = touched_paths([e for e in ev.person if e.what not in ("renamed-dir", "chmod")],
                           ev.plan)
    last: dict[str, Effect] = {}
    for e in ev.person:
        if e.what == "renamed-dir":
            continue
        if e.what == "made" and e.action != "hard-link":
            # the person moved their file aside: its bytes are claimed under the new name
            src = e.path.rsplit(".person-aside-", 1)[0]
            if src in last and last[src].what == "wrote":
                del last[src]
        last[e.path] = e

    # (1) every byte string a person wrote last to a name, at a visible path (and a
    # symlink the person made)
    for name, e in last.items():
        if e.what not in ("wrote", "made", "swapped") or e.digest is None:
            continue
        if e.digest in seen:
            continue
        if e.what == "made" and name in disk:
            continue  # the person's own name is there (its content changed in place)
        hid = hidden_at(e.digest)
        if hid and all(named(h) for h in hid):
            continue  # kept under a name the outcome and the ledger give
        what = {"wrote": "bytes", "made": "file", "swapped": "symlink"}[e.what]
        loss("1", f"the person's {what} {short(e.digest)} ({e.line()} to {name}) are"
                  f" {whereabouts(e.digest)}")

    # (2) a person's delete stays deleted unless the step recreated it by plan
    for name, e in last.items():
        if e.what != "deleted" or name not in disk:
            continue
        now = digest_at(disk, name)
        if name in ev.plan and now is not None and now == ev.account.get(name) \
                and ev.account_by.get(name) == ev.step:
            continue  # the step's record put it there, by plan
        pre, post = ev.plan.get(name, (None, None))
        image = " (the step's pre-image)" if now == pre and pre else \
            " (the step's post-image)" if now == post and post else ""
        loss("2", f"{name} deleted by the person ({e.line()}) is back, holding"
                  f" {short(now)}{image}, and no record of the step says it put it there")

    def moved_to(name: str, after: Effect) -> str:
        """Where `name` is after the person's directory renames that followed `after`."""
        for x in ev.person[ev.person.index(after) + 1:]:
            if x.what == "renamed-dir" and _under(name, x.path):
                name = x.to + name[len(x.path):]
        return name

    # (3) a person's chmod kept or reported (at the name it has after the person's own
    # directory renames)
    for name, e in last.items():
        if e.what != "chmod":
            continue
        got = disk.get(moved_to(name, e))
        if got is not None and got.kind == "file" and got.mode == e.mode:
            continue
        if reported(name):
            continue
        if got is None and name in ev.plan and ev.account.get(name) is None:
            continue  # the file went by the plan (a delete, a create taken back)
        now = "gone" if got is None else f"{oct(got.mode)} holding {short(got.digest)}"
        loss("3", f"the person's chmod {oct(e.mode or 0)} of {name} ({e.line()}) is lost:"
                  f" now {now}, and neither the outcome nor the ledger says so")

    # (4) a renamed directory: its files under the new name; the ledger's digest there
    for e in ev.person:
        if e.what != "renamed-dir":
            continue
        old, new = e.path, e.to
        for rel, ent in e.entries.items():
            if ent.kind != "file" or not visible(rel):
                continue
            if ent.digest in ev.plan.get(f"{old}/{rel}", ()):
                continue  # a step path holding the step's pre- or post-image: (4b) below
            if any(visible(p) and _under(p, new) for p in where.get(ent.digest or "", [])):
                continue
            if reported(f"{old}/{rel}") or reported(f"{new}/{rel}"):
                continue
            loss("4", f"{old}/{rel} ({short(ent.digest)}), renamed with its directory to"
                      f" {new}/ by the person ({e.line()}), is not under {new}/: it is"
                      f" {whereabouts(ent.digest)}")
        for p in ev.plan:
            if not _under(p, old) or p in direct:
                continue  # (a path the person changed itself is judged by (1)-(3))
            q = new + p[len(old):]
            want = ev.account.get(p)
            at_q, at_p = digest_at(disk, q), digest_at(disk, p)
            if want is None:
                if at_q is not None and at_q == ev.plan[p][1] and at_q != ev.plan[p][0] \
                        and not reported(p, at_q):
                    acct("4", f"the ledger says {p} is absent, but {q} (the person moved"
                              f" {old}/ to {new}/, {e.line()}) holds the step's post-image"
                              f" {short(at_q)}: half-applied")
                continue
            if want in (at_q, at_p) or reported(p, at_q) or reported(p, at_p):
                continue
            text = (f"the ledger says {p} holds {short(want)}; the person moved {old}/ to"
                    f" {new}/ ({e.line()}) and {q} holds {short(at_q)}")
            if want in seen:
                acct("4", text + f"; {short(want)} is at "
                     + ", ".join(x for x in where[want] if visible(x)))
            else:
                loss("4", text + f"; {short(want)} is {whereabouts(want)}")
        if old in disk and disk[old].kind == "dir" and old in ev.start:
            # (a directory the step itself made — absent at the start — may be made again
            # by the step's own run: its plan creates a file there)
            acct("4", f"{old}/, which the person renamed to {new}/ ({e.line()}), was"
                      " recreated")

    # (7) content the step moves, meant to be on disk, is visible
    # a move: bytes one path's write deletes and another's creates (a swap's per-path
    # undo is allowed to go path by path: the issue asks all-or-nothing of moves)
    moved = {pre for pre, post in ev.plan.values() if pre is not None and post is None} & \
        {post for pre, post in ev.plan.values() if pre is None and post is not None}
    intended = {d for d in ev.intended.values() if d is not None} & moved
    replaced = {e.replaced for e in ev.person if e.replaced}
    for p, ent in ev.start.items():
        d = ent.digest
        if p not in ev.plan or p in touched or ent.kind != "file" or d not in intended \
                or d in replaced:  # the person saved over (or deleted) it themselves
            continue
        if d in seen or (hidden_at(d) and all(named(h) for h in hidden_at(d))):
            continue
        meant = sorted(q for q, x in ev.intended.items() if x == d)
        loss("7", f"{short(d)}, which {p} held before and the ledger's verdict puts at"
                  f" {', '.join(meant)}, is {whereabouts(d)}")

    # (5) every path the person did not touch holds what the ledger says
    for p in ev.plan:
        if p in touched:
            continue
        now, want = digest_at(disk, p), ev.account.get(p)
        if now == want or reported(p, now):
            continue
        acct("5", f"{p}: the ledger says {short(want)}, the disk holds {short(now)}"
                  + (f" ({short(want)} is {whereabouts(want)})" if want else ""))

    # (6) no temporary holds bytes nobody holds
    claimed = {e.digest for e in ev.person if e.digest}
    for p, ent in disk.items():
        if visible(p) or ent.kind != "file" or ent.digest in seen or ent.digest in ev.held:
            continue
        if ent.digest in claimed:
            continue  # said under (1)
        acct("6", f"temporary {p} holds {short(ent.digest)}, which neither the ledger nor"
                  " a visible path holds")
    if not ev.verify_ok:
        acct("6", "the ledger does not verify")
    return out


# -- one run -----------------------------------------------------------------------------


class Crash(BaseException):
    """The process dies here (raised from the seam; no library code catches it)."""


class _Clock:
    """Strictly increasing nanoseconds, the same in every run."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000_000_000

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


@contextlib.contextmanager
def exchange_mode(mode: str) -> Iterator[None]:
    """``exchange``: the exchange call as found (renameat2 must be there); ``fallback``:
    none (``exchange._CALL = None``), put back after."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    saved = exchange._CALL
    if mode == "fallback":
        exchange._CALL = None
    elif saved is None:
        raise RuntimeError("no exchange call here (renameat2): the exchange mode cannot run")
    try:
        yield
    finally:
        exchange._CALL = saved


_WS_CODE: Final = os.path.dirname(os.path.abspath(_directory.__file__))


def guess_target(paths: Sequence[str]) -> str | None:
    """The step path the file operation being announced is about, read from the
    workspace code's frames (a local ``path``, a staged file's, a slot's ``name`` in its
    directory ``d``); ``dir:D`` for an operation on directory D; None: cannot tell."""
    f = sys._getframe(2)
    depth = 0
    while f is not None and depth < 16:
        if os.path.abspath(f.f_code.co_filename).startswith(_WS_CODE):
            loc = f.f_locals
            name, d = loc.get("name"), loc.get("d")
            if isinstance(name, str) and isinstance(d, str) and temp_stamp(name) is not None:
                for p in paths:
                    head, _, leaf = p.rpartition("/")
                    if head == d and name.startswith("." + leaf[:40]):
                        return p
            v = loc.get("path")
            if isinstance(v, str) and v in paths:
                return v
            for key in ("staged", "found", "w"):
                v = getattr(loc.get(key), "path", None)
                if isinstance(v, str) and v in paths:
                    return v
            if isinstance(d, str):
                return "dir:" + d
        f = f.f_back
        depth += 1
    return None


@dataclass(frozen=True)
class Point:
    index: int
    name: str
    target: str | None  # `guess_target`


@dataclass(frozen=True)
class Spec:
    """One run: `scenario`, the person's `actions`, and for ``settle`` the apply's point
    `crash_at` where the process died before the settling the person acts in."""

    scenario: str
    actions: tuple[Action, ...] = ()
    crash_at: int | None = None

    def label(self) -> str:
        c = f" crash@{self.crash_at}" if self.crash_at is not None else ""
        return f"{self.scenario}{c} " + " ".join(a.label() for a in self.actions)


@dataclass
class Result:
    spec: Spec
    mode: str
    problems: list[Problem]
    performed: list[Action]
    raised: list[str]
    seconds: float
    points: list[Point] = field(default_factory=list)
    leftovers: int = 0
    resettled: bool = False

    @property
    def losses(self) -> list[Problem]:
        return [p for p in self.problems if p.kind == "loss"]

    @property
    def accounting(self) -> list[Problem]:
        return [p for p in self.problems if p.kind == "accounting"]


#: What a scenario runs, the person acting at its points (`_Trial.run`):
#: ``apply``: the step (`run_fenced_step`), which lands everything and commits;
#: ``refuse``: the same, its last path made to differ once the first has landed (a save
#: by rename): refused there, every landed path taken back;
#: ``undo``: `compensate` of the committed step;
#: ``crash``: the step, the process dying right after the person's action (the ledger
#: abandoned, reopened without the hook, a new epoch forced: it settles the attempt);
#: ``settle``: the step dies at point `Spec.crash_at` (no person), then the person acts
#: during the next epoch's acquire, which settles it;
#: ``resume``: the same crash, then the person acts while the step is run again under
#: the same epoch (its landed writes found and recorded, or rolled back);
#: ``undo-crash``: `compensate`, the process dying right after the person's action.
SCENARIOS: Final = ("apply", "refuse", "undo", "crash", "settle", "resume", "undo-crash")
#: the scenarios whose points are all take-backs, undos, settling or resuming
TAKE_BACK: Final = ("refuse", "undo", "settle", "resume", "undo-crash")
#: the scenarios run after the step's apply died at `Spec.crash_at`
AFTER_CRASH: Final = ("settle", "resume")


class _Trial:
    """One scenario run in directory `base`: the workspace `base`/ws, the ledger in
    `base`/ledger/ (`Runner` sets them up)."""

    def __init__(self, base: Path, spec: Spec, workload: Sequence[PathWrite],
                 trace: bool = False) -> None:
        self.base, self.spec, self.workload = base, spec, workload
        self.root = base / "ws"
        self.db = base / "ledger" / "ledger.db"
        self.clock = _Clock()
        self.person = Person(self.root)
        self.paths = [w.path for w in workload]
        self.armed = False
        self.dead = False
        self.point = 0
        self.points: list[Point] = []
        self.trace = trace
        self.crash_at: int | None = None  # the point at which the armed operation dies
        self.pending: dict[int, list[Action]] = defaultdict(list)
        for a in spec.actions:
            self.pending[a.point].append(a)
            if a.name == "second-save":
                self.pending[a.point + 1].append(Action("second-save", a.point + 1, a.target))
        self.performed: list[Action] = []
        self.raised: list[str] = []
        self.resettled = False  # the step was still in flight: settled once more
        self.outcomes: list[Any] = []
        self.prep_done = spec.scenario != "refuse"
        self.ledger: Any = None
        self.epoch = 0

    # the seam
    def on_op(self, name: str) -> None:
        if not name.startswith(POINT_PREFIX):
            return
        if self.dead:
            raise Crash(name)  # a dead process does no more file operations
        if not self.armed:
            return
        self.point += 1
        i = self.point
        if self.trace:
            self.points.append(Point(i, name, guess_target(self.paths)))
        if not self.prep_done and self._first_landed():
            self.prep_done = True  # the last path made to differ: everything taken back
            if self.person.act("rename-save", i, self.workload[-1].path):
                self.person.effects[-1] = dataclasses.replace(self.person.effects[-1],
                                                              action="refuse-prep")
        for a in self.pending.pop(i, ()):
            if self.person.act(a.name, i, a.target):
                self.performed.append(a)
        if self.crash_at == i:
            self.dead = True
            raise Crash(name)

    def _first_landed(self) -> bool:
        w = self.workload[0]
        try:
            return w.post is not None and (self.root / w.path).read_bytes() == w.post
        except OSError:
            return False

    def open(self, hook: bool) -> Any:
        from .. import Ledger

        return Ledger.open(self.db, clock=self.clock, synchronous="OFF",
                           on_op=self.on_op if hook else None)

    def setup(self) -> None:
        from .. import Ledger, run_fenced_step
        from ..step.values import Write

        self.root.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger.init(self.db, clock=self.clock, synchronous="OFF",
                                  on_op=self.on_op)
        self.ledger.workspaces.add(WORKSPACE, str(self.root))
        self.epoch = self.ledger.workspaces.acquire(WORKSPACE, "agent-1", ttl_s=3600).epoch
        seed = [Write(w.path, w.pre, None, mode=SEED_MODE) for w in self.workload
                if w.pre is not None]
        out = run_fenced_step(self.ledger, WORKSPACE, SEED, seed, epoch=self.epoch)
        assert out.committed, out
        if self.spec.scenario in ("undo", "undo-crash"):
            out = run_fenced_step(self.ledger, WORKSPACE, STEP, workload_writes(self.workload),
                                  epoch=self.epoch)
            assert out.committed, out

    def operation(self) -> Any:
        from .. import run_fenced_step

        s = self.spec.scenario
        if s in ("apply", "refuse", "crash", "resume"):
            return run_fenced_step(self.ledger, WORKSPACE, STEP,
                                   workload_writes(self.workload), epoch=self.epoch)
        if s in ("undo", "undo-crash"):
            return self.ledger.workspaces.compensate(STEP, epoch=self.epoch)
        if s == "settle":
            return self.ledger.workspaces.acquire(WORKSPACE, "agent-2", ttl_s=3600,
                                                  force=True)
        raise ValueError(f"no scenario {s!r}")

    def abandon(self) -> None:
        self.armed = False
        self.dead = False
        with contextlib.suppress(BaseException):
            self.ledger.close()
        self.ledger = None

    def recover(self) -> None:
        """The crashed (or failed) process gone: reopen without the hook and take a new
        epoch by force (its acquire settles the old epoch's attempts)."""
        self.abandon()
        self.ledger = self.open(hook=False)
        try:
            lease = self.ledger.workspaces.acquire(WORKSPACE, "agent-recover", ttl_s=3600,
                                                   force=True)
            self.outcomes.append(lease)
            self.epoch = lease.epoch
        except LedgerError as exc:
            self.raised.append(f"recover: {type(exc).__name__}: {exc}")
            self.outcomes.append(exc)

    def run(self, setup: Callable[[_Trial], None] | None = None) -> Evidence:
        (setup or _Trial.setup)(self)
        start = snapshot(self.root)
        s = self.spec.scenario
        if s in AFTER_CRASH:  # the apply dies at `crash_at`, no person yet
            self.armed, self.crash_at = True, self.spec.crash_at
            pending, self.pending = self.pending, defaultdict(list)
            trace, self.trace = self.trace, False
            with contextlib.suppress(Crash):
                self.outcomes.append(self.operation_apply())
            self.abandon()
            self.pending, self.trace = pending, trace
            self.point, self.crash_at = 0, None
            self.ledger = self.open(hook=True)
        elif s in ("crash", "undo-crash"):
            # the process dies right after the person's action at that point
            self.crash_at = max((a.point for a in self.spec.actions), default=None)
        self.armed = True
        try:
            got = self.operation()
            self.outcomes.append(got)
            if s == "settle":
                self.epoch = got.epoch
        except Crash:
            self.recover()
        except Exception as exc:  # a refusal raised instead of returned (issue 36, 5)
            self.raised.append(f"{type(exc).__name__}: {exc}")
            self.outcomes.append(exc)
            self.recover()
        self.armed = False
        if self._in_flight():  # "unsettled": what a user does next is settle again
            self.resettled = True
            self.recover()
        for i in sorted(self.pending):  # a second save past the last point: made now
            for a in self.pending.pop(i):
                if a.name == "second-save" and self.person.act(a.name, i, a.target):
                    self.performed.append(a)
        return self.evidence(start)

    def _in_flight(self) -> bool:
        from ..projections.steps import ENDED

        try:
            row = self.ledger.find_step(STEP)
        except LedgerError:
            return False
        return row is not None and row.state not in ENDED and (
            not row.live or row.state == "compensating")

    def operation_apply(self) -> Any:
        from .. import run_fenced_step

        return run_fenced_step(self.ledger, WORKSPACE, STEP, workload_writes(self.workload),
                               epoch=self.epoch)

    def evidence(self, start: Mapping[str, Entry]) -> Evidence:
        from ..events import Compensated, Fenced

        led = self.ledger
        disk = snapshot(self.root)
        plan = {w.path: (None if w.pre is None else sha(w.pre),
                         None if w.post is None else sha(w.post)) for w in self.workload}
        paths = led.workspaces.paths(WORKSPACE)
        account = {p: (paths[p][1] if p in paths else None) for p in plan}
        by: dict[str, tuple[str | None, str]] = {}
        records: list[Any] = []
        for r in led.read(workspace=WORKSPACE):
            e = r.event
            if getattr(e, "step", "") == STEP:
                records.append(e)
            if isinstance(e, Fenced):
                for w in e.writes:
                    by[w.path] = (w.post_hash, e.step)
            elif isinstance(e, Compensated):
                for x in e.restored:
                    if x.outcome != "conflict":
                        by[x.path] = (x.digest, e.step)
        account_by = {p: (by[p][1] if p in by and by[p][0] == account[p] else "")
                      for p in plan}
        row = led.find_step(STEP)
        live = row is not None and row.live
        intended = {p: (post if live else pre) for p, (pre, post) in plan.items()}
        reports = list(_reports(self.outcomes))
        ledger_reports = list(_reports(records))
        text = "\n".join(repr(x) for x in self.outcomes)
        ledger_text = "\n".join(repr(x) for x in records)
        held = set()
        for e in disk.values():
            if e.kind == "file" and e.digest and e.digest not in held:
                with contextlib.suppress(LedgerError, OSError):
                    led.read_blob(e.digest)
                    held.add(e.digest)
        try:
            ok = led.verify().ok
        except LedgerError:
            ok = False
        return Evidence(person=list(self.person.effects), start=start, disk=disk, plan=plan,
                        account=account, account_by=account_by, intended=intended,
                        reports=reports, ledger_reports=ledger_reports, text=text,
                        ledger_text=ledger_text, held=frozenset(held), step=STEP,
                        verify_ok=ok)

    def close(self) -> None:
        if self.ledger is not None:
            with contextlib.suppress(BaseException):
                self.ledger.close()


def _reports(objs: Iterable[Any]) -> Iterator[Report]:
    """Every (path, digest) an outcome or a ledger record states, found by walking it:
    objects with a ``path`` and a digest-like field, and ``facts`` dicts."""
    seen: set[int] = set()

    def walk(x: Any, depth: int) -> Iterator[Report]:
        if depth > 6 or id(x) in seen or isinstance(x, str | bytes | int | float | bool) \
                or x is None:
            return
        seen.add(id(x))
        if isinstance(x, dict):
            if isinstance(x.get("path"), str) and "on_disk" in x:
                yield Report(x["path"], x["on_disk"], repr(x))
            for v in x.values():
                yield from walk(v, depth + 1)
            return
        if isinstance(x, list | tuple | set | frozenset):
            for v in x:
                yield from walk(v, depth + 1)
            return
        path = getattr(x, "path", None)
        if isinstance(path, str):
            for attr in ("digest", "on_disk_hash", "now", "found"):
                if hasattr(x, attr):
                    d = getattr(x, attr)
                    if d is None or isinstance(d, str):
                        outcome = getattr(x, "outcome", None)
                        yield Report(path, d, repr(x),
                                     attention=outcome not in ("restored", "already"))
                    break
        names: Iterable[str] = ()
        if dataclasses.is_dataclass(x):
            names = [f.name for f in dataclasses.fields(x)]
        elif hasattr(type(x), "__struct_fields__"):
            names = type(x).__struct_fields__
        for n in names:
            yield from walk(getattr(x, n, None), depth + 1)

    for o in objs:
        yield from walk(o, 0)


#: The world a scenario starts from: the seeded files (committed by a step ``seed``),
#: and for an undo the workload step committed on top.
def _kind(scenario: str) -> str:
    return "committed" if scenario in ("undo", "undo-crash") else "seeded"


class Runner:
    """Runs one spec after another in a scratch directory of its own (removed by
    `close`). Each (mode, starting world) is set up once and kept as a template, then
    copied in before each run — the workspace directory itself stays (the ledger
    registered its device and inode), everything in it and the ledger's files are
    replaced — so a run starts from exactly the state a fresh setup gives, for less."""

    def __init__(self, scratch: str | None = None,
                 workload: Sequence[PathWrite] = WORKLOAD) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="person-", dir=scratch))
        self.workload = tuple(workload)
        (self.home / "ws").mkdir()
        self.templates: dict[tuple[str, str], tuple[Path, int, int]] = {}

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def _clear(self) -> None:
        ws = self.home / "ws"
        for entry in os.listdir(ws):
            p = ws / entry
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        shutil.rmtree(self.home / "ledger", ignore_errors=True)

    def _setup(self, trial: _Trial, mode: str) -> None:
        key = (mode, _kind(trial.spec.scenario))
        self._clear()
        got = self.templates.get(key)
        if got is None:
            trial.setup()
            trial.ledger.close()
            saved = self.home / f"template-{len(self.templates)}"
            shutil.copytree(self.home / "ws", saved / "ws", symlinks=True)
            shutil.copytree(self.home / "ledger", saved / "ledger", symlinks=True)
            got = self.templates[key] = (saved, trial.clock.now, trial.epoch)
        else:
            shutil.copytree(got[0] / "ws", self.home / "ws", symlinks=True,
                            dirs_exist_ok=True)
            shutil.copytree(got[0] / "ledger", self.home / "ledger", symlinks=True)
        trial.clock.now, trial.epoch = got[1], got[2]
        trial.ledger = trial.open(hook=True)

    def run(self, spec: Spec, mode: str, trace: bool = False) -> Result:
        """Run `spec` in `mode` and check it."""
        t0 = time.perf_counter()
        trial = _Trial(self.home, spec, self.workload, trace=trace)
        try:
            with exchange_mode(mode):
                ev = trial.run(lambda t: self._setup(t, mode))
            problems = check(ev)
            leftovers = sum(1 for p, e in ev.disk.items()
                            if not visible(p) and e.kind == "file")
        finally:
            trial.close()
        return Result(spec, mode, problems, trial.performed, trial.raised,
                      time.perf_counter() - t0, trial.points, leftovers, trial.resettled)

    def count_points(self, scenario: str, mode: str, crash_at: int | None = None
                     ) -> list[Point]:
        """The scenario's points with no person (for ``crash``/``undo-crash``: those of
        the operation that will be crashed; for ``settle``: the settling's after a crash
        at `crash_at`)."""
        got = self.run(Spec(scenario, (), crash_at), mode, trace=True)
        if got.problems:
            raise AssertionError(f"{scenario} without a person already fails: "
                                 + "; ".join(map(str, got.problems)))
        return got.points


def run_one(spec: Spec, mode: str, scratch: str | None = None,
            workload: Sequence[PathWrite] = WORKLOAD, trace: bool = False) -> Result:
    """Run `spec` in `mode` in a fresh directory under `scratch` and check it."""
    with Runner(scratch, workload) as runner:
        return runner.run(spec, mode, trace)


def count_points(scenario: str, mode: str, scratch: str | None = None,
                 crash_at: int | None = None,
                 workload: Sequence[PathWrite] = WORKLOAD) -> list[Point]:
    """`Runner.count_points` in a fresh directory."""
    with Runner(scratch, workload) as runner:
        return runner.count_points(scenario, mode, crash_at)


# -- the table -----------------------------------------------------------------------------


CREATE_KINDS: Final = ("create", "delete", "move")


def targets(action: str, target: str | None, workload: Sequence[PathWrite]) -> list[str]:
    """The step paths `action` is tried on at a point about `target`."""
    paths = [w.path for w in workload]
    if target is None:
        chosen = paths
    elif target.startswith("dir:"):
        d = target[4:]
        chosen = [p for p in paths if p.rpartition("/")[0] == d] or paths
    else:
        chosen = [target]
    if action == "create":
        makes = [w.path for w in workload if w.pre is None or w.post is None]
        chosen = [p for p in chosen if p in makes] or makes
    if action == "rename-parent":
        parents: dict[str, str] = {}
        for p in chosen:
            parents.setdefault(p.rpartition("/")[0], p)
        chosen = [p for d, p in parents.items() if d]
    return chosen


def specs(scenario: str, points: Sequence[Point], *, every: int = 1,
          actions: Sequence[str] = ACTIONS, crash_at: int | None = None,
          workload: Sequence[PathWrite] = WORKLOAD) -> list[Spec]:
    """One spec per (point, action, target): every `every`-th point (the last always)."""
    out = []
    for pt in points:
        if every > 1 and pt.index % every and pt.index != len(points):
            continue
        for a in actions:
            for t in targets(a, pt.target, workload):
                out.append(Spec(scenario, (Action(a, pt.index, t),), crash_at))
    return out


@dataclass
class Cell:
    runs: int = 0
    na: int = 0
    losses: int = 0
    accounting: int = 0
    raised: int = 0
    resettled: int = 0
    seconds: float = 0.0


@dataclass
class Table:
    """scenario x action -> Cell, per mode; and every failing run."""

    cells: dict[tuple[str, str, str], Cell] = field(default_factory=dict)
    failures: list[Result] = field(default_factory=list)
    points: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, r: Result) -> None:
        action = r.spec.actions[0].name if len(r.spec.actions) == 1 else "sweep"
        c = self.cells.setdefault((r.mode, r.spec.scenario, action), Cell())
        c.seconds += r.seconds
        if not r.performed:
            c.na += 1
            return
        c.runs += 1
        c.losses += bool(r.losses)
        c.accounting += bool(r.accounting)
        c.raised += bool(r.raised)
        c.resettled += r.resettled
        if r.problems:
            self.failures.append(r)

    def render(self) -> str:
        lines = [f"{'mode':9} {'scenario':11} {'action':14} {'runs':>5} {'n/a':>4}"
                 f" {'losses':>6} {'acct':>5} {'raised':>6} {'again':>5} {'seconds':>8}"]
        total = Cell()
        for (mode, scen, action), c in sorted(
                self.cells.items(), key=lambda kv: (MODES.index(kv[0][0]),
                                                    _order(kv[0][1]), _aorder(kv[0][2]))):
            lines.append(f"{mode:9} {scen:11} {action:14} {c.runs:5d} {c.na:4d}"
                         f" {c.losses:6d} {c.accounting:5d} {c.raised:6d} {c.resettled:5d}"
                         f" {c.seconds:8.1f}")
            for f in ("runs", "na", "losses", "accounting", "raised", "resettled", "seconds"):
                setattr(total, f, getattr(total, f) + getattr(c, f))
        lines.append(f"{'all':9} {'':11} {'':14} {total.runs:5d} {total.na:4d}"
                     f" {total.losses:6d} {total.accounting:5d} {total.raised:6d}"
                     f" {total.resettled:5d} {total.seconds:8.1f}")
        if self.points:
            lines.append("points (ws-* operations without a person): " + ", ".join(
                f"{m}/{s}={n}" for (m, s), n in sorted(self.points.items())))
        return "\n".join(lines)

    def render_wide(self) -> str:
        """The same, one line per scenario x action, the modes side by side (runs,
        losses, accounting problems, raised, seconds each)."""
        head = f"{'scenario':11} {'action':14}" + "".join(
            f" | {m + ': runs':>15} {'loss':>5} {'acct':>5} {'rais':>5} {'s':>6}" for m in MODES)
        lines = [head]
        keys = sorted({(sc, a) for (_, sc, a) in self.cells},
                      key=lambda k: (_order(k[0]), _aorder(k[1])))
        for sc, a in keys:
            row = f"{sc:11} {a:14}"
            for m in MODES:
                c = self.cells.get((m, sc, a), Cell())
                row += (f" | {c.runs:15d} {c.losses:5d} {c.accounting:5d} {c.raised:5d}"
                        f" {c.seconds:6.1f}")
            lines.append(row)
        return "\n".join(lines)

    def grouped(self, limit: int = 3) -> str:
        """The failing runs grouped by (mode, scenario, action, rule), a few examples each."""
        groups: dict[tuple[str, str, str, str, str], list[tuple[Result, Problem]]] = \
            defaultdict(list)
        for r in self.failures:
            action = r.spec.actions[0].name if len(r.spec.actions) == 1 else "sweep"
            for p in r.problems:
                groups[(r.mode, r.spec.scenario, action, p.kind, p.rule)].append((r, p))
        lines = []
        for key in sorted(groups, key=lambda k: (MODES.index(k[0]), _order(k[1]),
                                                  _aorder(k[2]), k[3], k[4])):
            items = groups[key]
            runs = len({id(r) for r, _ in items})
            lines.append(f"{key[0]} {key[1]} {key[2]} {key[3]}({key[4]}): {runs} runs")
            for r, p in items[:limit]:
                lines.append(f"    {r.spec.label()}: {p.text}")
        return "\n".join(lines)


def _order(s: str) -> int:
    return SCENARIOS.index(s) if s in SCENARIOS else len(SCENARIOS)


def _aorder(a: str) -> int:
    return ACTIONS.index(a) if a in ACTIONS else len(ACTIONS)


def moves_names(name: str) -> bool:
    """Whether a point's name announces an operation that changes what a name holds (a
    rename, an exchange, a link; not an unlink)."""
    return any(part in ("rename", "exchange", "link", "noreplace")
               for part in name.split("-"))


def crash_points(points: Sequence[Point], full: bool) -> list[int]:
    """The apply's points the ``settle`` and ``resume`` scenarios crash at. `full`: from
    right before the first point that moves a name (a rename, an exchange, a link: all
    staged, nothing landed) to the last point (a crash before that is the apply again
    with less staged). Otherwise right after the first, the second, the middle and the
    last of those points (one landed path, two, half, all)."""
    moving = [p.index for p in points if moves_names(p.name)]
    if not moving:
        return [points[-1].index] if points else []
    if full:
        return [p.index for p in points if p.index >= moving[0]]
    picks = {moving[0] + 1, moving[min(1, len(moving) - 1)] + 1,
             moving[len(moving) // 2] + 1, moving[-1] + 1}
    return sorted(i for i in picks if 1 <= i <= len(points))


#: The slice `make test` runs: every k-th point of a scenario (the last point always);
#: ``settle`` and ``resume`` crash at four points (`crash_points`) and take every (k-th)
#: point after.
SLICE: Final = {"apply": 4, "crash": 4, "refuse": 1, "undo": 1, "undo-crash": 3,
                "settle": 2, "resume": 4}


def run_table(modes: Sequence[str] = MODES, scenarios: Sequence[str] = SCENARIOS, *,
              full: bool = False, every: Mapping[str, int] = SLICE,
              scratch: str | None = None, table: Table | None = None,
              progress: Callable[[str], None] | None = None,
              workload: Sequence[PathWrite] = WORKLOAD) -> Table:
    """Run scenario x point x action x target in each mode and return the table: `full`,
    every point of every scenario and every crash point of ``settle``; otherwise the
    slice `every` (scenario -> every k-th point) and three crash points."""
    table = table or Table()
    with Runner(scratch, workload) as runner:
        for mode in modes:
            for scen in scenarios:
                t0 = time.perf_counter()
                step = 1 if full else every.get(scen, 1)
                pts = runner.count_points("apply" if scen in AFTER_CRASH else scen, mode)
                todo: list[Spec] = []
                if scen in AFTER_CRASH:
                    for c in crash_points(pts, full):
                        sp = runner.count_points(scen, mode, crash_at=c)
                        table.points[(mode, f"{scen}@{c}")] = len(sp)
                        todo += specs(scen, sp, every=step, crash_at=c, workload=workload)
                else:
                    table.points[(mode, scen)] = len(pts)
                    todo = specs(scen, pts, every=step, workload=workload)
                for sp in todo:
                    table.add(runner.run(sp, mode))
                if progress:
                    progress(f"{mode} {scen}: {len(todo)} runs,"
                             f" {time.perf_counter() - t0:.1f}s")
    return table


def sweep(n: int, seed: int, modes: Sequence[str] = MODES, *, per_run: int = 3,
          scratch: str | None = None, table: Table | None = None,
          workload: Sequence[PathWrite] = WORKLOAD) -> Table:
    """`n` runs per mode, each of a scenario picked at random with `per_run` random
    actions at random points on random step paths (seeded: the same runs every time)."""
    table = table or Table()
    rng = random.Random(seed)
    paths = [w.path for w in workload]
    counts: dict[tuple[str, str, int | None], int] = {}
    with Runner(scratch, workload) as runner:
        for mode in modes:
            for _ in range(n):
                scen = rng.choice(SCENARIOS)
                crash_at = None
                if scen in AFTER_CRASH:
                    key = (mode, "apply", None)
                    if key not in counts:
                        counts[key] = len(runner.count_points("apply", mode))
                    crash_at = rng.randint(1, counts[key])
                key = (mode, scen, crash_at)
                if key not in counts:
                    counts[key] = len(runner.count_points(scen, mode, crash_at=crash_at))
                npts = max(counts[key], 1)
                acts = tuple(sorted((Action(rng.choice(ACTIONS), rng.randint(1, npts),
                                            rng.choice(paths)) for _ in range(per_run)),
                                    key=lambda a: a.point))
                table.add(runner.run(Spec(scen, acts, crash_at), mode))
    return table


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ledger.testing.person",
                                 description="The person injector's table (issue 36).")
    ap.add_argument("--full", action="store_true", help="every point of every scenario")
    ap.add_argument("--mode", choices=MODES, action="append")
    ap.add_argument("--scenario", choices=SCENARIOS, action="append")
    ap.add_argument("--sweep", type=int, default=0, help="random runs per mode, too")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--examples", type=int, default=3, help="failing runs shown per group")
    ap.add_argument("--wide", action="store_true", help="the modes side by side")
    args = ap.parse_args(argv)
    scratch = scratch_root()
    table = run_table(args.mode or MODES, args.scenario or SCENARIOS, full=args.full,
                      scratch=scratch, progress=lambda s: print(s, file=sys.stderr))
    if args.sweep:
        sweep(args.sweep, args.seed, args.mode or MODES, scratch=scratch, table=table)
    print(table.render_wide() if args.wide else table.render())
    if table.failures:
        print()
        print(table.grouped(args.examples))
    return 1 if table.failures else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ACTIONS", "MODES", "SCENARIOS", "SLICE", "WORKLOAD", "Action", "Crash", "Effect",
           "Entry", "Evidence", "PathWrite", "Person", "Point", "Problem", "Report", "Result",
           "Runner", "Spec", "Table", "check", "count_points", "exchange_mode", "run_one", "run_table",
           "snapshot", "specs", "sweep", "visible"]
