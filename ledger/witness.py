"""The witness: the chain head, kept outside the ledger file, after every commit.

A hash chain cannot see its own tail cut off, nor the whole store replaced by an older
genuine copy (docs/design.md "Integrity"). A witness can: a small file the user places
elsewhere — another volume, the orchestrator's storage — that receives the head after
every commit. On open, the ledger's chain must contain the witnessed head:

- ledger head == witness head, or the ledger ahead of it by one commit (a crash between
  the ledger's COMMIT and the witness write): an honest crash, accepted;
- the ledger *behind* its witness (tail truncated, snapshot rolled back, a damaged WAL
  that opened with committed history missing), or the witnessed seq holding another
  hash (a forged or rewritten history): refused, `WitnessMismatch`, nothing written.

Once a ledger is witnessed it records where (a chained `witness-anchored` event), and
every opener — read-only, read-write, `verify` — uses that witness unless it names the
same file; a missing, empty or zero-filled witness then fails closed (`WitnessMissing`)
instead of starting a fresh one from whatever head the file holds. Moving a witness, or
replacing a lost one, is `Ledger.anchor_witness` (`steptrail witness anchor`): it
verifies the whole chain first and records what it replaced. Witness paths are absolute.

Format: two fixed 128-byte slots, written alternately (slot = seq % 2) with `pwrite`
and `fdatasync`; each slot carries a checksum, so a torn write spoils only the slot
being written and the other still holds the previous head. One fsync per commit.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec

from .errors import (
    ANCHOR_COMMAND,
    AnchorRefused,
    CorruptLedger,
    InvalidInput,
    StorageFailure,
    WitnessElsewhere,
    WitnessMismatch,
    WitnessMissing,
)
from .events import WitnessAnchored, WitnessState, decode
from .store import EventQuery, EventReader, Head, Tx

if TYPE_CHECKING:
    from .log import EventLog

MAGIC: Final = b"SLW1"
SLOT: Final = 128
_BODY: Final = struct.Struct(">4s32sQ32s32s")  # magic, ledger id, seq, hash, key


#: The operator command that re-anchors a witness, named by every refusal it can lift.


def witness_path(path: str | os.PathLike[str]) -> str:
    """`path` normalized, if it is absolute; InvalidInput otherwise (a relative witness
    names another file from every other working directory)."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "\0" in text:
        raise InvalidInput(f"witness path {text!r} is not a file path; give an absolute path")
    if not os.path.isabs(text):
        raise InvalidInput(
            f"witness path {text!r} is relative; give an absolute path (a relative witness"
            " names a different file from every other working directory), e.g."
            f" {os.path.join('/', 'other-volume', os.path.basename(text) or 'ledger.witness')}"
        )
    return os.path.normpath(text)


def same_location(a: str, b: str) -> bool:
    """Whether two absolute witness paths name the same file (by path, or by inode when
    both exist: a symlinked directory is the same witness)."""
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


#: The journal keys of `witness-anchored` events, `["witness-anchored","","/…",N]`, all start
#: with this (a step named "witness-anchored" keys `["witness-anchored",1,…]`, which does
#: not): the store finds the anchors by a seek on the journal key, however long the log.
ANCHOR_KEY_PREFIX: Final = '["witness-anchored","",'


def newest_anchor_seq(view: EventReader) -> int:
    """The seq of the newest `witness-anchored` event (0: none), by an index seek."""
    row = view.journal_newest(ANCHOR_KEY_PREFIX, "witness-anchored")
    return 0 if row is None else int(row.seq)


def recorded_anchor(view: EventReader, path: str) -> tuple[int, WitnessAnchored] | None:
    """The newest `witness-anchored` event (its seq and event); None if never witnessed
    this way. Reads through the journal-key index; `verify` re-derives every key."""
    row = view.journal_newest(ANCHOR_KEY_PREFIX, "witness-anchored")
    if row is None:
        return None
    seq, v, payload = row.seq, row.v, row.payload
    try:
        event = decode(payload, v)
    except (msgspec.DecodeError, msgspec.ValidationError, InvalidInput, ValueError,
            TypeError) as exc:
        raise CorruptLedger(path, f"witness-anchored event #{seq} cannot be decoded: {exc}") from None
    if not isinstance(event, WitnessAnchored):
        raise CorruptLedger(path, f"event #{seq} is a witness-anchored row holding another event")
    return seq, event


