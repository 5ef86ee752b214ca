"""Failure classification (transient / deterministic / ambiguous / irreversible),
bounded backoff, and the transient-only retry loop. Nothing here really sleeps."""

from __future__ import annotations

import errno
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import (
    EXIT_ENVIRONMENT,
    BlobCorrupt,
    BlobNotFound,
    CompensationWindowClosed,
    CorruptLedger,
    EnvironmentFailure,
    HeadMismatch,
    IdempotencyConflict,
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LedgerBusy,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    ManifestConflict,
    NotALedger,
    PathEscapes,
    ProtocolRefused,
    ReadOnlyLedger,
    ReplanRefused,
    StaleEpoch,
    StorageFailure,
    UnknownStep,
    UnknownWorkspace,
    Unsettled,
)
from ledger.outcomes import (
    ACTIONS,
    Backoff,
    Classified,
    Outcome,
    classify,
    retry_transient,
)

T, D, A, I = Outcome.TRANSIENT, Outcome.DETERMINISTIC, Outcome.AMBIGUOUS, Outcome.IRREVERSIBLE
DIGEST = "ab" * 32


def _oserror(code: int) -> OSError:
    return OSError(code, "boom")


# (id, exception, outcome without commit, outcome with commit_attempted)
CASES: list[tuple[str, BaseException, Outcome, Outcome]] = [
    ("busy", LedgerBusy("/l.db", 5.0), T, T),
    ("lease-held", LeaseHeld("ws", 3, "other", 123), T, T),
    ("stale-epoch", StaleEpoch("ws", 7, 8), T, T),
    ("stale-epoch-no-lease", StaleEpoch("ws", 7, None, "expired"), T, T),
    ("storage", StorageFailure("/l.db", "disk full"), T, A),
    ("environment", EnvironmentFailure("lock failed"), T, A),
    ("enospc", _oserror(errno.ENOSPC), T, A),
    ("eio", _oserror(errno.EIO), T, A),
    ("timeout", TimeoutError("read timed out"), T, A),
    ("connection", ConnectionResetError(errno.ECONNRESET, "reset"), T, A),
    ("invalid", InvalidInput("bad field"), D, D),
    ("path-escapes", PathEscapes("ws", "../x", "leaves the workspace"), D, D),
    ("illegal", IllegalTransition("s", 1, "acked", "not published"), D, D),
    ("idempotency", IdempotencyConflict("s/1/planned", 4), D, D),
    ("manifest", ManifestConflict("s", 1, 2), D, D),
    ("replan", ReplanRefused("s", "pre_hash changed"), D, D),
    ("window", CompensationWindowClosed("s", 4000.0, 3600.0), D, D),
    ("unknown-step", UnknownStep("s"), D, D),
    ("unknown-workspace", UnknownWorkspace("ws"), D, D),
    ("corrupt", CorruptLedger("/l.db", "broken chain"), D, D),
    ("blob-corrupt", BlobCorrupt(DIGEST, "wrong size"), D, D),
    ("not-a-ledger", NotALedger("/x", "no header"), D, D),
    ("ledger-not-found", LedgerNotFound("/x"), D, D),
    ("too-new", LedgerTooNew("/x", 9, 1), D, D),
    ("read-only", ReadOnlyLedger("/x"), D, D),
    ("head-mismatch", HeadMismatch("abc", "cut off"), D, D),
    ("blob-not-found", BlobNotFound(DIGEST), T, T),
    ("unsettled", Unsettled("ws", ["s1", "s2"]), A, A),
    ("unknown-runtime", RuntimeError("?"), A, A),
    ("unknown-value", ValueError("?"), A, A),
    ("unknown-oserror", PermissionError(errno.EACCES, "denied"), A, A),
    ("unknown-ledger-error", LedgerError("?"), A, A),
    ("unknown-refusal", ProtocolRefused("?"), A, A),
    ("keyboard-interrupt", KeyboardInterrupt(), A, A),
]


