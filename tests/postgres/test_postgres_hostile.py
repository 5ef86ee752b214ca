"""Hostile input to the PostgreSQL store: the database itself and the URLs naming it.

A PostgreSQL ledger can be reached by anything holding its role, so the guarantees the
SQLite file gets from its schema allow-list are checked here on a real server (the
session's throwaway one, a fresh database per test):

* append-only in the database itself: UPDATE, DELETE and TRUNCATE of `events` through a
  raw connection of the application's own role are refused; with the triggers dropped or
  disabled they go through, and then every read-write open is refused (`NotALedger`,
  naming the trigger) while a forensic `verify` reports the change, as SQLite's does;
* a database that is not a ledger (empty, another application's `events`, a newer
  schema, planted triggers, rules, constraints and indexes) is refused and left exactly
  as it was; a row edited behind the ledger's back is a chain finding, as on SQLite;
* hostile URLs are typed one-line errors that never show the password, through the
  library and through the command line (``steptrail --ledger URL verify``).

The findings are compared with what the SQLite store reports for the same damage to the
same ledger (the same events on the same fake clock), so the two stay alike.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import FakeClock, closed_port, commit_step, run_cli, tamper

from ledger import Head, Ledger, Planned
from ledger import events as ev
from ledger.errors import (
    AccessDenied,
    DatabaseUnavailable,
    InvalidInput,
    LedgerError,
    LedgerNotFound,
    LedgerTooNew,
    NotALedger,
)

psycopg = pytest.importorskip("psycopg")

EVENTS = 13  # a, b, c committed (4 events each), d planned
SECRET = "s3cret"


def build(location: str | Path) -> list[Any]:
    """The ledger every test damages: the same events, on the same clock, on either store."""
    with Ledger.init(location, clock=FakeClock()) as led:
        for s in "abc":
            commit_step(led, s)
        led.append(Planned(step="d", attempt=1))
        events = list(led.read())
    assert len(events) == EVENTS
    return events


@pytest.fixture
def pg_ledger(pg_url: str) -> tuple[str, list[Any]]:
    return pg_url, build(pg_url)


def raw(url: str) -> Any:
    """A plain psycopg connection with the application's own URL (the same role)."""
    return psycopg.connect(url, autocommit=True)


def run(url: str, *statements: str | tuple[str, tuple[Any, ...]]) -> None:
    with raw(url) as conn:
        for s in statements:
            sql, params = (s, ()) if isinstance(s, str) else s
            conn.execute(sql, params)


def db_state(url: str) -> dict[str, Any]:
    """Everything in the database's public schema: each relation's kind and rows, and
    the triggers, rules, constraints and functions (what "left untouched" compares)."""
    with raw(url) as conn:
        rels = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c WHERE c.relnamespace ="
            " 'public'::regnamespace ORDER BY 1").fetchall()
        out: dict[str, Any] = {"relations": rels}
        for name, kind in rels:
            if kind == "r":
                out[f"rows:{name}"] = sorted(map(repr, conn.execute(
                    psycopg.sql.SQL("SELECT * FROM {}").format(psycopg.sql.Identifier(name)))))
        out["triggers"] = conn.execute(
            "SELECT tgname, tgrelid::regclass::text, tgenabled FROM pg_trigger"
            " WHERE NOT tgisinternal ORDER BY 1").fetchall()
        out["rules"] = conn.execute(
            "SELECT rulename, tablename FROM pg_rules WHERE schemaname = 'public'"
            " ORDER BY 1").fetchall()
        out["constraints"] = conn.execute(
            "SELECT conname, conrelid::regclass::text, pg_get_constraintdef(oid)"
            " FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1"
        ).fetchall()
        out["functions"] = conn.execute(
            "SELECT proname, prosrc, proconfig FROM pg_proc WHERE pronamespace ="
            " 'public'::regnamespace ORDER BY 1").fetchall()
    return out


def findings(location: str | Path, **kwargs: Any) -> list[tuple[str, int, str]]:
    """A forensic, read-only verify's findings as (check, seq, message)."""
    with Ledger.open(location, readonly=True, forensic=True) as led:
        report = led.verify(**kwargs)
    assert report.ok == (not report.findings)
    return [(f.check, f.seq, f.message) for f in report.findings]


