# NeoCloud Node: developer entry points. `make verify` is what CI runs (through .ci/run).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
IMAGE ?= ghcr.io/aibrix/neocloud-node
FUZZ_SECONDS ?= 600
FUZZ_SMOKE_SECONDS ?= 20
# The market replay's seed and output (docs/REPLAY.md); a seed gives the same trace and jobs.
REPLAY_SEED ?= 20261204
REPLAY_OUT ?= target/replay
REPLAY_STRATEGIES ?= single-provider cheapest-first default cel-spot-then-on-demand wasm-reliable-per-dollar
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The image's timestamps: the last commit's time, so the same commit builds the same digest.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: help verify fmt fmt-check locked clippy test test-unit test-integration testenv bench bench-serving \
        policies manifests run-local registry config-reference image docker-build fuzz fuzz-smoke replay flaky

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

verify: fmt-check locked clippy test ## formatting, clippy with warnings denied, every test (what CI runs)

fmt: ## format the workspace
	$(CARGO) fmt --all

fmt-check: ## fail on unformatted code
	$(CARGO) fmt --all --check

locked: ## fail when Cargo.lock or fuzz/Cargo.lock is out of date with the manifests (a build would rewrite it)
	$(CARGO) metadata --locked --format-version 1 >/dev/null
	cd fuzz && cargo metadata --locked --format-version 1 >/dev/null

clippy: ## clippy on every crate and target, warnings are errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# hack/ci/run-tests.py builds every test binary with one `cargo test --workspace --no-run` (which
# also builds target/debug/neocloud-runner, which the node's VM runner tests start), then runs
# them TEST_JOBS (4) at a time, those that start a worker node, a Docker engine or Kueue alone,
# and the doc tests. A failing binary does not keep the others from running, so one run reports
# every failure. The output is kept in target/test.log; on a failure the panics and then the
# failed tests, each after the binary it ran in, are printed again at the end, where a CI log's
# tail shows them. TEST_REPEAT=5 runs the whole set five times from one build and prints each
# binary's passes (the way to find flaky binaries). Four on two cores: most binaries spend much
# of their time waiting on their control planes and Pods. At three the cores were 83 % busy over
# a truly cold run's round, 1,110 s; once each test binary compiled a guest once, not once per
# registry, four took 756 s with the cores 64 % busy (docs/BENCHMARKS.md).
TEST_JOBS ?= 4
TEST_REPEAT ?= 1
test: testenv policies ## every test: unit, provider and integration (starts a real control plane)
	@mkdir -p target
	@if CARGO=$(CARGO) TEST_JOBS=$(TEST_JOBS) TEST_REPEAT=$(TEST_REPEAT) python3 hack/ci/run-tests.py --workspace 2>&1 | tee target/test.log; then exit 0; fi; \
	echo; echo "== the panics (whole output in target/test.log)"; \
	{ grep -A6 -E '^thread .* panicked at' target/test.log || true; } | cut -c1-300 | tail -n 60; \
	echo; echo "== the failed tests"; \
	{ grep -E '^test .* FAILED$$|^     Running ' target/test.log || true; } \
	  | { grep -B1 'FAILED$$' || true; } | { grep -v '^--$$' || true; } | tail -n 30; \
	exit 101

test-unit: ## library unit tests only (no control plane)
	$(CARGO) test --workspace --lib --no-fail-fast

test-integration: testenv ## integration tests against the real control plane
	$(CARGO) test -p neocloud-testenv -p neocloud-runner -p neocloud-node --tests --no-fail-fast

# One build, then the chosen tests N times; every run's outcome is counted and the failed runs'
# output is kept, so a flaky test shows how often it fails and why. STOP=1 stops at the first
# failure.
TEST ?=
N ?= 5
STOP ?=
flaky: ## run the tests TEST selects (cargo test arguments) N times (5) and count the failures
	@if [ -z "$(TEST)" ]; then echo "make flaky: set TEST, e.g. TEST='-p neocloud-node --test remote_cluster'" >&2; exit 2; fi
	$(CARGO) test --no-run $(TEST)
	@rm -rf target/flaky; mkdir -p target/flaky; failed=0; runs=0; \
	for i in $$(seq 1 $(N)); do \
	  runs=$$i; log=target/flaky/run-$$i.log; \
	  if $(CARGO) test $(TEST) >"$$log" 2>&1; then echo "flaky: run $$i/$(N) passed"; \
	  else failed=$$((failed + 1)); echo "flaky: run $$i/$(N) FAILED (output in $$log)"; \
	    grep -E '^(test .* FAILED|thread .* panicked)' "$$log" | head -n 20 || true; \
	    if [ -n "$(STOP)" ]; then break; fi; fi; \
	done; \
	echo "flaky: $$failed of $$runs runs failed: $(TEST)"; \
	[ "$$failed" -eq 0 ]

