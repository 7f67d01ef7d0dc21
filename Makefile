# leasefs — build, run and test on one machine.
#
#   make up      install what is missing, start the embedded cluster (1 metadata server,
#                3 block servers, state in $LEASEFS_HOME or ~/.leasefs; UP_ARGS='--storage 5')
#                and mount it with FUSE at ./mnt (MNT=/other/dir)
#   make test    install what is missing, run the whole pytest suite (PYTEST_ARGS=... passes
#                options through, e.g. make test PYTEST_ARGS='-x -k cli')
#   make test-fast  the fast lane: every test not marked slow, in parallel (FAST_WORKERS=8)
#   make down    unmount and stop the embedded cluster (data is kept)
#   make clean   stop it and delete its home folder
#   make proto   regenerate etcd's messages (meta/ha/etcdpb/*_pb2.py) after editing a .proto
#
# Idempotent: apt runs only when a package is missing, pip only when pyproject.toml changed.
# Works as root on a fresh Debian 12 with only python3 and git (uses sudo otherwise).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON      ?= python3
VENV        ?= .venv
EXTRAS      ?= test,fuse,spark
PYTEST_ARGS ?=
# the fast lane waits more than it computes (sleeps, timeouts, subprocesses): measured on
# 2 cores, 8 workers finished it faster than 4 or 6 (docs/TESTING.md)
FAST_WORKERS ?= 8
UP_ARGS     ?=
MNT         ?= $(CURDIR)/mnt
APT_PACKAGES := fuse3 libfuse3-dev pkg-config python3-venv python3-dev build-essential rsync git patch
# packages only the tests need (`make test`, CI), installed the same idempotent way: the web
# UI's browser test (tests/test_webui.py) and a real Prometheus scraping a cluster
# (tests/test_metrics.py; the binary only, not the package's system service), and a real
# 3-member etcd cluster for the metadata HA log (tests/test_halog.py; /usr/bin/etcd only:
# the package's own etcd.service, where systemd starts it, keeps 2379/2380, which the tests
# never use)
TEST_APT_PACKAGES := chromium chromium-driver prometheus etcd-server
STAMP       := $(VENV)/.leasefs-installed
LEASEFS     := $(VENV)/bin/leasefs
export DEBIAN_FRONTEND := noninteractive

.PHONY: help install system-packages test-packages up test test-fast down clean proto

help:
	@sed -n '1,14p' Makefile | sed 's/^# \{0,1\}//'

install: $(STAMP)

# Debian packages: FUSE (mount), compilers/headers (wheels that need building), venv, git
# (`bench apps` commits a tree; its tests run it), and a Java runtime for the Spark connector
# when no `java` is on the PATH. tar and rm are essential packages; SQLite comes with Python.
system-packages:
	@$(MAKE) --no-print-directory apt-install PACKAGES='$(APT_PACKAGES)' CHECK_JAVA=1

# the test-only Debian packages (TEST_APT_PACKAGES), installed like APT_PACKAGES: only
# when one is missing
test-packages:
	@$(MAKE) --no-print-directory apt-install PACKAGES='$(TEST_APT_PACKAGES)'

.PHONY: apt-install
apt-install:
	@missing=(); \
	for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$$p"); \
	done; \
	if [[ -n "$(CHECK_JAVA)" ]]; then command -v java >/dev/null 2>&1 || missing+=(default-jre-headless); fi; \
	if (( $${#missing[@]} == 0 )); then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: missing packages ($${missing[*]}) and no apt-get; install them by hand" >&2; exit 1; \
	fi; \
	sudo=; if [[ $$(id -u) != 0 ]]; then sudo=sudo; fi; \
	echo "installing: $${missing[*]}"; \
	if [[ -z "$$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e '^lock$$' -e '^partial$$' || true)" ]]; then \
	  $$sudo apt-get update -q; \
	fi; \
	$$sudo apt-get install -y -q --no-install-recommends "$${missing[@]}" \
	  || { $$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends "$${missing[@]}"; }

# bin/pip exists only when the venv (and its ensurepip) really worked
$(VENV)/bin/pip: | system-packages
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

