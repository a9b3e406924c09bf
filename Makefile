# isood: `make demo` and `make test` set everything up themselves on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.isood-installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup wordnet chromium demo test bench clean

setup: $(STAMP) wordnet chromium

# The venv is rebuilt only when the requirements change (idempotent).
# pip's own output goes to .venv/setup.log (shown when a step fails); one line says what each step does.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || { echo "setup: creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); }
	@echo "setup: installing isood and its dependencies into $(VENV) (torch, open_clip, diffusers, ...; a few" \
	  "minutes the first time; log: $(VENV)/setup.log)"
	@{ $(PIP) install --upgrade pip && $(PIP) install -c constraints.txt -e '.[test]'; } >$(VENV)/setup.log 2>&1 || \
	  { tail -n 40 $(VENV)/setup.log; echo "setup: pip failed (full log: $(VENV)/setup.log)"; exit 1; }
	@touch $(STAMP)
	@echo "setup: done"

# WordNet 3.0: Debian's wordnet-base when root, else nltk's data (see docs/install.md).
wordnet:
	@if [ -d /usr/share/wordnet ] || [ -n "$$ISOOD_WORDNET_DIR" ] || $(PY) -c "import nltk; nltk.data.find('corpora/wordnet')" >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing WordNet 3.0 (Debian wordnet-base)"; \
	  (apt-get install -y -qq --no-install-recommends wordnet-base >/dev/null 2>&1 || \
	   (apt-get update -qq && apt-get install -y -qq --no-install-recommends wordnet-base >/dev/null)); \
	else \
	  echo "WordNet 3.0 is missing: run 'sudo apt-get install wordnet-base' or '$(PY) -m nltk.downloader wordnet'"; exit 1; \
	fi

# Headless Chromium + ChromeDriver for the report's browser test (tests/isood/report): Debian's chromium and
# chromium-driver when root (never a test tool's own browser download); without them that test skips, saying why.
chromium:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing headless Chromium (Debian chromium + chromium-driver)"; \
	  (apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
	   (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null)); \
	else \
	  echo "note: Chromium is missing, so tests/isood/report is skipped: run 'sudo apt-get install chromium chromium-driver'"; \
	fi

demo: setup
	$(VENV)/bin/isood demo --out demo-out

# The import-linter contracts (pyproject [tool.importlinter]) first: a back-import fails the build. Then the type
# checker (mypy, pyproject [tool.mypy]: the four packages; about 45 s cold). Then the docs site (mkdocs.yml; offline,
# about 5 s): a broken link, page or docstring reference fails it. Then the tests.
test: setup
	$(VENV)/bin/lint-imports
	$(PY) -m mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PY) -m pytest

# Every bench script prints one SUMMARY line and appends a row to bench/results.local.md (git-ignored).
# < 10 min here; --full on a GPU box.
bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache .mypy_cache site