def anchor_problems(view: EventReader) -> list[tuple[int, str]]:
    """What is wrong with the recorded anchors, found by a scan of the kind column (not
    the key index): each names the head it was anchored at (its predecessor) and the
    location it replaced, and the newest is the one openers find. Read-only."""
    out: list[tuple[int, str]] = []
    last: WitnessAnchored | None = None
    last_seq = 0
    for row in view.events(EventQuery(kinds=frozenset({"witness-anchored"}))):
        seq, v, payload, prev_hash = row.seq, row.v, row.payload, row.prev_hash
        try:
            event = decode(payload, v)
        except (msgspec.DecodeError, msgspec.ValidationError, InvalidInput, ValueError,
                TypeError):
            continue  # verify's row check names an undecodable event
        if not isinstance(event, WitnessAnchored):
            continue  # verify's row check names a kind that disagrees with its payload
        if event.head_seq != seq - 1 or (isinstance(prev_hash, bytes)
                                         and event.head_hash != prev_hash.hex()):
            out.append((seq, f"witness-anchored event #{seq} names head #{event.head_seq}"
                             f" {event.head_hash[:16]}…, not the event before it"))
        if last is not None and not same_location(event.previous, last.witness):
            out.append((seq, f"witness-anchored event #{seq} replaces"
                             f" {event.previous or 'no witness'}, but the witness recorded"
                             f" before it (event #{last_seq}) is {last.witness}"))
        last, last_seq = event, seq
    try:
        found = recorded_anchor(view, "")
    except CorruptLedger as exc:
        out.append((last_seq, exc.why))
        return out
    if (found[0] if found is not None else 0) != last_seq:
        out.append((last_seq, f"the newest witness-anchored event is #{last_seq}, but its"
                              " journal key does not find it (an edited key: openers would"
                              " use another witness)"))
    return out


@dataclass(frozen=True)
class Witnessed:
    seq: int
    hash: bytes
    key: bytes = b""


def _pack(ledger_id: str, seq: int, digest: bytes, key: bytes) -> bytes:
    body = _BODY.pack(MAGIC, ledger_id.encode()[:32].ljust(32, b"\0"), seq, digest, key)
    return (body + hashlib.sha256(body).digest()[:8]).ljust(SLOT, b"\0")


def _unpack(raw: bytes, ledger_id: str) -> Witnessed | None:
    if len(raw) < _BODY.size + 8:
        return None
    body, check = raw[: _BODY.size], raw[_BODY.size: _BODY.size + 8]
    if hashlib.sha256(body).digest()[:8] != check:
        return None  # empty, torn or damaged
    magic, lid, seq, digest, key = _BODY.unpack(body)
    if magic != MAGIC:
        return None
    owner = lid.rstrip(b"\0").decode(errors="replace")
    if owner != ledger_id[:32]:
        raise InvalidInput(
            f"the witness belongs to ledger {owner}, not {ledger_id}; point --witness at"
            " this ledger's witness file"
        )
    return Witnessed(seq, digest, key)


class WitnessStatus(msgspec.Struct, kw_only=True):
    """Where a ledger's witness is and what it says (`Ledger.witness_status`).

    `state`: ``none`` (not witnessed), ``unknown`` (witnessed, location not recorded),
    ``ok``, ``missing``, ``blank`` (empty or zero-filled), ``damaged`` or ``mismatch``
    (the ledger behind it or off its chain); `problem` says why when not ``ok``.

    >>> from ledger import Ledger
    >>> with Ledger.init("ledger.db") as ledger:
    ...     status = ledger.witness_status()
    >>> status.witnessed, status.state
    (False, 'none')
    """

    witnessed: bool
    witness: str | None = None
    anchored_seq: int = 0
    state: str
    witnessed_seq: int | None = None
    head_seq: int
    lag: int = 0
    problem: str = ""


