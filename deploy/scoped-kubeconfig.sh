#!/usr/bin/env bash
# Makes a scoped kubeconfig for the Kubernetes executor from an admin kubeconfig, through
# `knotless-run kubeconfig scoped` (the Kubernetes executor's own client, no kubectl): a
# ServiceAccount, a namespaced Role (Jobs, pods, pods/log, pods/exec, events, NetworkPolicies;
# no secrets, nothing cluster-wide) bound to it, and a token of $DURATION (24h). The file is
# written atomically (a temporary file, mode 0600, then a rename) once the API server says the
# token may create Jobs and exec into pods and may not read secrets or nodes. The token is
# never printed.
#
# Usage: scoped-kubeconfig.sh ADMIN_KUBECONFIG NAMESPACE OUTPUT [ACCOUNT]
# Environment: KNOTLESS_RUN (knotless-run), PLUGIN_DIR (/usr/libexec/knotless, where the
# Kubernetes executor is), DURATION (24h), KUBECONFIG_OWNER (USER[:GROUP] that gets the file,
# for a runner that runs as another user than this script; default: unchanged)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: scoped-kubeconfig.sh ADMIN_KUBECONFIG NAMESPACE OUTPUT [ACCOUNT]" >&2; exit 2; }
run=${KNOTLESS_RUN:-knotless-run}
args=(kubeconfig scoped "$@" --duration "${DURATION:-24h}" --plugin-dir "${PLUGIN_DIR:-/usr/libexec/knotless}")
[ -z "${KUBECONFIG_OWNER:-}" ] || args+=(--owner "$KUBECONFIG_OWNER")
exec "$run" "${args[@]}"
