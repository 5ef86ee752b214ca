"""The documentation under docs/ (and ARCHITECTURE.md) is true as printed.

- docs/operations.md: the after-a-crash runbook's commands run, exactly as printed, against
  a crashed step (a worker SIGKILLed after its apply, another while storing artifacts),
  also with a person's edit made after the crash; the machine-lost recipe runs against a
  ledger whose workspace directory is gone; every other block runs in the state its
  section describes (an empty directory, or one holding a ledger). System installation
  commands (`sudo …`, `systemctl …`, `journalctl …`) are the only ones not run.
- docs/cli-json.md's `demo --json` example has the keys of a real `steptrail demo --json`
  and its deterministic values.
- docs/design.md has every section the code cites; no file points outside the
  repository; every relative link and anchor resolves; `pre_hash` is taught as the hash of
  what the planner read.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from docblocks import ROOT, Block, blocks, clean_env, commands, run_python, run_shell

DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"

# --- the after-a-crash runbook ------------------------------------------------------------


def steptrail(cwd: Path, *args: str) -> None:
    done = subprocess.run(["steptrail", *args], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, (args, done.stderr)


def python(cwd: Path, code: str, *, killed: bool = False) -> None:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    if killed:
        assert done.returncode == -signal.SIGKILL, done.stderr
    else:
        assert done.returncode == 0, done.stderr


#: A worker of epoch 1 applies edit-1 (app.py v0 -> v1) and stores build-7's artifact,
#: then dies by SIGKILL: edit-1 fenced, build-7 blob-stored, nothing published.
WORKER_DIES = """
import os, signal
from ledger import Ledger, StepPlan
ledger = Ledger.open(".steptrail/ledger.db")
read = ledger.workspaces.read_file("repo", "app.py")
ledger.workspaces.admit("repo", 1, [StepPlan("edit-1", [read.write(b'print("v1")\\n')])])
assert ledger.workspaces.apply("edit-1", epoch=1).verdict == "applied"
ledger.plan("build-7", artifacts=["report.txt"])
ledger.store("build-7", 1, "report.txt", b"ok\\n")
os.kill(os.getpid(), signal.SIGKILL)
"""


def crashed(tmp_path: Path) -> Path:
    """The runbook's situation: workspace `repo` with its ledger inside, epoch 1 held by
    agent-1 (live), its worker killed mid-step. Returns the workspace directory."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text('print("v0")\n')
    steptrail(repo, "init")
    steptrail(repo, "workspace", "add", "repo", ".")
    steptrail(repo, "--workspace", "repo", "lease", "acquire", "--holder", "agent-1", "--ttl", "10m")
    python(repo, WORKER_DIES, killed=True)
    assert (repo / "app.py").read_text() == 'print("v1")\n'  # landed, recorded, not committed
    return repo


def section(doc: Path, name: str) -> list[Block]:
    found = [b for b in blocks(doc) if b.section == name]
    assert found, f"{doc.name} has no blocks under {name!r}"
    return found


def run_commands(block: Block, cwd: Path, env: dict[str, str]) -> list[tuple[str, subprocess.CompletedProcess[str]]]:
    """Each command of a shell block as printed, one at a time, carrying its exports."""
    out = []
    for cmd in commands(block.code):
        export = re.match(r"export (\w+)=(\S+)", cmd)
        if export:
            env[export[1]] = export[2]
            continue
        done = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        out.append((cmd.split("#")[0].strip(), done))
    return out


def by_command(results: list[tuple[str, subprocess.CompletedProcess[str]]]) -> dict[str, subprocess.CompletedProcess[str]]:
    return {cmd: done for cmd, done in results}


RUNBOOK = "After a crash, do this"


