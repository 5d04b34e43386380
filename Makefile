# ddp-trainer: `make run` trains locally, `make test` runs every test. Both set themselves up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The torch the tests run with (tools/imagebuild/wheels.py reads this line too). PyPI's Linux
# build of it is the CUDA one (~3.5 GB with its nvidia wheels); where ../shared/wheels holds the
# CPU wheel (this project's machines), pip is given it as a find-links source: its local version
# `2.13.0+cpu` sorts above `2.13.0`, so pip takes it. Elsewhere PyPI's build is the right one.
TORCH_SPEC ?= torch==2.13.0
WHEELS ?= $(wildcard $(CURDIR)/../shared/wheels)
PIP_LINKS := $(if $(WHEELS),--find-links $(abspath $(WHEELS)))
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' trainer/__init__.py)
IMAGE ?= ghcr.io/ddp-trainer/ddp-trainer
TAG ?= $(VERSION)
NPROC ?= 2
RUN_ARGS ?=

.PHONY: venv tools e2e-tools cluster-tools cluster-up cluster-down run test test-fast e2e \
	lint docs bench k8s image push release clean

# What running needs: torch and the package's own dependencies, no extras (`make run` on a
# fresh clone: docs/development.md). The test, lint and docs targets add their extras on top.
$(VENV)/.installed-run: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c 'import torch' 2>/dev/null || $(PIP) install -q $(PIP_LINKS) "$(TORCH_SPEC)"
	$(PIP) install -q $(PIP_LINKS) -e .
	touch $@

# Everything the tests and the linters import: the jobs CLI's kubernetes client, pytest and
# the data formats, transformers, kmock, ruff, mypy, s3fs (the S3 tests).
$(VENV)/.installed: $(VENV)/.installed-run
	$(PIP) install -q $(PIP_LINKS) -e '.[k8s,test,lint,s3]'
	touch $@

$(VENV)/.installed-docs: $(VENV)/.installed-run
	$(PIP) install -q $(PIP_LINKS) -e '.[docs]'
	touch $@

venv: $(VENV)/.installed

# External binaries the tests drive for real: helm 3 + 4, kubectl, Prometheus/promtool, and
# SeaweedFS's weed (the S3 server of tests/test_s3_storage.py, built once per machine from
# tools/s3server/go.mod: ~23 min cold on 2 shared cores).
tools: venv
	bash tools/install-helm.sh
	bash tools/install-prometheus.sh
	$(PY) -m tools.s3server

# The container runtime of the end-to-end tests: podman + runc, netavark, debootstrap.
e2e-tools:
	bash tools/install-podman.sh

# The real Kubernetes of the tests (docs/cluster.md), one node or NODES=2 (the second in a
# network namespace of its own): Debian's containerd, runc, CNI plugins and registry;
# Kubernetes, etcd, CoreDNS and local-path-provisioner built once per machine from the Go
# modules in tools/cluster.
NODES ?= 1
cluster-tools: e2e-tools
	bash tools/install-cluster.sh

cluster-up: venv cluster-tools
	$(PY) -m tools.cluster up --nodes $(NODES)

cluster-down:
	$$(test -x $(PY) && echo $(PY) || echo $(PYTHON)) -m tools.cluster down

run: $(VENV)/.installed-run
	$(VENV)/bin/ddp-trainer run --nproc-per-node $(NPROC) --dataset digits --output-dir outputs \
		--metrics-bind-address 127.0.0.1 \
		--set metrics.linger_seconds=0 $(RUN_ARGS)

# Every test, the cluster's included: the cluster comes up in the background (its build and
# start-up times printed) while the other tests run on two workers; then tests/cluster runs,
# a few long whole-run files beside it at idle CPU priority, and the cluster goes down
# whatever the outcome (tools/run-tests.sh).
test: venv tools e2e-tools cluster-tools
	bash tools/run-tests.sh

# The edit-test loop: unit and in-process tests, no external binaries (under 3 minutes on 2
# CPU cores). tests/conftest.py marks `slow` what drives helm/podman/the image or starts
# processes; `make test` above still runs everything.
test-fast: venv
	$(PY) -m pytest -q -m "not slow" --durations=10

# End to end (docs/e2e.md): the image built from the Dockerfile with podman, air-gapped, and
# checked; the cluster tests run what the chart makes of it.
e2e: venv tools e2e-tools
	PATH="$(CURDIR)/.tools/bin:$$PATH" $(PY) -m pytest -q tests/e2e tests/image/test_built_image.py

lint: venv
	$(VENV)/bin/ruff check trainer tests benchmarks examples tools
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy --strict --explicit-package-bases tools/imagebuild
	$(VENV)/bin/hadolint Dockerfile

# The documentation site (mkdocs.yml): README.md is its home page, docs/*.md the reference.
# --strict turns every warning into an error: a broken link or anchor fails the build, and so
# does a link to a file of the repository that does not exist (tools/mkdocs_hooks.py).
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: venv
	$(PY) benchmarks/bench_trainer.py
	$(PY) benchmarks/bench_sampler.py
	$(PY) benchmarks/bench_metrics.py
	$(PY) benchmarks/bench_precision.py
	$(PY) benchmarks/bench_data.py
	$(PY) benchmarks/bench_fsdp.py

k8s: tools
	bash tools/render-k8s.sh

image:
	docker build -t $(IMAGE):$(TAG) --build-arg VERSION=$(VERSION) .

push: image
	docker push $(IMAGE):$(TAG)

# The image and the chart pushed to an OCI registry, as a user's CI would (tools/release.py):
# make release REGISTRY=host:port [REGISTRY_CA=ca.crt]
release: venv tools e2e-tools
	@test -n "$(REGISTRY)" || { echo "release: error: REGISTRY is not set (fix: make release REGISTRY=host:port [REGISTRY_CA=ca.crt])" >&2; exit 2; }
	$(PY) tools/release.py $(REGISTRY) $(if $(REGISTRY_CA),--ca $(REGISTRY_CA))

clean:
	rm -rf $(VENV) .tools .cache site outputs checkpoints .pytest_cache .mypy_cache .ruff_cache
