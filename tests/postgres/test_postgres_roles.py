"""The role split docs/operations.md ("A ledger on PostgreSQL", **Roles**) recommends: an
administrator's role owns the tables; the workers' role has SELECT and INSERT on them,
plus UPDATE and DELETE on the projection tables, and nothing else (on the schema marker
`stepledger_schema` SELECT alone: INSERT there would let a worker add a second row,
which every open then refuses).

With exactly those grants a worker runs the whole workload (workspace, lease, fenced
apply, artifacts stored as chunk rows, publish, ack, compensate, verify with its TEMP
tables, GC, audit, rebuild, the command line), and every way of rewriting the events
that the triggers alone would leave to an owner (dropping or disabling a trigger,
replacing their function) is refused to it by privileges; the control shows the same
statements go through for a role that owns the tables. Sealing a run (it deletes
events) is the admin's alone. A grant the worker lacks is AccessDenied, naming the fix.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import FakeClock, run_cli
from psycopg import sql

from ledger import Ledger
from ledger.errors import (
    AccessDenied,
    EnvironmentFailure,
    NotALedger,
)
from ledger.step.values import StepPlan, Write
from ledger.gc import audit, collect
from ledger.seal import seal_run
from ledger.store.postgres.schema import TABLES

#: What the doc says the workers' role may UPDATE and DELETE.
PROJECTION_TABLES = ("steps", "pins", "manifests", "manifest_entries", "workspaces",
                     "ws_paths", "projection_checkpoint", "meta", "condemned", "blob_data",
                     "blob_files", "blob_chunks")
#: The doc's SELECT and INSERT on every ledger table; the schema marker SELECT only.
INSERT_TABLES = tuple(t for t in TABLES if t != "stepledger_schema")

LARGE = os.urandom(1_500_000)  # over the inline limit: a blob_files row, two 1 MiB chunks
SMALL = b"a small artifact\n"
_roles = itertools.count(1)


def h(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def as_role(url: str, role: str) -> str:
    assert url.startswith("postgresql://steptrail@"), url
    return url.replace("postgresql://steptrail@", f"postgresql://{role}@", 1)


def admin(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def events_of(url: str) -> list[tuple]:
    with admin(url) as conn:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()


def make_role(url: str, name: str) -> None:
    with admin(url) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))


def drop_role(url: str, name: str) -> None:
    with admin(url) as conn:  # its privileges and objects here, then the role
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def grant_worker(url: str, role: str) -> None:
    """Exactly the doc's grants, nothing more."""
    r = sql.Identifier(role)
    with admin(url) as conn:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(r))
        conn.execute(sql.SQL("GRANT SELECT ON stepledger_schema TO {}").format(r))
        for table in INSERT_TABLES:
            conn.execute(sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(
                sql.Identifier(table), r))
        for table in PROJECTION_TABLES:
            conn.execute(sql.SQL("GRANT UPDATE, DELETE ON {} TO {}").format(
                sql.Identifier(table), r))


def granted(url: str, role: str) -> dict[str, set[str]]:
    with admin(url) as conn:
        rows = conn.execute(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = %s AND table_schema = 'public'", (role,)).fetchall()
    out: dict[str, set[str]] = {}
    for table, privilege in rows:
        out.setdefault(table, set()).add(privilege)
    return out


@pytest.fixture
def worker(pg_url: str) -> Iterator[str]:
    """A ledger the admin (`steptrail`) initialised and owns, and the URL of a LOGIN
    role holding exactly the doc's grants on it."""
    Ledger.init(pg_url, clock=FakeClock()).close()
    role = f"worker_{os.getpid()}_{next(_roles)}"
    make_role(pg_url, role)
    try:
        grant_worker(pg_url, role)
        yield as_role(pg_url, role)
    finally:
        drop_role(pg_url, role)


def test_the_grants_are_exactly_the_docs(pg_url: str, worker: str) -> None:
    role = worker.split("//", 1)[1].split("@", 1)[0]
    expected = {t: {"SELECT", "INSERT"} for t in INSERT_TABLES}
    expected["stepledger_schema"] = {"SELECT"}
    for table in PROJECTION_TABLES:
        expected[table] |= {"UPDATE", "DELETE"}
    assert granted(pg_url, role) == expected
    assert set(expected) == set(TABLES)
    assert granted(pg_url, role)["events"] == {"SELECT", "INSERT"}
    with admin(pg_url) as conn:
        owners = set(conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = ANY(%s)",
                                  (list(TABLES),)).fetchall())
        assert owners == {("steptrail",)}
        # PUBLIC's default TEMP on the database is what verify's scratch tables need
        assert conn.execute("SELECT has_database_privilege(%s, current_database(), 'TEMP'),"
                            " has_schema_privilege(%s, 'public', 'CREATE')",
                            (role, role)).fetchone() == (True, False)


