"""`LedgerSaver`: LangGraph's `BaseCheckpointSaver` over a `Ledger` (docs/langgraph.md).

The mapping, in short:

- a checkpoint is one artifact-only step, ``langgraph/checkpoint/<key>`` (run: the
  thread id), committed in ONE transaction (planned, inline bytes, blob-stored,
  manifest-published, acked; a file blob is written and fsynced before it). Its
  artifacts: ``checkpoint`` (the body: ids, parent, the checkpoint without its values,
  the metadata, and per channel its version and value digest — and the value itself
  when it serializes to at most EMBED_MAX bytes) and ``values/<i>``, one blob per
  larger channel value. A value whose version did not change is named by digest,
  not stored again: the manifest of every checkpoint names every value it needs, so
  each checkpoint is self-contained and pruning its ancestors never strands it.
- a pending write is one step, ``langgraph/write/<key of thread, ns, checkpoint, task,
  idx>``: the step id is the idempotency key LangGraph defines ((task_id, idx), idx
  from `WRITES_IDX_MAP` for the special channels). A regular write already committed
  is kept (first wins); a special channel's write (ERROR, INTERRUPT, RESUME, ...)
  replaces the previous one: the old attempt is compensated and a new one committed,
  in one transaction.
- delete_thread, delete_for_runs and prune end steps with `compensated` events that
  release their blobs (`release=True`); reads skip ended steps; `ledger.gc.collect`
  reclaims the blobs no live checkpoint names.
- `claim(thread)` takes the thread's lease (a bare lease: a name, no directory): the
  claimant's events carry its epoch, and the ledger refuses them inside the transaction
  once another worker took the thread over (StaleEpoch). Every write is fenced on that
  lease, a claimant's or not: a saver holding no claim writes under epoch 0, refused
  (LeaseHeld) while another worker's claim is live; a claim this saver lost stays
  recorded, so its later writes are refused too, never let through unfenced.

Reads are served from an in-memory index of the saver's steps, folded from the events
and caught up (one query) before every read: other processes' writes are seen, and the
ledger stays the only ground truth.
"""

from __future__ import annotations

import functools
import hashlib
import random
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from .. import AsyncLedger, digest_of
from ..errors import (
    BlobNotFound,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    StaleEpoch,
)
from ..events import (
    Acked,
    BlobStored,
    Compensated,
    Event,
    ManifestEntry,
    ManifestPublished,
    Planned,
    RecordedEvent,
    manifest_digest,
)
from .. import Ledger

PREFIX = "langgraph/"
CHECKPOINT_PREFIX = PREFIX + "checkpoint/"
WRITE_PREFIX = PREFIX + "write/"
BODY_PATH = "checkpoint"
WRITE_PATH = "write"
#: A claim's lease, unless the caller gives one; a claimant renews it as it writes.
CLAIM_TTL_S_DEFAULT = 300.0
#: A channel value serialized to at most this many bytes rides in the checkpoint body
#: (a counter, a flag, a short string): one blob and three events fewer per value. A
#: larger one is a content-addressed blob of its own, stored once while it is unchanged.
EMBED_MAX = 512
#: Steps ended per transaction by delete/prune (bounds one transaction's size).
END_BATCH_MAX = 500
PRUNE_STRATEGIES = ("keep_latest", "delete")

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.decode


def _key(*parts: object) -> str:
    """A fixed-length, collision-resistant name for a tuple of LangGraph ids (any text
    fits a step id this way: no length limit, no control characters)."""
    return hashlib.sha256(_encode(list(parts))).hexdigest()[:40]


def _text(value: str, what: str) -> str:
    """`value`, refused (InvalidInput) unless UTF-8 can encode it: a lone surrogate
    (``"\\ud800"``, what a bad decode with ``surrogateescape`` leaves) can be neither hashed
    into a step id nor stored, and would fail deep inside as a UnicodeEncodeError."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} {value[:60]!r} is not valid UTF-8: it holds a lone surrogate"
                           f" ({value[exc.start]!r} at index {exc.start}); pass text without"
                           " one (decode bytes with errors='replace', not 'surrogateescape')"
                           ) from None
    return value


def _thread(thread_id: object, what: str) -> str:
    """A thread id as the saver keys it (LangGraph allows an int: its str)."""
    if not isinstance(thread_id, str | int) or isinstance(thread_id, bool):
        raise InvalidInput(f"{what}: thread id {thread_id!r} must be a string (or an int)")
    return _text(str(thread_id), f"{what}: thread id")


@functools.lru_cache(maxsize=4096)
def _lease_name(thread_id: str) -> str:
    """The name of a thread's lease (`LedgerSaver.owner_workspace`), for a thread id
    already checked (`_thread`): a hash, cached (every commit fences on it)."""
    return "langgraph-" + _key(thread_id)[:32]


def _run_name(thread_id: str) -> str:
    """The thread id as the steps' `run` (shown by `steptrail steps`), when it fits."""
    if len(thread_id) <= 200 and thread_id.isprintable():
        return thread_id
    return "#" + _key(thread_id)


