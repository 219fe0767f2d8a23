#!/usr/bin/env bash
# Refreshes the scoped kubeconfig before its token expires: run it hourly (a systemd timer).
# When the file is older than REFRESH_AFTER_HOURS (20) or missing, or with --force, it re-runs
# scoped-kubeconfig.sh, which replaces the file atomically; the executor makes a new client
# when the kubeconfig changes, so the next Job uses the new token without a restart. Warns
# when the file is within an hour of TOKEN_HOURS (24) and could not be refreshed.
# It finds scoped-kubeconfig.sh beside itself, under that name or installed as
# scoped-kubeconfig (deploy/install.sh puts both in $PREFIX/libexec/knotless).
#
# Usage: refresh-kubeconfig.sh [--force] ADMIN_KUBECONFIG NAMESPACE OUTPUT [ACCOUNT]
# Environment: REFRESH_AFTER_HOURS, TOKEN_HOURS, and what scoped-kubeconfig.sh reads
# (KNOTLESS_RUN, PLUGIN_DIR, DURATION, KUBECONFIG_OWNER).
set -euo pipefail
force=
if [ "${1:-}" = --force ]; then force=1; shift; fi
out=${3:?usage: refresh-kubeconfig.sh [--force] ADMIN_KUBECONFIG NAMESPACE OUTPUT [ACCOUNT]}
after=${REFRESH_AFTER_HOURS:-20}
life=${TOKEN_HOURS:-24}
here=$(cd "$(dirname "$0")" && pwd)
scoped=$here/scoped-kubeconfig.sh
[ -e "$scoped" ] || scoped=$here/scoped-kubeconfig

age_hours() {
  local now mtime
  now=$(date +%s)
  mtime=$(stat -c %Y "$1")
  echo $(((now - mtime) / 3600))
}

if [ -z "$force" ] && [ -e "$out" ] && [ "$(age_hours "$out")" -lt "$after" ]; then
  exit 0
fi
if ! bash "$scoped" "$@"; then
  if [ -e "$out" ] && [ "$(age_hours "$out")" -ge $((life - 1)) ]; then
    echo "refresh-kubeconfig: WARNING: the token in $out expires within the hour and was not refreshed" >&2
  fi
  exit 1
fi