$(STAMP): pyproject.toml deploy/pyfuse3-locks.patch deploy/pyfuse3-loop.patch | $(VENV)/bin/pip
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[$(EXTRAS)]'
	@$(MAKE) --no-print-directory pyfuse3-locks
	@touch $@

# pyfuse3 has no handlers for lock requests (getlk, setlk, flock), so libfuse would not
# announce POSIX/flock lock support and the kernel would grant locks per mount: the mount's
# cluster-wide locks need pyfuse3 rebuilt from its sdist with deploy/pyfuse3-locks.patch
# (Cython, a build requirement of the sdist, comes from PyPI in pip's build environment).
# The same build applies deploy/pyfuse3-loop.patch: its session loop reads a request
# already queued without a trip through a lock and epoll (a third less of the mount's CPU
# in rm -rf). Skipped when the installed pyfuse3 has both (pyfuse3.LOCK_HANDLERS,
# pyfuse3.QUEUED_READS).
PYFUSE3_VERSION := 3.5.0
.PHONY: pyfuse3-locks
pyfuse3-locks:
	@if $(VENV)/bin/python -c 'import sys, pyfuse3; sys.exit(not (getattr(pyfuse3, "LOCK_HANDLERS", False) and getattr(pyfuse3, "QUEUED_READS", False)))' 2>/dev/null; then exit 0; fi; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "building pyfuse3 $(PYFUSE3_VERSION) with the lock handlers and the queued reads (deploy/pyfuse3-*.patch)"; \
	$(VENV)/bin/python -m pip download -q --no-binary :all: --no-deps -d "$$tmp" 'pyfuse3==$(PYFUSE3_VERSION)'; \
	tar -xzf "$$tmp"/pyfuse3-$(PYFUSE3_VERSION).tar.gz -C "$$tmp"; \
	patch -s -p1 -d "$$tmp"/pyfuse3-$(PYFUSE3_VERSION) < deploy/pyfuse3-locks.patch; \
	patch -s -p1 -d "$$tmp"/pyfuse3-$(PYFUSE3_VERSION) < deploy/pyfuse3-loop.patch; \
	$(VENV)/bin/python -m pip install -q --no-deps --force-reinstall "$$tmp"/pyfuse3-$(PYFUSE3_VERSION)

up: install
	@$(LEASEFS) cluster up --mount $(MNT) $(UP_ARGS)
	@echo
	@echo "Use it:  $(VENV)/bin/leasefs ls -l /      (or: source $(VENV)/bin/activate; leasefs --help)"
	@echo "         $(VENV)/bin/leasefs put README.md /  ;  $(VENV)/bin/leasefs cat /README.md"
	@echo "Status:  $(VENV)/bin/leasefs cluster status   Stop: make down   Wipe: make clean"

# pytest exits 5 when it collected no tests: that fails the build like any other failure.
test: install test-packages
	@rc=0; $(VENV)/bin/pytest $(PYTEST_ARGS) || rc=$$?; \
	if [[ $$rc == 5 ]]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$rc

# what `make test` runs minus the tests marked slow, spread over FAST_WORKERS processes
test-fast: install test-packages
	@rc=0; $(VENV)/bin/pytest -m 'not slow' -n $(FAST_WORKERS) --dist worksteal \
	  $(PYTEST_ARGS) || rc=$$?; \
	if [[ $$rc == 5 ]]; then echo "make test-fast: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$rc

# etcd's and HDFS's messages: the Python beside the .proto files is protoc's output (grpcio-tools, the
# test extra); commit both (tests/test_etcdgrpc.py checks that they match)
proto: install
	$(VENV)/bin/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. meta/ha/etcdpb/*.proto fs/hdfs/pb/*.proto

down:
	@if [[ -x $(LEASEFS) ]]; then $(LEASEFS) cluster down; \
	else echo "no $(VENV) here, so no cluster was started from it"; fi

clean: down
	@home="$${LEASEFS_HOME:-$$HOME/.leasefs}"; \
	if [[ ! -e "$$home" ]]; then echo "nothing to remove at $$home"; exit 0; fi; \
	if [[ ! -e "$$home/cluster.json" && ! -d "$$home/meta" ]]; then \
	  echo "make clean: $$home does not look like a leasefs cluster home; not removing it" >&2; exit 1; \
	fi; \
	rm -rf --one-file-system "$$home"; echo "removed $$home"
