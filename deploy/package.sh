#!/usr/bin/env bash
# Builds the Debian packages, one a binary, into target/debian/ with cargo-deb: knotless-run
# (the runner, its manual pages, its systemd units and /etc/knotless/env, a conffile) and
# knotless-executor-{kubernetes,docker,shell}, each installing /usr/libexec/knotless/NAME. Each
# package has its binary's own version (its Cargo.toml); an executor depends on a protocol
# version the runner provides (knotless-run-protocol-N), not on the runner's version.
#
# Usage: package.sh [--profile PROFILE] [--output DIR]
#   --profile PROFILE  the cargo profile whose binaries are packaged, already built
#                      (default release; `dev` packages target/debug, for tests)
#   --output DIR       where the .debs go (default target/debian)
# Needs cargo-deb (cargo install cargo-deb --locked).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_root=$(cd "$here/.." && pwd)
profile=release
output=$source_root/target/debian
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=${2:?--profile needs a profile}; shift 2 ;;
    --output) output=${2:?--output needs a folder}; shift 2 ;;
    -h | --help) sed -n '/^# Usage:/,/^# Needs/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "package.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v cargo-deb >/dev/null || { echo "package.sh: no cargo-deb here: cargo install cargo-deb --locked" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-$source_root/target}
case $profile in dev | test) bin_dir=$target/debug ;; *) bin_dir=$target/$profile ;; esac
packages=(knotless-run knotless-executor-kubernetes knotless-executor-docker knotless-executor-shell)
for package in "${packages[@]}"; do
  [ -x "$bin_dir/$package" ] || { echo "package.sh: no $bin_dir/$package: build it first (cargo build --profile $profile --bins)" >&2; exit 1; }
done

# What the runner's package holds besides files of the source tree (runner/Cargo.toml names
# them): its manual pages, made by the runner, and its units, rewritten for /usr.
assets=$source_root/target/package-assets
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/units"
"$bin_dir/knotless-run" manpage --dir "$assets/man" > /dev/null
for unit in knotless-run.service knotless-refresh-kubeconfig.service knotless-refresh-kubeconfig.timer; do
  sed -e 's|/usr/local/libexec/knotless/|/usr/libexec/knotless-run/|g' \
    -e 's|/usr/local/share/doc/knotless/|/usr/share/doc/knotless-run/|g' \
    -e 's|/usr/local/|/usr/|g' \
    -e 's|^# Installed to /etc/systemd/system/\(.*\) by deploy/install.sh.|# Installed to /lib/systemd/system/\1 by the knotless-run package.|' \
    "$here/$unit" > "$assets/units/$unit"
done

mkdir -p "$output"
for package in "${packages[@]}"; do
  # Debug binaries are large: strip them and compress fast; a release is compressed as usual.
  args=(--no-build --profile "$profile" --output "$output" -p "$package" --quiet)
  [ "$profile" = release ] || args+=(--strip --fast)
  (cd "$source_root" && cargo deb "${args[@]}")
done
