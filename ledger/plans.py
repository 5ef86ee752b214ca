"""Plan files: the JSON a harness hands to ``steptrail step plan``, and the rule new work
follows (docs/cli-json.md "The plan format"; docs/design.md "Epochs and leases").

`load_plan` decodes and checks a plan document — one step ``{"step": ..., "writes":
[...]}`` or a batch ``{"steps": [...]}`` — into the steps (`StepPlan`) `ledger.workspaces.admit` takes,
raising the library's typed errors: InvalidInput naming the bad field, OperatorOnly for
a plan that turns a protection off (the fence mode and the journal are the operator's),
ContentFileEscapes for a ``content_file`` that leaves the plan's directory. It reads the
content files and touches no ledger. `check_settled` is the rule a new plan or apply
meets first: the workspace's older epochs are settled.

The input files a command reads (a plan, its content files, artifacts) are read here
too, bounded and without blocking: `open_input`, `open_confined`, `input_content`.
"""

from __future__ import annotations

import base64
import errno
import os
import stat
from dataclasses import dataclass
from typing import Annotated, BinaryIO, Literal

import msgspec

from .errors import ContentFileEscapes, InvalidInput, OperatorOnly
from .events import check_relpath
from .step.values import FENCE_MODES, StepPlan, Write

# The schema (docs/cli-json.md "The plan format").
_Digest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}\Z")]
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class PlanWriteDoc(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str
    pre_hash: _Digest | None  # required: null means the file must not exist
    base_rev: _NonNegative | None = None
    content: str | None = None
    content_b64: str | None = None
    content_file: str | None = None
    delete: bool = False


class PlanStepDoc(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    step: str
    writes: list[PlanWriteDoc] = []
    artifacts: list[str] = []
    run: str | None = None
    irreversible: bool = False


class PlanDoc(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    steps: Annotated[list[PlanStepDoc], msgspec.Meta(min_length=1)]
    run: str = ""
    # Accepted only at the protective defaults (older plans spell them out): the
    # operator turns a protection off on the command line, never the plan's author.
    fence: Literal["step", "plan", "none"] = "step"
    journal: bool = True
    plan_rev: _NonNegative | None = None


class SinglePlanDoc(PlanStepDoc, forbid_unknown_fields=True, kw_only=True):
    fence: Literal["step", "plan", "none"] = "step"
    journal: bool = True
    plan_rev: _NonNegative | None = None


assert set(FENCE_MODES) == {"step", "plan", "none"}


INPUT_FILE_MAX = 1 << 30  # bytes of one input file (artifact, plan content_file)
#: Input files up to this size are read into memory; larger ones stay open and are
#: streamed into the blob store (hashed, then copied, never held whole).
INPUT_READ_MAX = 1 << 20


_INPUT_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def open_confined(base_dir: str, relpath: str, what: str) -> int:
    """A read descriptor of `relpath` inside `base_dir` (the caller closes it), opened
    one component at a time relative to its parent's descriptor with ``O_NOFOLLOW``:
    an absolute path, a ``..`` component or a symlink anywhere below `base_dir` (the
    file itself included) raises ContentFileEscapes, so the file read is inside
    `base_dir` even if a component is swapped for a symlink meanwhile. `base_dir`
    itself may be reached through symlinks (the operator chose it). Non-blocking."""
    if relpath.startswith("/"):
        raise ContentFileEscapes(relpath, base_dir, "an absolute path")
    if ".." in relpath.split("/"):
        raise ContentFileEscapes(relpath, base_dir, "a '..' component")
    check_relpath(relpath, f"{what} path")
    parts = relpath.split("/")
    try:
        fd = os.open(base_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput(f"{what}: the plan's directory {base_dir}:"
                           f" {exc.strerror or exc}") from None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = (_INPUT_FLAGS if last else os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                child = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and not last):
                    raise ContentFileEscapes(relpath, base_dir, f"{'/'.join(parts[:i + 1])!r}"
                                             " is a symlink or not a directory") from None
                raise InvalidInput(f"{what}: {exc.strerror or exc}") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_input(path: str, what: str) -> int:
    """A read-only descriptor of an input file, opened without blocking (a FIFO is
    refused by `input_content`, not waited on); InvalidInput naming `what`."""
    try:
        return os.open(path, _INPUT_FLAGS)
    except OSError as exc:
        raise InvalidInput(f"{what}: {exc.strerror or exc}") from None


def input_content(fd: int, what: str) -> bytes | BinaryIO:
    """The content of an opened input file (the descriptor is taken over): a regular
    file of at most INPUT_FILE_MAX bytes. Up to INPUT_READ_MAX it is read into bytes;
    a larger one is returned as an open binary file, which the ledger hashes and
    streams without holding it whole — the caller closes it. A FIFO, a device or a
    directory is refused (InvalidInput naming `what`) before anything is read."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{what} is not a regular file (a FIFO, a device or a"
                               " directory); give a regular file")
        if st.st_size > INPUT_FILE_MAX:
            raise InvalidInput(f"{what} is {st.st_size} bytes; the limit is {INPUT_FILE_MAX}")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    if st.st_size > INPUT_READ_MAX:
        return f
    try:
        data = f.read(INPUT_READ_MAX + 1)
    except OSError as exc:
        f.close()
        raise InvalidInput(f"{what}: {exc.strerror or exc}") from None
    if len(data) > INPUT_READ_MAX:
        return f  # it grew since: streamed like a large file (the ledger reads from offset 0)
    f.close()
    return data


def parse_plan(raw: bytes, base_dir: str) -> tuple[PlanDoc, list[StepPlan]]:
    """Decode and check a plan document (`load_plan`'s work on bytes): the document and
    its steps, each write's content read (a large content file left open)."""
    if not raw.strip():
        raise InvalidInput("the plan is empty; give a JSON object (see docs/cli-json.md"
                           " 'The plan format')")
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"the plan is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("the plan is nested too deeply to be a plan; give a JSON object"
                           " (see docs/cli-json.md 'The plan format')") from None
    if not isinstance(obj, dict):
        raise InvalidInput("the plan must be a JSON object: {\"steps\": [...]} or one step"
                           " {\"step\": ..., \"writes\": [...]}")
    try:
        if "steps" in obj:
            doc = msgspec.convert(obj, PlanDoc)
        else:
            single = msgspec.convert(obj, SinglePlanDoc)
            doc = PlanDoc(steps=[single], run="", fence=single.fence, journal=single.journal,
                          plan_rev=single.plan_rev)
    except msgspec.ValidationError as exc:
        hint = ""
        if "pre_hash" in str(exc):
            hint = ("; pre_hash is the sha256 (64 lowercase hex) of the content the write was"
                    " planned against, or null when the file must not exist")
        raise InvalidInput(f"bad plan: {exc}{hint}") from None
    if doc.fence != "step":
        raise OperatorOnly("fence", doc.fence, f"--fence {doc.fence}")
    if not doc.journal:
        raise OperatorOnly("journal", False, "--no-journal")
    opened: list[BinaryIO] = []
    try:
        return doc, _plan_steps(doc, "steps" in obj, base_dir, opened)
    except BaseException:
        for f in opened:
            f.close()
        raise


def _plan_steps(doc: PlanDoc, batch: bool, base_dir: str, opened: list[BinaryIO]) -> list[StepPlan]:
    """The document's steps, their content read (or, large, opened: added to `opened`)."""
    plans = []
    for i, s in enumerate(doc.steps):
        writes = []
        for j, w in enumerate(s.writes):
            where = f"$.steps[{i}].writes[{j}] ({w.path})" if batch else f"$.writes[{j}] ({w.path})"
            given = [k for k in ("content", "content_b64", "content_file")
                     if getattr(w, k) is not None] + (["delete"] if w.delete else [])
            if len(given) != 1:
                raise InvalidInput(f"bad plan: {where}: give exactly one of content, content_b64,"
                                   f" content_file or \"delete\": true (got {', '.join(given) or 'none'})")
            content: bytes | None
            if w.content is not None:
                try:
                    content = w.content.encode()
                except UnicodeEncodeError:
                    raise InvalidInput(f"bad plan: {where}: content is not valid UTF-8 text (a"
                                       " lone surrogate); use content_b64") from None
            elif w.content_b64 is not None:
                try:
                    content = base64.b64decode(w.content_b64, validate=True)
                except ValueError:
                    raise InvalidInput(f"bad plan: {where}: content_b64 is not valid base64") from None
            elif w.content_file is not None:
                what = f"bad plan: {where}: content_file"
                content = input_content(open_confined(base_dir, w.content_file, what),
                                         f"{what} {os.path.join(base_dir, w.content_file)}")
                if not isinstance(content, bytes):
                    opened.append(content)
            else:
                content = None  # delete
            writes.append(Write(w.path, content, w.pre_hash, w.base_rev))
        plans.append(StepPlan(s.step, tuple(writes), tuple(s.artifacts),
                              doc.run if s.run is None else s.run, s.irreversible))
    return plans


@dataclass
class Plan:
    """A checked plan: its steps (for `ledger.workspaces.admit`), the plan's `run` and `plan_rev`.

    A content file larger than INPUT_READ_MAX is handed on open (streamed by the ledger,
    never held whole): `close()` the plan when done with it (or use it in a ``with``).

    >>> from ledger import load_plan
    >>> plan = load_plan(b'{"run": "nightly", "steps": [{"step": "fetch"}]}')
    >>> plan.run, [s.step for s in plan.steps]
    ('nightly', ['fetch'])
    """

    steps: list[StepPlan]
    run: str = ""
    plan_rev: int | None = None

    def close(self) -> None:
        """Close the content files left open (large content_file writes)."""
        for p in self.steps:
            for w in p.writes:
                if w.content is not None and not isinstance(w.content, bytes):
                    w.content.close()

    def __enter__(self) -> Plan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_plan(source: bytes | str | os.PathLike[str], base_dir: str | None = None) -> Plan:
    """A plan document — its bytes, or the path of its file — decoded and checked.

    ``content_file`` paths are relative to `base_dir`: by default the plan file's
    directory (the current directory for bytes), and stay inside it (`open_confined`).
    Raises InvalidInput (naming the field), OperatorOnly or ContentFileEscapes; nothing is
    written anywhere.

    >>> from ledger import load_plan
    >>> load_plan(b'{"step": "fetch", "artifacts": ["out.txt"]}').steps[0].artifacts
    ('out.txt',)
    """
    if isinstance(source, bytes):
        raw = source
        where = os.getcwd()
    else:
        path = os.fspath(source)
        what = f"the plan file {path}"
        content = input_content(open_input(path, what), what)
        if not isinstance(content, bytes):
            with content:
                content = content.read()
        raw, where = content, os.path.dirname(os.path.abspath(path))
    doc, steps = parse_plan(raw, where if base_dir is None else base_dir)
    return Plan(steps, doc.run, doc.plan_rev)


def __getattr__(name: str) -> object:
    # `check_settled` lives beside the workspaces it asks (`ledger.workspaces`); this
    # name stays for code that imported it from here
    if name == "check_settled":
        from .workspaces import check_settled
        return check_settled
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["INPUT_FILE_MAX", "INPUT_READ_MAX", "Plan", "PlanDoc", "PlanStepDoc", "PlanWriteDoc",
           "SinglePlanDoc", "input_content", "load_plan", "open_confined",
           "open_input", "parse_plan"]
