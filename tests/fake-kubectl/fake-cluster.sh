#!/usr/bin/env bash
# Makes a fake cluster for fake-kubectl: a state folder with the pods' root filesystem, and a
# kubeconfig whose server is fake://<state folder>. Prints the kubeconfig's path.
# Usage: fake-cluster.sh DIR [ROOTFS_CACHE.tar]
set -euo pipefail
dir=$(realpath -m "${1:?usage: fake-cluster.sh DIR [ROOTFS_CACHE.tar]}")
here=$(cd "$(dirname "$0")" && pwd)
cache=${2:-${TMPDIR:-/tmp}/knotless-rootfs.tar}
bash "$here/../support/rootfs.sh" "$cache"
mkdir -p "$dir/state"
ln -sf "$(realpath "$cache")" "$dir/state/rootfs.tar"
umask 077
cat > "$dir/kubeconfig" <<YAML
apiVersion: v1
kind: Config
current-context: fake
clusters:
- name: fake
  cluster:
    server: fake://$dir/state
contexts:
- name: fake
  context:
    cluster: fake
    user: admin
    namespace: default
users:
- name: admin
  user: {}
YAML
echo "$dir/kubeconfig"
