"""The witness: the chain head, kept outside the ledger file, after every commit.

A hash chain cannot see its own tail cut off, nor the whole store replaced by an older
genuine copy (DESIGN.md "Integrity"). A witness can: a small file the user places
elsewhere — another volume, the orchestrator's storage — that receives the head after
every commit. On open, the ledger's chain must contain the witnessed head:

- ledger head == witness head, or the ledger ahead of it by one commit (a crash between
  the ledger's COMMIT and the witness write): an honest crash, accepted;
- the ledger *behind* its witness (tail truncated, snapshot rolled back, a damaged WAL
  that opened with committed history missing), or the witnessed seq holding another
  hash (a forged or rewritten history): refused, `WitnessMismatch`, nothing written.

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
from typing import Final

from .errors import HeadMismatch, InvalidInput, StorageFailure

MAGIC: Final = b"SLW1"
SLOT: Final = 128
_BODY: Final = struct.Struct(">4s32sQ32s32s")  # magic, ledger id, seq, hash, key


class WitnessMismatch(HeadMismatch):
    """The ledger does not contain the head its witness recorded: history was cut off,
    rolled back or rewritten. Nothing was written."""

    def __init__(self, ledger_path: str, witness_path: str, why: str) -> None:
        Exception.__init__(
            self,
            f"ledger {ledger_path} fails its witness {witness_path}: {why}. Its history was"
            " cut off, rolled back or rewritten (or this is not the ledger the witness"
            " belongs to); the ledger was not changed. Restore the newest copy, or"
            " inspect it with 'stepledger verify' (which reports, not refuses)",
        )
        self.expected, self.why = witness_path, why
        self.ledger_path, self.witness_path = ledger_path, witness_path


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


class Witness:
    """One ledger's witness file. `read` the newest valid slot; `write` a new head."""

    def __init__(self, path: str | os.PathLike[str], ledger_id: str) -> None:
        self.path = os.path.abspath(os.fspath(path))
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
        """The newest head the witness holds (None: no witness file yet)."""
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

    def write(self, seq: int, digest: bytes) -> None:
        """Record a new head durably (one pwrite + fdatasync into the slot seq % 2)."""
        if self.last is not None and self.last.seq == seq and self.last.hash == digest:
            return
        try:
            if self._fd is None:
                created = not os.path.exists(self.path)
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["MAGIC", "SLOT", "Witness", "WitnessMismatch", "Witnessed"]