def test_the_runbook_after_a_crash_runs_as_printed(tmp_path: Path) -> None:
    repo = crashed(tmp_path)
    inspect, rerun, check = section(OPERATIONS, RUNBOOK)
    assert (inspect.lang, rerun.lang, check.lang) == ("sh", "python", "sh")
    env = clean_env()
    got = by_command(run_commands(inspect, repo, env))
    for cmd, done in got.items():
        assert done.returncode == 0, (cmd, done.stderr)
        assert "Traceback" not in done.stderr
    assert "verify: ok" in got["steptrail verify"].stdout
    assert "epoch 1 held by agent-1" in got["steptrail lease show"].stdout
    in_flight = got["steptrail steps --in-flight"].stdout
    assert re.search(r"edit-1 +fenced", in_flight), in_flight
    assert re.search(r"build-7 +blob-stored", in_flight), in_flight
    acquire = next(d for c, d in got.items() if c.startswith("steptrail lease acquire"))
    assert "epoch 2" in acquire.stdout and "edit-1" in acquire.stdout  # settled
    assert re.search(r"edit-1 +compensated", got["steptrail steps --state compensated"].stdout)
    assert (repo / "app.py").read_text() == 'print("v0")\n'  # settling put v0 back
    assert env["STEPTRAIL_EPOCH"] == "2" and env["STEPTRAIL_WORKSPACE"] == "repo"

    run_python(rerun, repo, "docs/operations.md")  # 5. the re-run, under the same step ids
    assert (repo / "app.py").read_text() == 'print("v1")\n'

    got = by_command(run_commands(check, repo, env))
    for cmd, done in got.items():
        assert done.returncode == 0, (cmd, done.stderr)
    assert re.search(r"edit-1 +acked +2 ", got["steptrail steps"].stdout)  # a new attempt
    assert re.search(r"build-7 +acked +1 ", got["steptrail steps"].stdout)  # continued
    assert "verify: ok" in got["steptrail verify"].stdout
    assert "audit: ok" in got["steptrail audit"].stdout


def test_the_runbook_with_a_persons_edit_after_the_crash(tmp_path: Path) -> None:
    """Step 4's exit 1: settling finds app.py holding neither the attempt's bytes nor the
    old ones — left as it is, one stderr line, the lease held all the same."""
    repo = crashed(tmp_path)
    (repo / "app.py").write_text('print("a person fixed it")\n')
    inspect = section(OPERATIONS, RUNBOOK)[0]
    got = run_commands(inspect, repo, clean_env())
    acquire = next(d for c, d in got if c.startswith("steptrail lease acquire"))
    assert acquire.returncode == 1
    err = acquire.stderr.strip().splitlines()
    assert len(err) == 1 and "CompensationConflict" in err[0] and "edit-1:app.py" in err[0]
    assert "lease is held" in err[0] and "epoch 2" in acquire.stdout
    assert (repo / "app.py").read_text() == 'print("a person fixed it")\n'  # untouched
    text = OPERATIONS.read_text()
    assert "Exit 1 with `CompensationConflict`" in text and "**is held**" in text
    for cmd, done in got:
        if not cmd.startswith("steptrail lease acquire"):
            assert done.returncode == 0, (cmd, done.stderr)


def test_the_machine_lost_recipe_runs_as_printed(tmp_path: Path) -> None:
    """A ledger beside the workspace survives; the workspace directory is gone with a
    committed step and one in flight; restore, then a new epoch."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "app.py").write_text("v0\n")
    db = ".steptrail/ledger.db"
    steptrail(tmp_path, "--ledger", db, "init")
    steptrail(tmp_path, "--ledger", db, "workspace", "add", "repo", "repo")
    steptrail(tmp_path, "--ledger", db, "--workspace", "repo", "lease", "acquire",
               "--holder", "agent-1", "--ttl", "10m")
    python(tmp_path, f"""