@pytest.mark.parametrize(("exc", "plain", "committed"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_rules(exc: BaseException, plain: Outcome, committed: Outcome) -> None:
    for commit_attempted, want in ((False, plain), (True, committed)):
        got = classify(exc, commit_attempted=commit_attempted)
        assert got.outcome is want
        assert got.retry is (want is T)
        assert got.needs_human is False
        assert got.action == ACTIONS[want]
        assert "\n" not in got.reason and got.reason.startswith(type(exc).__name__)
        assert got.evidence["message"] == str(exc)
        assert str(got.evidence["type"]).endswith(type(exc).__qualname__)


@pytest.mark.parametrize("exc", [c[1] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("commit_attempted", [False, True])
def test_irreversible_overrides_everything(exc: BaseException, commit_attempted: bool) -> None:
    got = classify(exc, irreversible=True, commit_attempted=commit_attempted)
    assert got.outcome is I
    assert got.needs_human and not got.retry
    assert got.action == "ask a human; recorded, not retried"


def test_actions_are_the_documented_ones() -> None:
    assert {str(k): v for k, v in ACTIONS.items()} == {
        "transient": "retry with backoff under a new lease",
        "deterministic": "stop; fix the input or the plan",
        "ambiguous": "reconcile: read the ledger and the workspace before retrying",
        "irreversible": "ask a human; recorded, not retried",
    }
    assert Outcome("ambiguous") is A and f"{T}" == "transient"


def test_reasons_name_the_cause() -> None:
    assert "re-store" in classify(BlobNotFound(DIGEST)).reason
    assert "new lease" in classify(StaleEpoch("ws", 1, 2)).reason
    assert "older epoch" in classify(Unsettled("ws", ["s"])).reason
    assert "durable" in classify(StorageFailure("/l", "EIO"), commit_attempted=True).reason
    assert "ENOSPC" in classify(_oserror(errno.ENOSPC)).reason
    assert "unknown" in classify(RuntimeError("x")).reason


def test_evidence_carries_type_message_exit_code_and_fields() -> None:
    exc = StaleEpoch("ws", 7, 8)
    ev = classify(exc).evidence
    assert ev["type"] == "ledger.errors.StaleEpoch"
    assert ev["exit_code"] == 1
    assert ev["fields"] == {"workspace": "ws", "epoch": 7, "live": 8}

    ev = classify(Unsettled("ws", ["a", "b"])).evidence
    assert ev["fields"] == {"workspace": "ws", "steps": ["a", "b"]}

    ev = classify(_oserror(errno.ENOSPC)).evidence
    assert ev["errno"] == "ENOSPC" and "exit_code" not in ev

    try:
        try:
            raise OSError(errno.EIO, "read failed")
        except OSError as inner:
            raise StorageFailure("/l.db", "I/O error") from inner
    except StorageFailure as outer:
        ev = classify(outer).evidence
    assert ev["exit_code"] == EXIT_ENVIRONMENT
    assert str(ev["cause"]).startswith("OSError: ")


def test_classified_is_frozen_and_hashable() -> None:
    got = classify(LedgerBusy("/l", 1.0))
    assert isinstance(got, Classified)
    with pytest.raises(AttributeError):
        got.outcome = D  # type: ignore[misc]
    assert hash(got) == hash(classify(LedgerBusy("/l", 1.0)))


# --- Backoff ---------------------------------------------------------------------------


def test_backoff_defaults_without_jitter() -> None:
    assert Backoff(jitter=0).delays() == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert Backoff(base_s=1, max_s=3, attempts=5, jitter=0).delays() == [1, 2, 3, 3]
    assert Backoff(attempts=1).delays() == []


def test_backoff_is_deterministic_given_rng_and_bounded() -> None:
    b = Backoff(base_s=1, max_s=4, attempts=8, jitter=0.5)
    first = b.delays(random.Random(42))
    assert first == b.delays(random.Random(42))
    assert len(first) == 7 and all(0 <= d <= 4 for d in first)
    assert first[-1] <= 4 and first[0] >= 0.5


def test_backoff_large_attempts_does_not_overflow() -> None:
    delays = Backoff(base_s=1, factor=10, max_s=60, attempts=2000, jitter=0).delays()
    assert len(delays) == 1999 and delays[-1] == 60


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"base_s": -1}, "base_s"),
        ({"base_s": float("nan")}, "base_s"),
        ({"base_s": "1"}, "base_s"),
        ({"factor": 0.5}, "factor"),
        ({"factor": float("inf")}, "factor"),
        ({"max_s": 0.01}, "max_s"),
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": True}, "jitter"),
    ],
)
def test_backoff_validation(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=rf"Backoff\.{field}=.*; give") as info:
        Backoff(**kwargs)  # type: ignore[arg-type]
    assert info.value.exit_code == 2


@settings(max_examples=200, deadline=None)
@given(
    base_s=st.floats(0, 10),
    factor=st.floats(1, 10),
    extra=st.floats(0, 100),
    attempts=st.integers(1, 50),
    jitter=st.floats(0, 1),
    seed=st.integers(0, 2**32),
)
def test_backoff_delays_property(
    base_s: float, factor: float, extra: float, attempts: int, jitter: float, seed: int
) -> None:
    b = Backoff(base_s=base_s, factor=factor, max_s=base_s + extra, attempts=attempts,
                jitter=jitter)
    delays = b.delays(random.Random(seed))
    assert len(delays) == attempts - 1
    assert all(0 <= d <= b.max_s for d in delays)
    assert delays == b.delays(random.Random(seed))


# --- retry_transient -------------------------------------------------------------------


