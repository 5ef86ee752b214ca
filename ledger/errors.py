"""Every error steptrail raises on purpose.

One root (`LedgerError`), a few children callers catch. Each carries the fact, the
subject and the remedy in its message, and an `exit_code` the CLI maps to
(docs/design.md "The command line"): 1 the answer is no (a violation or a protocol
refusal), 2 usage or bad input (including a file that is not a usable ledger),
3 the environment failed (disk full, I/O error, lock timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

EXIT_NO = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3


class LedgerError(Exception):
    """Base class for every error steptrail raises on purpose.

    >>> from ledger import Ledger, LedgerError
    >>> try:
    ...     Ledger.open("no/such/ledger.db")
    ... except LedgerError as e:
    ...     print(type(e).__name__, e.exit_code)
    LedgerNotFound 2
    """

    exit_code = EXIT_USAGE
    #: The same error as the command line says it, where its fix differs by surface
    #: (a command to run instead of a Python call); None: `str(self)` serves both.
    cli_message: str | None = None

    def at_a_shell(self, message: str) -> Self:
        """This error, with `message` as the command line's words for it (its fix a
        command, where `str(self)` names a Python call); returns the error, to raise."""
        self.cli_message = message
        return self


def said_at_a_shell(exc: BaseException) -> str:
    """`exc` in the words of a person at a shell: its command-line fix where the fix
    differs by surface (the CLI, and the MCP server, whose operator starts it from a
    shell and fixes its ledger there), else its text."""
    return (exc.cli_message if isinstance(exc, LedgerError) else None) or str(exc)


# --- 2: bad input, not a usable ledger -------------------------------------------------


class InvalidInput(LedgerError, ValueError):
    """An argument or an event field failed validation; nothing was written.

    >>> from ledger import Ledger, InvalidInput
    >>> with Ledger.init("ledger.db") as ledger:
    ...     try:
    ...         ledger.plan("")
    ...     except InvalidInput as e:
    ...         print(e.exit_code, isinstance(e, ValueError))
    2 True
    """

    exit_code = EXIT_USAGE


class ContentChanged(InvalidInput):
    """Content changed between the hash that named it and the copy that stored it: a
    file read twice (hashed, then streamed into the blob store) was written to in
    between. Nothing was stored under the wrong name.

    >>> from ledger import ContentChanged, InvalidInput
    >>> err = ContentChanged("ab" * 32, "cd" * 32)
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, digest: str, actual: str) -> None:
        super().__init__(
            f"the content hashed to {digest[:12]}… but to {actual[:12]}… when it was copied:"
            " its file changed while steptrail read it; run the command again once"
            " nothing writes to the file"
        )
        self.digest, self.actual = digest, actual


class LedgerNotFound(LedgerError):
    """No ledger at `path` (and the call does not create one).

    >>> from ledger import Ledger, LedgerNotFound
    >>> try:
    ...     Ledger.open("no/such/ledger.db")
    ... except LedgerNotFound as e:
    ...     print(e.path)
    no/such/ledger.db
    """

    def __init__(self, path: str, message: str | None = None) -> None:
        super().__init__(message or (
            f"no ledger at {path}; create one with Ledger.init({path!r}), or open an"
            " existing one by its path"
        ))
        if message is None:
            self.cli_message = (
                f"no ledger at {path}; create one with 'steptrail --ledger {path} init'"
                " or point --ledger / STEPTRAIL_LEDGER at an existing one")
        self.path = path


class ForeignLedger(InvalidInput):
    """The ledger the upward search found (`path`) is not this user's: its directory or
    file belongs to another user (`owner`). Another user could have planted it where
    you work — in ``/tmp``, a shared directory — and every step, restore and settle
    would then follow their workspace registrations with your permissions (git refuses
    a ``.git`` another user owns for the same reason). Nothing was read. A path named
    (``--ledger``, ``STEPTRAIL_LEDGER``, `Ledger.open(path)`) is used as given.

    >>> from ledger import ForeignLedger, InvalidInput
    >>> err = ForeignLedger("/tmp/.steptrail/ledger.db", "/tmp/.steptrail", 1001, "mallory")
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, path: str, owned: str, uid: int, owner: str) -> None:
        fact = (f"the ledger found searching upward from here, {path}, is not yours: {owned}"
                f" belongs to {owner} (uid {uid}); a ledger found by searching upward is used only"
                " when it is its user's (another user could have placed it there), so nothing"
                " was read. To use it anyway, name it:")
        stop = "or stop the search above with STEPTRAIL_CEILING_DIRECTORIES"
        super().__init__(f"{fact} Ledger.open({path!r}); to make your own here,"
                         f" Ledger.init('.steptrail/ledger.db'); {stop}")
        self.cli_message = (f"{fact} --ledger {path}; to make your own here, 'steptrail init"
                            f" --nested'; {stop}")
        self.path, self.owned, self.uid, self.owner = path, owned, uid, owner


class NotALedger(LedgerError):
    """The file exists but is not a steptrail ledger. It was left byte-identical.

    >>> from pathlib import Path
    >>> from ledger import Ledger, NotALedger
    >>> _ = Path("notes.txt").write_text("not a database")
    >>> try:
    ...     Ledger.open("notes.txt")
    ... except NotALedger as e:
    ...     print(e.path)
    notes.txt
    """

    def __init__(self, path: str, why: str) -> None:
        fact = f"{path} is not a steptrail ledger ({why}); it was left untouched."
        super().__init__(fact + " Check the path, or Ledger.init() a new file elsewhere")
        self.cli_message = fact + (" Check the --ledger path, or 'steptrail init' a new file"
                                   " elsewhere")
        self.path, self.why = path, why


class LedgerTooNew(LedgerError):
    """The file's schema is newer than this steptrail reads; it was left untouched.

    >>> from ledger import LedgerTooNew, LedgerError
    >>> err = LedgerTooNew("ledger.db", found=9, supported=3)
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 2)
    """

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            f"ledger {path} has schema version {found}, this steptrail reads up to"
            f" {supported}; upgrade steptrail (the file was left untouched)"
        )
        self.path, self.found, self.supported = path, found, supported


class UnknownStep(LedgerError):
    """`step` has no events in this ledger.

    >>> from ledger import Ledger, UnknownStep
    >>> with Ledger.init("ledger.db") as ledger:
    ...     try:
    ...         ledger.step("nope")
    ...     except UnknownStep as e:
    ...         print(e.step)
    nope
    """

    def __init__(self, step: str) -> None:
        super().__init__(
            f"step {step!r} has no events in this ledger; list them with ledger.steps()"
        )
        self.cli_message = (f"step {step!r} has no events in this ledger; list steps with"
                            " 'steptrail steps'")
        self.step = step


class ReadOnlyLedger(LedgerError):
    """A write through a ledger opened with `readonly=True`; nothing was written.

    >>> from ledger import Ledger, ReadOnlyLedger
    >>> Ledger.init("ledger.db").close()
    >>> with Ledger.open("ledger.db", readonly=True) as ledger:
    ...     try:
    ...         ledger.plan("fetch")
    ...     except ReadOnlyLedger as e:
    ...         print(e.exit_code)
    2
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            f"ledger {path} was opened read-only; open it with readonly=False to write"
        )
        self.cli_message = (f"ledger {path} was opened read-only (a read-only command);"
                            " use a command that writes")
        self.path = path