import os, signal
from ledger import Ledger, StepPlan
ledger = Ledger.open({db!r})
read = ledger.workspaces.read_file("repo", "app.py")
ledger.workspaces.admit("repo", 1, [StepPlan("edit-1", [read.write(b"v1\\n")])])
done = ledger.workspaces.apply("edit-1", epoch=1)
ledger.publish("edit-1", receipt=done.receipt)
ledger.ack("edit-1", epoch=1)
read = ledger.workspaces.read_file("repo", "app.py")
ledger.workspaces.admit("repo", 1, [StepPlan("edit-2", [read.write(b"v2\\n")])])
ledger.workspaces.apply("edit-2", epoch=1)
os.kill(os.getpid(), signal.SIGKILL)
""", killed=True)
    for p in (tmp_path / "repo").iterdir():
        p.unlink()
    (tmp_path / "repo").rmdir()  # the machine is gone
    (block,) = section(OPERATIONS, "If the workspace's machine is gone")
    got = run_commands(block, tmp_path, clean_env())
    assert [d.returncode for _, d in got] == [0, 0], [(c, d.stderr) for c, d in got]
    assert (tmp_path / "repo-restored" / "app.py").read_text() == "v1\n"  # committed only
    assert "epoch 2" in got[1][1].stdout and "edit-2" in got[1][1].stdout  # settled


# --- every other block of docs/operations.md ----------------------------------------------


def empty(tmp_path: Path) -> Path:
    return tmp_path


def with_ledger(tmp_path: Path) -> Path:
    """A directory holding `.steptrail/ledger.db` with a committed step and an orphan."""
    python(tmp_path, """
from ledger import Ledger
from ledger.runner import run_step
with Ledger.init(".steptrail/ledger.db") as ledger:
    run_step(ledger, "build-1", {"report.txt": b"ok\\n"})
    ledger.plan("build-2", artifacts=["log.txt"])
    ledger.store("build-2", 1, "log.txt", b"half")
    ledger.workspaces.compensate("build-2", reason="died")
""")
    return tmp_path


def with_runs(tmp_path: Path) -> Path:
    """A directory holding `.steptrail/ledger.db` with a settled run, build-42."""
    python(tmp_path, """
from ledger import Ledger
from ledger.runner import run_step
with Ledger.init(".steptrail/ledger.db") as ledger:
    for i in range(3):
        run_step(ledger, f"build-42/s{i}", {"report.txt": b"ok %d\\n" % i}, run="build-42")
    run_step(ledger, "build-43/s0", {"report.txt": b"later\\n"}, run="build-43")
