# Two entry points (see README.md): `make demo` and `make test`.
# Each creates or reuses .venv by itself; only python3 (3.11+), git and make are needed.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench dist release-check docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/steptrail demo

# Every core (pytest-xdist): each worker takes a whole test file at a time, so a file's
# fixtures and servers stay in one process. The temporary files go in a fresh directory
# of their own (removed when every test passed, kept and named when one failed): pytest's
# own numbered /tmp/pytest-of-USER/ directories are pruned at exit by a walk that can leave
# a directory iterator open, which the suite's warnings-as-errors turns into a failed run.
test: $(STAMP)
	@t=$$(mktemp -d "$${TMPDIR:-/tmp}/st-test.XXXXXX") && \
	$(BIN)/python -m pytest -q -n auto --dist loadfile --basetemp="$$t/t" $(PYTEST_ARGS); \
	rc=$$?; if [ $$rc -eq 0 ]; then rm -rf "$$t"; else echo "test files kept in $$t"; fi; exit $$rc

# The sdist and wheel in dist/, checked (twine check --strict).
dist: $(STAMP)
	rm -rf dist && $(BIN)/python -m build --outdir dist . && $(BIN)/python -m twine check --strict dist/*

# The wheel installed as users install it, the docs' snippets run against it (.ci/run).
release-check: $(STAMP)
	$(BIN)/python tools/release_check.py

# The API reference, from the docstrings of ledger.__all__, into docs/api/ (links checked).
docs: $(STAMP)
	$(BIN)/python tools/build_api_docs.py -o docs/api

bench: $(STAMP)
	$(BIN)/python tools/bench_ledger.py

clean:
	rm -rf $(VENV) build dist *.egg-info
