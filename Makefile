# shardsmith: `make demo` and `make test` work on a fresh machine (they create .venv when missing).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test test-heavy test-walkthroughs bench lint install-dev clean data docs

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.core: $(VENV)/bin/python pyproject.toml
	$(PIP) install -e '.[images,root,webdataset]'
	touch $@

$(VENV)/.dev: $(VENV)/bin/python pyproject.toml
	$(PIP) install -e '.[dev]'
	# mosaicml-streaming reads --to mds output back in the tests; its own requirements would replace numpy,
	# transformers and tokenizers and pull a GPU torchvision, so it comes without them, with what its reader imports
	$(PIP) install --no-deps mosaicml-streaming==0.13.0 Brotli==1.2.1 python-snappy==0.7.3 zstd==1.5.7.2 catalogue==2.0.10
	touch $@ $(VENV)/.core

install-dev: $(VENV)/.dev

demo: $(VENV)/.core
	$(PY) examples/demo.py --out demo-out

# two processes, each taking whole test files (a file's module fixtures, e.g. its S3 server, start once);
# two suites are targets of their own, which .ci/run also runs: the heavy files (many processes a test: staged
# runs, executors, kills, S3 stages and outputs, DataLoader workers, a browser; or long) and the walk-throughs (a user's path end to end: every docs
# page, the README's loops, a plugin package in a fresh venv)
test: $(VENV)/.dev
	$(PY) -m pytest -n 2 --dist loadfile -m "not walkthrough and not heavy" --durations=25

test-heavy: $(VENV)/.dev
	$(PY) -m pytest -n 2 --dist loadfile -m heavy --durations=10

test-walkthroughs: $(VENV)/.dev
	$(PY) -m pytest -n 2 --dist loadfile -m walkthrough

# make data RECIPE=recipes/NAME.toml: run a data-preparation recipe on this machine
data: $(VENV)/.core
	@test -n "$(RECIPE)" || { echo "usage: make data RECIPE=recipes/NAME.toml"; exit 2; }
	$(PY) -m shardsmith run $(RECIPE)

# make bench [BENCH=mix,pack_tokens]: every benchmark that can run here, at quick sizes, into build/bench/
# (a table as they end; peer tools not installed are named with their install command). Full-size runs:
# bench/README.md.
bench: $(VENV)/.dev
	$(PY) bench/suite.py --only "$(BENCH)"

# make docs: the documentation site from docs/ into build/site/ (open build/site/index.html), --strict: a broken
# link, a missing page or an API reference that does not resolve fails the build
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@echo "docs: build/site/index.html"

$(VENV)/.docs: $(VENV)/bin/python pyproject.toml
	$(PIP) install -e '.[docs]'
	touch $@

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check shardsmith tests bench examples

clean:
	rm -rf demo-out tour build .pytest_cache

.PHONY: slurm test-slurm test-cluster

# make slurm RECIPE=recipes/NAME.toml TASKS=N [SBATCH_ARGS="--partition=cpu --account=me"]: submit a recipe
# to SLURM as a scatter array of N tasks, a plan job, a gather array of N tasks and a finalize job, each
# after the one before
# (recipes/slurm/); run it where sbatch works, from a folder every node sees.
slurm: $(VENV)/.core
	@test -n "$(RECIPE)" -a -n "$(TASKS)" || { echo "usage: make slurm RECIPE=recipes/NAME.toml TASKS=N [SBATCH_ARGS=...]"; exit 2; }
	PYTHON=$(abspath $(PY)) recipes/slurm/submit.sh $(RECIPE) $(TASKS) $(SBATCH_ARGS)

# make test-slurm: starts a real one-node SLURM cluster here (root; apt-get installs it when missing),
# runs recipes through recipes/slurm/ with 3 and 2 tasks (and failed ranks rerun alone) and commands
# with --executor slurm (submitit: a failed unit, --no-wait, requeued tasks), compares with local
# runs, stops the cluster.
test-slurm: $(VENV)/.cluster
	SHARDSMITH_SLURM_TEST=1 $(PY) -m pytest -rs -p no:cacheprovider tests/slurm

$(VENV)/.cluster: $(VENV)/.dev
	$(PIP) install -e '.[dev,ray,dask,slurm]'
	touch $@

# make test-cluster: jobs on real Ray and Dask clusters started here (tests/cluster/), inside a network
# namespace that has only loopback (Ray binds the machine's interface otherwise); needs root and unshare.
test-cluster: $(VENV)/.cluster
	unshare -n sh -c 'ip link set lo up && SHARDSMITH_CLUSTER_TEST=1 $(PY) -m pytest -rs -p no:cacheprovider tests/cluster'