""")
    return tmp_path


#: The state each section's blocks run in (in order, in one directory per section).
SETUP: dict[str, Callable[[Path], Path] | None] = {
    "Where the ledger lives": empty,
    "A copied or moved project": empty,
    "A ledger on PostgreSQL": empty,
    RUNBOOK: None,  # the scenarios above
    "If the workspace's machine is gone": None,
    "Running GC on a schedule": with_ledger,
    "Audit": with_ledger,
    "GC and audit from Python": empty,
    "The witness": empty,
    "Checking a ledger": with_ledger,
    "What the ledger holds: `steptrail stats`": with_ledger,
    "Backups": with_ledger,
    "Sealing": with_runs,
    "Shell completion": empty,
}


def is_system_install(block: Block) -> bool:
    """The narrow rule: every command installs or inspects a system service."""
    return all(re.match(r"(sudo|systemctl|journalctl) ", c) for c in commands(block.code))


def test_every_operations_block_belongs_to_a_tested_section() -> None:
    for block in blocks(OPERATIONS):
        assert block.section in SETUP, f"{block.where('docs/operations.md')} is not tested"
        assert block.lang in ("sh", "python"), block.where("docs/operations.md")


@pytest.mark.parametrize("name", [n for n, s in SETUP.items() if s is not None])
def test_operations_blocks_run_as_printed(name: str, tmp_path: Path) -> None:
    setup = SETUP[name]
    assert setup is not None
    cwd = setup(tmp_path)
    ran = 0
    for block in section(OPERATIONS, name):
        if block.lang == "python":
            run_python(block, cwd, "docs/operations.md")
        elif not is_system_install(block):
            run_shell(block.code, cwd, "docs/operations.md", block.where("docs/operations.md"))
        else:
            continue
        ran += 1
    assert ran


def test_the_system_install_commands_name_shipped_files() -> None:
    text = OPERATIONS.read_text()
    for unit in ("steptrail-maintenance.service", "steptrail-maintenance.timer",
                 "steptrail-maintenance.cron"):
        assert (ROOT / "examples" / "schedule" / unit).is_file()
        assert f"examples/schedule/{unit}" in text
    installs = [b for b in blocks(OPERATIONS) if b.lang == "sh" and is_system_install(b)]
    assert len(installs) == 2
    for block in installs:
        named = re.findall(r"examples/schedule/[\w.-]+", block.code)
        assert named
        for path in named:
            assert (ROOT / path).is_file(), path
    # one schedule ships: no second set elsewhere
    assert not list((ROOT / "tools").glob("steptrail-*.service"))
    assert not list((ROOT / "tools").glob("*.cron"))


# --- docs/cli-json.md's demo example ------------------------------------------------------

#: What differs between two demo runs (times, random ids, the chain hash).
UNSTABLE = {"elapsed_s", "now_ns", "collection"}


def _compare(doc: object, real: object, where: str) -> None:
    if isinstance(real, dict):
        assert isinstance(doc, dict), where
        assert list(doc) == list(real), f"{where}: documented keys {list(doc)} != {list(real)}"
        for key in real:
            if key not in UNSTABLE:
                _compare(doc[key], real[key], f"{where}.{key}")
    elif where == "$.head":
        assert isinstance(doc, str) and doc.split(":")[0] == real.split(":")[0], where  # type: ignore[union-attr]
    else:
        assert doc == real, f"{where}: documented {doc!r}, a real run gives {real!r}"


def test_the_demo_json_example_is_a_real_run(tmp_path: Path) -> None:
    text = (DOCS / "cli-json.md").read_text()
    example = next(b for b in blocks(DOCS / "cli-json.md") if b.section == "`demo --json`")
    assert example.lang == "json"
    doc = json.loads(example.code)
    done = subprocess.run(["steptrail", "demo", "--json"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    _compare(doc, json.loads(done.stdout), "$")
    assert "## `demo --json`" in text


# --- the design, links, and nothing outside ------------------------------------------------

CITED_SECTIONS = ["Events and the attempt lifecycle", "The commit protocol", "Epochs and leases",
                   "Fence modes", "Integrity", "Read side", "GC", "The command line", "Bad input"]


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    names = [n for n in out.stdout.decode().split("\0") if n]
    untracked = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"],
                               cwd=ROOT, capture_output=True, check=True)
    names += [n for n in untracked.stdout.decode().split("\0") if n]
    return [ROOT / n for n in sorted(set(names)) if (ROOT / n).is_file()]


def test_design_has_every_section_the_code_cites() -> None:
    headings = set(re.findall(r"^#+ (.+)$", (DOCS / "design.md").read_text(), re.M))
    assert set(CITED_SECTIONS) <= headings
    for path in _tracked():
        if path.suffix not in (".py", ".md", ".service", ".timer", ".cron"):
            continue
        for cited in re.findall(r'docs/design\.md "([^"]+)"', path.read_text(errors="replace")):
            cited = " ".join(cited.split())  # a citation may wrap: `"Epochs and\n    leases"`
            assert cited in headings, f"{path.relative_to(ROOT)} cites a missing section {cited!r}"


def test_invariants_are_defined_once_in_the_design() -> None:
    text = (DOCS / "design.md").read_text()
    for i in range(1, 10):
        assert f"**I{i} " in text, f"I{i}"


# Spelled in pieces, so this file does not match what it looks for (nor a repository grep).
OUTSIDE = re.compile("|".join([
    r"\.\./" + "shared", "(?-i:" + "DES" + r"IGN\.md)", "/wo" + "rk/",
    "back" + "ground article", "sou" + "rce article"]), re.I)


def test_no_file_points_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    found = []
    for path in _tracked():
        if path.resolve() == this or path.suffix in (".png", ".db"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):  # docs/design.md is ours; the team's notes are not
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


MARKDOWN = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: p.name)
def test_every_link_resolves(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: link to {target} (no such file)"
        assert ROOT in dest.parents or dest == ROOT, f"{doc.name}: {target} leaves the repository"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", dest.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{doc.name}: no #{anchor} in {dest.name}"


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda p: p.name)
def test_every_named_file_exists(doc: Path) -> None:
    for path in set(re.findall(r"(?<![\w/.])((?:tools|tests|ledger|docs)/[\w/.-]+\.(?:py|md|service|timer|cron))", doc.read_text())):
        assert (ROOT / path).exists(), f"{doc.name} names {path}, which does not exist"


def test_pre_hash_is_taught_as_the_hash_of_what_was_read() -> None:
    """No doc tells a planner to take pre_hash from a snapshot (a later look at the file
    would hash a person's edit into the plan); the design says what it is."""
    for doc in MARKDOWN:
        for sentence in re.split(r"(?<=[.;])\s", doc.read_text()):
            if "pre_hash" in sentence and "snapshot" in sentence:
                assert not re.search(r"(take|taken|from|use)\b[^.]*\bsnapshot", sentence, re.I) or \
                    re.search(r"\bnot\b|never|instead|hide|would", sentence), (doc.name, sentence)
    design = (DOCS / "design.md").read_text()
    assert "`pre_hash` is the sha256 of the bytes the planner **read**, taken when it read them" in design


def test_architecture_maps_every_part() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    for part in ("gc/collector.py", "gc/holders.py", "gc/audit.py", "restore.py", "witness.py",
                 "-lockq", "verify.py"):
        assert part in text, part


def test_pyproject_license_is_an_spdx_string() -> None:
    """A license table makes setuptools print a page of deprecation warnings at every
    install; the SPDX string form needs setuptools 77."""
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]