def refused_everywhere(url: str, error: type[LedgerError], match: str) -> None:
    """Every way in (read-write, read-only, init) refuses with `error` naming `match`, and
    writes nothing."""
    before = db_state(url)
    for how in ("readwrite", "readonly", "init"):
        with pytest.raises(error) as info:
            if how == "init":
                Ledger.init(url).close()
            else:
                Ledger.open(url, readonly=how == "readonly").close()
        assert match in str(info.value), (how, str(info.value))
        assert "\n" not in str(info.value)
    assert db_state(url) == before


# === append-only in the database itself ===================================================

DENIED = {
    "update": "UPDATE events SET payload = payload || '\\x00'::bytea WHERE seq = 6",
    "update-all": "UPDATE events SET time_ns = time_ns + 1",
    "delete": "DELETE FROM events WHERE seq = 13",
    "delete-all": "DELETE FROM events",
    "truncate": "TRUNCATE events",
    "truncate-cascade": "TRUNCATE events, steps CASCADE",
}


@pytest.mark.parametrize("statement", list(DENIED))
def test_events_are_append_only_for_the_applications_own_role(
        pg_ledger: tuple[str, list[Any]], statement: str) -> None:
    url, _ = pg_ledger
    before = db_state(url)
    with raw(url) as conn:
        with pytest.raises(psycopg.Error, match="append-only"):
            conn.execute(DENIED[statement])
        # inside a transaction too (the refusal is the statement's, not the session's)
        with pytest.raises(psycopg.Error, match="append-only"), conn.transaction():
            conn.execute(DENIED[statement])
    assert db_state(url) == before
    assert findings(url) == []


def _sqlite_twin(tmp_path: Path, damage: Callable[[Any], None] | None, *,
                 drop: bool, expect_head: bool = False) -> list[tuple[str, int, str]]:
    """The same ledger on SQLite, damaged the same way (its triggers dropped, or
    dropped and recreated as `tamper` does), and its forensic verify's findings (given
    the head it had before, with `expect_head`)."""
    import apsw

    path = tmp_path / "twin" / "ledger.db"
    last = build(path)[-1]
    head = Head(last.seq, last.hash)
    if drop:
        conn = apsw.Connection(str(path))
        conn.execute("DROP TRIGGER events_no_update")
        conn.execute("DROP TRIGGER events_no_delete")
        if damage is not None:
            damage(conn)
        conn.close()
    elif damage is not None:
        tamper(path, damage)
    return findings(path, expect_head=head if expect_head else None)


def _edit_and_cut(events: list[Any]) -> Callable[[Any], None]:
    """Edit event #6's payload and delete the last event, in either store's dialect."""
    stored = events[5].event
    payload = ev.encode(msgspec.structs.replace(stored, inline=not stored.inline))

    def damage(conn: Any) -> None:
        ph = "%s" if isinstance(conn, psycopg.Connection) else "?"
        conn.execute(f"UPDATE events SET payload = {ph} WHERE seq = 6", (payload,))
        conn.execute(f"DELETE FROM events WHERE seq = {EVENTS}")
    return damage


@pytest.mark.parametrize("how", ["drop", "disable"])
def test_without_its_triggers_the_ledger_is_refused_and_verify_reports_it(
        pg_ledger: tuple[str, list[Any]], tmp_path: Path, how: str) -> None:
    """The control: the refusal above is the triggers' (without them the same
    statements go through), and a ledger without them is refused read-write and reported
    by a forensic verify with the SQLite store's very findings."""
    url, events = pg_ledger
    with Ledger.open(url, readonly=True) as led:
        head = led.head()
    if how == "drop":
        run(url, *(f"DROP TRIGGER {t} ON events" for t in
                   ("events_no_update", "events_no_delete", "events_no_truncate")))
    else:
        run(url, "ALTER TABLE events DISABLE TRIGGER USER")
    damage = _edit_and_cut(events)
    with raw(url) as conn:
        damage(conn)
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == EVENTS - 1
        with conn.transaction(force_rollback=True):  # TRUNCATE goes through too (undone)
            conn.execute("TRUNCATE events")
            assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    word = "dropped" if how == "drop" else "disabled"
    with pytest.raises(NotALedger, match=f"trigger events_no_update was {word}") as info:
        Ledger.open(url)
    assert "events_no_delete" in str(info.value) and "events_no_truncate" in str(info.value)
    with pytest.raises(NotALedger, match="events_no_update"):
        Ledger.open(url, readonly=True)  # only a forensic open examines it
    got = findings(url, expect_head=head)
    twin = _sqlite_twin(tmp_path, damage, drop=True, expect_head=True)
    # SQLite has no TRUNCATE (nor its trigger); otherwise the very same report
    truncate = ("schema", 0, f"VIOLATION: the schema differs from a steptrail v6 ledger:"
                             f" trigger events_no_truncate was {word}")
    assert truncate in got
    assert sorted(f for f in got if f != truncate) == sorted([
        (c, s, m.replace("was dropped", f"was {word}")) for c, s, m in twin])
    checks = {(c, s) for c, s, _ in got}
    assert {("schema", 0), ("chain", 6), ("head", 0)} <= checks, got


