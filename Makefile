# Two commands matter: `make test` (everything, from a fresh machine) and `make dev`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements.lock
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml testbed/pyproject.toml $(LOCK) | sha1sum | cut -c1-12)
PIP := $(BIN)/pip install -q --disable-pip-version-check
UV_INSTALL := $(BIN)/uv pip install --quiet --python $(BIN)/python
SLINKY_CACHE ?= $(HOME)/.cache/slinky
export UV_CACHE_DIR ?= $(SLINKY_CACHE)/uv
export MYPY_CACHE_DIR ?= $(SLINKY_CACHE)/mypy
DEV_DIR ?= $(SLINKY_CACHE)/testbeds/dev
PYTEST_ARGS ?= --durations=25
# Three workers, each with its own test beds: the e2e tests mostly wait on Slurm and kubelets
# (on 2 cores, three kept the CPU 74% busy and took 18-20 min where two took 22-23).
PYTEST_XDIST ?= -n 3 --dist worksteal

.PHONY: all venv lock testbed-build images lint fmt typecheck unit e2e test dev dev-down dev-env bench crds clean

all: test

# Dependencies come only from the lock file, each checked against its hash; the two local
# distributions are installed editable on top, without resolving anything again.
# uv (itself pinned with hashes in the lock) does the install: seconds from its cache under
# ~/.cache/slinky/uv, where pip needs minutes for a fresh clone.
$(STAMP): pyproject.toml testbed/pyproject.toml $(LOCK)
	rm -f $(VENV)/.installed-*
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	sed -n '/^uv==/,/^[^ ]/{/^uv==/p;/^ /p}' $(LOCK) > $(VENV)/uv.lock
	$(PIP) --require-hashes -r $(VENV)/uv.lock
	$(UV_INSTALL) --require-hashes -r $(LOCK)
	$(UV_INSTALL) --no-deps -e . -e ./testbed
	touch $@

venv: $(STAMP)

## Refresh requirements.lock (every pinned dependency and its hashes) after editing the pins
## in pyproject.toml: `make lock && make venv`.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(BIN)/uv || $(PIP) uv==$$(sed -n 's/^ *"uv==\(.*\)",/\1/p' pyproject.toml)
	$(BIN)/uv pip compile pyproject.toml --extra dev --generate-hashes --universal \
		--python-version 3.11 --no-header --quiet -o $(LOCK)

## Build or reuse the cached test bed: Kubernetes binaries (control plane, kubelet, kube-proxy),
## kwok, helm, etcd, containerd, runc, CNI plugins, CoreDNS, pause, Prometheus, the Slurm root; and the
## JobSet and LeaderWorkerSet controllers the slurm-bridge gang tests run.
testbed-build: venv
	$(BIN)/slinky testbed build
	bash hack/build-groups.sh

## OCI image archives (Slurm, Slurm HPC, Slinky) in ~/.cache/slinky/images, no registry or daemon
## needed; rebuilt only when their inputs change. Import with `ctr -n k8s.io images import <archive>`.
images: testbed-build
	bash hack/build-slurm-root.sh
	bash hack/build-hpc-layer.sh
	bash hack/build-python-root.sh
	$(BIN)/python -m slinky_testbed.images build

lint: venv
	$(BIN)/ruff check src testbed tests bench
	$(BIN)/ruff format --check src testbed tests bench
	$(BIN)/mypy

fmt: venv
	$(BIN)/ruff format src testbed tests bench
	$(BIN)/ruff check --fix src testbed tests bench

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q tests/unit $(PYTEST_ARGS)

e2e: images
	$(BIN)/pytest -q tests/e2e $(PYTEST_XDIST) $(PYTEST_ARGS)

## Everything: install, build/cache the test bed, lint + types, unit and end-to-end tests.
test: images lint
	$(BIN)/pytest -q tests $(PYTEST_XDIST) $(PYTEST_ARGS)

## A local Kubernetes with the site a user installs from the charts (operator, Slurm with
## accounting, login and LDAP users, bridge) that stays up; poke it with kubectl, sinfo, ssh.
dev: images
	@$(BIN)/slinky testbed --dir $(DEV_DIR) status >/dev/null 2>&1 || \
		$(BIN)/slinky testbed --dir $(DEV_DIR) up --nodes 2 --kwok-nodes 2
	@$(BIN)/python -m slinky_testbed.dev_site --dir $(DEV_DIR)

dev-down: venv
	$(BIN)/slinky testbed --dir $(DEV_DIR) down
	rm -f $(DEV_DIR)/slurm-commands

dev-env: venv
	@$(BIN)/slinky testbed --dir $(DEV_DIR) env
	@$(BIN)/python -m slinky_testbed.dev_site --dir $(DEV_DIR) env

## Regenerate config/crd/ from the API models (and the CRD chart's copy of them).
crds: venv
	$(BIN)/python -m slinky.api.v1alpha1.crds config/crd
	cp config/crd/*.yaml helm/slurm-operator-crds/files/

bench: images
	$(BIN)/python -m bench

## Chaos soak on a test bed of its own (bench/soak.py): batch jobs and bridge pods while
## processes are killed, NodeSets scaled and rolled, nodes drained; then the report.
SOAK_DURATION ?= 30m
SOAK_SEED ?= 1
SOAK_ARGS ?=
.PHONY: soak
soak: images
	$(BIN)/python -m bench.soak --duration $(SOAK_DURATION) --seed $(SOAK_SEED) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
