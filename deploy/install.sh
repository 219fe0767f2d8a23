#!/usr/bin/env bash
# Installs knotless-run, its executors, its units and its fixed folders, and records what it
# added in a manifest for uninstall.sh:
#
#   $PREFIX/bin/knotless-run                              the runner
#   /usr/libexec/knotless/{kubernetes,docker,shell}       the executors (the runner's --plugin-dir)
#   $PREFIX/libexec/knotless/{scoped,refresh}-kubeconfig  the kubeconfig scripts
#   /etc/systemd/system/knotless-run.service              the runner's unit
#   /etc/systemd/system/knotless-refresh-kubeconfig.{service,timer}
#   /etc/systemd/system/knotless-run.service.d/docker.conf  with --docker, or a docker group
#   $PREFIX/share/doc/knotless/                           the guide and env.example
#   $PREFIX/share/man/man1/knotless-run*.1                the manual pages (knotless-run manpage)
#   $PREFIX/share/knotless/installed-files                the manifest
#   /etc/knotless/env                          0600  from env.example, only when there is none
#   /etc/knotless/tenant.kubeconfig            0600  with --kubeconfig FILE (replaced atomically)
#   /var/lib/knotless/{caches,mirrors,work}/   0700  owned by the service user
#
# An existing env file, and anything already in /var/lib/knotless (state.json, the secrets key),
# is never overwritten. Without DESTDIR, as root, it also creates the service user (a system
# user whose home is /var/lib/knotless) and reloads systemd; it enables and starts nothing.
#
# Usage: install.sh [--bin-dir DIR] [--kubeconfig FILE] [--user NAME] [--docker | --no-docker]
#   --bin-dir DIR      where the built binaries are (default: target/release of the source)
#   --kubeconfig FILE  install FILE as /etc/knotless/tenant.kubeconfig
#   --user NAME        the service user (default knotless)
#   --docker           install the docker.conf drop-in (SupplementaryGroups=docker)
#   --no-docker        do not, and remove one a previous install added
#                      (default: install it when the host has a docker group)
# Environment: DESTDIR (a staging root, default none), PREFIX (default /usr/local).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_root=$(cd "$here/.." && pwd)
destdir=${DESTDIR:-}
prefix=${PREFIX:-/usr/local}
bin_dir=$source_root/target/release
kubeconfig=
user=knotless
docker=auto

usage() { sed -n '/^# Usage:/,/^# Environment:/s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=${2:?--bin-dir needs a folder}; shift 2 ;;
    --kubeconfig) kubeconfig=${2:?--kubeconfig needs a file}; shift 2 ;;
    --user) user=${2:?--user needs a name}; shift 2 ;;
    --docker) docker=yes; shift ;;
    --no-docker) docker=no; shift ;;
    -h | --help) usage 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; usage ;;
  esac
done
case $prefix in /*) ;; *) echo "install.sh: PREFIX must be absolute, not $prefix" >&2; exit 2 ;; esac
prefix=${prefix%/}

plugin_dir=/usr/libexec/knotless
unit_dir=/etc/systemd/system
conf_dir=/etc/knotless
state_dir=/var/lib/knotless
manifest=$prefix/share/knotless/installed-files
binaries=(knotless-run knotless-executor-kubernetes knotless-executor-docker knotless-executor-shell)
for binary in "${binaries[@]}"; do
  [ -x "$bin_dir/$binary" ] || { echo "install.sh: no $bin_dir/$binary: build it (make release) or pass --bin-dir" >&2; exit 1; }
done
for source in scoped-kubeconfig.sh refresh-kubeconfig.sh env.example knotless-run.service \
  knotless-refresh-kubeconfig.service knotless-refresh-kubeconfig.timer knotless-run.service.d/docker.conf \
  ../docs/guide/kubernetes-runner.md; do
  [ -r "$here/$source" ] || { echo "install.sh: $here/$source is missing" >&2; exit 1; }
done
[ -z "$kubeconfig" ] || [ -r "$kubeconfig" ] || { echo "install.sh: cannot read --kubeconfig $kubeconfig" >&2; exit 1; }

# The manifest: one `KIND PATH` a line, PATH without DESTDIR. Kinds: `file` and `dir` (removed
# by uninstall.sh), `config` and `state` (kept unless --purge), `user` (removed with --purge).
# An uninstall without --purge leaves what it kept in $conf_dir/.installed-files.
declare -A recorded=()
kept=$conf_dir/.installed-files
for previous in "$destdir$manifest" "$destdir$kept"; do
  if [ -f "$previous" ]; then
    while read -r kind path; do recorded["$kind $path"]=1; done < "$previous"
  fi
done
record() { recorded["$1 $2"]=1; }

# Creates a folder and each missing parent, recording the ones it created.
ensure_dir() {
  local path=$1 mode=${2:-} parent
  parent=$(dirname "$path")
  [ "$parent" = "$path" ] || [ -d "$destdir$parent" ] || ensure_dir "$parent"
  if [ ! -d "$destdir$path" ]; then
    mkdir "$destdir$path"
    record dir "$path"
  fi
  [ -z "$mode" ] || chmod "$mode" "$destdir$path"
}

# Copies SOURCE to PATH with MODE, through a temporary file renamed into place.
put() {
  local source=$1 path=$2 mode=$3 tmp
  ensure_dir "$(dirname "$path")"
  tmp=$(mktemp "$destdir$(dirname "$path")/.knotless-install.XXXXXX")
  if ! cat "$source" > "$tmp" || ! chmod "$mode" "$tmp"; then
    rm -f "$tmp"
    echo "install.sh: cannot write $destdir$path" >&2
    exit 1
  fi
  mv -f "$tmp" "$destdir$path"
}

installed() { put "$@"; record file "$2"; }

# The service user: created only on the real root, and owner of what it must write.
group=$user
if [ -z "$destdir" ] && [ "$(id -u)" = 0 ] && ! getent passwd "$user" >/dev/null; then
  useradd --system --user-group --home-dir "$state_dir" --no-create-home --shell /usr/sbin/nologin "$user"
  record user "$user"
fi
owned=
if getent passwd "$user" >/dev/null && [ "$(id -u)" = 0 ]; then
  group=$(id -gn "$user")
  owned=1
else
  echo "install.sh: no user $user here (or not root): leaving owners as they are; chown $state_dir and $conf_dir/tenant.kubeconfig to $user" >&2
fi
own() { [ -z "$owned" ] || chown "$user:$group" "$destdir$1"; }

installed "$bin_dir/knotless-run" "$prefix/bin/knotless-run" 0755
for name in kubernetes docker shell; do
  installed "$bin_dir/knotless-executor-$name" "$plugin_dir/$name" 0755
done
installed "$here/scoped-kubeconfig.sh" "$prefix/libexec/knotless/scoped-kubeconfig" 0755
installed "$here/refresh-kubeconfig.sh" "$prefix/libexec/knotless/refresh-kubeconfig" 0755
installed "$source_root/docs/guide/kubernetes-runner.md" "$prefix/share/doc/knotless/kubernetes-runner.md" 0644
installed "$here/env.example" "$prefix/share/doc/knotless/env.example" 0644
# The manual pages, made by the runner from the definitions its --help shows.
pages=$(mktemp -d)
if ! "$bin_dir/knotless-run" manpage --dir "$pages" > /dev/null; then
  rm -rf "$pages"
  echo "install.sh: $bin_dir/knotless-run manpage failed" >&2
  exit 1
fi
for page in "$pages"/*.1; do
  installed "$page" "$prefix/share/man/man1/${page##*/}" 0644
