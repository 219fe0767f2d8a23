#!/usr/bin/env bash
# Removes what install.sh added, as its manifest ($PREFIX/share/knotless/installed-files)
# lists it, and nothing else: the files it installed, then the folders it created, when empty.
# The env file, the tenant kubeconfig and the state (/var/lib/knotless: state.json, the secrets
# key, caches, mirrors, work) are kept, unless --purge, which also removes the service user
# install.sh created. Without DESTDIR, it first stops and disables the units.
#
# Usage: uninstall.sh [--purge]
# Environment: DESTDIR (the staging root install.sh used), PREFIX (default /usr/local).
set -euo pipefail
destdir=${DESTDIR:-}
prefix=${PREFIX:-/usr/local}
prefix=${prefix%/}
purge=
case ${1:-} in
  --purge) purge=1 ;;
  "") ;;
  -h | --help) sed -n '/^# Usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0"; exit 0 ;;
  *) echo "uninstall.sh: unknown argument $1 (usage: uninstall.sh [--purge])" >&2; exit 2 ;;
esac
manifest=$prefix/share/knotless/installed-files
# What an uninstall without --purge kept, for a later --purge or install.
kept=/etc/knotless/.installed-files
from=$manifest
[ -f "$destdir$from" ] || from=$kept
[ -f "$destdir$from" ] || { echo "uninstall.sh: no manifest at $destdir$manifest: nothing was installed with PREFIX=$prefix" >&2; exit 1; }

# Every path must be absolute and plain: a damaged manifest must not steer rm anywhere else.
files=() dirs=() configs=() states=() users=()
while read -r kind path; do
  if [ "$kind" = user ]; then
    users+=("$path")
    continue
  fi
  case $path in
    / | [!/]* | *[[:space:]]*) echo "uninstall.sh: refusing the manifest line '$kind $path'" >&2; exit 1 ;;
  esac
  case $path/ in
    */../* | */./* | *//*) echo "uninstall.sh: refusing the manifest path $path" >&2; exit 1 ;;
  esac
  case $kind in
    file) files+=("$path") ;;
    dir) dirs+=("$path") ;;
    config) configs+=("$path") ;;
    state) states+=("$path") ;;
    *) echo "uninstall.sh: unknown manifest kind '$kind'" >&2; exit 1 ;;
  esac
done < <(cat "$destdir$from"; [ "$from" = "$kept" ] || [ ! -f "$destdir$kept" ] || cat "$destdir$kept")

if [ -z "$destdir" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now knotless-refresh-kubeconfig.timer knotless-run.service 2>/dev/null || true
fi

for path in "${files[@]}"; do
  [ "$path" = "$manifest" ] || rm -f "$destdir$path"
done
if [ -n "$purge" ]; then
  for path in "${configs[@]}"; do rm -f "$destdir$path"; done
  for path in "${states[@]}"; do rm -rf "${destdir:?}$path"; done
fi
rm -f "$destdir$manifest" "$destdir$kept"
# Deepest first; a folder something else still uses stays.
if [ ${#dirs[@]} -gt 0 ]; then
  while read -r path; do
    rmdir "$destdir$path" 2>/dev/null || true
  done < <(printf '%s\n' "${dirs[@]}" | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-)
fi
if [ -z "$purge" ] && [ -d "$destdir${kept%/*}" ]; then
  {
    for path in "${configs[@]}"; do echo "config $path"; done
    for path in "${states[@]}"; do echo "state $path"; done
    for name in "${users[@]}"; do echo "user $name"; done
    for path in "${dirs[@]}"; do [ ! -d "$destdir$path" ] || echo "dir $path"; done
  } | sort -u > "$destdir$kept"
fi
if [ -n "$purge" ] && [ -z "$destdir" ]; then
  for name in "${users[@]}"; do
    userdel "$name" 2>/dev/null || echo "uninstall.sh: could not remove the user $name" >&2
  done
fi
if [ -z "$destdir" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
fi
if [ -n "$purge" ]; then
  echo "uninstall.sh: removed knotless-run, its configuration and its state from ${destdir:-/}"
else
  echo "uninstall.sh: removed knotless-run from ${destdir:-/}; kept /etc/knotless and /var/lib/knotless (--purge removes them)"
fi