def test_a_row_edited_behind_the_ledgers_back_is_a_chain_finding_like_sqlites(
        pg_ledger: tuple[str, list[Any]], tmp_path: Path) -> None:
    """Triggers disabled, one payload edited, triggers enabled again: the schema is the
    ledger's, it opens, and only verify can tell (exactly what SQLite's verify says)."""
    url, events = pg_ledger
    stored = events[5].event
    payload = ev.encode(msgspec.structs.replace(stored, inline=not stored.inline))
    with raw(url) as conn, conn.transaction():
        conn.execute("ALTER TABLE events DISABLE TRIGGER USER")
        conn.execute("UPDATE events SET payload = %s WHERE seq = 6", (payload,))
        conn.execute("ALTER TABLE events ENABLE TRIGGER USER")
    Ledger.open(url).close()  # nothing in the schema says so
    got = findings(url)
    assert {(c, s) for c, s, _ in got} == {("chain", 6)}, got
    twin = _sqlite_twin(
        tmp_path, lambda c: c.execute("UPDATE events SET payload = ? WHERE seq = 6", (payload,)),
        drop=False)
    assert got == twin


def test_a_session_that_skips_triggers_is_a_superusers_tamper_and_verify_sees_it(
        pg_ledger: tuple[str, list[Any]]) -> None:
    """``session_replication_role = replica`` skips ordinary triggers for one session of a
    superuser (the test role is one) and changes no catalog: the PostgreSQL form of
    SQLite's drop-edit-recreate (`tamper`). The schema check cannot see it; the chain can."""
    url, events = pg_ledger
    with raw(url) as conn:
        if not conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                            ).fetchone()[0]:
            pytest.skip("the test role is not a superuser")
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE events SET time_ns = time_ns + 1 WHERE seq = 6")
    assert {(c, s) for c, s, _ in findings(url)} == {("chain", 6)}


def test_a_temporary_table_cannot_shadow_the_seal_check(
        pg_ledger: tuple[str, list[Any]]) -> None:
    """The DELETE exemption (a range a `run-sealed` event registered) reads
    `sealed_ranges` and `events`: with the path a function's ``SET search_path FROM
    CURRENT`` captured, PostgreSQL looks in the session's temporary schema first, so
    any role that may DELETE events (the one sealing does) planted a temporary
    "seal" and deleted any event, leaving every catalog as it was (found here: the
    function now searches the ledger's schema, then pg_temp)."""
    url, _ = pg_ledger
    before = db_state(url)
    with raw(url) as conn:
        conn.execute("CREATE TEMP TABLE sealed_ranges(first_seq bigint, last_seq bigint,"
                     " run text, seal_seq bigint)")
        conn.execute("CREATE TEMP TABLE events(seq bigint, kind text)")
        conn.execute("INSERT INTO sealed_ranges VALUES (1, 1000, '', 1001)")
        conn.execute("INSERT INTO pg_temp.events VALUES (1001, 'run-sealed')")
        for seq in (7, EVENTS):
            with pytest.raises(psycopg.Error, match="append-only"):
                conn.execute("DELETE FROM public.events WHERE seq = %s", (seq,))
    assert db_state(url) == before
    assert findings(url) == []


def _in_schema(url: str, schema: str) -> str:
    from urllib.parse import quote
    return f"{url}?options={quote(f'-csearch_path={schema}')}"


