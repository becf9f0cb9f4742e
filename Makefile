# mirrorgate: the two set-up commands are `make serve` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install plugin serve docs test test-fast test-e2e test-versions lint e2e-deps bench bench-abuse bench-policy bench-secrets bench-health bench-pods bench-kubelet bench-profile image release lock clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

# The kubelet credential-provider plugin (plugins/credential-provider), static, for
# linux/amd64 and linux/arm64: build/plugins/linux-<arch>/mirrorgate-credential-provider.
# Its `go vet` and `go test` run with the suite (tests/plugin).
plugin:
	bash plugins/build.sh

DEV_CERTS := dev-certs

# The HTTPS webhook on 127.0.0.1:8443 with the example policy and development
# certificates (generated once; the CA is reused so its caBundle is stable).
# The example's mirrors are fictional: no health probes, or every rule would fall back.
serve: install
	@test -f $(DEV_CERTS)/tls.crt || $(VENV)/bin/mirrorgate certs generate --service mirrorgate \
	  --namespace mirrorgate --dns localhost --ip 127.0.0.1 --out $(DEV_CERTS) >/dev/null
	$(VENV)/bin/mirrorgate serve --policy examples/policy.yaml --no-health-probes \
	  --tls-cert $(DEV_CERTS)/tls.crt --tls-key $(DEV_CERTS)/tls.key --host 127.0.0.1 --port 8443

# Debian packages, the Go-built control plane (kube-apiserver, etcd,
# kustomize; cached by version outside the work tree) and nothing else.
e2e-deps:
	bash tests/e2e/deps.sh

# The tables in docs/ that are generated from the code (a test holds them equal).
docs: install
	$(PY) -m mirrorgate.webhook.commands.serve.flagtable --write docs/cli.md
	$(PY) -m mirrorgate.webhook.policyfile.crds --write

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The whole suite, end-to-end included. pytest exits 5 when it collects no
# test; that is a failure here like any other non-zero status.
# The conformance corpus is the one prerequisite make cannot provide: it lives
# beside the checkout (../shared/conformance), where CI lays it out. It runs
# apart, under the caller's environment: where the corpus is, it runs; on a
# fresh clone it says that it did not run; under CI (CI=true) or with
# MIRRORGATE_REQUIRE_E2E=1 set by the caller, a missing corpus fails.
CONFORMANCE := tests/policy/test_conformance.py
# The conformance check runs first, so that the whole suite's count is the
# last pytest summary a reader (or CI) sees.
# The upgrade from 0.1.0 (marker `upgrade`) builds 0.1.0's image: it belongs to
# `make test-versions`, which keeps `make test`'s cold run inside 60 minutes.
test: install e2e-deps lint
	$(PY) -m pytest $(CONFORMANCE)
	MIRRORGATE_REQUIRE_E2E=1 $(PY) -m pytest --ignore=$(CONFORMANCE) -m "not upgrade"
	$(PY) -m tests.packaging.check_dist --single-package

test-fast: install
	$(PY) -m pytest -m "not e2e and not image"

test-e2e: install e2e-deps
	MIRRORGATE_REQUIRE_E2E=1 $(PY) -m pytest -m e2e tests/e2e

# The e2e suite against every supported Kubernetes minor (tests/e2e/versions.py):
# the API-server suite on each, the node scenarios with the chart-installed image
# (and the upgrade from 0.1.0) on the oldest and the newest. One line per version:
# `kubernetes vX.Y.Z (api): N passed, F failed, S skipped`. Each extra minor's
# binaries are built once (cold: tens of minutes on two cores) and cached by
# version. Not part of `make test`; CI runs it nightly and on tags.
test-versions: install e2e-deps
	$(PY) -m tests.e2e.versions

# Benchmarks, not timed tests: figures are ratios against a baseline measured
# in the same run, because this machine is shared and noisy.
# Each records its report in bench/results.json; bench.figures then writes the
# figures of docs/development.md from it.
bench-policy: install
	$(PY) -m bench.policy_bench --check
	$(PY) -m bench.figures

# The admission server against its floor, then the same with pull secrets
# against a real API server (and the first-Pod latency), the server under
# abuse (idle connections, a flood of unique 2.5 MB images), health probing on
# against off, then Pod start on a real node with and without mirrorgate:
# about 11 minutes.
bench: install e2e-deps
	$(PY) -m bench.server_bench
	$(PY) -m bench.secrets_bench
	$(PY) -m bench.policy_objects_bench
	$(PY) -m bench.abuse_bench
	$(PY) -m bench.health_bench
	$(PY) -m bench.pod_start_bench
	$(PY) -m bench.kubelet_bench
	$(PY) -m bench.objects_bench
	$(PY) -m bench.figures

# The kubelet plugin's round trip (warm and cold verdicts) and the credential endpoint's
# throughput on one core, against a real etcd + kube-apiserver (about a minute).
bench-kubelet: install e2e-deps
	$(PY) -m bench.kubelet_bench
	$(PY) -m bench.figures

# BEFORE=DIR (a checkout of the previous code, e.g. `git worktree add /tmp/before main`)
# measures the big-Pod and policy scenarios against it too, in the same run.
bench-abuse: install
	$(PY) -m bench.abuse_bench $(if $(BEFORE),--before $(BEFORE)) $(if $(BASELINE),--baseline-server $(BASELINE)) $(if $(CHECK),--check)
	$(PY) -m bench.figures

# Health probing on against off, with a real TLS mirror on loopback (about a minute).
bench-health: install e2e-deps
	$(PY) -m bench.health_bench
	$(PY) -m bench.figures

# Pod start on a real node (kubelet, containerd; under the machine-wide node lock).
bench-pods: install e2e-deps
	$(PY) -m bench.pod_start_bench
	$(PY) -m bench.figures

# Pull secrets against a real etcd + kube-apiserver (started and stopped by the run).
bench-secrets: install e2e-deps
	$(PY) -m bench.secrets_bench
	$(PY) -m bench.figures

bench-profile: install
	$(PY) -m bench.profile_server --size small
	$(PY) -m bench.profile_server --size large --requests 600

# The server image, built with podman (installed from Debian's packages when
# missing). BASE=debian, the default and the releases' base, makes the Python
# base from this machine's apt sources, every package checked against the
# archive's signatures (no registry of base images needed); BASE=official
# takes the official Python image only as PYTHON_IMAGE=...@sha256:<digest>, a
# digest you resolved and verified: none is shipped. TAG names the result.
BASE ?= debian
TAG ?= localhost/mirrorgate:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	BASE=$(BASE) TAG=$(TAG) bash image/build.sh

# Every release artifact, built into DIST and verified (release/release.sh):
# the image as one OCI archive for PLATFORMS (arm64 emulated through Debian's
# qemu-user-static; where binfmt_misc or root is missing, PLATFORMS=linux/amd64),
# its CycloneDX SBOM, the chart stamped with VERSION, SHA256SUMS. VERSION must
# be pyproject.toml's and have a CHANGELOG.md section. Publishing is CI's
# (.github/workflows/release.yml).
DIST ?= dist
PLATFORMS ?= linux/amd64 linux/arm64
release: install
	VERSION=$(VERSION) DIST=$(DIST) PLATFORMS="$(PLATFORMS)" bash release/release.sh

# Re-pin the image's dependencies (every file by hash) from pyproject.toml.
lock: install
	$(VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	  --native-tls pyproject.toml image/requirements.in -o image/requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