class UnknownWorkspace(LedgerError):
    """`workspace` is not registered in this ledger.

    >>> from ledger import Ledger, UnknownWorkspace
    >>> with Ledger.init("ledger.db") as ledger:
    ...     try:
    ...         ledger.workspaces.acquire("nope", holder="agent-1")
    ...     except UnknownWorkspace as e:
    ...         print(e.workspace)
    nope
    """

    def __init__(self, workspace: str) -> None:
        super().__init__(
            f"workspace {workspace!r} is not in this ledger; add it with"
            f" ledger.workspaces.add({workspace!r}, DIR)"
        )
        self.cli_message = (f"workspace {workspace!r} is not in this ledger; add it with"
                            f" 'steptrail workspace add {workspace} DIR'")
        self.workspace = workspace


class PathEscapes(InvalidInput):
    """A workspace path leaves the workspace (``..``, absolute, or through a symlink).

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import PathEscapes
    >>> Path("elsewhere").mkdir(); Path("repo/link").symlink_to("../elsewhere")
    >>> try:
    ...     ledger.workspaces.read_file("repo", "link/notes.txt")
    ... except PathEscapes as e:
    ...     print(e.path)
    link/notes.txt
    >>> ledger.close()
    """

    def __init__(self, workspace: str, path: str, why: str) -> None:
        super().__init__(
            f"path {path!r} escapes workspace {workspace!r} ({why}); give a plain relative"
            " path inside the workspace that crosses no symlink"
        )
        self.workspace, self.path, self.why = workspace, path, why


class PathForbidden(InvalidInput):
    """A workspace path no step may write: the ledger's own files (its directory, blobs,
    ``-wal``/``-shm``/``-lockq``, GC lock, witness) or, unless the workspace opted in,
    ``.git`` internals. Judged at admit and again by every walk to the file.

    >>> from ledger import PathForbidden, InvalidInput
    >>> err = PathForbidden("repo", ".git/config", "git internals", "allow git on the workspace")
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, workspace: str, path: str, why: str, fix: str,
                 cli_fix: str | None = None) -> None:
        fact = f"path {path!r} in workspace {workspace!r} is refused ({why});"
        super().__init__(f"{fact} {fix}")
        if cli_fix is not None:
            self.cli_message = f"{fact} {cli_fix}"
        self.workspace, self.path, self.why, self.fix = workspace, path, why, fix


class WorkspaceMoved(InvalidInput):
    """The workspace's root is not the directory it was registered as: a component of
    its path is now a symlink, or the directory there has another device and inode
    (moved, swapped, restored from a backup). Nothing was read or written in it.

    >>> from ledger import WorkspaceMoved, InvalidInput
    >>> err = WorkspaceMoved("repo", "/srv/repo", "another directory is there")
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, workspace: str, root: str, why: str) -> None:
        fact = (f"workspace {workspace!r} directory {root} is not the directory it was"
                f" registered as ({why}); nothing was written. If that directory is the"
                f" workspace now (it was moved or restored), re-register it with")
        super().__init__(f"{fact} ledger.workspaces.add({workspace!r}, DIR, rebind=True)")
        self.cli_message = f"{fact} 'steptrail workspace add {workspace} DIR --rebind'"
        self.workspace, self.root, self.why = workspace, root, why