def test_a_ledger_in_a_mixed_case_schema_is_judged_by_its_own_objects(pg_url: str) -> None:
    """``current_schema()::regnamespace`` read the name as SQL (folded to lower case): a
    ledger in schema "Led" could not be created (a raw InvalidSchemaName), and beside a
    schema "led" it was judged by that one's objects (found here)."""
    run(pg_url, 'CREATE SCHEMA "Led"', "CREATE SCHEMA led")
    upper, lower = _in_schema(pg_url, '"Led"'), _in_schema(pg_url, "led")
    build(upper)
    build(lower)
    assert findings(upper) == [] and findings(lower) == []
    run(upper, _LOOT, _EVIL_FN,
        "CREATE TRIGGER evil AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION evil()")
    with pytest.raises(NotALedger, match="trigger evil was added"):
        Ledger.open(upper)
    Ledger.open(lower).close()


def _sealed_world(url: str, tmp_path: Path) -> tuple[int, int]:
    """Two interleaved runs, run0 sealed: (the seal's seq, the first remaining run1 row)."""
    from ledger.runner import run_step
    from ledger.seal import seal_run

    with Ledger.init(url) as led:
        for i in range(2):
            for r in range(2):
                run_step(led, f"r{r}-s{i}", {"out.txt": f"run {r} step {i}".encode()},
                         run=f"run{r}")
        seal = seal_run(led, "run0", str(tmp_path / "archive")).seal_seq
        victim = next(e.seq for e in led.read() if getattr(e.event, "run", "") == "run1")
        assert led.verify().ok
    return seal, victim


def _forge_a_seal_range_and_delete(url: str, seal: int, victim: int) -> int:
    """A row in `sealed_ranges` (which no trigger guards) naming an unsealed event and
    the genuine seal of another run, then the DELETE: how many rows went."""
    with raw(url) as conn:
        conn.execute("INSERT INTO sealed_ranges VALUES (%s, %s, 'run1', %s)",
                     (victim, victim, seal))
        try:
            deleted = conn.execute("DELETE FROM events WHERE seq = %s", (victim,)).rowcount
        except psycopg.Error as exc:
            assert "append-only" in str(exc)
            deleted = 0
        conn.execute("DELETE FROM sealed_ranges WHERE first_seq = %s", (victim,))
    return deleted


def test_a_forged_seal_range_is_seen_by_verify(pg_url: str, tmp_path: Path) -> None:
    seal, victim = _sealed_world(pg_url, tmp_path)
    deleted = _forge_a_seal_range_and_delete(pg_url, seal, victim)
    checks = {(c, s) for c, s, _ in findings(pg_url)}
    if deleted:
        assert ("chain", seal) in checks and ("seq", victim + 1) in checks, checks
    else:  # (refused: nothing to see)
        assert checks == set()


def test_a_forged_seal_range_does_not_make_an_unsealed_event_deletable(
        pg_url: str, tmp_path: Path) -> None:
    seal, victim = _sealed_world(pg_url, tmp_path)
    assert _forge_a_seal_range_and_delete(pg_url, seal, victim) == 0


def _as_v5(conn: Any) -> None:
    """Make a ledger the current code wrote exactly what a v5 writer leaves: no
    checkpoint trigger or its function, the checkpoint at the head (v5 rewrote it at
    every commit), version 5."""
    conn.execute("DROP TRIGGER checkpoint_follows ON projection_checkpoint")
    conn.execute("DROP FUNCTION stepledger_checkpoint_follows()")
    conn.execute("UPDATE projection_checkpoint SET last_seq = (SELECT max(seq) FROM events)")
    conn.execute("UPDATE stepledger_schema SET version = 5")


def test_a_v4_ledger_reads_as_it_is_and_is_migrated_by_its_first_read_write_open(
        pg_url: str, tmp_path: Path) -> None:
    """A ledger written by an earlier version (schema 4: the looser DELETE exception):
    a read-only open reads it untouched; the first read-write open brings it to today's
    version (v5's function, v6's checkpoint), after which a forged range deletes
    nothing."""
    from ledger.store.postgres import schema as sch
    seal, victim = _sealed_world(pg_url, tmp_path)
    with raw(pg_url) as conn:  # (no parameters: the body's '%' is its own)
        _as_v5(conn)
        for stmt in sch._function_statements("stepledger_events_append_only",
                                             sch.APPEND_ONLY_BODIES[4], replace=True):
            conn.execute(stmt)
        conn.execute("UPDATE stepledger_schema SET version = 4")
    before = db_state(pg_url)
    with Ledger.open(pg_url, readonly=True) as led:
        assert led.verify().ok and led.storage.info.version == 4
    assert db_state(pg_url) == before
    with Ledger.open(pg_url) as led:
        assert led.storage.info.version == sch.SCHEMA_VERSION
    with raw(pg_url) as conn:
        assert conn.execute("SELECT version FROM stepledger_schema").fetchone()[0] \
            == sch.SCHEMA_VERSION
        assert conn.execute("SELECT last_seq FROM projection_checkpoint").fetchone()[0] == -1
    assert _forge_a_seal_range_and_delete(pg_url, seal, victim) == 0
    with Ledger.open(pg_url) as led:
        assert led.verify().ok