def test_a_worker_runs_the_whole_workload_with_only_those_grants(
        pg_url: str, worker: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "app.py").write_text("v0")
    clock = FakeClock(start_ns=FakeClock().now + 10**12)  # after the admin's init
    with Ledger.open(worker, clock=clock) as led:
        led.workspaces.add("w", str(ws))
        epoch = led.workspaces.acquire("w", "agent", ttl_s=3600).epoch
        led.workspaces.heartbeat("w", epoch, ttl_s=3600)

        # a fenced step that writes a file, published and acked
        led.workspaces.admit("w", epoch, [StepPlan("s1", [Write("app.py", b"v1", h("v0"), None)],
                                        run="run-1")])
        assert led.workspaces.apply("s1", epoch=epoch).verdict == "applied"
        assert (ws / "app.py").read_text() == "v1"
        led.publish("s1")
        led.ack("s1")
        assert led.step("s1").state == "acked"

        # an artifact over the inline threshold (chunk rows) and a small one (inline)
        row = led.plan("art", artifacts=["big.bin", "small.txt"])
        led.store("art", row.attempt, "big.bin", LARGE)
        led.store("art", row.attempt, "small.txt", SMALL)
        led.publish("art")
        led.ack("art")
        assert led.read_blob(h(LARGE)) == LARGE and led.read_blob(h(SMALL)) == SMALL
        with admin(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM blob_chunks WHERE digest = %s",
                                (h(LARGE),)).fetchone()[0] == 2
            assert conn.execute("SELECT count(*) FROM blob_data WHERE digest = %s",
                                (h(SMALL),)).fetchone()[0] == 1

        # another fenced step, compensated: the file goes back
        led.workspaces.admit("w", epoch, [StepPlan("s2", [Write("app.py", b"v2", h("v1"), None)],
                                        run="run-1")])
        assert led.workspaces.apply("s2", epoch=epoch).verdict == "applied"
        assert (ws / "app.py").read_text() == "v2"
        comp = led.workspaces.compensate("s2", epoch=epoch, reason="tests failed")
        assert [r.outcome for r in comp.restored] == ["restored"]
        assert (ws / "app.py").read_text() == "v1"

        # an abandoned attempt's blobs: orphans the collector deletes (rows and chunks)
        orphan_big, orphan_small = os.urandom(200_000), b"an orphan"
        row = led.plan("orphan", artifacts=["o.bin", "o.txt"])
        led.store("orphan", row.attempt, "o.bin", orphan_big)
        led.store("orphan", row.attempt, "o.txt", orphan_small)
        led.workspaces.compensate("orphan", row.attempt, reason="abandoned")
        clock.advance(10)
        report = collect(led, grace_s=0, force=True)
        gone = {r.event.digest for r in led.read(kind="blob-collected")}
        assert {h(orphan_big), h(orphan_small)} <= gone, report  # (and s2's post-image)
        assert report.collected == len(gone) and not {h(LARGE), h(SMALL)} & gone
        with admin(pg_url) as conn:
            assert conn.execute(
                "SELECT (SELECT count(*) FROM blob_chunks WHERE digest = %(d)s)"
                " + (SELECT count(*) FROM blob_files WHERE digest = %(d)s)"
                " + (SELECT count(*) FROM blob_data WHERE digest = %(s)s)"
                " + (SELECT count(*) FROM condemned)",
                {"d": h(orphan_big), "s": h(orphan_small)}).fetchone()[0] == 0
        found = audit(led, deep=True)
        assert found.violations == 0 and found.ok, found

        steps = led.rebuild()
        assert steps == 4
        assert led.step("s1").state == "acked" and led.step("art").state == "acked"
        assert led.verify().ok
        led.workspaces.release("w", epoch)

    out = run_cli(["--ledger", worker, "verify"])
    assert out.code == 0, out
    with Ledger.open(pg_url) as led:  # the admin sees the same, intact ledger
        assert led.verify().ok
        assert led.read_blob(h(LARGE)) == LARGE


