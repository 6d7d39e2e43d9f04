PY      := .venv/bin/python
VERSION ?= atlas-full-v1
MODEL   ?= kmer-4
STORE   ?= store

.PHONY: install lint format test test-kinds test-all embeddings report demo lab docs bench check clean

# The environment is (re)built whenever the project's dependency files change.
.venv/.installed: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	touch $@

install: .venv/.installed

lint: install
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
	.venv/bin/deptry . && .venv/bin/lint-imports

format: install
	.venv/bin/ruff check --fix . && .venv/bin/ruff format .

# two workers: the suite mostly waits on the servers and processes it starts (16 min
# in one, 8 in two on the 2-core machines); a worker takes the next test when free
test: install
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow and not gpu" -q

# every CPU kind is a supported kind (issue 43): the tests marked cpu_kind (their keys
# or vectors follow what --dtype auto resolves to) with each kind forced
test-kinds: install
	for kind in AVX2 "AVX-512 BF16" AMX; do EMBEDCACHE_CPU_KIND="$$kind" \
	  $(PY) -m pytest -n 2 -m "cpu_kind and not slow and not gpu" -q || exit 1; done

test-all: install
	$(PY) -m pytest -q

embeddings: install
	$(PY) -m embedcache.cli embeddings --model $(MODEL) --version $(VERSION) --store $(STORE)

report: install
	$(PY) -m embedcache.cli report --version $(VERSION) --store $(STORE)

demo: install
	$(PY) -m embedcache.cli demo --store $(STORE)

# notebooks/*.py open as notebooks: .jupyter/ makes jupytext's viewer the default
lab: install
	JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter .venv/bin/jupyter lab notebooks/

# every benchmark in turn, each appending its record (BENCH_ARGS=--quick: smaller runs)
bench: install
	$(PY) -m benchmarks list | cut -d' ' -f1 | xargs -I{} $(PY) -m benchmarks run {} $(BENCH_ARGS)

check: lint test

# the documentation site into site/ (its generated tables read this checkout's code);
# --strict: a broken link, a missing page or a bad anchor fails the build
docs: install
	PYTHONPATH=$(CURDIR) NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf reports/*/ .pytest_cache site
