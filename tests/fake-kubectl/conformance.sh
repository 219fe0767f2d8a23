#!/usr/bin/env bash
# The Kubernetes executor against the fake kubectl: `knotless-run plugin check`, then the demo
# repository's workflows, each on a fresh fake cluster in a temporary folder.
# Usage: conformance.sh BIN_DIR   (where knotless-run, knotless-executor-kubernetes and fake-kubectl are)
set -euo pipefail
bin=$(realpath "${1:?usage: conformance.sh BIN_DIR}")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cache="$bin/knotless-rootfs.tar"
flags=(--kubectl "$bin/fake-kubectl" --image busybox)

kubeconfig=$(bash "$here/fake-cluster.sh" "$work/check" "$cache")
"$bin/knotless-run" plugin check "$bin/knotless-executor-kubernetes" "${flags[@]}" --kubeconfig "$kubeconfig"

kubeconfig=$(bash "$here/fake-cluster.sh" "$work/demo" "$cache")
"$bin/knotless-run" run "$root/examples/demo" --executor-plugin "$bin/knotless-executor-kubernetes" \
  "${flags[@]}" --kubeconfig "$kubeconfig"
echo "kubectl calls for the demo: $(wc -l < "$work/demo/state/calls.jsonl")"