ATTACKS = {
    "update events": "UPDATE events SET payload = '\\x00'::bytea",
    "delete from events": "DELETE FROM events",
    "truncate events": "TRUNCATE events",
    "drop a trigger": "DROP TRIGGER events_no_update ON events",
    "disable the triggers": "ALTER TABLE events DISABLE TRIGGER ALL",
    "replace the function": (
        "CREATE OR REPLACE FUNCTION stepledger_events_append_only() RETURNS trigger"
        " LANGUAGE plpgsql AS $$BEGIN RETURN OLD; END$$"),
    "change the schema version": "UPDATE stepledger_schema SET version = 99",
    "add a schema row": "INSERT INTO stepledger_schema VALUES ('steptrail', 99)",
    "create a table": "CREATE TABLE public.sealed_ranges_2(x int)",
    "truncate a projection": "TRUNCATE steps",
}


def test_a_worker_cannot_rewrite_the_events(pg_url: str, worker: str) -> None:
    with Ledger.open(worker, clock=FakeClock(start_ns=FakeClock().now + 10**12)) as led:
        for i in range(3):  # some events that are the worker's own
            row = led.plan(f"s{i}", artifacts=["a"])
            led.store(f"s{i}", row.attempt, "a", f"artifact {i}".encode())
            led.publish(f"s{i}")
            led.ack(f"s{i}")
    before = events_of(pg_url)
    assert len(before) > 10
    refused = {}
    with psycopg.connect(worker, autocommit=True) as conn:
        for name, statement in ATTACKS.items():
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(statement)
            refused[name] = caught.value
    for name, exc in refused.items():
        assert isinstance(exc, psycopg.errors.InsufficientPrivilege), (name, exc)
        # refused by the privileges, not by the triggers' own error
        assert "append-only" not in str(exc), (name, exc)
        assert "permission denied" in str(exc) or "must be owner" in str(exc), (name, exc)
    assert events_of(pg_url) == before
    with Ledger.open(pg_url) as led:
        report = led.verify()
        assert report.ok, report
    with admin(pg_url) as conn:
        from ledger.store.postgres.schema import SCHEMA_VERSION
        assert conn.execute("SELECT version FROM stepledger_schema").fetchall() == \
            [(SCHEMA_VERSION,)]