class LedgerMoved(InvalidInput):
    """The ledger is not where it was when the workspace was registered, and it travels
    with the workspace (its directory inside the root — the default ``.steptrail/`` —,
    or a ``.steptrail/`` whose parent holds the root): the project was copied (``cp -a``,
    a restored CI cache, a container snapshot), moved, or the ledger alone was copied or
    moved. A step would write the registered root — in a
    copy, the original project's files —, so nothing was read or written.

    `case`: ``copied`` (the registered root is still there: the original's), ``moved``
    (it is gone, and the ledger's new place holds the project) or ``ledger-only`` (the
    ledger's new place holds none of the workspace's files); `new_root`: where the
    workspace is when it moved with the ledger; `command`: the one that resolves it
    (``workspace add --rebind``, or ``restore`` into `restore_to` — `new_root` when it
    does not exist — or a new directory). A ledger in a database has no directory: it is
    never judged by its place.

    >>> from ledger import LedgerMoved, InvalidInput
    >>> err = LedgerMoved("repo", "/srv/repo", "/srv/repo/.steptrail", "/tmp/repo2/.steptrail",
    ...                   "copied", "/tmp/repo2", "/tmp/repo2/.steptrail/ledger.db", True)
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    >>> err.command
    'steptrail --ledger /tmp/repo2/.steptrail/ledger.db workspace add repo /tmp/repo2 --rebind'
    """

    def __init__(self, workspace: str, root: str, recorded_dir: str, ledger_dir: str,
                 case: str, new_root: str | None, ledger: str, root_exists: bool,
                 restore_to: str | None = None, witness: str | None = None) -> None:
        from shlex import quote

        base = f"steptrail --ledger {quote(ledger)}"
        where = (f"this ledger ({ledger_dir}) is not where it was when workspace {workspace!r}"
                 f" was registered ({recorded_dir})")
        target = new_root or "DIR"
        to = restore_to or "NEWDIR"
        # each fix as the command line says it and as Python does
        rebind = (f"{base} workspace add {quote(workspace)} {quote(target)} --rebind",
                  f"ledger.workspaces.add({workspace!r}, {target!r}, rebind=True)")
        rebind_root = (f"{base} workspace add {quote(workspace)} {quote(root)} --rebind",
                       f"ledger.workspaces.add({workspace!r}, {root!r}, rebind=True)")
        restore = (f"{base} restore --workspace {quote(workspace)} --to {quote(to)}",
                   f"ledger.workspaces.restore({workspace!r}, {to!r})")
        anchor = (f"{base} witness anchor --witness /ANOTHER/PATH",
                  f"Ledger.anchor_witness({ledger!r}, '/ANOTHER/PATH')")

        def say(i: int) -> str:  # 0: the command line, 1: Python
            run = ("run '{}'", "call {}")[i].format
            if case == "copied":
                text = (f"{where}: it is a copy, and the workspace's directory {root} is still"
                        f" there with the original's files, which a step from this copy would"
                        f" write; nothing was read or written. To make this copy's steps write"
                        f" its own files ({new_root}), {run(rebind[i])}")
            elif case == "moved":
                text = (f"{where}: the project was moved with its ledger, and {root} is gone;"
                        f" nothing was read or written. Re-register the workspace where it is"
                        f" now ({new_root}): {run(rebind[i])}")
            else:
                holds = (f"{new_root}, where its files would be, does not exist" if restore_to
                         else f"{new_root}, where its files would be, holds none of them")
                there = (f"{root} is still there (another ledger's workspace)" if root_exists
                         else f"{root} is gone")
                text = (f"{where}: the ledger was copied or moved without the workspace"
                        f" ({holds}) and {there}; nothing was read or written. Write the"
                        f" workspace's committed files into a new directory: {run(restore[i])}"
                        + (f", or, if this ledger alone is to write {root} from now on,"
                           f" {run(rebind_root[i])}" if root_exists else ""))
            if witness is not None and root_exists:
                # a commit of the copy would reach the witness the original is checked against
                text += (f" (first give this copy a witness of its own: {run(anchor[i])}; it"
                         f" shares {witness} with the original)")
            return text

        super().__init__(say(1))
        self.cli_message = say(0)
        command = (rebind if case in ("copied", "moved") else restore)[0]
        self.workspace, self.root, self.case, self.new_root = workspace, root, case, new_root
        self.recorded_dir, self.ledger_dir, self.command = recorded_dir, ledger_dir, command
        self.root_exists = root_exists


class WorkspaceOverlap(InvalidInput):
    """A workspace root that is, contains or lies inside another workspace's root or the
    ledger's own directory: one directory belongs to one workspace.

    >>> from ledger import WorkspaceOverlap, InvalidInput
    >>> err = WorkspaceOverlap("/srv/repo/sub", "repo", "/srv/repo", "inside")
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, root: str, other: str, other_root: str, how: str) -> None:
        owner = f"workspace {other!r}" if other else "the ledger's own directory"
        super().__init__(
            f"workspace directory {root} {how} {owner} ({other_root}); a directory belongs to"
            " one workspace, and the ledger's files to no workspace: give a directory outside"
            " every other workspace's (the ledger's directory may sit inside it, like .git)"
        )
        self.root, self.other, self.other_root, self.how = root, other, other_root, how


class ContentFileEscapes(InvalidInput):
    """A plan's `content_file` leaves the plan file's directory (absolute, ``..``, or
    through a symlink). Plans come from agents: they may not read the host's files.

    >>> from ledger import ContentFileEscapes, InvalidInput
    >>> err = ContentFileEscapes("../secret", "plans/", "leaves the plan's directory")
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, path: str, base_dir: str, why: str) -> None:
        super().__init__(
            f"content_file {path!r} leaves the plan's directory {base_dir} ({why}); give a"
            " plain relative path to a file inside that directory that crosses no symlink"
        )
        self.path, self.base_dir, self.why = path, base_dir, why


class OperatorOnly(InvalidInput):
    """A plan (written by an agent) tried to turn a protection off — a fence mode other
    than ``step``, or the apply journal off. Only the operator may: on the command
    line (`flag`) or through the library's parameters. Nothing was written.

    >>> from ledger import OperatorOnly, InvalidInput
    >>> err = OperatorOnly("fence", "off", "--fence off")
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, key: str, value: object, flag: str) -> None:
        fact = (f"the plan sets {key!r} to {value!r}; a plan may not turn the fence or the"
                f" journal off. Remove {key!r} from the plan; the operator may choose it")
        super().__init__(f"{fact} by passing {key}={value!r} to run_fenced_step or"
                         " ledger.workspaces.admit (verify reports such steps)")
        self.cli_message = f"{fact} with 'steptrail step plan {flag}' (verify reports such steps)"
        self.key, self.value, self.flag = key, value, flag


# --- 1: the protocol refused, or a violation was found ---------------------------------


class ProtocolRefused(LedgerError):
    """The ledger refused a transition; nothing was written.

    >>> from ledger import Ledger, ProtocolRefused
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("fetch"); _ = ledger.publish("fetch"); _ = ledger.ack("fetch")
    ...     try:
    ...         ledger.publish("fetch", expected_rev=5)
    ...     except ProtocolRefused as e:
    ...         print(type(e).__name__, e.exit_code)
    ManifestConflict 1
    """

    exit_code = EXIT_NO


class IllegalTransition(ProtocolRefused):
    """An event that does not follow from its step's state (`why`); nothing was written.

    >>> from ledger import IllegalTransition, ProtocolRefused
    >>> err = IllegalTransition("fetch", 1, "acked", "the step was never published")
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, step: str, attempt: int, kind: str, why: str) -> None:
        fact = f"step {step!r} attempt {attempt}: {kind} is not allowed ({why}); inspect the step"
        super().__init__(f"{fact} with ledger.step({step!r}) and ledger.timeline({step!r})")
        self.cli_message = f"{fact} with 'steptrail show {step}'"
        self.step, self.attempt, self.kind, self.why = step, attempt, kind, why