def test_a_v5_ledger_is_migrated_and_a_v5_worker_left_running_cannot_commit(
        pg_url: str, tmp_path: Path) -> None:
    """v5 -> v6 on a shared ledger: the first read-write open of today's code migrates
    it; a v5 worker still running rewrites the checkpoint at its commit, to its head —
    refused, the fix named, its whole transaction (its event too) rolled back."""
    from ledger.runner import run_step
    from ledger.store.postgres import schema as sch
    seal, victim = _sealed_world(pg_url, tmp_path)
    with raw(pg_url) as conn:
        _as_v5(conn)
    with Ledger.open(pg_url, readonly=True) as led:
        assert led.storage.info.version == 5 and led.verify().ok
        head = led.head()
    with Ledger.open(pg_url) as led:
        assert led.storage.info.version == sch.SCHEMA_VERSION
        assert led.verify().ok and led.projection_lag() == 0
        run_step(led, "after", {"a.txt": b"after the migration"})
        assert next(iter(led.read(after_seq=head.seq))).prev_hash == head.hash
        head = led.head()
    with raw(pg_url) as conn:  # what a v5 commit does: its event, then the checkpoint
        with pytest.raises(psycopg.Error, match="upgrade steptrail"):
            with conn.transaction():
                conn.execute(
                    "INSERT INTO events(seq, time_ns, workspace, run, step, attempt, epoch,"
                    " rev, journal_key, kind, v, payload, prev_hash, hash) VALUES (%s, 1, '',"
                    " '', 'x', 1, 0, 0, 'k-v5', 'planned', 1, %s, %s, %s)",
                    (head.seq + 1, b"{}", head.hash, b"h" * 32))
                conn.execute(
                    "INSERT INTO projection_checkpoint(name, last_seq, version)"
                    " VALUES ('steps', %s, 5) ON CONFLICT(name) DO UPDATE SET"
                    " last_seq = excluded.last_seq, version = excluded.version",
                    (head.seq + 1,))
    with Ledger.open(pg_url) as led:
        assert led.head() == head and led.verify().ok


def test_a_worker_meets_a_newer_format_at_its_next_write_typed(pg_url: str) -> None:
    """A worker of this version, open while another migrates the shared ledger to a
    later format, is refused at its next write transaction (LedgerTooNew), writing
    nothing: the format is read with the transaction's locks, in the same round trip."""
    from ledger.runner import run_step
    from ledger.store.postgres import schema as sch
    with Ledger.init(pg_url) as led:
        run_step(led, "before", {"a.txt": b"a"})
        head = led.head()
        with raw(pg_url) as conn:
            conn.execute(f"UPDATE stepledger_schema SET version = {sch.SCHEMA_VERSION + 1}")
        with pytest.raises(LedgerTooNew):
            run_step(led, "after", {"b.txt": b"b"})
    with raw(pg_url) as conn:
        conn.execute(f"UPDATE stepledger_schema SET version = {sch.SCHEMA_VERSION}")
    with Ledger.open(pg_url, readonly=True) as led:
        assert led.head() == head


# === databases that are not ledgers ========================================================


def test_an_empty_database_is_no_ledger_and_stays_empty(pg_url: str) -> None:
    before = db_state(pg_url)
    assert before["relations"] == []
    for readonly in (False, True):
        with pytest.raises(LedgerNotFound, match="no ledger at"):
            Ledger.open(pg_url, readonly=readonly)
    assert db_state(pg_url) == before


