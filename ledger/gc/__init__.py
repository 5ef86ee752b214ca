"""The collector and the byte audit (docs/design.md "GC", "Read side", invariant I8).

    from ledger import Ledger
    from ledger.gc import audit, collect

    with Ledger.open("ws/.steptrail/ledger.db") as ledger:
        report = collect(ledger, grace_s=24 * 3600)       # condemn, re-check, unlink, record
        print(report.collected, report.reclaimed_bytes)
        assert audit(ledger).ok                          # every byte in one bucket
"""

from .audit import AuditReport, Bucket, audit
from .collector import (
    CollectorBusy,
    GcReport,
    collect,
    last_run,
    parse_duration,
)
from .grace import DEFAULT_GRACE_S, MIN_GRACE_S, check_grace
from .holders import GcRefused, read_references

__all__ = [
    "last_run",
    "read_references",
    "DEFAULT_GRACE_S",
    "MIN_GRACE_S",
    "check_grace",
    "AuditReport",
    "Bucket",
    "CollectorBusy",
    "GcRefused",
    "GcReport",
    "audit",
    "collect",
    "parse_duration",
]
