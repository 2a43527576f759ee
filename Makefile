# Set-up and checks. `make run` and `make test` work on a fresh clone with Python 3.11+.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LLOGOS := $(VENV)/bin/llogos
MODEL  ?= smollm2-135m
PROMPT ?= The capital of France is

.PHONY: run test venv test-venv models browser cuda-check bench clean

PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

# Running needs llogos alone; the tests also need the server and Ray extras and the test tools.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e '.[test,server,ray]'
	touch $@

venv: $(VENV)/.installed

test-venv: $(VENV)/.installed-test

models: venv
	$(LLOGOS) pull smollm2-135m
	$(LLOGOS) pull gemma3-270m

run: venv
	$(LLOGOS) pull $(MODEL)
	$(LLOGOS) generate -m $(MODEL) -p "$(PROMPT)" -n 32 --temp 0 --stats
	@echo "try next: .venv/bin/llogos chat -m $(MODEL)   or   .venv/bin/llogos --help   (make test adds the server, Ray and test extras)" >&2

# The suite runs in TEST_WORKERS processes (pytest-xdist), each test file in one of them, so that a
# file's model or server is set up once. Most tests keep one core busy. Files are handed out in
# the order tests/conftest.py collects them (the longest first), not xdist's by number of tests.
# cuda-check's files run in the same invocation: one start-up, and they fill in beside the others.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: models test-venv browser
	$(PY) -m pytest $(XDIST) -rs

# The web page's tests drive Debian's Chromium through Playwright; apt-get installs it where it can
# (as root), and without it those tests skip, saying why.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || \
		echo "no Chromium (apt-get install chromium): the web page's browser tests will skip" >&2

cuda-check: test-venv
	$(PY) -m pytest $(XDIST) -q -rs tests/test_cuda_compile.py tests/test_cuda_emulated.py tests/test_cuda_encoders.py

bench: venv
	$(PY) bench/bench_cpu.py

clean:
	rm -rf $(VENV) .pytest_cache
