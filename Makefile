# The two commands: `make run` (the whole system with a demo) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# pytest's worker processes (pytest-xdist): many tests wait on agents, browsers and servers, so two
# workers on two cores took the suite from about 1,900 s to 1,250 s here.
TEST_WORKERS ?= 2
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)

.PHONY: run test calendar setup engine migrate lint format browser slurm directory clean schema

# `make run` does not wait for the engine's compiler: without a build of these sources it serves on the
# plain-Python core (which decides the same) while the build runs in the background, niced, logging to
# var/engine-build.log; the next start takes the build. The line "engine: ..." says which core runs.
# `make run EXECUTOR=slurm` runs the jobs on Slurm: a local single-host one the supervisor starts and
# stops (npuportal/slurm_demo.py), or the site's when SLURM_CONF is given; no agents, no load generator.
EXECUTOR ?= $(or $(NPUPORTAL_EXECUTOR),agents)
SEED_ARGS = $(if $(filter slurm,$(EXECUTOR)),--no-agents)
run: $(STAMP) ## set up, seed the demo once, start web + worker + beat + agents + load generator
	@if [ "$(EXECUTOR)" = slurm ]; then $(PY) -m npuportal.slurm_demo || exit 1; fi; \
	engine=$$($(PY) -m scheduling.build_engine --background) || exit 1; \
	set -e; export NPUPORTAL_EXECUTOR=$(EXECUTOR); \
	echo "$(PY) manage.py migrate --noinput -v0"; $(PY) manage.py migrate --noinput -v0; \
	echo "$(PY) manage.py seed_demo $(SEED_ARGS)"; $(PY) manage.py seed_demo $(SEED_ARGS); \
	echo "$(PY) manage.py collectstatic --noinput -v0"; $(PY) manage.py collectstatic --noinput -v0; \
	NPUPORTAL_ENGINE=$$engine $(PY) -m npuportal.supervisor $(RUN_ARGS)

test: setup browser slurm directory ## set up and run the whole suite
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(PY) manage.py makemigrations --check --dry-run
	@# Beside the suite, in one more process: the decision core once more as plain Python (the suite
	@# runs the compiled build, if any), then the date-sensitive tests (marked clock) at each fixed
	@# instant of tests/clock.py and at three drawn at random (the seed is printed; NPUPORTAL_CLOCK_SEED
	@# repeats the draw). The suite's workers mostly wait on agents, browsers and servers; this fills
	@# that time. Its output goes to a file, shown whole when the suite is done. The suite's output is
	@# kept too (test-suite.log), and the failures of both are told once more, last, so the tail of a
	@# long log still names them.
	@beside_log="$${NPUPORTAL_VAR_DIR:-var}/test-beside.log"; mkdir -p "$$(dirname "$$beside_log")"; \
	{ NPUPORTAL_ENGINE=python $(BIN)/pytest tests/engine -p no:xdist $(PYTEST_ARGS) \
	  && $(PY) -m tests.clock sweep fixed random -- $(PYTEST_ARGS); } > "$$beside_log" 2>&1 < /dev/null & \
	beside=$$!; trap 'pkill -P $$beside 2>/dev/null; kill $$beside 2>/dev/null' INT TERM; \
	echo "== beside the suite: the engine as plain Python, then the clock sweep (output: $$beside_log)"; \
	echo "$(BIN)/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)"; \
	suite_log="$$(dirname "$$beside_log")/test-suite.log"; \
	{ $(BIN)/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS); echo $$? > "$$suite_log.rc"; } 2>&1 | tee "$$suite_log"; \
	suite=$$(cat "$$suite_log.rc"); \
	wait $$beside; swept=$$?; \
	echo "== beside the suite: the engine as plain Python, then the clock sweep"; cat "$$beside_log"; \
	echo "== the suite exited $$suite; the engine as plain Python and the clock sweep exited $$swept"; \
	grep -h -E '^(FAILED|ERROR) ' "$$suite_log" "$$beside_log" | sed 's/^/== failed: /'; \
	[ $$suite = 0 ] && [ $$swept = 0 ]