@dataclass
class _Value:
    version: Any
    type: str
    digest: str
    size: int
    #: the serialized value itself when it is at most EMBED_MAX bytes: carried in the
    #: checkpoint body, not stored as a blob of its own
    data: bytes | None = None


@dataclass
class _Write:
    step: str
    task_id: str
    idx: int
    channel: str
    task_path: str
    digest: str
    size: int


@dataclass
class _Checkpoint:
    step: str
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    body: Any  # the checkpoint without channel_values
    metadata: Any
    values: dict[str, _Value]


@dataclass
class _Row:
    """What the saver knows of one of its steps: its latest attempt and manifest rev,
    and the lease name the attempt was planned under ("" none): every later event of
    the attempt names the same (its compensation included)."""

    attempt: int
    manifest_rev: int
    live: bool
    workspace: str = ""


@dataclass
class Ownership:
    """A claim on a thread: the thread's lease (`workspace`: its name, a bare lease with
    no directory), under `epoch`.

    >>> from ledger import Ledger
    >>> from ledger.langgraph import LedgerSaver
    >>> ledger = Ledger.init("ledger.db")
    >>> saver = LedgerSaver(ledger)
    >>> claim = saver.claim("t1", "worker-1")
    >>> (claim.thread_id, claim.epoch, claim.holder)
    ('t1', 1, 'worker-1')
    >>> saver.claim("t1", "worker-2", takeover=True).epoch   # worker-1's writes now refused
    2
    >>> saver.close(); ledger.close()
    """

    thread_id: str
    workspace: str
    epoch: int
    holder: str
    ttl_s: float
    expires_ns: int


@dataclass
class _Index:
    """The saver's steps, folded from the events (`seq`: the last event folded)."""

    seq: int = 0
    rows: dict[str, _Row] = field(default_factory=dict)
    # thread -> ns -> checkpoint id -> checkpoint
    threads: dict[str, dict[str, dict[str, _Checkpoint]]] = field(default_factory=dict)
    # (thread, ns, checkpoint id) -> (task id, idx) -> write
    writes: dict[tuple[str, str, str], dict[tuple[str, int], _Write]] = field(default_factory=dict)
    # step -> where it sits (a checkpoint's key, or a write's key and its (task, idx))
    where: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # (thread, ns, channel, version) -> the value's blob (for unchanged channels)
    versions: dict[tuple[str, str, str, Any], _Value] = field(default_factory=dict)
    # the last catch-up read found no event (`catch_up` checks the head first)
    quiet: bool = False

    def add_checkpoint(self, c: _Checkpoint) -> None:
        self.threads.setdefault(c.thread_id, {}).setdefault(c.ns, {})[c.checkpoint_id] = c
        self.where[c.step] = ("checkpoint", c.thread_id, c.ns, c.checkpoint_id)
        for channel, value in c.values.items():
            self.versions[(c.thread_id, c.ns, channel, value.version)] = value

    def add_write(self, thread_id: str, ns: str, checkpoint_id: str, w: _Write) -> None:
        self.writes.setdefault((thread_id, ns, checkpoint_id), {})[(w.task_id, w.idx)] = w
        self.where[w.step] = ("write", thread_id, ns, checkpoint_id, w.task_id, w.idx)

    def catch_up(self, ledger: Ledger, serde: SerializerProtocol) -> None:
        """Fold every event after the index's seq (another process's, or ours appended
        while another thread's were). A step's blobs are read only if it is still live
        at the end: a pruned checkpoint's may be collected already. Under the saver's
        lock."""
        index = self
        # While the last read found nothing new (no other writer lately), the head first:
        # one light statement, and when it is still the last event folded there is
        # nothing to read (exact on every store: seqs only grow, so an event after
        # index.seq would be the head). Once a read finds events (another writer is
        # busy), the next one reads straight away: one statement a catch-up, steady
        # either way (two at the turn from quiet to busy).
        if self.quiet and ledger.log.head().seq == index.seq:
            return
        published: dict[str, tuple[ManifestEntry, ...]] = {}
        last = index.seq
        found = False
        for recorded in ledger.read(index.seq):
            last, found = recorded.seq, True
            event = recorded.event
            step = getattr(event, "step", "")
            if not step.startswith(PREFIX):
                continue
            if isinstance(event, Planned):
                prev = index.rows.get(step)
                index.rows[step] = _Row(event.attempt, prev.manifest_rev if prev else -1, False,
                                        event.workspace)
            elif isinstance(event, ManifestPublished):
                row = index.rows.setdefault(step, _Row(event.attempt, -1, False))
                row.manifest_rev, row.live = event.manifest_rev, True
                published[step] = event.artifacts
            elif isinstance(event, Compensated):
                published.pop(step, None)
                index.end(step)
        for step, artifacts in published.items():
            self.index_manifest(ledger, serde, step, artifacts)
        index.seq = last
        self.quiet = not found

    def index_manifest(self, ledger: Ledger, serde: SerializerProtocol, step: str,
                       artifacts: Sequence[ManifestEntry]) -> None:
        """Index a committed step from its blobs (a step another process wrote)."""
        named = {e.path: e for e in artifacts}
        if step.startswith(CHECKPOINT_PREFIX) and BODY_PATH in named:
            entry = named[BODY_PATH]
            doc = _decode(ledger.read_blob(entry.digest, size=entry.size))
            body = serde.loads_typed(tuple(doc["body"]))
            self.add_checkpoint(_Checkpoint(
                step=step, thread_id=doc["thread_id"], ns=doc["checkpoint_ns"],
                checkpoint_id=doc["checkpoint_id"], parent_id=doc["parent_checkpoint_id"],
                body=body["checkpoint"], metadata=body["metadata"],
                values={ch: _Value(*v) for ch, v in doc["values"].items()}))
        elif step.startswith(WRITE_PREFIX) and WRITE_PATH in named:
            entry = named[WRITE_PATH]
            doc = _decode(ledger.read_blob(entry.digest, size=entry.size))
            self.add_write(doc["thread_id"], doc["checkpoint_ns"], doc["checkpoint_id"],
                                  _Write(step, doc["task_id"], doc["idx"], doc["channel"],
                                         doc["task_path"], entry.digest, entry.size))

    def end(self, step: str) -> None:
        """Forget an ended step (deleted, pruned, replaced)."""
        row = self.rows.get(step)
        if row is not None:
            row.live = False
        where = self.where.pop(step, None)
        if where is None:
            return
        if where[0] == "checkpoint":
            _, thread, ns, cid = where
            by_ns = self.threads.get(thread, {})
            c = by_ns.get(ns, {}).pop(cid, None)
            if c is not None:
                for channel, value in c.values.items():
                    key = (thread, ns, channel, value.version)
                    if self.versions.get(key) is value:
                        del self.versions[key]
            if ns in by_ns and not by_ns[ns]:
                del by_ns[ns]
            if thread in self.threads and not by_ns:
                del self.threads[thread]
        else:
            _, thread, ns, cid, task, idx = where
            writes = self.writes.get((thread, ns, cid), {})
            if writes.get((task, idx)) is not None and writes[(task, idx)].step == step:
                del writes[(task, idx)]
            if not writes:
                self.writes.pop((thread, ns, cid), None)