def test_another_applications_events_table_is_refused_untouched(pg_url: str) -> None:
    run(pg_url, "CREATE TABLE events(id serial PRIMARY KEY, body text NOT NULL)",
        "INSERT INTO events(body) VALUES ('theirs'), ('not a ledger event')",
        "CREATE TABLE users(name text)", "INSERT INTO users VALUES ('alice')")
    refused_everywhere(pg_url, NotALedger, "events table but no stepledger_schema")


@pytest.mark.parametrize("marker", [
    pytest.param("INSERT INTO stepledger_schema VALUES ('stepledger', 4)", id="two-rows"),
    pytest.param("UPDATE stepledger_schema SET application = 'other'", id="other-application"),
    pytest.param("DELETE FROM stepledger_schema", id="no-row"),
    pytest.param("UPDATE stepledger_schema SET version = 0", id="version-0"),
    pytest.param("UPDATE stepledger_schema SET version = 3", id="older"),
])
def test_a_bad_schema_marker_is_refused_untouched(pg_ledger: tuple[str, list[Any]],
                                                  marker: str) -> None:
    url, _ = pg_ledger
    run(url, marker)
    refused_everywhere(url, NotALedger, url.rsplit("/", 1)[1])


def test_a_newer_schema_is_refused_untouched(pg_ledger: tuple[str, list[Any]]) -> None:
    url, _ = pg_ledger
    run(url, "UPDATE stepledger_schema SET version = 99")
    refused_everywhere(url, LedgerTooNew, "99")
    before = db_state(url)
    with pytest.raises(LedgerTooNew):
        Ledger.open(url, readonly=True, forensic=True)  # not even verify reads it
    assert db_state(url) == before


_LOOT = "CREATE TABLE loot(what text)"
_EVIL_FN = ("CREATE FUNCTION evil() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN INSERT INTO loot VALUES (TG_TABLE_NAME); RETURN NEW; END$$")
_LOOT_FN = ("CREATE FUNCTION loot_it(x bigint) RETURNS boolean LANGUAGE plpgsql AS"
            " $$BEGIN INSERT INTO loot VALUES (x::text); RETURN true; END$$")
_REPLACED = ("CREATE OR REPLACE FUNCTION stepledger_events_append_only() RETURNS trigger"
             " LANGUAGE plpgsql AS $$BEGIN RETURN COALESCE(NEW, OLD); END$$")

#: name -> (statements planting it, what the refusal names, whether a forensic verify
#: examines it: a change outside the tables, as on SQLite)
PLANTED: dict[str, tuple[tuple[str, ...], str, bool]] = {
    "trigger-on-events": ((_LOOT, _EVIL_FN, "CREATE TRIGGER evil AFTER INSERT ON events"
                           " FOR EACH ROW EXECUTE FUNCTION evil()"),
                          "trigger evil was added", True),
    "trigger-on-steps": ((_LOOT, _EVIL_FN, "CREATE TRIGGER evil BEFORE INSERT OR UPDATE ON"
                          " steps FOR EACH ROW EXECUTE FUNCTION evil()"),
                         "trigger evil was added", True),
    "statement-trigger-on-meta": ((_LOOT, _EVIL_FN, "CREATE TRIGGER evil AFTER INSERT ON meta"
                                   " FOR EACH STATEMENT EXECUTE FUNCTION evil()"),
                                  "trigger evil was added", True),
    "rule-on-events": ((_LOOT, "CREATE RULE evil AS ON INSERT TO events DO ALSO"
                        " INSERT INTO loot VALUES ('rule')"), "rule evil on events was added",
                       True),
    "instead-rule-on-events": (("CREATE RULE evil AS ON INSERT TO events DO INSTEAD NOTHING",),
                               "rule evil on events was added", True),
    "rule-on-workspaces": (("CREATE RULE evil AS ON UPDATE TO workspaces DO INSTEAD NOTHING",),
                           "rule evil on workspaces was added", True),
    "replaced-append-only-function": ((_REPLACED,), "trigger events_no_update was changed",
                                      True),
    "index-on-events": (("CREATE INDEX evil ON events(kind)",), "index evil was added", True),
    "row-security": (("ALTER TABLE events ENABLE ROW LEVEL SECURITY",),
                     "table events has row security", False),
    "extra-column": (("ALTER TABLE events ADD COLUMN evil text",), "table events was changed",
                     False),
    "dropped-index": (("DROP INDEX events_step",), "index events_step was dropped", True),
}


