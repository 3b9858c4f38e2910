# Two entry points for a fresh machine:  make run    (set up, run the default matrix, print the report's path)
#                                        make test   (set up, run the tests)
# The virtual environment is made once and refreshed when pyproject.toml changes. pip byte-compiles what it installs:
# with PYTHONDONTWRITEBYTECODE set (as here, and in many containers) nothing else ever would (docs/performance.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup test run screenshots lint

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test]'
	touch $@

# `snakemake --profile slurm` by name: profiles/link.sh links profiles/slurm where Snakemake looks for profiles.
setup: $(VENV)/.installed
	@bash profiles/link.sh $(PY)

# The default matrix (config/config.yaml) with the workflow profile profiles/default.
# Jobs run the venv's python (the workflow's own: feedbench.plan.job.job_python); its bin first on PATH serves the
# user's own tools. Extra arguments: make run SNAKEMAKE_ARGS='--configfile my.yaml'.
CORES ?= all
run: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --cores $(CORES) $(SNAKEMAKE_ARGS)
	@echo "Report: $(CURDIR)/results/report/index.html"

# The lint gate: ruff (lint and format), snakefmt, `snakemake --lint` and the house rules (tests/workflow/test_house.py:
# layers, no import cycle, no function over 80 lines), with the venv's bin first on PATH
# (snakefmt runs shfmt from there). Configs: pyproject.toml ([tool.ruff], [tool.snakefmt]).
BINPATH := PATH="$(abspath $(VENV))/bin:$$PATH"
lint: setup
	$(BINPATH) ruff check .
	$(BINPATH) ruff format --check .
	$(BINPATH) snakefmt --check Snakefile workflow/rules
	$(BINPATH) snakemake --lint
	$(PY) -m pytest -q -n 0 -p no:cacheprovider tests/workflow/test_house.py

# Three sessions. The Slurm tests (marked `slurm`: one cluster, mostly waiting on Slurm) start first, in a pytest of
# their own in the background, its output in $(SLURM_LOG), printed when it ends. Beside them, every other test but
# the timing ones on TEST_WORKERS pytest-xdist workers (three keep two cores busy; --dist loadgroup keeps each
# xdist_group on one worker); then the tests marked `timing`, with nothing running but what is left of the Slurm
# tests (sleeps, mostly). Any session failing fails `make test` (5: it selected no test). docs/performance.md has
# the figures.
TEST_WORKERS ?= 3
SLURM_LOG ?= .pytest-slurm.log
test: setup system-deps lint
	$(PY) -m pytest -m "slurm and not timing" -n 0 --durations=8 $(PYTEST_ARGS) >$(SLURM_LOG) 2>&1 & slurm_pid=$$!; \
	$(PY) -m pytest -m "not timing and not slurm" -n $(TEST_WORKERS) --dist loadgroup --durations=8 $(PYTEST_ARGS); parallel=$$?; \
	$(PY) -m pytest -m timing --durations=8 $(PYTEST_ARGS); timing=$$?; \
	wait $$slurm_pid; slurm=$$?; \
	echo "make test: the Slurm tests ($(SLURM_LOG)):"; cat $(SLURM_LOG); \
	echo "make test: parallel exit $$parallel, timing exit $$timing, Slurm exit $$slurm"; \
	[ "$$parallel$$timing$$slurm" != 555 ] && \
	for code in $$parallel $$timing $$slurm; do [ $$code = 0 ] || [ $$code = 5 ] || exit 1; done

# Chromium for the browser test: Debian's package, never a downloaded browser.
# Installed only when missing and we are root; otherwise one line says what to install.
# Slurm, munge, slurmdbd and MariaDB for the cluster tests (tests/slurm/install.sh, the same rule).
.PHONY: system-deps
system-deps:
	@bash tests/slurm/install.sh
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	else \
		echo "system-deps: the browser test needs Chromium (Debian: sudo apt-get install chromium); it is skipped until then"; \
	fi

# docs/report.png (the README's picture), docs/decode-report.png, docs/breakdown-report.png and docs/study-view.png, by
# headless Chromium: the default matrix and the breakdown preset's small run, each in its own folder under .screenshots/.
SHOTS := .screenshots
BIN := $(abspath $(VENV))/bin
SNAKEMAKE := PATH="$(BIN):$$PATH" $(BIN)/snakemake -s $(CURDIR)/Snakefile --cores $(CORES)
screenshots: setup
	$(SNAKEMAKE) --directory $(SHOTS)/default --configfile $(CURDIR)/config/config.yaml
	$(SNAKEMAKE) --directory $(SHOTS)/breakdown --configfile $(CURDIR)/config/presets/breakdown.yaml --config size=small
	PYTHONPATH=tests $(PY) -m helpers.screenshots $(SHOTS)/default/results/report/index.html $(SHOTS)/breakdown/results/report/index.html