class StepSealed(IllegalTransition):
    """An event for a step of a sealed run: its events were archived and their journal
    keys left the ledger, so a redelivery cannot be answered from it; the tombstone the
    seal left refuses it instead (docs/design.md "Sealed runs").

    >>> from ledger import StepSealed, IllegalTransition
    >>> err = StepSealed("fetch", 1, "acked", seal_seq=40)
    >>> isinstance(err, IllegalTransition), err.exit_code
    (True, 1)
    """

    def __init__(self, step: str, attempt: int, kind: str, seal_seq: int) -> None:
        fact = (f"step {step!r} attempt {attempt}: {kind} is not allowed (the step's run was"
                f" sealed by event #{seal_seq}: its events are archived, none may follow);")
        Exception.__init__(self, f"{fact} use a new step id (the archive is named by the"
                                 f" seal event #{seal_seq})")
        self.cli_message = f"{fact} find its archive with 'steptrail seal list' and use a new step id"
        self.step, self.attempt, self.kind, self.why = step, attempt, kind, "sealed"
        self.seal_seq = seal_seq


class NotSealable(ProtocolRefused):
    """A run that may not be sealed (yet): something live or unsettled needs it.

    >>> from ledger import NotSealable, ProtocolRefused
    >>> err = NotSealable("nightly", "a step is in flight")
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, run: str, why: str) -> None:
        super().__init__(f"run {run!r} cannot be sealed: {why}; nothing was archived")
        self.run, self.why = run, why


class ArchiveInvalid(LedgerError):
    """A file offered as a seal archive that is not one, is damaged, or belongs to another
    ledger or seal. It is only read, never changed.

    >>> from ledger import ArchiveInvalid, LedgerError
    >>> err = ArchiveInvalid("seal-1.tar", "not a seal archive")
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 2)
    """

    exit_code = EXIT_USAGE

    def __init__(self, path: str, why: str) -> None:
        fact = f"{path} is not a usable steptrail archive ({why}); it was left untouched:"
        super().__init__(f"{fact} check the path (each seal event names its archive)")
        self.cli_message = f"{fact} check the path, or 'steptrail seal list' for this ledger's archives"
        self.path, self.why = path, why


class ArchiveMissing(InvalidInput):
    """Archives a ledger's seals name that are not in its archive directory (or, for a
    ledger in a database, no archive directory is recorded). A copy or a backup of a
    sealed ledger carries every archive its seals name, or it is refused, nothing
    written: it never makes a copy that has lost a sealed run's history.

    >>> from ledger import ArchiveMissing, InvalidInput
    >>> err = ArchiveMissing("ledger.db", "archives/", ["seal-1.tar"])
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, location: str, directory: str | None, names: list[str]) -> None:
        where = directory if directory is not None else "no directory (the ledger records none)"
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        super().__init__(
            f"{location} has sealed runs whose archives are not in its archive directory"
            f" {where}: {', '.join(names[:3])}{more}; put them back there (a backup holds"
            " them under DEST/archive/) and run it again; nothing was written")
        self.location, self.directory, self.names = location, directory, names


class IdempotencyConflict(ProtocolRefused):
    """An event whose journal key is already recorded (at `seq`) with different contents;
    nothing was written.

    >>> from ledger import IdempotencyConflict, ProtocolRefused
    >>> err = IdempotencyConflict('["fetch",1,"planned"]', 3)
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, journal_key: str, seq: int) -> None:
        super().__init__(
            f"journal key {journal_key} already recorded event #{seq} with a different"
            " payload; a retry must resend the same event (this is a caller bug)"
        )
        self.journal_key, self.seq = journal_key, seq


class CorruptLedger(LedgerError):
    """The ledger's contents contradict themselves (a broken chain, a bad row).

    >>> from ledger import CorruptLedger, LedgerError
    >>> err = CorruptLedger("ledger.db", "broken chain at seq 7")
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 2)
    """

    exit_code = EXIT_USAGE

    def __init__(self, path: str, why: str) -> None:
        fact, then = f"ledger {path} is damaged: {why};", "and restore the file from a backup"
        super().__init__(f"{fact} ledger.verify() lists every finding; {then}")
        self.cli_message = f"{fact} run 'steptrail verify' for every finding {then}"
        self.path, self.why = path, why


class BackupInvalid(LedgerError):
    """A backup directory that cannot be used as one: damaged (its marker or database
    digest does not match, a blob is missing or corrupt, it fails verify), or another
    ledger's. Nothing was written.

    >>> from ledger import BackupInvalid, LedgerError
    >>> err = BackupInvalid("backup/", "its marker is damaged")
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 2)
    """

    exit_code = EXIT_USAGE

    def __init__(self, path: str, why: str, fix: str | None = None) -> None:
        super().__init__(f"backup {path} is not usable: {why}; " + (
            fix or "take the backup again (backup(LEDGER, DEST) from ledger.backup) into a new"
            " directory"))
        if fix is None:
            self.cli_message = (f"backup {path} is not usable: {why}; take the backup again"
                                " ('steptrail backup DEST') into a new directory")
        self.path, self.why = path, why


class BackupIncomplete(BackupInvalid):
    """A backup directory without its completion marker: a backup interrupted before it
    finished (or never one). It is never taken for complete.

    >>> from ledger import BackupIncomplete, BackupInvalid
    >>> err = BackupIncomplete("backup/", "no completion marker")
    >>> isinstance(err, BackupInvalid), err.exit_code
    (True, 2)
    """

    def __init__(self, path: str, why: str) -> None:
        fact = (f"incomplete backup {path}: {why}; it was interrupted before it was complete:"
                " take it again")
        LedgerError.__init__(self, f"{fact} (backup(LEDGER, DEST) from ledger.backup)")
        self.cli_message = f"{fact} ('steptrail backup DEST')"
        self.path, self.why = path, why


class BlobNotFound(LedgerError):
    """A blob that should be stored is not there.

    >>> from ledger import BlobNotFound, LedgerError
    >>> err = BlobNotFound("ab" * 32)
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 1)
    """

    exit_code = EXIT_NO

    def __init__(self, digest: str, why: str = "") -> None:
        fact = f"blob {digest[:12]}… is missing from the blob store{why and ': ' + why};"
        then = "and re-store it (replay the step) if you still have the bytes"
        super().__init__(f"{fact} audit(ledger) from ledger.gc lists every missing blob; {then}")
        self.cli_message = f"{fact} run 'steptrail audit' to list every missing blob, {then}"
        self.digest = digest


class BlobCorrupt(LedgerError):
    """A stored blob is not what its name says: wrong bytes, wrong size, or not a file.

    >>> from ledger import BlobCorrupt, LedgerError
    >>> err = BlobCorrupt("ab" * 32, "wrong size")
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 1)
    """

    exit_code = EXIT_NO

    def __init__(self, digest: str, why: str) -> None:
        fact = (f"blob {digest[:12]}… is corrupt ({why}); it is never served as valid —"
                " replay the step that produced it, or")
        super().__init__(f"{fact} list every such blob with audit(ledger, deep=True) from ledger.gc")
        self.cli_message = f"{fact} run 'steptrail audit --deep'"
        self.digest, self.why = digest, why


class ManifestConflict(ProtocolRefused):
    """The manifest compare-and-swap failed: the live revision is not the expected one.

    >>> from ledger import Ledger, ManifestConflict
    >>> with Ledger.init("ledger.db") as ledger:
    ...     _ = ledger.plan("fetch"); _ = ledger.publish("fetch")
    ...     try:
    ...         ledger.publish("fetch", expected_rev=5)
    ...     except ManifestConflict as e:
    ...         print(e.step)
    fetch
    """

    def __init__(self, step: str, expected: int, live: int | None) -> None:
        have = "no live manifest" if live is None else f"live revision {live}"
        fact = f"step {step!r}: expected manifest revision {expected} but the step has {have};"
        rev = -1 if live is None else live
        super().__init__(f"{fact} re-read it with ledger.step({step!r}) and retry with"
                         f" expected_rev={rev}")
        self.cli_message = (f"{fact} re-read it with 'steptrail show {step}' and retry with"
                            f" --expected-rev {rev}")
        self.step, self.expected, self.live = step, expected, live


class HeadMismatch(ProtocolRefused):
    """The ledger's head is not the one the caller expected (`expected`); nothing was
    written.

    >>> from ledger import HeadMismatch, ProtocolRefused
    >>> err = HeadMismatch("7:ab", "the ledger's head moved")
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, expected: str, why: str) -> None:
        super().__init__(
            f"the ledger does not contain the head {expected} recorded elsewhere ({why});"
            " history was cut off or rolled back"
        )
        self.expected, self.why = expected, why


