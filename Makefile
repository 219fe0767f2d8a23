# Thin targets over cargo. `make test` is what CI runs (.ci/run).
CARGO ?= cargo
PREFIX ?= /usr/local
DESTDIR ?=
LIBEXEC ?= $(PREFIX)/libexec/knotless
BIN := target/debug

.PHONY: build release test lint unit conformance conformance-docker conformance-kubernetes demo bench install

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

# The Kubernetes executor through the conformance suite and the demo, on the fake kubectl.
conformance-kubernetes: build
	bash tests/fake-kubectl/conformance.sh $(BIN)

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

install: release
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBEXEC)
	install -m 0755 target/release/knotless-run $(DESTDIR)$(PREFIX)/bin/knotless-run
	install -m 0755 target/release/knotless-executor-shell $(DESTDIR)$(LIBEXEC)/shell