@pytest.mark.parametrize("kind", list(PLANTED))
def test_a_planted_object_is_refused_untouched(pg_ledger: tuple[str, list[Any]], kind: str) -> None:
    url, _ = pg_ledger
    statements, named, examined = PLANTED[kind]
    run(url, *statements)
    refused_everywhere(url, NotALedger, named)
    if examined:
        got = findings(url)
        assert ("schema", 0, "VIOLATION: the schema differs from a steptrail v6 ledger: "
                + named) in got, got
    else:
        with pytest.raises(NotALedger, match=named):
            Ledger.open(url, readonly=True, forensic=True)
    with raw(url) as conn:
        if conn.execute("SELECT to_regclass('loot')").fetchone()[0] is not None:
            assert conn.execute("SELECT count(*) FROM loot").fetchone()[0] == 0  # never ran


#: Weakenings of the append-only triggers that keep each trigger's name, table,
#: function, source and enabled flag: SQLite's allow-list compares a trigger's whole
#: SQL, so its equivalent is refused there.
WEAKENED: dict[str, tuple[str, ...]] = {
    "when-false": ("DROP TRIGGER events_no_update ON events",
                   "CREATE TRIGGER events_no_update BEFORE UPDATE ON events FOR EACH ROW"
                   " WHEN (false) EXECUTE FUNCTION stepledger_events_append_only()"),
    "update-of-one-column": ("DROP TRIGGER events_no_update ON events",
                             "CREATE TRIGGER events_no_update BEFORE UPDATE OF rev ON events"
                             " FOR EACH ROW EXECUTE FUNCTION stepledger_events_append_only()"),
    "check-constraint-calling-a-function": (
        _LOOT, _LOOT_FN, "ALTER TABLE events ADD CONSTRAINT evil CHECK (loot_it(seq))"),
    "unique-index": ("CREATE UNIQUE INDEX evil ON events(kind, step)",),
    "function-search-path": (
        "CREATE SCHEMA evil",
        "ALTER FUNCTION stepledger_events_append_only() SET search_path = evil, public"),
    "function-security-definer": (
        "ALTER FUNCTION stepledger_events_append_only() SECURITY DEFINER",),
    "dropped-unique-journal-key": ("ALTER TABLE events DROP CONSTRAINT events_journal_key_key",),
    "foreign-key": ("CREATE TABLE allowed(step text COLLATE \"C\" PRIMARY KEY)",
                    "INSERT INTO allowed SELECT DISTINCT step FROM events",
                    "ALTER TABLE events ADD CONSTRAINT evil FOREIGN KEY (step)"
                    " REFERENCES allowed(step)"),
}


@pytest.mark.parametrize("kind", list(WEAKENED))
def test_a_weakened_append_only_rule_or_a_planted_constraint_is_refused(
        pg_ledger: tuple[str, list[Any]], kind: str) -> None:
    url, _ = pg_ledger
    run(url, *WEAKENED[kind])
    before = db_state(url)
    with pytest.raises(NotALedger, match="schema differs"):
        led = Ledger.open(url)
        try:  # (what an accepted one lets through)
            led.append(Planned(step="e", attempt=1))
        finally:
            led.close()
    assert db_state(url) == before


# === hostile URLs ===========================================================================