class StaleEpoch(ProtocolRefused):
    """An effect carried an epoch that is not the workspace's live one: a zombie, a late
    receipt, or a lease that expired. Nothing was written.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import StepStatus, run_fenced_step
    >>> _ = ledger.workspaces.acquire("repo", holder="agent-2", force=True)      # epoch 2
    >>> late = run_fenced_step(ledger, "repo", "edit-1",
    ...                        lambda read: [read.read("app.py").write(b"v1\\n")], epoch=lease.epoch)
    >>> late.status is StepStatus.STALE_EPOCH, type(late.error).__name__
    (True, 'StaleEpoch')
    >>> ledger.close()
    """

    def __init__(self, workspace: str, epoch: int, live: int | None, why: str = "", *,
                 latest: int | None = None, holder: str = "") -> None:
        # `latest`: the workspace's newest epoch issued, and `holder` its holder, when the
        # caller knows them (the live epoch, when there is one, is the newest).
        have = "no live lease" if live is None else f"live epoch {live}"
        newest = live if latest is None else latest
        why = why and f"; {why}"
        where = f"workspace {workspace!r}: "
        if newest is not None and epoch > newest:
            issued = "no epoch was ever issued" if newest == 0 else (
                f"the live epoch is {live}" if live == newest else
                f"the newest is {newest}, not live")
            _both(self, lambda fix: (
                f"{where}epoch {epoch} was never issued ({issued}{why}); an epoch comes from"
                f" acquiring the lease ({fix['acquire']}), which returns it: use that one"))
        elif newest is not None and epoch < newest:
            by = f"epoch {newest}" + (f", holder {holder!r}" if holder else "")
            state = "" if live == newest else ", itself no longer live"
            Exception.__init__(self, f"{where}epoch {epoch} is not live: the lease was taken"
                               f" over by {by}{state}{why}; this worker must stop: the newer"
                               " epoch's holder continues")
        elif newest is not None:
            _both(self, lambda fix: (
                f"{where}epoch {epoch} is not live: the lease expired or was released, and"
                f" an ended lease is never revived{why}; acquire a new epoch"
                f" ({fix['acquire']})"))
        else:
            _both(self, lambda fix: (
                f"{where}epoch {epoch} is not live ({have}{why}); stop, and acquire a new"
                f" epoch ({fix['acquire']})"))
        self.workspace, self.epoch, self.live = workspace, epoch, live


class LeaseHeld(ProtocolRefused):
    """Another holder's lease on the workspace is live.

    >>> from pathlib import Path
    >>> from ledger import Ledger
    >>> Path("repo").mkdir(); _ = Path("repo/app.py").write_text("v0\\n")
    >>> ledger = Ledger.init("ledger.db")
    >>> _ = ledger.workspaces.add("repo", "repo")
    >>> lease = ledger.workspaces.acquire("repo", holder="agent-1", ttl_s=600)
    >>> from ledger import LeaseHeld
    >>> try:
    ...     ledger.workspaces.acquire("repo", holder="agent-2")
    ... except LeaseHeld as e:
    ...     print(e.holder, e.epoch)
    agent-1 1
    >>> ledger.close()
    """

    def __init__(self, workspace: str, epoch: int, holder: str, expires_ns: int,
                 remedy: str | None = None) -> None:
        import datetime as dt

        until = dt.datetime.fromtimestamp(expires_ns / 1e9, dt.timezone.utc).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")  # as every time printed
        fact = f"workspace {workspace!r} is leased by {holder!r} (epoch {epoch}) until {until}"
        super().__init__(fact + "; " + (remedy or (
            "wait for it to expire, or take it over when its holder is dead"
            " (acquire(..., force=True); resume=True when the holder is your own)")))
        if remedy is None:
            self.cli_message = fact + (
                "; wait for it to expire, or take it over when its holder is dead ('steptrail"
                " lease acquire --force'; --resume when it is this --holder's)")
        self.workspace, self.epoch, self.holder, self.expires_ns = (
            workspace, epoch, holder, expires_ns,
        )