done
rm -rf "$pages"

# The units name /usr/local and the user knotless: rewritten for this PREFIX and user.
unit() {
  local tmp
  tmp=$(mktemp)
  sed -e "s|/usr/local/|$prefix/|g" -e "s|^User=knotless\$|User=$user|" -e "s|^Group=knotless\$|Group=$group|" \
    -e "s|^Environment=KUBECONFIG_OWNER=knotless:knotless\$|Environment=KUBECONFIG_OWNER=$user:$group|" \
    "$here/$1" > "$tmp"
  installed "$tmp" "$unit_dir/$1" 0644
  rm -f "$tmp"
}
unit knotless-run.service
unit knotless-refresh-kubeconfig.service
unit knotless-refresh-kubeconfig.timer
if [ "$docker" = auto ]; then
  if getent group docker >/dev/null; then docker=yes; else docker=no; fi
fi
if [ "$docker" = yes ]; then
  unit knotless-run.service.d/docker.conf
else
  dropin="file $unit_dir/knotless-run.service.d/docker.conf"
  if [ -n "${recorded[$dropin]:-}" ]; then
    rm -f "$destdir${dropin#file }"
    unset "recorded[$dropin]"
  fi
fi

# Configuration: the env file only when there is none; the kubeconfig when given.
ensure_dir "$conf_dir" 0755
if [ -e "$destdir$conf_dir/env" ] || [ -L "$destdir$conf_dir/env" ]; then
  echo "install.sh: kept the existing $conf_dir/env (see $prefix/share/doc/knotless/env.example for new settings)" >&2
else
  put "$here/env.example" "$conf_dir/env" 0600
fi
record config "$conf_dir/env"
if [ -n "$kubeconfig" ]; then
  put "$kubeconfig" "$conf_dir/tenant.kubeconfig" 0600
  own "$conf_dir/tenant.kubeconfig"
  record config "$conf_dir/tenant.kubeconfig"
fi

# State: the folders, never their contents.
ensure_dir "$(dirname "$state_dir")"
[ -d "$destdir$state_dir" ] || mkdir "$destdir$state_dir"
chmod 0700 "$destdir$state_dir"
own "$state_dir"
record state "$state_dir"
for folder in caches mirrors work; do
  [ -d "$destdir$state_dir/$folder" ] || mkdir "$destdir$state_dir/$folder"
  chmod 0700 "$destdir$state_dir/$folder"
  own "$state_dir/$folder"
done

# The manifest lists itself, so uninstall.sh removes it last.
ensure_dir "$(dirname "$manifest")"
record file "$manifest"
tmp=$(mktemp "$destdir$(dirname "$manifest")/.knotless-install.XXXXXX")
printf '%s\n' "${!recorded[@]}" | sort > "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$destdir$manifest"
rm -f "$destdir$kept"

if [ -z "$destdir" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
fi
echo "install.sh: installed knotless-run into ${destdir:-/} (manifest $manifest)"
echo "install.sh: next: edit $conf_dir/env, then systemctl enable --now knotless-run knotless-refresh-kubeconfig.timer"