@pytest.mark.parametrize("how", ["owns the tables", "granted ALL"])
def test_control_an_owner_can_drop_the_trigger(pg_url: str, how: str) -> None:
    """Without the split the same statements go through (an owner), or are stopped by the
    triggers alone (ALL privileges): the privileges are what stop a split worker."""
    role = f"owner_{os.getpid()}_{next(_roles)}"
    make_role(pg_url, role)
    url = as_role(pg_url, role)
    try:
        if how == "owns the tables":
            with admin(pg_url) as conn:
                conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
                    sql.Identifier(role)))
            Ledger.init(url, clock=FakeClock()).close()
        else:
            Ledger.init(pg_url, clock=FakeClock()).close()
            with admin(pg_url) as conn:
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(
                    sql.Identifier(role)))
                conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(
                    sql.Identifier(role)))
        with Ledger.open(url) as led:
            row = led.plan("s", artifacts=["a"])
            led.store("s", row.attempt, "a", b"artifact")
            led.publish("s")
            led.ack("s")
        before = events_of(pg_url)
        with psycopg.connect(url, autocommit=True) as conn:
            # what the triggers stop, for either role
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute("UPDATE events SET payload = '\\x00'::bytea")
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute("TRUNCATE events")
            if how == "owns the tables":
                conn.execute("DROP TRIGGER events_no_update ON events")
                conn.execute("ALTER TABLE events DISABLE TRIGGER ALL")
                conn.execute("UPDATE events SET payload = '\\x00'::bytea WHERE seq = 1")
            else:  # not the owner: only the privileges the split also withholds
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="owner"):
                    conn.execute("DROP TRIGGER events_no_update ON events")
        if how == "owns the tables":
            assert events_of(pg_url) != before
            with pytest.raises(NotALedger, match="events_no_update was dropped"):
                Ledger.open(pg_url)
            with Ledger.open(pg_url, readonly=True, forensic=True) as led:
                report = led.verify()  # names what was done
            assert not report.ok
        else:
            assert events_of(pg_url) == before
    finally:
        drop_role(pg_url, role)


def test_sealing_a_run_is_the_admins(pg_url: str, worker: str, tmp_path: Path) -> None:
    """A seal deletes the run's events: under the split only the admin's role may (the
    worker has no DELETE on events, nor anything on sealed_ranges but INSERT)."""
    with Ledger.open(worker, clock=FakeClock(start_ns=FakeClock().now + 10**12)) as led:
        row = led.plan("s", artifacts=["a"], run="r1")
        led.store("s", row.attempt, "a", b"artifact")
        led.publish("s")
        led.ack("s")
        before = events_of(pg_url)
        with pytest.raises(EnvironmentFailure, match="permission denied for table events"):
            seal_run(led, "r1", str(tmp_path / "archive"))
    assert events_of(pg_url) == before
    with Ledger.open(pg_url) as led:
        assert led.verify().ok


def test_a_missing_grant_is_access_denied(pg_url: str, worker: str) -> None:
    role = worker.split("//", 1)[1].split("@", 1)[0]
    with admin(pg_url) as conn:
        conn.execute(sql.SQL("REVOKE UPDATE ON steps FROM {}").format(sql.Identifier(role)))
    with Ledger.open(worker, clock=FakeClock(start_ns=FakeClock().now + 10**12)) as led:
        with pytest.raises(AccessDenied):
            led.plan("s", artifacts=["a"])


def test_a_worker_may_read_an_unmigrated_ledger_but_not_write_it(
        pg_url: str, worker: str) -> None:
    """A ledger of an older format that a worker's role may not migrate (the schema is
    the admin's): the worker reads it as it is; its read-write open is AccessDenied,
    naming the fix, and writes nothing (v6 writers do not rewrite the checkpoint at each
    commit, so writing a v5 ledger as it is would make its tables read as lagging). The
    admin's open migrates it; then the worker writes."""
    with admin(pg_url) as conn:
        conn.execute("DROP TRIGGER checkpoint_follows ON projection_checkpoint")
        conn.execute("DROP FUNCTION stepledger_checkpoint_follows()")
        conn.execute("UPDATE projection_checkpoint SET last_seq ="
                     " coalesce((SELECT max(seq) FROM events), 0)")
        conn.execute("UPDATE stepledger_schema SET version = 5")
    clock = FakeClock(start_ns=FakeClock().now + 10**12)
    with Ledger.open(worker, readonly=True, clock=clock) as led:
        assert led.storage.info.version == 5 and led.verify().ok
    with pytest.raises(AccessDenied, match="owner open it read-write once"):
        Ledger.open(worker, clock=clock)
    with admin(pg_url) as conn:
        assert conn.execute("SELECT version FROM stepledger_schema").fetchone()[0] == 5
    Ledger.open(pg_url, clock=clock).close()  # the admin's open migrates it
    with Ledger.open(worker, clock=clock) as led:
        led.plan("s", artifacts=["a"])
        assert led.verify().ok