class Unsettled(ProtocolRefused):
    """Attempts of an older epoch are still in flight on the workspace.

    >>> from ledger import Unsettled, ProtocolRefused
    >>> err = Unsettled("repo", ["edit-1"])
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, workspace: str, steps: list[str]) -> None:
        shown = ", ".join(steps[:5]) + (" …" if len(steps) > 5 else "")
        fact = (f"workspace {workspace!r} has attempts of an older epoch still in flight"
                f" ({shown}); settle them first")
        super().__init__(f"{fact} with ledger.workspaces.settle({workspace!r}, epoch=EPOCH)")
        self.cli_message = f"{fact} with 'steptrail lease settle'"
        self.workspace, self.steps = workspace, steps


class ReplanRefused(ProtocolRefused):
    """`replan` cannot re-stamp a plan whose pre-images no longer hold.

    >>> from ledger import ReplanRefused, ProtocolRefused
    >>> err = ReplanRefused("edit-1", "app.py changed since it was read")
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, step: str, why: str) -> None:
        super().__init__(
            f"step {step!r} cannot be re-stamped ({why}); plan it anew from the"
            " workspace's current content"
        )
        self.step, self.why = step, why


class PlanConflict(ProtocolRefused):
    """A plan names a step whose attempt is in flight or committed, and it is not the
    plan recorded for that attempt. Re-sending the recorded plan is a retried admission
    (answered `unchanged`); a different one is refused, nothing written, so a new plan
    is never silently dropped.

    >>> from ledger import PlanConflict, ProtocolRefused
    >>> err = PlanConflict("edit-1", 1, "fenced", ["writes differ"])
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, step: str, attempt: int, state: str, differences: list[str]) -> None:
        shown = "; ".join(differences[:5]) + (" …" if len(differences) > 5 else "")
        fact = (f"step {step!r} attempt {attempt} ({state}) was admitted with another plan"
                f" ({shown}); a retry must resend the recorded plan: give a new plan a new step"
                f" id, or end the attempt first")
        super().__init__(f"{fact} (ledger.workspaces.compensate({step!r}, epoch=EPOCH)) and"
                         " plan again")
        self.cli_message = f"{fact} ('steptrail step compensate {step}') and plan again"
        self.step, self.attempt, self.state, self.differences = step, attempt, state, differences


class StepRejected(ProtocolRefused):
    """The fence (or the admission) rejected an attempt: its verdict is
    ``rejected:<reason>`` (``stale_rev``, ``pre_hash``, ``overlap``) and the attempt is
    over. The library returns this as a verdict (`ApplyResult`); the command line
    raises it so that a refusal has a type. `facts` are what the fence saw (for
    ``pre_hash``: the path and the hash on disk).

    >>> from ledger import StepRejected, ProtocolRefused
    >>> err = StepRejected("edit-1", 1, "pre_hash", "app.py changed")
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, step: str, attempt: int, reason: str, detail: str,
                 facts: dict[str, object] | None = None) -> None:
        fact = (f"step {step!r} attempt {attempt}: rejected:{reason}"
                f"{detail and ' (' + detail + ')'}; the attempt is over: plan the step anew from"
                f" the workspace's current content, or")
        super().__init__(f"{fact} re-stamp it with ledger.workspaces.replan({step!r}, ...)")
        self.cli_message = f"{fact} 'steptrail step replan {step}'"
        self.step, self.attempt, self.reason, self.detail = step, attempt, reason, detail
        self.facts = dict(facts or {})


class CompensationConflict(ProtocolRefused):
    """A compensation (or settling) found paths changed since the attempt wrote them:
    they were left as they are, and the rest was put back. The compensation is
    recorded; a human decides about `paths` (``STEP:PATH`` each).

    >>> from ledger import CompensationConflict, ProtocolRefused
    >>> err = CompensationConflict(["app.py"])
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, paths: list[str]) -> None:
        shown = ", ".join(paths[:10]) + (" …" if len(paths) > 10 else "")
        super().__init__(
            f"{len(paths)} {'path' if len(paths) == 1 else 'paths'} conflict, left as they are (a human decides): {shown};"
            " inspect them and edit or revert them by hand"
        )
        self.paths = paths


class CompensationWindowClosed(ProtocolRefused):
    """The step committed longer ago than the compensation window allows; it was not undone.

    >>> from ledger import CompensationWindowClosed, ProtocolRefused
    >>> err = CompensationWindowClosed("edit-1", age_s=7200.0, window_s=3600.0)
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, step: str, age_s: float, window_s: float) -> None:
        super().__init__(
            f"step {step!r} was committed {age_s:.0f}s ago, past the compensation window"
            f" of {window_s:.0f}s; revert it with a new step instead"
        )
        self.step, self.age_s, self.window_s = step, age_s, window_s


# --- 3: the environment failed ---------------------------------------------------------


class EnvironmentFailure(LedgerError):
    """The disk, the OS or a lock failed us; the transaction did not commit (or its
    outcome is unknown: retry with the same journal key).

    >>> from ledger import EnvironmentFailure, LedgerError
    >>> err = EnvironmentFailure("disk full")
    >>> isinstance(err, LedgerError), err.exit_code
    (True, 3)
    """

    exit_code = EXIT_ENVIRONMENT


class LedgerBusy(EnvironmentFailure):
    """The ledger stayed locked by other writers for `waited_s` seconds; the transaction did
    not commit.

    >>> from ledger import LedgerBusy, EnvironmentFailure
    >>> err = LedgerBusy("ledger.db", 5.0)
    >>> isinstance(err, EnvironmentFailure), err.exit_code
    (True, 3)
    """

    def __init__(self, path: str, waited_s: float) -> None:
        super().__init__(
            f"ledger {path} stayed locked by another writer for {waited_s:g}s;"
            " retry later or raise the busy timeout"
        )
        self.path, self.waited_s = path, waited_s


class StorageFailure(EnvironmentFailure):
    """Reading or writing the ledger's storage failed (disk full, I/O error); the
    transaction did not commit.

    >>> from ledger import StorageFailure, EnvironmentFailure
    >>> err = StorageFailure("ledger.db", "I/O error")
    >>> isinstance(err, EnvironmentFailure), err.exit_code
    (True, 3)
    """

    def __init__(self, path: str, what: str) -> None:
        super().__init__(
            f"storage failed under {path}: {what}; free space or fix the disk, then retry"
            " with the same journal key (a failed commit may still have been durable)"
        )
        self.path, self.what = path, what


