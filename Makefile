# Thin targets over cargo. `make test` is what CI runs (.ci/run).
CARGO ?= cargo
PREFIX ?= /usr/local
DESTDIR ?=
LIBEXEC ?= $(PREFIX)/libexec/knotless
BIN := target/debug

.PHONY: build release test lint unit conformance conformance-docker demo bench install

build:
	$(CARGO) build --workspace --bins

release:
	$(CARGO) build --workspace --bins --release

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: build
	$(CARGO) test --workspace

conformance: build
	$(BIN)/knotless-run plugin check $(BIN)/knotless-executor-shell

# Needs a Docker engine and the test image: plugins/docker/tests/support/engine.sh makes both.
conformance-docker: build
	$(BIN)/knotless-run plugin check $(BIN)/knotless-executor-docker --image knotless-test/busybox:1

# Everything, as CI runs it: formatting, lints, every test, the conformance suite.
test: lint unit conformance conformance-docker

# The workflows of the demo repository, through the shell executor.
demo: build
	$(BIN)/knotless-run run examples/demo --executor shell

bench:
	$(CARGO) run --release -p knotless-tests --bin bench

install: release
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBEXEC)
	install -m 0755 target/release/knotless-run $(DESTDIR)$(PREFIX)/bin/knotless-run
	install -m 0755 target/release/knotless-executor-shell $(DESTDIR)$(LIBEXEC)/shell