testenv: ## build etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, the kubelet and kube-proxy, the OCI registry, the OpenTelemetry Collector, KWOK, Kueue and helm (cached)
	bash hack/testenv/build.sh >/dev/null
	bash hack/testenv/build-kubelet.sh >/dev/null
	bash hack/testenv/build-registry.sh >/dev/null
	bash hack/testenv/build-otelcol.sh >/dev/null
	bash hack/testenv/build-kwok.sh >/dev/null
	bash hack/testenv/build-kueue.sh >/dev/null
	bash hack/helm/build.sh >/dev/null

config-reference: ## regenerate docs/CONFIGURATION.md from the config types (a docs test fails when it is stale)
	$(CARGO) run -q -p neocloud-node --bin neocloud-node -- config reference > docs/CONFIGURATION.md

bench: ## criterion benchmarks (figures go to docs/BENCHMARKS.md)
	$(CARGO) bench --workspace

bench-serving: testenv ## serving from a burst Pod: relay vs direct vs kubectl port-forward (root, the rig's worker node; docs/BENCHMARKS.md)
	$(CARGO) build --release -p neocloud-runner
	$(CARGO) bench -p neocloud-node --bench serving

fuzz: ## run every fuzz target FUZZ_SECONDS (600) each, one after another (nightly; docs/FUZZING.md)
	bash fuzz/run.sh run $(FUZZ_SECONDS)

fuzz-smoke: ## replay the fuzz seeds and crash regressions, then fuzz each target FUZZ_SMOKE_SECONDS (CI)
	bash fuzz/run.sh smoke $(FUZZ_SMOKE_SECONDS)

policies: ## build the guest policies (C, JavaScript, Python, hostile test guests) from source into policies/build/
	bash policies/build.sh

manifests: testenv ## regenerate config/crd from the Rust types and deploy/neocloud-node.yaml from config/default
	$(CARGO) run -q -p neocloud-node -- crds > config/crd/cloud.aibrix.ai.yaml
	cp config/crd/cloud.aibrix.ai.yaml deploy/helm/neocloud-node/crds/cloud.aibrix.ai.yaml
	{ echo "# Generated by make manifests from config/default; do not edit."; \
	  "$$(bash hack/testenv/build.sh --print)/kubectl" kustomize config/default; } > deploy/neocloud-node.yaml

replay: policies ## a week of three clouds' market and 1,000 jobs replayed under each strategy; report in REPLAY_OUT (docs/REPLAY.md)
	$(CARGO) build -p neocloud-replay
	target/debug/neocloud-replay generate --seed $(REPLAY_SEED) --out $(REPLAY_OUT)
	target/debug/neocloud-replay run --trace $(REPLAY_OUT)/trace.jsonl --jobs $(REPLAY_OUT)/jobs.jsonl \
	  $(foreach s,$(REPLAY_STRATEGIES),--strategy host/replay/strategies/$(s).json) --out $(REPLAY_OUT)

run-local: ## control plane, cloud simulators and the node on this machine, with the samples and a live summary
	bash hack/run-local.sh

# REGISTRY_PORT picks the port (a free one otherwise); REGISTRY_ENV names a file to write the
# export lines to, for `source` in another shell.
REGISTRY_PORT ?=
REGISTRY_ENV ?=
registry: ## start the OCI registry (built once by make testenv) on 127.0.0.1 with TLS and a login, and print the REGISTRY=... lines to export; Ctrl-C stops it
	bash hack/testenv/build-registry.sh >/dev/null
	$(CARGO) build -q -p neocloud-testenv --bin neocloud-testenv
	target/debug/neocloud-testenv registry $(if $(REGISTRY_PORT),--port $(REGISTRY_PORT)) $(if $(REGISTRY_ENV),--env-file $(REGISTRY_ENV))

image: ## build the node's OCI image without a daemon or network into target/image/ (layout/ and image.tar)
	$(CARGO) build --release --locked -p neocloud-node --bin neocloud-node
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) python3 hack/image/build.py \
	  --binary target/release/neocloud-node --out target/image --ref $(IMAGE):$(VERSION)

docker-build: ## build the container image ghcr.io/aibrix/neocloud-node:$(VERSION) (needs docker)
	@command -v docker >/dev/null || { echo "make docker-build: docker is not installed on this machine" >&2; exit 1; }
	docker build -t $(IMAGE):$(VERSION) .