class DatabaseUnavailable(EnvironmentFailure):
    """The database server could not be reached, or the connection was lost (a
    PostgreSQL ledger). A transaction in flight may or may not have committed: retry
    with the same journal key, which answers either way.

    >>> from ledger import DatabaseUnavailable, EnvironmentFailure
    >>> err = DatabaseUnavailable("postgresql://db/steptrail", "connection refused")
    >>> isinstance(err, EnvironmentFailure), err.exit_code
    (True, 3)
    """

    def __init__(self, location: str, what: str, *, reading: bool = False) -> None:
        # a read-only open (status, verify, steps) wrote nothing: no journal key to keep
        then = " then run it again (nothing was written)" if reading else (
            " then retry with the same journal key (a commit cut off may still have been"
            " durable)")
        super().__init__(
            f"the database at {location} is unavailable: {what}; start the server or fix"
            f" the URL,{then}"
        )
        self.path, self.what = location, what


class AccessDenied(StorageFailure):
    """The ledger, its blob store or a workspace cannot be read or written where it is: a
    read-only file system, or permissions (the ledger is private to its owner). Retrying
    as it is fails the same way, so it is not a retry code: exit 2 (``retryable: false``
    under ``--json``); the message names the cause and its fix.

    >>> from ledger import AccessDenied, EnvironmentFailure
    >>> err = AccessDenied("ledger.db", "permission denied", "fix the owner")
    >>> isinstance(err, EnvironmentFailure), err.exit_code
    (True, 2)
    """

    exit_code = EXIT_USAGE

    def __init__(self, path: str, why: str, fix: str, *, readers_work: bool = True) -> None:
        also = (" (read-only commands, such as verify, events and audit, work as it is)"
                if readers_work else "")
        EnvironmentFailure.__init__(self, f"no access to {path}: {why}; {fix}{also}")
        self.path, self.what = path, why


class UnsafeRename(StorageFailure):
    """A workspace's file system offers neither a no-replace rename (renameat2's
    ``RENAME_NOREPLACE``) nor hard links, so giving a file its name could replace a file
    a person saves at that very moment; steptrail refuses to move bytes there unless the
    user accepts that window with ``STEPTRAIL_UNSAFE_RENAME=1`` (docs/guarantees.md).
    Nothing was moved.

    >>> from ledger import UnsafeRename, StorageFailure
    >>> err = UnsafeRename("/mnt/fat/app.py")
    >>> isinstance(err, StorageFailure), err.exit_code
    (True, 3)
    """

    def __init__(self, path: str) -> None:
        why = ("its file system has neither a no-replace rename nor hard links, so a move"
               " could replace a file a person saves at that moment")
        EnvironmentFailure.__init__(
            self, f"refused to move bytes under {path}: {why}; keep the workspace on a"
            " file system that has either (ext4, xfs, btrfs, tmpfs, APFS), or accept the"
            " window with STEPTRAIL_UNSAFE_RENAME=1 (docs/guarantees.md); nothing was moved")
        self.path, self.what = path, why


# --- the collector, workspaces and the witness ---------------------------------------

#: How an operator re-anchors a witness (named by the witness errors), on the command
#: line and in Python.
ANCHOR_COMMAND = "steptrail --ledger {ledger} witness anchor --witness {witness}"
ANCHOR_CALL = "Ledger.anchor_witness({ledger!r}, {witness!r})"


def _both(self: LedgerError, say: Callable[[dict[str, str]], str], *,
          ledger: str = "", witness: str = "") -> None:
    """Word the error once per surface: `say` gets the fixes' names (``verify``,
    ``force``, ``witness_flag``, ``acquire``, ``anchor`` for `ledger` and `witness`) as
    Python calls for the error's text, and as commands for its `cli_message`."""
    py = {"verify": "ledger.verify()", "force": "force=True", "witness_flag": "witness=",
          "pass_witness": "witness='/ABSOLUTE/PATH'",
          "acquire": "ledger.workspaces.acquire",
          "anchor": ANCHOR_CALL.format(ledger=ledger, witness=witness)}
    cli = {"verify": "'steptrail verify'", "force": "--force",
           "witness_flag": "--witness/STEPTRAIL_WITNESS",
           "pass_witness": "--witness /ABSOLUTE/PATH", "acquire": "'steptrail lease acquire'",
           "anchor": "'" + ANCHOR_COMMAND.format(ledger=ledger, witness=witness) + "'"}
    Exception.__init__(self, say(py))
    self.cli_message = say(cli)


class IllegalWorkspaceTransition(IllegalTransition):
    """A workspace or lease event that does not follow from the workspace's state.

    >>> from ledger import IllegalWorkspaceTransition, IllegalTransition
    >>> err = IllegalWorkspaceTransition("repo", "lease-renewed", "no live lease")
    >>> isinstance(err, IllegalTransition), err.exit_code
    (True, 1)
    """

    def __init__(self, workspace: str, kind: str, why: str) -> None:
        fact = f"workspace {workspace!r}: {kind} is not allowed ({why}); inspect it with"
        Exception.__init__(self, f"{fact} ledger.workspaces.lease({workspace!r})")
        self.cli_message = f"{fact} 'steptrail lease show --workspace {workspace}'"
        self.step, self.attempt, self.kind, self.why = workspace, 0, kind, why
        self.workspace = workspace


