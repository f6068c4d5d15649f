# `make demo` and `make test` work on a fresh machine with only Python: they build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BARE := .venv-bare

.PHONY: demo test test-bare test-matrix bench reliability lint docs clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m pip install -q --no-deps flarejax
	touch $(STAMP)

demo: $(STAMP)
	@for script in examples/demo_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

lint: $(STAMP)
	$(PY) -m ruff check src tests bench examples reliability conftest.py docs/hooks
	$(PY) -m ruff format --check src tests bench examples reliability conftest.py docs/hooks
	$(PY) -m mypy

# Three workers: on two cores a third runs while the others wait on the processes their tests start (a sampler
# killed and started again, a timeout waited out); a worker out of tests takes the last ones queued for another
# (worksteal), so that none waits idle at the end; the ten slowest tests printed at the end. `make lint` and
# `make test-bare` run as two of the suite's tests (tests/package/test_make_checks.py), beside the others.
# Python's bytecode caches are written even where the machine sets PYTHONDONTWRITEBYTECODE: each worker and each
# Python program the tests start would otherwise compile the project, and rewrite the tests' asserts, from source again.
test: $(STAMP) $(BARE)/.installed
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n 3 --dist worksteal --durations=10

# A venv with the required dependencies only (what `pip install jaxstow` gives): the project is installed from a wheel
# built now, and tests/package/required_only runs against that copy, on its own: `--confcutdir=.` leaves out the
# conftest.py files above it, which find their helpers through pyproject.toml's pytest settings that -c /dev/null drops.
$(BARE)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(BARE)
	$(BARE)/bin/python -m pip install -q --upgrade pip
	$(BARE)/bin/python -m pip install -q . pytest
	touch $@

test-bare: $(BARE)/.installed
	$(BARE)/bin/python -m pip install -q --no-deps --force-reinstall .
	cd tests/package/required_only && ../../../$(BARE)/bin/python -m pytest -q -p no:cacheprovider -c /dev/null \
		--confcutdir=. .

# The ends of the supported versions (tests/versions.py): every dependency at its declared lower bound, and at the
# newest release the index serves, on $(PYTHON), each running the core tests; and the newest release of everything
# on the newest supported Python (pyenv's or on PATH), running the whole suite (less `make lint` and `make test-bare`,
# which check the source, not the versions), or saying why it is skipped. The venvs
# are kept, so a second run only tests. The source goes on PYTHONPATH as an absolute path: the programs a test starts
# from a folder of its own must find it too.
.venv-%/.installed: pyproject.toml tests/versions.py
	rm -rf .venv-$*
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	$(PYTHON) tests/versions.py requirements $* > .venv-$*/requirements.txt
	.venv-$*/bin/python -m pip install -q -r .venv-$*/requirements.txt
	touch $@

.venv-newest-python/.installed: pyproject.toml tests/versions.py
	rm -rf .venv-newest-python
	"$$($(PYTHON) tests/versions.py interpreter)" -m venv .venv-newest-python
	.venv-newest-python/bin/python -m pip install -q --upgrade pip
	$(PYTHON) tests/versions.py requirements newest-python > .venv-newest-python/requirements.txt
	.venv-newest-python/bin/python -m pip install -q -r .venv-newest-python/requirements.txt
	.venv-newest-python/bin/python -m pip install -q --no-deps flarejax
	touch $@

test-matrix: .venv-lowest/.installed .venv-newest/.installed
	@for end in lowest newest; do \
		echo "== $$end: $$(.venv-$$end/bin/python tests/versions.py report $$end)"; \
		PYTHONPATH=$(CURDIR)/src .venv-$$end/bin/python -m pytest -n 2 -p no:cacheprovider $$($(PYTHON) tests/versions.py tests) \
			|| exit 1; \
	done
	@if why=$$($(PYTHON) tests/versions.py interpreter); then \
		$(MAKE) --no-print-directory .venv-newest-python/.installed || exit 1; \
		echo "== newest-python: $$(.venv-newest-python/bin/python tests/versions.py report newest-python)"; \
		PYTHONPATH=$(CURDIR)/src .venv-newest-python/bin/python -m pytest -n 3 --dist worksteal -p no:cacheprovider \
			--ignore=tests/package/test_make_checks.py || exit 1; \
	else \
		echo "== newest-python: skipped: $$why"; \
	fi

bench: $(STAMP)
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

# The documentation site (mkdocs.yml): docs/*.md and an API reference from the docstrings, built into site/ in a venv
# of its own with the `docs` extra alone (mkdocstrings reads the sources, src/, without importing them); --strict fails
# on a broken link or reference.
DOCS := .venv-docs
$(DOCS)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(DOCS)
	$(DOCS)/bin/python -m pip install -q --upgrade pip
	$(DOCS)/bin/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs'], sep='\n')" > $(DOCS)/requirements.txt
	$(DOCS)/bin/python -m pip install -q -r $(DOCS)/requirements.txt
	touch $@

docs: $(DOCS)/.installed
	NO_MKDOCS_2_WARNING=1 $(DOCS)/bin/python -m mkdocs build --strict

# Attacks and crashes at full size (byte flips, fuzzed headers, SIGKILLs, a full disk, ...): the table of what was
# detected and what was lost. `make test` runs a small slice of each probe.
reliability: $(STAMP)
	$(PY) -m reliability.run

clean:
	rm -rf $(VENV) $(BARE) $(DOCS) .venv-lowest .venv-newest .venv-newest-python build site *.egg-info