def hostile_urls(pg_server: Any) -> dict[str, tuple[str, tuple[type[LedgerError], ...]]]:
    """name -> (URL, the errors it may be): each holds the password SECRET."""
    port, closed = pg_server.port, closed_port()
    creds = f"steptrail:{SECRET}"
    return {
        "unbalanced-ipv6-bracket": (f"postgresql://{creds}@[bad/db", (InvalidInput,)),
        "bad-percent-escape": (f"postgresql://%zz:{SECRET}@127.0.0.1:{port}/x", (InvalidInput,)),
        "bad-percent-escape-in-password": (f"postgresql://steptrail:{SECRET}%zz@127.0.0.1/x",
                                           (InvalidInput,)),
        "unknown-option": (f"postgresql://{creds}@127.0.0.1:{port}/x?bogus=1", (InvalidInput,)),
        # libpq refuses these before connecting; a retry cannot help, and either type says
        # what to fix ("fix the URL")
        "port-not-a-number": (f"postgresql://{creds}@127.0.0.1:notaport/x",
                              (InvalidInput, DatabaseUnavailable)),
        "port-out-of-range": (f"postgresql://{creds}@127.0.0.1:99999/x",
                              (InvalidInput, DatabaseUnavailable)),
        "bad-sslmode": (f"postgresql://{creds}@127.0.0.1:{port}/x?sslmode=bogus",
                        (InvalidInput, DatabaseUnavailable)),
        "no-such-socket-dir": (f"postgresql://{creds}@/x?host=/nonexistent/socket/dir",
                               (DatabaseUnavailable,)),
        "unresolvable-host": (f"postgresql://{creds}@nonexistent.invalid:{port}/x",
                              (DatabaseUnavailable,)),
        "closed-port": (f"postgresql://{creds}@127.0.0.1:{closed}/x", (DatabaseUnavailable,)),
        "no-such-database": (f"postgresql://{creds}@127.0.0.1:{port}/no_such_db",
                             (LedgerNotFound,)),
        "no-such-user": (f"postgresql://nobody:{SECRET}@127.0.0.1:{port}/postgres",
                         (AccessDenied,)),
        "password-in-the-query": (f"postgresql://nobody@127.0.0.1:{port}/postgres"
                                  f"?password={SECRET}", (AccessDenied,)),
    }


@pytest.fixture
def urls(pg_server: Any) -> dict[str, tuple[str, tuple[type[LedgerError], ...]]]:
    out = hostile_urls(pg_server)
    assert sorted(out) == sorted(HOSTILE_NAMES)
    return out


def _no_secret(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert SECRET not in str(exc) and SECRET not in repr(exc), str(exc)
    assert SECRET not in repr(vars(exc)) and SECRET not in text


HOSTILE_NAMES = ["unbalanced-ipv6-bracket", "bad-percent-escape", "bad-percent-escape-in-password",
                 "unknown-option", "port-not-a-number", "port-out-of-range", "bad-sslmode",
                 "no-such-socket-dir", "unresolvable-host", "closed-port", "no-such-database",
                 "no-such-user", "password-in-the-query"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_url_is_a_typed_one_line_error_without_the_password(
        urls: dict[str, tuple[str, tuple[type[LedgerError], ...]]], name: str) -> None:
    import time
    url, types = urls[name]
    for how in ("readwrite", "readonly", "init"):
        start = time.monotonic()
        with pytest.raises(LedgerError) as info:
            if how == "init":
                Ledger.init(url).close()
            else:
                Ledger.open(url, readonly=how == "readonly").close()
        assert time.monotonic() - start < 5, "a connection attempt hung"
        exc = info.value
        assert isinstance(exc, types), (how, type(exc).__name__, str(exc))
        assert "\n" not in str(exc) and str(exc).strip(), str(exc)
        _no_secret(exc)


# === the command line ======================================================================


def test_cli_verify_of_a_postgresql_ledger(pg_ledger: tuple[str, list[Any]]) -> None:
    url, _ = pg_ledger
    r = run_cli(["--ledger", url, "verify"])
    assert r.code == 0 and "verify: ok" in r.out and f"{EVENTS} events" in r.out, r
    run(url, "ALTER TABLE events DISABLE TRIGGER USER",
        "UPDATE events SET time_ns = time_ns + 1 WHERE seq = 6")
    r = run_cli(["--ledger", url, "verify"])
    assert r.code == 1, r
    assert "VIOLATION [schema]" in r.out + r.err and "events_no_update was disabled" in r.out + r.err
    r = run_cli(["--ledger", url, "steps"])  # anything else refuses it
    assert r.code != 0 and "events_no_update" in r.err, r


def test_cli_hostile_urls_are_one_line_errors_without_the_password(
        urls: dict[str, tuple[str, tuple[type[LedgerError], ...]]]) -> None:
    for name, (url, types) in urls.items():
        for argv in (["--ledger", url, "verify"], ["--ledger", url, "steps"],
                     ["--ledger", url, "init"]):
            r = run_cli(argv)
            assert r.code in (2, 3), (name, argv, r)
            assert r.err.startswith("steptrail: error: ") and r.err.count("\n") == 1, (name, r)
            assert any(f"error: {t.__name__}:" in r.err for t in types), (name, r.err)
            assert SECRET not in r.out + r.err, (name, r.err)
