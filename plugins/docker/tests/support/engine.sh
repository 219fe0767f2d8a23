#!/usr/bin/env bash
# Makes a Docker engine and the test image ready for the Docker executor's tests, idempotently:
# installs Debian's docker.io (and tini) when absent, starts dockerd when no engine answers
# (logging to /var/log/knotless-dockerd.log) and waits for it, and imports the test image
# knotless-test/busybox:1 from tests/support/rootfs.sh when the engine lacks it.
# There is no registry: nothing is ever pulled.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
image=knotless-test/busybox:1
log=${KNOTLESS_DOCKERD_LOG:-/var/log/knotless-dockerd.log}

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker >/dev/null || need+=(docker.io)
command -v tini >/dev/null || command -v docker-init >/dev/null || need+=(tini)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if ! answers; then
  # No systemd here: dockerd runs in the background. The sandbox has no iptables rights, and
  # the tests' containers have no network anyway.
  mkdir -p "$(dirname "$log")"
  nohup dockerd --iptables=false --ip-masq=false >>"$log" 2>&1 &
  for _ in $(seq 1 300); do
    answers && break
    sleep 0.1
  done
  if ! answers; then
    echo "engine.sh: dockerd did not answer within 30 s; its log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
fi

if ! docker image inspect "$image" >/dev/null 2>&1; then
  rootfs=${TMPDIR:-/tmp}/knotless-test-rootfs.tar
  bash tests/support/rootfs.sh "$rootfs"
  docker import "$rootfs" "$image" >/dev/null
fi
echo "engine.sh: docker $(docker version --format '{{.Server.Version}}') answers; image $image is ready"