class Flaky:
    """Raises the given exceptions in turn, then returns "done"."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


NOJITTER = Backoff(base_s=1, factor=2, max_s=3, attempts=4, jitter=0)


def test_retries_transient_then_succeeds() -> None:
    fn = Flaky(LedgerBusy("/l", 1), StaleEpoch("ws", 1, 2), BlobNotFound(DIGEST))
    sleeps: list[float] = []
    renews: list[int] = []
    seen: list[tuple[int, Outcome]] = []
    got = retry_transient(
        fn, backoff=NOJITTER, sleep=sleeps.append,
        renew=lambda: renews.append(fn.calls),
        on_retry=lambda n, c: seen.append((n, c.outcome)),
    )
    assert got == "done" and fn.calls == 4
    assert sleeps == [1, 2, 3] == NOJITTER.delays()
    assert renews == [1, 2, 3]  # renewed before each retry, never before the first call
    assert seen == [(1, T), (2, T), (3, T)]


def test_sleeps_follow_jittered_delays_for_the_same_rng() -> None:
    b = Backoff(base_s=1, max_s=10, attempts=5, jitter=0.3)
    sleeps: list[float] = []
    fn = Flaky(*[LedgerBusy("/l", 1)] * 4)
    assert retry_transient(fn, backoff=b, sleep=sleeps.append, rng=random.Random(7)) == "done"
    assert sleeps == b.delays(random.Random(7))


def test_success_first_time_never_sleeps_or_renews() -> None:
    sleeps: list[float] = []
    renew_calls: list[None] = []
    fn = Flaky()
    assert retry_transient(fn, sleep=sleeps.append,
                           renew=lambda: renew_calls.append(None)) == "done"
    assert fn.calls == 1 and sleeps == [] and renew_calls == []


@pytest.mark.parametrize(
    "exc",
    [
        IllegalTransition("s", 1, "acked", "x"),
        PathEscapes("ws", "/etc", "absolute"),
        Unsettled("ws", ["s"]),
        RuntimeError("unknown"),
    ],
    ids=["deterministic", "path-escapes", "unsettled", "unknown"],
)
def test_non_transient_reraises_immediately(exc: Exception) -> None:
    sleeps: list[float] = []
    fn = Flaky(exc)
    with pytest.raises(type(exc)) as info:
        retry_transient(fn, backoff=NOJITTER, sleep=sleeps.append)
    assert info.value is exc and fn.calls == 1 and sleeps == []


def test_commit_attempted_makes_storage_failure_stop() -> None:
    exc = StorageFailure("/l", "EIO at COMMIT")
    fn = Flaky(exc)
    with pytest.raises(StorageFailure) as info:
        retry_transient(fn, backoff=NOJITTER, sleep=lambda s: None, commit_attempted=True)
    assert info.value is exc and fn.calls == 1
    fn = Flaky(StorageFailure("/l", "EIO before COMMIT"))
    assert retry_transient(fn, backoff=NOJITTER, sleep=lambda s: None) == "done"


def test_gives_up_after_attempts_with_the_last_exception() -> None:
    failures = [LedgerBusy("/l", float(i)) for i in range(10)]
    fn = Flaky(*failures)
    sleeps: list[float] = []
    with pytest.raises(LedgerBusy) as info:
        retry_transient(fn, backoff=NOJITTER, sleep=sleeps.append)
    assert fn.calls == NOJITTER.attempts == 4
    assert info.value is failures[3]
    assert sleeps == [1, 2, 3]


def test_single_attempt_never_retries() -> None:
    fn = Flaky(LedgerBusy("/l", 1))
    with pytest.raises(LedgerBusy):
        retry_transient(fn, backoff=Backoff(attempts=1), sleep=lambda s: pytest.fail("slept"))
    assert fn.calls == 1


def test_failing_renew_counts_as_an_attempt() -> None:
    fn = Flaky(StaleEpoch("ws", 1, 2))
    renew_failures = [LeaseHeld("ws", 2, "other", 99)]

    def renew() -> None:
        if renew_failures:
            raise renew_failures.pop(0)

    assert retry_transient(fn, backoff=NOJITTER, sleep=lambda s: None, renew=renew) == "done"
    assert fn.calls == 2  # attempt 2 failed in renew, attempt 3 called fn

    def deny() -> None:
        raise IllegalTransition("s", 1, "lease", "refused")

    with pytest.raises(IllegalTransition):
        retry_transient(Flaky(StaleEpoch("ws", 1, 2)), backoff=NOJITTER,
                        sleep=lambda s: None, renew=deny)


def test_base_exceptions_are_not_caught() -> None:
    fn = Flaky(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        retry_transient(fn, sleep=lambda s: pytest.fail("slept"))
    assert fn.calls == 1

