# netsleuth: `make run` and `make test` do every set-up step themselves on a fresh Debian 12 machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLANG ?= clang
LLVM_STRIP ?= llvm-strip
ARCH := x86
# One set of objects serves every architecture a wheel is built for: the programs read the kernel through
# tracepoints and CO-RE only (no PT_REGS, which -D__TARGET_ARCH_ changes), so each architecture's build is the
# same bytes, and check-bpf holds them to it. Each one's relocations are checked against that architecture's
# Debian kernel BTF (tests/unit/test_core_relocations.py).
BPF_ARCHES := x86 arm64
BPF_SOURCES := $(wildcard bpf/*.bpf.c)
# -fdebug-prefix-map keeps the checkout's absolute path out of the BTF line info, so every clone builds
# byte-identical objects.
bpf_cflags = -O2 -g -target bpf -fdebug-prefix-map=$(CURDIR)=. -D__TARGET_ARCH_$(1) -Ibpf/include -Ibpf
BPF_CFLAGS := $(call bpf_cflags,$(ARCH))
BPF_OBJECTS := $(patsubst bpf/%.bpf.c,src/netsleuth/_generated/%.bpf.o,$(BPF_SOURCES))
# Debian packages. `make run` (a `netsleuth diagnose`) needs only the first list: libbpf1 loads the programs,
# iptables/nftables name the rule behind a NETFILTER_DROP, iproute2 names namespaces, python3-venv makes .venv.
DEB_RUN_PACKAGES := libbpf1 iproute2 iptables nftables procps python3-venv
# `make test` adds what builds and checks the BPF objects (clang/llvm, bpftool), what tests and benchmarks drive
# (firewalls, captures, bpftrace for comparison, Prometheus for the exporter, Alertmanager for the alert ->
# diagnosis path, nats-server for the fleet, Chromium for the web UI, a containerd with its CRI plugin, runc,
# the CNI plugins and umoci for the pod tests, gcc and a static libc for their image) and what builds and runs
# the OCI image (mmdebstrap, umoci, podman).
DEB_PACKAGES := $(DEB_RUN_PACKAGES) clang llvm libbpf-dev bpftool bpftrace tshark conntrack ethtool kmod \
	prometheus prometheus-alertmanager util-linux systemd chromium bind9-dnsutils nats-server \
	containerd runc containernetworking-plugins umoci gcc libc6-dev mmdebstrap podman
KUBECTL ?= kubectl
RUN_DURATION ?= 5

.PHONY: all setup deps deps-run venv venv-core bpf bpf-objects check-bpf wheels image lint typecheck alert-rules unit privileged test run bench clean fleet-demo

all: bpf

# apt-get only the packages of $(1) that are not installed. kubectl (for the Kubernetes manifests) is wanted as
# a command: Debian's kubernetes-client provides it when no other package (e.g. google-cloud-cli's) does.
define install_missing
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(if $(2),command -v $(KUBECTL) >/dev/null 2>&1 || missing="$$missing kubernetes-client";) \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
endef
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

deps-run:
	$(call install_missing,$(DEB_RUN_PACKAGES))

deps:
	$(call install_missing,$(DEB_PACKAGES),kubectl)

# Two installs into one .venv: the core (what `make run` needs: the CLI and the agent's exporter) and
# everything (`make test`: the fleet and controller extras, the test and lint tools).
$(VENV)/.core-installed: pyproject.toml
	@if [ $(VENV)/.dev-installed -nt pyproject.toml ]; then touch $@; exit 0; fi; \
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV); \
	$(BIN)/pip install -q --upgrade pip && $(BIN)/pip install -q -e . && touch $@

$(VENV)/.dev-installed: pyproject.toml
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv-core: $(VENV)/.core-installed

venv: $(VENV)/.dev-installed

setup: deps venv

# Objects are committed (bpf2go style): users need neither clang nor kernel headers. Paths stay relative to
# the repository so the output is byte-identical wherever the tree is checked out.
src/netsleuth/_generated/%.bpf.o: bpf/%.bpf.c $(wildcard bpf/*.h bpf/include/*.h)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@
	$(LLVM_STRIP) -g $@

# The Python side of the ABI (ctypes structs, enums, limits, map sizes, program -> tracepoint) is generated from
# the objects' BTF into src/netsleuth/_generated/*_abi.py (src/netsleuth/bpf/abigen.py, bpf2go's idea).
bpf: $(BPF_OBJECTS) venv
	$(BIN)/python -m netsleuth.bpf.abigen

# Every object built for $(ARCH) into $(BPF_OUT), in parallel: check-bpf and the wheels (packaging/build_wheels.py)
# build each architecture's objects this way; `make bpf` writes the committed ones.
BPF_OUT ?= build/bpf/$(ARCH)
bpf-objects:
	@mkdir -p $(BPF_OUT); \
	for src in $(BPF_SOURCES); do $(CLANG) $(BPF_CFLAGS) -c $$src -o $(BPF_OUT)/$$(basename $$src .c).o & done; \
	status=0; for job in $$(jobs -p); do wait $$job || status=1; done; [ $$status -eq 0 ] || exit 1; \
	$(LLVM_STRIP) -g $(patsubst bpf/%.bpf.c,$(BPF_OUT)/%.bpf.o,$(BPF_SOURCES))

# Rebuild into a temporary place, for each architecture, and fail when an object differs from the committed one.
check-bpf: deps venv
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; status=0; \
	for arch in $(BPF_ARCHES); do \
		$(MAKE) -s --no-print-directory bpf-objects ARCH=$$arch BPF_OUT=$$tmp/$$arch || exit 1; \
		for src in $(BPF_SOURCES); do \
			name=$$(basename $$src .bpf.c); \
			if [ $$arch = $(ARCH) ]; then \
				cmp -s $$tmp/$$arch/$$name.bpf.o src/netsleuth/_generated/$$name.bpf.o || { status=1; \
					echo "src/netsleuth/_generated/$$name.bpf.o is stale: run 'make bpf' and commit it"; }; \
			elif ! cmp -s $$tmp/$$arch/$$name.bpf.o $$tmp/$(ARCH)/$$name.bpf.o; then \
				echo "$$name.bpf.o built for $$arch differs from its $(ARCH) build: one object no longer serves" \
					"every architecture (see BPF_ARCHES)"; status=1; \
			fi; \
		done; \
	done; \
	[ $$status -eq 0 ] && echo "BPF objects match their sources ($(words $(BPF_SOURCES)) checked for $(BPF_ARCHES))"; \
	$(BIN)/python -m netsleuth.bpf.abigen --check || status=1; exit $$status

# The OCI image, built offline from Debian packages (packaging/image/build.py; docs/kubernetes.md).
image: deps venv
	$(BIN)/python packaging/image/build.py

# One wheel per architecture in dist/, each holding the objects built for it (packaging/build_wheels.py).
wheels: deps venv
	$(BIN)/python packaging/build_wheels.py --out dist

lint: venv
	$(BIN)/ruff check src tests bench packaging
	$(BIN)/ruff format --check src tests bench packaging

typecheck: venv
	$(BIN)/mypy

# The shipped alerting rules: syntax, then their unit tests (promtool's format); the example Alertmanager route.
alert-rules: deps
	promtool check rules packaging/prometheus/netsleuth-alerts.yml
	cd packaging/prometheus && promtool test rules netsleuth-alerts.test.yml
	amtool check-config packaging/prometheus/alertmanager.yml >/dev/null

unit: venv
	$(BIN)/pytest -q tests/unit

privileged: setup
	$(BIN)/pytest -q tests/privileged

test: setup check-bpf lint typecheck alert-rules
	$(BIN)/pytest -q -p no:cacheprovider tests

run: deps-run venv-core
	$(BIN)/netsleuth diagnose --duration $(RUN_DURATION)

bench: setup
	$(BIN)/python bench/drops_storm.py

# The fleet on one machine (tests/fleet_lab.py): nats-server, client/lb/server namespaces, one agent each, and
# one synchronised `conn` session over the seed-001 story (an INVALID ACK skips the server's sidecar REDIRECT
# and draws a RST from the application's LISTEN socket), the merged verdict printed first.
fleet-demo: setup
	$(BIN)/python -m tests.fleet_lab --demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
