# netsleuth: `make run` and `make test` do every set-up step themselves on a fresh Debian 12 machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CLANG ?= clang
LLVM_STRIP ?= llvm-strip
ARCH := x86
BPF_SOURCES := $(wildcard bpf/*.bpf.c)
# -fdebug-prefix-map keeps the checkout's absolute path out of the BTF line info, so every clone builds
# byte-identical objects.
BPF_CFLAGS := -O2 -g -target bpf -fdebug-prefix-map=$(CURDIR)=. -D__TARGET_ARCH_$(ARCH) -Ibpf/include -Ibpf
BPF_OBJECTS := $(patsubst bpf/%.bpf.c,src/netsleuth/_generated/%.bpf.o,$(BPF_SOURCES))
# Debian packages: clang/llvm build the BPF objects, libbpf1 loads them, the rest are what tests and
# benchmarks drive (firewalls, captures, bpftrace for comparison, Prometheus for the exporter, a containerd
# with its CRI plugin, runc, the CNI plugins and umoci for the pod tests, gcc and a static libc for their image).
DEB_PACKAGES := clang llvm libbpf1 libbpf-dev bpftool bpftrace tshark iptables nftables conntrack iproute2 \
	ethtool kmod procps prometheus util-linux systemd chromium bind9-dnsutils nats-server \
	containerd runc containernetworking-plugins umoci gcc libc6-dev
RUN_DURATION ?= 5

.PHONY: all setup deps venv bpf check-bpf lint typecheck unit privileged test run bench clean fleet-demo

all: bpf

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq $$missing >/dev/null; \
	fi

$(BIN)/netsleuth: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/netsleuth

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

# Rebuild into a temporary place and fail when the committed objects differ from their sources.
check-bpf: deps venv
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; status=0; \
	for src in $(BPF_SOURCES); do \
		name=$$(basename $$src .bpf.c); \
		$(CLANG) $(BPF_CFLAGS) -c $$src -o $$tmp/$$name.bpf.o && \
		$(LLVM_STRIP) -g $$tmp/$$name.bpf.o || exit 1; \
		if ! cmp -s $$tmp/$$name.bpf.o src/netsleuth/_generated/$$name.bpf.o; then \
			echo "src/netsleuth/_generated/$$name.bpf.o is stale: run 'make bpf' and commit it"; status=1; \
		fi; \
	done; \
	[ $$status -eq 0 ] && echo "BPF objects match their sources ($(words $(BPF_SOURCES)) checked)"; \
	$(BIN)/python -m netsleuth.bpf.abigen --check || status=1; exit $$status

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q tests/unit

privileged: setup
	$(BIN)/pytest -q tests/privileged

test: setup check-bpf lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider tests

run: setup
	$(BIN)/netsleuth diagnose --duration $(RUN_DURATION)

bench: setup
	$(BIN)/python bench/drops_storm.py

# The fleet on one machine (tests/fleet_lab.py): nats-server, client/lb/server namespaces, one agent each, and
# one synchronised session showing the far firewall drop and the DNAT-bypass reset.
fleet-demo: setup
	$(BIN)/python -m tests.fleet_lab --demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