def _configurable(config: RunnableConfig | None, what: str) -> dict[str, Any]:
    conf = (config or {}).get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(conf, Mapping) or not isinstance(conf.get("thread_id"), str | int):
        raise InvalidInput(f"{what}: config['configurable']['thread_id'] is missing; pass"
                           " {'configurable': {'thread_id': 'my-thread'}}")
    ns = conf.get("checkpoint_ns", "") or ""
    if not isinstance(ns, str):
        raise InvalidInput(f"{what}: checkpoint_ns {ns!r} is not a string; pass a string"
                           " ('' for the root graph)")
    out = {**conf, "thread_id": _thread(conf["thread_id"], what),
           "checkpoint_ns": _text(ns, f"{what}: checkpoint_ns")}
    cid = conf.get("checkpoint_id")
    if isinstance(cid, str):
        _text(cid, f"{what}: checkpoint_id")
    return out


class LedgerSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints, pending writes and metadata as ledger steps (module doc).

    `ledger` stays the caller's (closing the saver does not close it). The sync API runs
    on the caller's thread; the async one runs the same calls in an `AsyncLedger`'s
    pool, so concurrent coroutines' commits share transactions (group commit). A claim
    (`claim`) is a lease in the ledger itself, no file or directory: it works wherever
    the ledger is (inside a workspace, in PostgreSQL).

    >>> from langgraph.checkpoint.base import empty_checkpoint
    >>> from ledger import Ledger
    >>> from ledger.langgraph import LedgerSaver
    >>> ledger = Ledger.init("ledger.db")
    >>> saver = LedgerSaver(ledger)
    >>> config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    >>> checkpoint = empty_checkpoint()
    >>> saved = saver.put(config, checkpoint, {"step": 0}, {})
    >>> saver.get_tuple(config).checkpoint["id"] == checkpoint["id"]   # one commit, read back
    True
    >>> ledger.verify().ok
    True
    >>> saver.close(); ledger.close()
    """

    def __init__(self, ledger: Ledger, *, serde: SerializerProtocol | None = None,
                 max_workers: int = 32) -> None:
        if not isinstance(ledger, Ledger):
            raise InvalidInput(f"LedgerSaver takes a ledger.Ledger, not {type(ledger).__name__};"
                               " open one with Ledger.open(path) or Ledger.init(path)")
        super().__init__(serde=serde)
        self.ledger = ledger
        self.aio = AsyncLedger(ledger, max_workers=max_workers)
        self._index = _Index()
        self._lock = threading.RLock()
        #: thread -> this saver's claim, live or lost: a lost one stays (its writes are
        #: refused as stale) until `claim` again or a successful `release`. Under _lock.
        self._owned: dict[str, Ownership] = {}

    # -- the index ---------------------------------------------------------------------

    def _catch_up(self) -> None:
        """The index brought up to the log (`_Index.catch_up`). Under `_lock`."""
        self._index.catch_up(self.ledger, self.serde)

    # -- committing --------------------------------------------------------------------

    def _owner(self, thread_id: str) -> tuple[str, int]:
        """(lease, epoch) the thread's new events carry: its claim's, else ('', 0).
        Under `_lock`."""
        own = self._owned.get(thread_id)
        if own is None:
            return "", 0
        if self.ledger.clock() > own.expires_ns - int(own.ttl_s * 1e9) // 2:
            self.renew(thread_id)  # half the lease gone: renew (itself fenced)
        return own.workspace, own.epoch

    def _fence(self, threads: Iterable[str]) -> dict[str, int]:
        """thread -> the epoch its writes are fenced under: this saver's claim's (a lost
        one included: refused as stale), else 0 (refused while anyone's claim is live).
        Taken under `_lock`, with the events it fences."""
        return {t: self._owned[t].epoch if t in self._owned else 0 for t in threads}

    def _ending(self, step: str, thread_id: str, reason: str, *, release: bool) -> Compensated:
        """The `compensated` event ending the step's live attempt. It names the lease its
        attempt was planned under (every event of an attempt names the same), and this
        saver's epoch only when that is the lease this saver holds: otherwise epoch 0,
        and the commit's `epochs` fence does the check the event cannot."""
        row = self._index.rows[step]
        workspace, epoch = self._owner(thread_id)
        return Compensated(step=step, attempt=row.attempt, run=_run_name(thread_id),
                           workspace=row.workspace,
                           epoch=epoch if workspace and row.workspace == workspace else 0,
                           reason=reason, release=release)

    def _step_events(self, step: str, thread_id: str, artifacts: Sequence[tuple[str, str, int]],
                     *, replace: bool = False) -> list[Event]:
        """A fresh attempt of `step` committed whole: planned, blob-stored,
        manifest-published, acked (`replace`: the live attempt is ended first)."""
        row = self._index.rows.get(step)
        workspace, epoch = self._owner(thread_id)
        common: dict[str, Any] = {"step": step, "run": _run_name(thread_id),
                                  "workspace": workspace, "epoch": epoch}
        events: list[Event] = []
        if row is not None and row.live:
            assert replace, step
            events.append(self._ending(step, thread_id, "langgraph: replaced by a newer write",
                                       release=False))
        attempt = 1 if row is None else row.attempt + 1
        manifest_rev = 0 if row is None else row.manifest_rev + 1
        inline_max = self.ledger.inline_max_bytes
        entries = tuple(ManifestEntry(path=p, digest=d, size=s) for p, d, s in sorted(artifacts))
        # No pins: every blob is stored and published in this one transaction, so there
        # is no moment between them when GC could see it unreferenced.
        events.append(Planned(**common, attempt=attempt, artifacts=tuple(e.path for e in entries)))
        events += [BlobStored(**common, attempt=attempt, digest=e.digest, size=e.size,
                              path=e.path, inline=e.size <= inline_max) for e in entries]
        events.append(ManifestPublished(**common, attempt=attempt, manifest_rev=manifest_rev,
                                        digest=manifest_digest(step, (), entries),
                                        artifacts=entries))
        events.append(Acked(**common, attempt=attempt, manifest_rev=manifest_rev))
        return events

    def _commit(self, events: list[Event], data: Mapping[str, bytes], fence: dict[str, int]
                ) -> list[RecordedEvent] | None:
        """Append `events` in one transaction, the blob bytes in `data` made durable
        (files first, small ones inline), fenced on each thread's lease at the epoch
        `fence` gives (`_fence`), inside the transaction. None when a concurrent writer
        committed one of these steps first (the caller re-checks from the index)."""
        inline_max = self.ledger.inline_max_bytes
        small = {d: b for d, b in data.items() if len(b) <= inline_max}
        for digest, blob in data.items():
            if len(blob) > inline_max:
                self.ledger.blobs.put(blob, digest, verified=True)
        names = {_lease_name(t): t for t in fence}
        try:
            return self.ledger.append_batch(
                events, inline=small, epochs={name: fence[t] for name, t in names.items()})
        except StaleEpoch as exc:
            thread = names.get(exc.workspace, exc.workspace)
            raise StaleEpoch(exc.workspace, exc.epoch, exc.live,
                             f"thread {thread!r} was taken over by another worker, or this"
                             " saver's claim on it ended: its write was refused and nothing"
                             " was recorded") from None
        except LeaseHeld as exc:
            thread = names.get(exc.workspace, exc.workspace)
            raise LeaseHeld(exc.workspace, exc.epoch, exc.holder, exc.expires_ns,
                            f"that lease is thread {thread!r}'s claim and this saver holds"
                            " none, so its write was refused and nothing was recorded; claim"
                            " the thread first (saver.claim(thread_id, holder); takeover=True"
                            " when its holder is dead)") from None
        except (IllegalTransition, IdempotencyConflict):
            return None

    def _applied(self, recorded: list[RecordedEvent] | None) -> bool:
        """Whether our just-committed events directly follow the index (then the caller
        indexes them itself); otherwise catch up, which folds them with the others."""
        if recorded is None:
            self._catch_up()
            return False
        if recorded[0].seq == self._index.seq + 1:
            self._index.seq = recorded[-1].seq
            return True
        self._catch_up()
        return False

    def _mark(self, events: Sequence[Event]) -> None:
        """Record our own committed events' step rows in the index."""
        for event in events:
            step = getattr(event, "step", "")
            if isinstance(event, Compensated):
                self._index.end(step)
            elif isinstance(event, Planned):
                prev = self._index.rows.get(step)
                self._index.rows[step] = _Row(event.attempt, prev.manifest_rev if prev else -1,
                                              False, event.workspace)
            elif isinstance(event, ManifestPublished):
                row = self._index.rows[step]
                row.manifest_rev, row.live = event.manifest_rev, True

    # -- the sync API --------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Commit one checkpoint (one transaction; two with a value over the inline limit).

        A checkpoint id already committed on the thread is answered as it is (a replay).
        """
        conf = _configurable(config, "put")
        thread, ns = conf["thread_id"], conf["checkpoint_ns"]
        if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("id"), str):
            raise InvalidInput("put: checkpoint has no string 'id'; pass a LangGraph Checkpoint"
                               " (langgraph.checkpoint.base.empty_checkpoint() makes one)")
        cid = _text(checkpoint["id"], "put: checkpoint id")
        parent = conf.get("checkpoint_id")
        versions = checkpoint.get("channel_versions", {})
        for channel, version in versions.items():
            _text(channel, "put: channel name")
            if isinstance(version, str):
                _text(version, f"put: channel {channel!r}'s version")
        md = get_checkpoint_metadata(config, metadata)
        out: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                                                "checkpoint_id": cid}}
        body_checkpoint = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
        step = CHECKPOINT_PREFIX + _key(thread, ns, cid)
        for fresh in (False, True):  # fresh: a reused blob vanished (GC): serialize all
            with self._lock:
                self._catch_up()
                row = self._index.rows.get(step)
                if row is not None and row.live:
                    return out
                chosen: dict[str, _Value] = {}
                data: dict[str, bytes] = {}
                for channel, version in versions.items():
                    known = self._index.versions.get((thread, ns, channel, version))
                    if known is not None and channel not in new_versions and not fresh:
                        chosen[channel] = known
                    elif channel in values:
                        type_, blob = self.serde.dumps_typed(values[channel])
                        digest = digest_of(blob)
                        if len(blob) <= EMBED_MAX:
                            chosen[channel] = _Value(version, type_, digest, len(blob), blob)
                        else:
                            data[digest] = blob
                            chosen[channel] = _Value(version, type_, digest, len(blob))
                blobs = sorted(ch for ch, v in chosen.items() if v.data is None)
                paths = {channel: f"values/{i}" for i, channel in enumerate(blobs)}
                doc = _encode({
                    "thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid,
                    "parent_checkpoint_id": parent,
                    "body": list(self.serde.dumps_typed({"checkpoint": body_checkpoint,
                                                         "metadata": md})),
                    "values": {ch: [v.version, v.type, v.digest, v.size]
                               + ([] if v.data is None else [v.data])
                               for ch, v in chosen.items()},
                })
                body_digest = digest_of(doc)
                data[body_digest] = doc
                artifacts = [(BODY_PATH, body_digest, len(doc))]
                artifacts += [(paths[ch], chosen[ch].digest, chosen[ch].size) for ch in blobs]
                events = self._step_events(step, thread, artifacts)
                fence = self._fence([thread])
            try:
                recorded = self._commit(events, data, fence)
            except BlobNotFound:
                if fresh:
                    raise
                continue
            with self._lock:
                if self._applied(recorded):
                    self._mark(events)
                    self._index.add_checkpoint(_Checkpoint(
                        step=step, thread_id=thread, ns=ns, checkpoint_id=cid, parent_id=parent,
                        body=body_checkpoint, metadata=md, values=chosen))
            return out
        raise AssertionError("unreachable")

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Commit a task's writes against a checkpoint, all in one transaction.

        Idempotent on (task_id, idx): a regular write already committed is kept; a
        special channel's (`WRITES_IDX_MAP`) replaces the one before it.
        """
        conf = _configurable(config, "put_writes")
        thread, ns = conf["thread_id"], conf["checkpoint_ns"]
        cid = conf.get("checkpoint_id")
        if not isinstance(cid, str):
            raise InvalidInput("put_writes: config has no checkpoint_id; pass the config put()"
                               " returned (it names the checkpoint the writes belong to)")
        if not isinstance(task_id, str) or not task_id:
            raise InvalidInput(f"put_writes: task_id {task_id!r} must be a non-empty string")
        if not isinstance(task_path, str):
            raise InvalidInput(f"put_writes: task_path {task_path!r} must be a string")
        _text(task_id, "put_writes: task_id")
        _text(task_path, "put_writes: task_path")
        for channel, _value in writes:
            if not isinstance(channel, str):
                raise InvalidInput(f"put_writes: channel {channel!r} must be a string")
            _text(channel, "put_writes: channel name")
        with self._lock:
            self._catch_up()
            events: list[Event] = []
            data: dict[str, bytes] = {}
            made: list[tuple[str, _Write]] = []
            existing = self._index.writes.get((thread, ns, cid), {})
            for i, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                step = WRITE_PREFIX + _key(thread, ns, cid, task_id, idx)
                row = self._index.rows.get(step)
                type_, blob = self.serde.dumps_typed(value)
                doc = _encode({"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid,
                               "task_id": task_id, "idx": idx, "channel": channel,
                               "task_path": task_path, "value": [type_, blob]})
                digest = digest_of(doc)
                if row is not None and row.live:
                    old = existing.get((task_id, idx))
                    if idx >= 0 or (old is not None and old.digest == digest):
                        continue  # already recorded: the journal's answer is the first
                data[digest] = doc
                events += self._step_events(step, thread, [(WRITE_PATH, digest, len(doc))],
                                            replace=True)
                made.append((step, _Write(step, task_id, idx, channel, task_path, digest,
                                          len(doc))))
            if not events:
                return
            fence = self._fence([thread])
        recorded = self._commit(events, data, fence)
        with self._lock:
            if self._applied(recorded):
                self._mark(events)
                for _step, w in made:
                    self._index.add_write(thread, ns, cid, w)

    def _load(self, v: _Value) -> Any:
        """A channel value: from the body when embedded, else from its blob."""
        blob = v.data if v.data is not None else self.ledger.read_blob(v.digest, size=v.size)
        return self.serde.loads_typed((v.type, blob))

    def _tuple(self, c: _Checkpoint) -> CheckpointTuple:
        values = {ch: self._load(v) for ch, v in c.values.items()}
        stored = self._index.writes.get((c.thread_id, c.ns, c.checkpoint_id), {})
        pending = []
        for key in sorted(stored, key=lambda k: writes_sort_key(stored[k].task_path, *k)):
            w = stored[key]
            doc = _decode(self.ledger.read_blob(w.digest, size=w.size))
            pending.append((w.task_id, w.channel, self.serde.loads_typed(tuple(doc["value"]))))
        conf = {"thread_id": c.thread_id, "checkpoint_ns": c.ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": c.checkpoint_id}},
            checkpoint={**c.body, "channel_values": values},
            metadata=c.metadata,
            parent_config=({"configurable": {**conf, "checkpoint_id": c.parent_id}}
                           if c.parent_id else None),
            pending_writes=pending,
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = _configurable(config, "get_tuple")
        with self._lock:
            self._catch_up()
            by_id = self._index.threads.get(conf["thread_id"], {}).get(conf["checkpoint_ns"], {})
            cid = get_checkpoint_id(config)
            if cid is None:
                cid = max(by_id, default=None)
            c = by_id.get(cid) if cid is not None else None
            return None if c is None else self._tuple(c)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id), of one thread (and namespace, and
        checkpoint id, when `config` names them) or of all; `filter` matches metadata."""
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidInput(f"list: limit {limit!r} must be a non-negative integer or None")
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidInput(f"list: filter {filter!r} must be a dict of metadata keys to values")
        conf = _configurable(config, "list") if config is not None else None
        before_id = get_checkpoint_id(before) if before else None
        with self._lock:
            self._catch_up()
            threads = [conf["thread_id"]] if conf else sorted(self._index.threads)
            picked: list[_Checkpoint] = []
            for thread in threads:
                for ns, by_id in self._index.threads.get(thread, {}).items():
                    if conf is not None and "checkpoint_ns" in (config or {}).get(
                            "configurable", {}) and ns != conf["checkpoint_ns"]:
                        continue
                    for cid, c in by_id.items():
                        if conf is not None and conf.get("checkpoint_id") and cid != conf[
                                "checkpoint_id"]:
                            continue
                        if before_id is not None and cid >= before_id:
                            continue
                        if filter and not all(c.metadata.get(k) == v for k, v in filter.items()):
                            continue
                        picked.append(c)
            picked.sort(key=lambda c: c.checkpoint_id, reverse=True)
            if limit is not None:
                picked = picked[:limit]
            tuples = [self._tuple(c) for c in picked]
        yield from tuples

    # -- ending steps: delete, prune --------------------------------------------------------

    def _end(self, steps: Sequence[str], reason: str) -> None:
        """End these steps (`compensated`, releasing their blobs for GC), in bounded
        transactions. Called with the index caught up, under `_lock`."""
        todo = [s for s in dict.fromkeys(steps)
                if s in self._index.rows and self._index.rows[s].live]
        for start in range(0, len(todo), END_BATCH_MAX):
            events: list[Event] = []
            threads: set[str] = set()
            for step in todo[start:start + END_BATCH_MAX]:
                where = self._index.where.get(step)
                thread = where[1] if where else ""
                threads.add(thread)
                events.append(self._ending(step, thread, reason, release=True))
            recorded = self._commit(events, {}, self._fence(threads - {""}))
            if self._applied(recorded):
                self._mark(events)

    def _steps_of(self, checkpoints: Sequence[_Checkpoint]) -> list[str]:
        """The checkpoints' steps and their pending writes' steps."""
        out = []
        for c in checkpoints:
            out.append(c.step)
            out += [w.step for w in self._index.writes.get(
                (c.thread_id, c.ns, c.checkpoint_id), {}).values()]
        return out

    def delete_thread(self, thread_id: str) -> None:
        """End every checkpoint and write of the thread (GC reclaims their blobs)."""
        self.prune([_thread(thread_id, "delete_thread")], strategy="delete")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """End every checkpoint whose metadata names one of `run_ids`, with its writes."""
        if isinstance(run_ids, str):
            raise InvalidInput("delete_for_runs: give a list of run ids, not one string")
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            self._catch_up()
            doomed = [c for by_ns in self._index.threads.values() for by_id in by_ns.values()
                      for c in by_id.values() if c.metadata.get("run_id") in wanted]
            self._end(self._steps_of(doomed), "langgraph: delete_for_runs")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: keep each namespace's newest checkpoint and its pending writes
        (what a resume, an interrupt's included, needs); `delete`: end them all."""
        if strategy not in PRUNE_STRATEGIES:
            raise InvalidInput(f"prune: strategy {strategy!r} is not one of"
                               f" {', '.join(PRUNE_STRATEGIES)}")
        if isinstance(thread_ids, str):
            raise InvalidInput("prune: give a list of thread ids, not one string")
        threads = [_thread(t, "prune") for t in thread_ids]
        with self._lock:
            self._catch_up()
            doomed: list[_Checkpoint] = []
            for thread in threads:
                for by_id in self._index.threads.get(thread, {}).values():
                    ids = sorted(by_id)
                    if strategy == "keep_latest":
                        ids = ids[:-1]
                    doomed += [by_id[cid] for cid in ids]
                # writes whose checkpoint is gone already go too
                if strategy == "delete":
                    for (t, _ns, _cid), ws in list(self._index.writes.items()):
                        if t == thread:
                            self._end([w.step for w in ws.values()], f"langgraph: {strategy}")
            self._end(self._steps_of(doomed), f"langgraph: prune {strategy}")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread: new steps naming the same blobs
        (values are not stored again)."""
        src = _thread(source_thread_id, "copy_thread")
        dst = _thread(target_thread_id, "copy_thread")
        with self._lock:
            self._catch_up()
            sources = [c for by_id in self._index.threads.get(src, {}).values()
                       for c in by_id.values()]
            writes = {key: list(ws.values()) for key, ws in self._index.writes.items()
                      if key[0] == src}
        for c in sorted(sources, key=lambda c: c.checkpoint_id):
            values = {ch: self._load(v) for ch, v in c.values.items()}
            conf: RunnableConfig = {"configurable": {"thread_id": dst, "checkpoint_ns": c.ns}}
            if c.parent_id:
                conf["configurable"]["checkpoint_id"] = c.parent_id
            self.put(conf, {**c.body, "channel_values": values}, c.metadata,
                     {ch: v.version for ch, v in c.values.items()})
            wconf: RunnableConfig = {"configurable": {"thread_id": dst, "checkpoint_ns": c.ns,
                                                      "checkpoint_id": c.checkpoint_id}}
            for w in sorted(writes.get((src, c.ns, c.checkpoint_id), []),
                            key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx)):
                doc = _decode(self.ledger.read_blob(w.digest, size=w.size))
                value = self.serde.loads_typed(tuple(doc["value"]))
                self._put_write_at(wconf, w, value)

    def _put_write_at(self, config: RunnableConfig, w: _Write, value: Any) -> None:
        """One write with its original idx (copy_thread)."""
        conf = _configurable(config, "copy_thread")
        thread, ns, cid = conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"]
        step = WRITE_PREFIX + _key(thread, ns, cid, w.task_id, w.idx)
        with self._lock:
            self._catch_up()
            if step in self._index.rows and self._index.rows[step].live:
                return
            type_, blob = self.serde.dumps_typed(value)
            doc = _encode({"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid,
                           "task_id": w.task_id, "idx": w.idx, "channel": w.channel,
                           "task_path": w.task_path, "value": [type_, blob]})
            digest = digest_of(doc)
            events = self._step_events(step, thread, [(WRITE_PATH, digest, len(doc))])
            fence = self._fence([thread])
        recorded = self._commit(events, {digest: doc}, fence)
        with self._lock:
            if self._applied(recorded):
                self._mark(events)
                self._index.add_write(thread, ns, cid, _Write(step, w.task_id, w.idx, w.channel,
                                                              w.task_path, digest, len(doc)))

    # -- ownership ---------------------------------------------------------------------------

    def owner_workspace(self, thread_id: str) -> str:
        """The name of the lease that is the thread's ownership: a bare lease (no
        directory; `steptrail --workspace NAME lease show` shows it)."""
        return _lease_name(_thread(thread_id, "owner_workspace"))

    def claim(self, thread_id: str, holder: str, *, ttl_s: float = CLAIM_TTL_S_DEFAULT,
              takeover: bool = False) -> Ownership:
        """Own the thread: from here on this saver's writes to it carry a new epoch of the
        thread's lease, and the ledger refuses them (StaleEpoch) once another worker
        claims it; while this claim is live, every other saver's write to the thread is
        refused (LeaseHeld). Refused with LeaseHeld while another worker's claim is live,
        unless `takeover`. The lease is a record in the ledger, nothing on disk."""
        thread = _thread(thread_id, "claim")
        workspace = self.owner_workspace(thread)
        with self._lock:
            lease = self.ledger.workspaces.acquire(workspace, holder, ttl_s, force=takeover, bare=True)
            own = Ownership(thread, workspace, lease.epoch, holder, float(ttl_s),
                            lease.expires_ns)
            self._owned[thread] = own
        return own

    def renew(self, thread_id: str) -> Ownership:
        """Extend this saver's claim (StaleEpoch if it was taken over or expired: the
        claim stays recorded, stale, and the thread's writes are refused until `claim`)."""
        thread = _thread(thread_id, "renew")
        with self._lock:
            own = self._owned.get(thread)
            if own is None:
                raise InvalidInput(f"thread {thread_id!r} is not claimed by this saver; claim"
                                   " it first (saver.claim(thread_id, holder))")
            lease = self.ledger.workspaces.heartbeat(own.workspace, own.epoch, own.ttl_s)
            own.expires_ns = lease.expires_ns
            return own

    def release(self, thread_id: str) -> None:
        """Give the claim up; later writes to the thread are a non-claimant's again
        (epoch 0: refused while another worker's claim is live).

        A claim another worker took over is not this saver's to give up: StaleEpoch,
        and the lost claim stays recorded, so this saver's writes to the thread go on
        being refused as stale (never let through unfenced) until it claims it again.
        """
        thread = _thread(thread_id, "release")
        with self._lock:
            own = self._owned.get(thread)
            if own is None:
                return
            try:
                self.ledger.workspaces.release(own.workspace, own.epoch)
            except StaleEpoch as exc:
                raise StaleEpoch(exc.workspace, exc.epoch, exc.live,
                                 f"thread {thread!r} was taken over by another worker: its"
                                 " claim is not this saver's to release; this saver's writes"
                                 " to the thread stay refused until it claims it again"
                                 ) from None
            del self._owned[thread]

    # -- versions --------------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """LangGraph's string versions (as its in-memory and SQLite savers): an increasing
        integer and a random fraction."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # -- the async API: the same calls, in the AsyncLedger's pool -----------------------------

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await self.aio.call(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self.aio.call(self.put_writes, config, writes, task_id, task_path)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.aio.call(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        tuples = await self.aio.call(lambda: list(self.list(config, filter=filter, before=before,
                                                            limit=limit)))
        for tup in tuples:
            yield tup

    async def adelete_thread(self, thread_id: str) -> None:
        await self.aio.call(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.aio.call(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.aio.call(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.aio.call(self.prune, thread_ids, strategy=strategy)

    async def aclaim(self, thread_id: str, holder: str, *, ttl_s: float = CLAIM_TTL_S_DEFAULT,
                     takeover: bool = False) -> Ownership:
        return await self.aio.call(self.claim, thread_id, holder, ttl_s=ttl_s, takeover=takeover)

    def close(self) -> None:
        """Stop the async pool (the ledger stays open: it is the caller's)."""
        self.aio._pool.shutdown(wait=True)

    async def aclose(self) -> None:
        await self.aio.aclose()


__all__ = ["LedgerSaver", "Ownership"]