class Witness:
    """One ledger's witness file. `read` the newest valid slot; `write` a new head;
    `start` a fresh witness (a new key) at a head."""

    def __init__(self, path: str | os.PathLike[str], ledger_id: str) -> None:
        self.path = witness_path(path)
        self.ledger_id = ledger_id
        self._fd: int | None = None
        self.last: Witnessed | None = None
        self._key: bytes | None = None

    @property
    def key(self) -> bytes:
        """The witness's secret: created with the witness file, kept only in it."""
        if self._key is None:
            seen = self.read()
            self._key = seen.key if seen is not None and seen.key.strip(b"\0") else os.urandom(32)
        return self._key

    def tag(self, seq: int, digest: bytes) -> str:
        """HMAC of a head under the witness's key: written into the ledger with each
        commit, so a ledger ahead of its witness proves its tail was written by a holder
        of the witness (an honest crash), not forged by someone with only the file."""
        msg = self.ledger_id.encode() + seq.to_bytes(8, "big") + digest
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()

    def read(self) -> Witnessed | None:
        """The newest head the witness holds (None: no witness file, or an empty or
        zero-filled one — which a witnessed ledger treats as missing)."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(2 * SLOT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageFailure(self.path, f"the witness cannot be read: {exc.strerror}") from None
        slots = [_unpack(raw[i * SLOT:(i + 1) * SLOT], self.ledger_id) for i in (0, 1)]
        valid = [s for s in slots if s is not None]
        if not valid:
            if raw.strip(b"\0"):
                raise WitnessMismatch("?", self.path, "the witness file is damaged (no valid slot)")
            return None
        return max(valid, key=lambda s: s.seq)

    def state(self) -> tuple[WitnessState, Witnessed | None, str]:
        """What the file holds, without raising: ("ok", head, "") or ("missing" | "blank"
        | "damaged", None, why)."""
        try:
            seen = self.read()
        except (WitnessMismatch, InvalidInput, StorageFailure) as exc:
            return "damaged", None, str(exc)
        if seen is not None:
            return "ok", seen, ""
        if not os.path.lexists(self.path):
            return "missing", None, f"the witness {self.path} does not exist"
        return "blank", None, f"the witness {self.path} is empty or zero-filled"

    def start(self, seq: int, digest: bytes) -> None:
        """Replace the file with a fresh witness of head (seq, digest) under a new key,
        atomically (a temporary file, fsynced, renamed over the path, directory fsynced);
        created 0600, as the key it holds proves who wrote a ledger's tail."""
        self.close()
        key = os.urandom(32)
        directory = os.path.dirname(self.path)
        tmp = os.path.join(directory, f".{os.path.basename(self.path)}.{os.urandom(6).hex()}.tmp")
        raw = bytearray(2 * SLOT)
        raw[(seq % 2) * SLOT:(seq % 2 + 1) * SLOT] = _pack(self.ledger_id, seq, digest, key)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, bytes(raw))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
            parent = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(parent)
            finally:
                os.close(parent)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            what = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror
            raise StorageFailure(self.path, f"the witness could not be written ({what});"
                                 " nothing was recorded: fix it and retry") from None
        self._key = key
        self.last = Witnessed(seq, digest, key)

    def write(self, seq: int, digest: bytes) -> None:
        """Record a new head durably (one pwrite + fdatasync into the slot seq % 2)."""
        if self.last is not None and self.last.seq == seq and self.last.hash == digest:
            return
        try:
            if self._fd is None:
                created = not os.path.exists(self.path)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                if created:
                    parent = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        os.fsync(parent)
                    finally:
                        os.close(parent)
            os.pwrite(self._fd, _pack(self.ledger_id, seq, digest, self.key), (seq % 2) * SLOT)
            os.fdatasync(self._fd)
        except OSError as exc:
            what = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror
            raise StorageFailure(self.path, f"the witness could not be updated ({what}); the"
                                 " commit itself is durable: retry it (the journal dedupes)"
                                 ) from None
        self.last = Witnessed(seq, digest, self.key)

    def record(self, head: Head) -> None:
        """Write `head` (the log calls this after every commit that appended)."""
        self.write(head.seq, head.hash)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class AnchorCheck:
    """What a writer checks inside every write transaction, before COMMIT (the log's
    `before_commit`): refuse if another process re-anchored the witness since this one
    looked (its commits would not be under the new witness); tag the new head with the
    witness's key. `seq` is the newest witness-anchored event this process saw;
    `anchoring` is set while it appends its own (which the check lets through).

    The events are read only when the chain moved under this writer: when the head its
    transaction appends after (`EventLog.start_head`, read under the write lock) is the
    head the last checked transaction was to commit, nobody has appended since — so
    nobody re-anchored (a re-anchor is an event) — and the answer stands. (A checked
    transaction that did not commit leaves a head no later transaction starts from:
    the next one reads the events again.)"""

    __slots__ = ("path", "seq", "anchoring", "witness", "log", "_after")

    def __init__(self, path: str, log: EventLog) -> None:
        self.path = path
        self.seq = 0
        self.anchoring = False
        self.witness: Witness | None = None
        self.log = log
        self._after: Head | None = None  # the head the last checked transaction committed

    def before_commit(self, tx: Tx, head: Head) -> None:
        start = self.log.start_head
        if self.anchoring or start is None or start != self._after:
            self._check(tx, head)
        self._after = head
        if self.witness is not None:
            tx.set_meta("witness_tag", self.witness.tag(head.seq, head.hash))

    def _check(self, tx: Tx, head: Head) -> None:
        newest = newest_anchor_seq(tx)
        if newest != self.seq and not (self.anchoring and newest == head.seq):
            found = recorded_anchor(tx, self.path)
            where = found[1].witness if found is not None else "?"
            raise WitnessMismatch(
                self.path, where, f"the witness was anchored at {where} by another process"
                f" (event #{newest}) after this one opened the ledger",
                "Nothing was written: open the ledger again (it then uses the new witness)")


__all__ = [
    "AnchorCheck",
    "ANCHOR_COMMAND",
    "MAGIC",
    "SLOT",
    "AnchorRefused",
    "Witness",
    "WitnessElsewhere",
    "WitnessMismatch",
    "WitnessMissing",
    "WitnessStatus",
    "Witnessed",
    "anchor_problems",
    "newest_anchor_seq",
    "recorded_anchor",
    "same_location",
    "witness_path",
]
