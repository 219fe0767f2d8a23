#!/usr/bin/env bash
# The Kubernetes executor against the fake API server: `knotless-run plugin check` (on one node,
# then on three), then the demo repository's workflows, each on a fresh fake cluster, with a
# `kubectl` on PATH that fails if anything runs it. Prints the API requests the demo took. With KNOTLESS_K8S_LIVE=1
# and a KUBECONFIG, the same two against that cluster instead.
# Usage: conformance.sh BIN_DIR   (where knotless-run, knotless-executor-kubernetes and
# knotless-fake-apiserver are)
set -euo pipefail
bin=$(realpath "${1:?usage: conformance.sh BIN_DIR}")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
servers=()
cleanup() {
  exec 4>&-
  for pid in "${servers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${servers[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
mkfifo "$work/hold"
exec 4<>"$work/hold"
cache="$bin/knotless-rootfs.tar"
bash "$root/tests/support/rootfs.sh" "$cache"

mkdir -p "$work/trap"
printf '#!/bin/sh\necho "kubectl was run: $*" >&2\nexit 99\n' > "$work/trap/kubectl"
chmod +x "$work/trap/kubectl"
export PATH="$work/trap:$PATH"

# Starts a fake API server with its state in $1, ${2:-3} nodes and the flags after them; sets
# `kubeconfig` and `server`.
start() {
  mkdir -p "$1"
  # Its stdin is a FIFO this script holds open (fd 4): the server ends on TERM, or when the
  # script is gone. The required anti-affinity gives each run a node of its own; plugin check
  # holds one session at a time, so one node is enough for it.
  "$bin/knotless-fake-apiserver" --state "$1" --rootfs "$cache" --grace 2s --nodes "${2:-3}" "${@:3}" < "$work/hold" > "$1.out" 4>&- &
  servers+=("$!")
  for _ in $(seq 1 300); do
    if read -r word path < "$1.out" 2>/dev/null && [ "$word" = ready ]; then
      kubeconfig=$path
      server=$(sed -n 's/^ *server: http:\/\///p' "$kubeconfig" | head -n 1)
      return 0
    fi
    sleep 0.05
  done
  echo "conformance.sh: the fake API server did not start" >&2
  exit 1
}

flags=(--image busybox --namespace knotless-runs)

# Against a real cluster instead: KNOTLESS_K8S_LIVE=1 KUBECONFIG=... [KNOTLESS_K8S_NAMESPACE=...]
# [KNOTLESS_K8S_IMAGE=...] runs the same suite and the demo there.
if [ "${KNOTLESS_K8S_LIVE:-}" = 1 ]; then
  kubeconfig=${KUBECONFIG:?KNOTLESS_K8S_LIVE=1 needs KUBECONFIG}
  flags=(--image "${KNOTLESS_K8S_IMAGE:-busybox:1.36}" --namespace "${KNOTLESS_K8S_NAMESPACE:-default}")
  "$bin/knotless-run" plugin check "$bin/knotless-executor-kubernetes" "${flags[@]}" --kubeconfig "$kubeconfig"
  "$bin/knotless-run" run "$root/examples/demo" --executor-plugin "$bin/knotless-executor-kubernetes" \
    "${flags[@]}" --kubeconfig "$kubeconfig"
  exit 0
fi

# plugin check on one node, then on three.
for nodes in 1 3; do
  start "$work/check-$nodes" "$nodes"
  echo "plugin check on $nodes node(s)"
  "$bin/knotless-run" plugin check "$bin/knotless-executor-kubernetes" "${flags[@]}" --kubeconfig "$kubeconfig"
done

# The oldest supported version, whose exec speaks v4.channel.k8s.io alone (no end of stdin
# but the end of the connection).
start "$work/oldest" 1 --kubernetes-version 1.27.0
"$bin/knotless-run" plugin check "$bin/knotless-executor-kubernetes" "${flags[@]}" --kubeconfig "$kubeconfig"

start "$work/demo"
"$bin/knotless-run" run "$root/examples/demo" --executor-plugin "$bin/knotless-executor-kubernetes" \
  "${flags[@]}" --kubeconfig "$kubeconfig"
# The fake's request count, over bash's own /dev/tcp.
exec 3<>"/dev/tcp/${server%:*}/${server##*:}"
printf 'GET /fake/stats HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$server" >&3
echo "API requests for the demo: $(tr -d '\r' <&3 | sed -n 's/.*"requests": *\([0-9]*\).*/\1/p' | head -n 1)"
exec 3<&-