# --- docs/time-travel.md ----------------------------------------------------------------


def test_time_travel_blocks_run_as_printed(tmp_path: Path) -> None:
    doc = DOCS / "time-travel.md"
    shell, python = [b for b in blocks(doc) if b.section == "Observe"]
    assert (shell.lang, python.lang) == ("sh", "python")
    out = run_shell(shell.code, tmp_path, "docs/time-travel.md", shell.where("docs/time-travel.md"))
    # the baseline, the dry run's two changes, the recorded ones, then nothing changed
    assert "recorded 2 changes as baseline" in out.stdout
    assert "M app.py\nD notes.txt\n2 changes not recorded" in out.stdout
    assert "nothing changed outside the steps" in out.stdout
    observed = json.loads((tmp_path / "observed.json").read_text())
    assert [(c["path"], c["kind"]) for c in observed["changes"]] == [
        ("app.py", "changed"), ("notes.txt", "deleted")]
    assert observed["label"] == "by hand" and observed["recorded"]
    printed = run_python(python, tmp_path / "proj", "docs/time-travel.md")
    assert printed.strip() == "() []"  # nothing changed since


def test_time_travel_retention_blocks_run_as_printed(tmp_path: Path) -> None:
    """The policy file as printed loads; the Python block, run in a project whose old
    versions a policy released and gc collected, prints the reason it documents."""
    from ledger import Ledger, run_fenced_step
    from ledger.gc import collect
    from ledger.retention import Policy, load_policy

    toml, sh, python = [b for b in blocks(DOCS / "time-travel.md") if b.section == "Retention"]
    assert (toml.lang, sh.lang, python.lang) == ("toml", "sh", "python")
    (tmp_path / "retention.toml").write_text(toml.code)
    policy = load_policy(tmp_path / "retention.toml")
    assert (policy.keep_days, policy.keep_versions, policy.workspaces) == (30, 10, ())
    proj = tmp_path / "proj"
    (proj / "repo").mkdir(parents=True)
    (proj / "repo" / "app.py").write_text("v0\n")
    with Ledger.init(str(proj / ".steptrail" / "ledger.db")) as led:
        led.workspaces.add("repo", str(proj / "repo"))
        lease = led.workspaces.acquire("repo", "agent", ttl_s=600)
        for i in (1, 2, 3):
            run_fenced_step(led, "repo", f"s{i}", lambda read, i=i: [
                read.read("app.py").write(f"v{i}\n".encode())], epoch=lease.epoch)
        collect(led, grace_s=0, force=True, now_ns=led.clock() + 40 * 86_400 * 10**9,
                retention=Policy(keep_versions=1, source="test"))
    printed = run_python(python, proj, "docs/time-travel.md").strip()
    want = python.code.strip().splitlines()[-1].lstrip("# ")
    assert re.sub(r"#\d+", "#N", printed) == re.sub(r"#\d+", "#N", want), printed