class GcRefused(ProtocolRefused):
    """GC (or audit) found something it cannot be sure about; it deleted nothing.

    >>> from ledger import GcRefused, ProtocolRefused
    >>> err = GcRefused("a blob is held by an unknown step")
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, why: str, fix: tuple[str, str] | None = None) -> None:
        # `fix`: (the Python call, the command) when the cause's fix is known
        fact = f"gc refused to delete anything: {why};"
        py, cli = fix or ("read ledger.verify() and audit(ledger) from ledger.gc, fix the"
                          " cause", "run 'steptrail verify' and 'steptrail audit', fix the"
                          " cause")
        super().__init__(f"{fact} {py}, then collect again")
        self.cli_message = f"{fact} {cli}, then run gc again"
        self.why = why


class CollectorBusy(EnvironmentFailure):
    """Another GC (or audit) holds the collector's lock on the ledger; nothing was deleted.

    >>> from ledger import CollectorBusy, EnvironmentFailure
    >>> err = CollectorBusy("ledger.db")
    >>> isinstance(err, EnvironmentFailure), err.exit_code
    (True, 3)
    """

    def __init__(self, path: str) -> None:
        fact = (f"another steptrail gc holds {path}; this run did nothing. Two collectors"
                " are safe but the second is wasted work: retry later, or pass")
        super().__init__(f"{fact} wait=True")
        self.cli_message = f"{fact} --wait"
        self.path = path


class WitnessMismatch(HeadMismatch):
    """The ledger does not contain the head its witness recorded: history was cut off,
    rolled back or rewritten. Nothing was written.

    >>> from ledger import WitnessMismatch, HeadMismatch
    >>> err = WitnessMismatch("ledger.db", "ledger.witness", "history was rewritten")
    >>> isinstance(err, HeadMismatch), err.exit_code
    (True, 1)
    """

    def __init__(self, ledger_path: str, witness_path: str, why: str,
                 remedy: str | Callable[[dict[str, str]], str] = "") -> None:
        def say(fix: dict[str, str]) -> str:
            told = remedy(fix) if callable(remedy) else remedy
            return f"ledger {ledger_path} fails its witness {witness_path}: {why}. " + (
                told or "Its history was cut off, rolled back or rewritten (or this is not"
                " the ledger the witness belongs to); the ledger was not changed. Restore the"
                f" newest copy, or inspect it with {fix['verify']} (which reports, not"
                f" refuses); to keep this history anyway, re-anchor with {fix['anchor']} and"
                f" {fix['force']} (recorded)")

        _both(self, say, ledger=ledger_path, witness=witness_path)
        self.expected, self.why = witness_path, why
        self.ledger_path, self.witness_path = ledger_path, witness_path


class WitnessMissing(WitnessMismatch):
    """A witnessed ledger whose witness is missing, empty or zero-filled, or whose
    location is recorded nowhere (`witness_path` None): it fails closed (a rolled-back
    copy with its witness deleted looks exactly like this). Nothing was written.

    >>> from ledger import WitnessMissing, WitnessMismatch
    >>> err = WitnessMissing("ledger.db", "ledger.witness", "the file is empty")
    >>> isinstance(err, WitnessMismatch), err.exit_code
    (True, 1)
    """

    def __init__(self, ledger_path: str, witness_path: str | None, why: str) -> None:
        if witness_path is None:
            _both(self, lambda fix: (
                f"ledger {ledger_path} is witnessed but records no witness location ({why});"
                f" the ledger was not changed. Pass its witness once with"
                f" {fix['pass_witness']} (a writer then records it), or, once"
                f" {fix['verify']} is clean, start a new one with {fix['anchor']}"),
                ledger=ledger_path, witness="/ABSOLUTE/PATH")
            self.expected, self.why = "", why
            self.ledger_path, self.witness_path = ledger_path, ""
            return
        super().__init__(
            ledger_path, witness_path, why,
            lambda fix: ("A witnessed ledger is not opened without its witness: the ledger"
                         " was not changed. Restore the witness file, or, once"
                         f" {fix['verify']} is clean, start a new one with {fix['anchor']}"),
        )


class WitnessElsewhere(InvalidInput):
    """A witness was named that is not the one the ledger records. Nothing was written.

    >>> from ledger import WitnessElsewhere, InvalidInput
    >>> err = WitnessElsewhere("ledger.db", "a.witness", "b.witness", 7)
    >>> isinstance(err, InvalidInput), err.exit_code
    (True, 2)
    """

    def __init__(self, ledger_path: str, given: str, recorded: str, seq: int) -> None:
        _both(self, lambda fix: (
            f"ledger {ledger_path} is witnessed by {recorded} (recorded at event #{seq}), not"
            f" {given}; drop {fix['witness_flag']} to use the recorded one, or move the witness"
            f" with {fix['anchor']}"), ledger=ledger_path, witness=given)
        self.ledger_path, self.given, self.recorded, self.seq = ledger_path, given, recorded, seq


class AnchorRefused(ProtocolRefused):
    """`anchor_witness` found problems and was not forced. Nothing was written.

    >>> from ledger import AnchorRefused, ProtocolRefused
    >>> err = AnchorRefused("ledger.db", ["the witness is behind"])
    >>> isinstance(err, ProtocolRefused), err.exit_code
    (True, 1)
    """

    def __init__(self, ledger_path: str, problems: list[str]) -> None:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more"
                                           if len(problems) > 3 else "")
        fact = f"ledger {ledger_path} was not re-anchored: {shown}."
        why = "(the findings are recorded in the witness-anchored event)"
        super().__init__(f"{fact} Read ledger.verify() and fix or restore the ledger first;"
                         f" to anchor this history anyway, pass force=True {why}")
        self.cli_message = (f"{fact} Run 'steptrail verify' and fix or restore the ledger"
                            f" first; to anchor this history anyway, add --force {why}")
        self.ledger_path, self.problems = ledger_path, problems


__all__ = [
    "BackupIncomplete",
    "BackupInvalid",
    "ANCHOR_COMMAND",
    "ANCHOR_CALL",
    "said_at_a_shell",
    "AccessDenied",
    "ForeignLedger",
    "ArchiveInvalid",
    "ArchiveMissing",
    "NotSealable",
    "StepSealed",
    "AnchorRefused",
    "BlobCorrupt",
    "BlobNotFound",
    "CollectorBusy",
    "CompensationConflict",
    "CompensationWindowClosed",
    "ContentChanged",
    "ContentFileEscapes",
    "CorruptLedger",
    "EXIT_ENVIRONMENT",
    "EXIT_NO",
    "EXIT_USAGE",
    "EnvironmentFailure",
    "GcRefused",
    "HeadMismatch",
    "IdempotencyConflict",
    "IllegalTransition",
    "IllegalWorkspaceTransition",
    "InvalidInput",
    "LeaseHeld",
    "LedgerBusy",
    "LedgerError",
    "LedgerMoved",
    "LedgerNotFound",
    "LedgerTooNew",
    "ManifestConflict",
    "NotALedger",
    "OperatorOnly",
    "PathEscapes",
    "PathForbidden",
    "PlanConflict",
    "ProtocolRefused",
    "ReadOnlyLedger",
    "ReplanRefused",
    "StaleEpoch",
    "StepRejected",
    "StorageFailure",
    "UnsafeRename",
    "DatabaseUnavailable",
    "UnknownStep",
    "UnknownWorkspace",
    "Unsettled",
    "WitnessElsewhere",
    "WitnessMismatch",
    "WitnessMissing",
    "WorkspaceMoved",
    "WorkspaceOverlap",
]
