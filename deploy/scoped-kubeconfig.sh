#!/usr/bin/env bash
# Makes a scoped kubeconfig for the Kubernetes executor from an admin kubeconfig: a
# ServiceAccount, a namespaced Role (Jobs, pods, pods/log, pods/exec, events, NetworkPolicies;
# no secrets, nothing cluster-wide) bound to it, and a token of $DURATION (24h). The file is
# written atomically (a temporary file, mode 0600, then mv) and checked with `auth can-i`
# before it replaces the old one. The token is never printed.
#
# Usage: scoped-kubeconfig.sh ADMIN_KUBECONFIG NAMESPACE OUTPUT [ACCOUNT]
# Environment: KUBECTL (kubectl), DURATION (24h), KUBECONFIG_OWNER (USER[:GROUP] that gets the
# file, for a runner that runs as another user than this script; default: unchanged)
set -euo pipefail
admin=${1:?usage: scoped-kubeconfig.sh ADMIN_KUBECONFIG NAMESPACE OUTPUT [ACCOUNT]}
namespace=${2:?namespace}
out=${3:?output path}
account=${4:-knotless-runner}
kubectl=${KUBECTL:-kubectl}
duration=${DURATION:-24h}
owner=${KUBECONFIG_OWNER:-}

k() { "$kubectl" --kubeconfig "$admin" "$@"; }

# Creates something unless it exists already.
ensure() {
  local said
  if ! said=$(k "$@" 2>&1); then
    case $said in
      *"already exists"* | *AlreadyExists*) ;;
      *) echo "scoped-kubeconfig: kubectl $*: $said" >&2; exit 1 ;;
    esac
  fi
}

ensure create namespace "$namespace"
ensure -n "$namespace" create serviceaccount "$account"
ensure -n "$namespace" create role "$account" \
  --verb=get,list,watch,create,update,patch,delete \
  --resource=jobs,pods,pods/log,pods/exec,events,networkpolicies
ensure -n "$namespace" create rolebinding "$account" --role="$account" --serviceaccount="$namespace:$account"

token=$(k -n "$namespace" create token "$account" --duration "$duration")
server=$(k config view --raw --minify -o 'jsonpath={.clusters[0].cluster.server}')
ca=$(k config view --raw --minify -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
[ -n "$server" ] || { echo "scoped-kubeconfig: no server in $admin" >&2; exit 1; }

dir=$(dirname "$out")
mkdir -p "$dir"
tmp=$(mktemp "$dir/.scoped-kubeconfig.XXXXXX")
trap 'rm -f "$tmp"' EXIT
chmod 0600 "$tmp"
{
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "current-context: $account"
  echo "clusters:"
  echo "- name: $account"
  echo "  cluster:"
  echo "    server: $server"
  [ -z "$ca" ] || echo "    certificate-authority-data: $ca"
  echo "contexts:"
  echo "- name: $account"
  echo "  context: {cluster: $account, user: $account, namespace: $namespace}"
  echo "users:"
  echo "- name: $account"
  echo "  user:"
  echo "    token: $token"
} > "$tmp"

can() { "$kubectl" --kubeconfig "$tmp" -n "$namespace" auth can-i "$@" 2>/dev/null || true; }
[ "$(can create jobs)" = yes ] || { echo "scoped-kubeconfig: the token cannot create jobs" >&2; exit 1; }
[ "$(can create pods/exec)" = yes ] || { echo "scoped-kubeconfig: the token cannot exec into pods" >&2; exit 1; }
[ "$(can get nodes)" = no ] || { echo "scoped-kubeconfig: the token can read nodes" >&2; exit 1; }
[ "$(can get secrets)" = no ] || { echo "scoped-kubeconfig: the token can read secrets" >&2; exit 1; }

[ -z "$owner" ] || chown "$owner" "$tmp"
mv -f "$tmp" "$out"
trap - EXIT
echo "scoped-kubeconfig: wrote $out for $namespace/$account, valid for $duration"