# The date-sensitive tests at every instant of tests/clock.calendar_instants() (65: every day across a
# year end, both ends of every month, 29 February, DST days north and south), one pytest process each;
# goes on past a failure and ends with the count and the instants that failed.
calendar: setup
	$(PY) -m tests.clock sweep calendar --keep-going -- $(PYTEST_ARGS)

setup: $(STAMP) engine migrate

# --no-compile: byte-compiling every installed module took 17 of pip's 28 s; a module is compiled
# when first imported instead (most of them never are).
$(STAMP): requirements.txt
	@# python-ldap (directory sign-in) compiles against OpenLDAP's and SASL's headers.
	@if [ ! -e /usr/include/ldap.h ] || [ ! -e /usr/include/sasl/sasl.h ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing OpenLDAP's headers for python-ldap"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libldap2-dev libsasl2-dev >/dev/null) \
	      || { echo "could not install libldap2-dev libsasl2-dev: python-ldap will not build"; exit 1; }; \
	  else echo "python-ldap needs OpenLDAP's headers: apt-get install libldap2-dev libsasl2-dev (as root)"; exit 1; fi; \
	fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed-*
	touch $@

# The decision core compiled with mypyc (see scheduling/engine/__init__.py); a no-op when
# the build of these sources exists, plain Python when it cannot be built.
engine: $(STAMP)
	@$(PY) -m scheduling.build_engine || echo "could not compile the engine: it runs as plain Python"

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput -v0

# The console's browser tests drive Debian's chromium; install it when we may.
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium for the browser tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "could not install chromium: browser tests will be skipped"; \
	  else echo "no /usr/bin/chromium: browser tests will be skipped (apt-get install chromium)"; fi; \
	fi
	@# WeasyPrint (PDF statements) needs pango, whether or not chromium was already there.
	@if ! ldconfig -p 2>/dev/null | grep -q libpangoft2-1.0; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpango-1.0-0 libpangoft2-1.0-0 >/dev/null) \
	      || echo "could not install pango: PDF statement tests will be skipped"; \
	  fi; \
	fi

# The Slurm executor's tests bring up a real single-host Slurm (devices/slurm/cluster.py); install it when we may.
SLURM_PACKAGES = slurm-wlm slurmctld slurmd slurmdbd munge slurm-client
slurm:
	@if ! $(PY) -c "from devices.slurm.cluster import missing_commands as m; raise SystemExit(bool(m()))"; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Slurm for the Slurm executor's tests"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SLURM_PACKAGES) >/dev/null) \
	      || echo "could not install Slurm: the Slurm tests (tests/slurm) will be skipped"; \
	  else echo "no Slurm here: the Slurm tests (tests/slurm) will be skipped (apt-get install $(SLURM_PACKAGES))"; fi; \
	fi

# The directory sign-in tests (tests/directory) run a real OpenLDAP slapd of their own; Debian's package
# gives the program and its schemas (no_configuration: its own database and daemon are not used).
directory:
	@if ! command -v slapd >/dev/null && [ ! -x /usr/sbin/slapd ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing OpenLDAP's slapd for the directory sign-in tests"; \
	    echo "slapd slapd/no_configuration boolean true" | debconf-set-selections; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slapd ldap-utils >/dev/null) \
	      || echo "could not install slapd: the LDAP tests (tests/directory) will be skipped"; \
	  else echo "no slapd here: the LDAP tests (tests/directory) will be skipped (apt-get install slapd ldap-utils)"; fi; \
	fi

# The OpenAPI schema is generated, never hand-written; tests/test_api_schema.py fails when it is stale.
schema: $(STAMP)
	$(PY) manage.py spectacular --validate --file schema/openapi.yaml

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) var staticfiles build
