# Thin targets over cargo. `make test` is what CI runs (.ci/run).
CARGO ?= cargo
PREFIX ?= /usr/local
DESTDIR ?=
BIN := target/debug
# Where cargo writes (CARGO_TARGET_DIR when set), for the release binaries `install` takes.
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)

.PHONY: build release test lint unit conformance conformance-docker conformance-kubernetes demo bench install install-user uninstall \
	package compat-record

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --workspace --bins --release

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: build
	$(CARGO) test --workspace

# The shell executor through the suite; then the suite's own test: each fake executor mode that
# breaks a MUST of the reference must fail the case naming it (the count is printed).
conformance: build
	$(BIN)/knotless-run plugin check $(BIN)/knotless-executor-shell
	$(CARGO) test -p knotless-tests --test e2e -- --ignored --nocapture every_mode_that_breaks_a_must \
		> $(TARGET_DIR)/mutations.log 2>&1 || { cat $(TARGET_DIR)/mutations.log; exit 1; }
	grep '^conformance suite: ' $(TARGET_DIR)/mutations.log

# The Kubernetes executor through the conformance suite and the demo, on the fake API server.
conformance-kubernetes: build
	bash tests/fake-apiserver/conformance.sh $(BIN)

# Needs a Docker engine and the test image: plugins/docker/tests/support/engine.sh makes both.
conformance-docker: build
	$(BIN)/knotless-run plugin check $(BIN)/knotless-executor-docker --image knotless-test/busybox:1
	$(BIN)/knotless-run run examples/demo --executor docker --image knotless-test/busybox:1

# Everything, as CI runs it: formatting, lints, every test, the conformance suites.
test: lint unit conformance conformance-docker conformance-kubernetes

# The workflows of the demo repository, through the shell executor.
demo: build
	$(BIN)/knotless-run run examples/demo --executor shell

# Each figure next to its reference from the same run; the Docker rows need an engine
# (plugins/docker/tests/support/engine.sh).
bench: release
	$(CARGO) build --release -p knotless-tests --bin bench
	$(CARGO) build --release -p knotless-executor-docker --example bench
	target/release/bench
	if docker version >/dev/null 2>&1; then target/release/examples/bench; else echo "(no Docker engine: Docker rows skipped)"; fi

# The runner into $(PREFIX)/bin, its manual pages into $(PREFIX)/share/man/man1, the executors
# into /usr/libexec/knotless, the systemd units, and /etc/knotless and /var/lib/knotless
# (deploy/install.sh says what, and keeps a manifest); DESTDIR stages it all.
install: release
	DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' bash deploy/install.sh --bin-dir '$(TARGET_DIR)/release'

# For one user, without root, for local runs: the runner into $(PREFIX)/bin and its executors
# into $(PREFIX)/libexec/knotless, where it finds them (PREFIX defaults to ~/.local here); the
# four binaries built once in release mode.
install-user:
	$(CARGO) build --release --bins -p knotless-run -p knotless-executor-shell -p knotless-executor-docker \
		-p knotless-executor-kubernetes
	bash deploy/install-user.sh --bin-dir '$(TARGET_DIR)/release' \
		--prefix '$(if $(filter command line environment,$(origin PREFIX)),$(PREFIX),$(HOME)/.local)'

# The Debian packages, one a binary, into target/debian/ (deploy/package.sh, with cargo-deb:
# `cargo install cargo-deb --locked`). PROFILE=dev packages the debug binaries instead.
PROFILE ?= release
package:
	$(CARGO) build --bins --profile $(PROFILE) -p knotless-run -p knotless-executor-kubernetes \
		-p knotless-executor-docker -p knotless-executor-shell
	bash deploy/package.sh --profile $(PROFILE)

# The compatibility transcripts of a release into tests/compat/RELEASE/ (tests/compat/README.md):
# `make compat-record RELEASE=0.3.0` from this tree's binaries, or with COMMIT=REV from that
# commit's, built under target/compat/. The Docker executor's needs an engine, as conformance-docker.
compat-record:
	bash tests/compat/record.sh '$(RELEASE)' $(COMMIT)

# Removes what `install` added; the env file and the state stay (deploy/uninstall.sh --purge
# removes them too).
uninstall:
	DESTDIR='$(DESTDIR)' PREFIX='$(PREFIX)' bash deploy/uninstall.sh
