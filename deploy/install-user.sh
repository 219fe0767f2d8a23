#!/usr/bin/env bash
# Installs knotless-run for one user, without root, for local runs (`knotless-run run`):
#
#   $PREFIX/bin/knotless-run                          the runner
#   $PREFIX/libexec/knotless/{shell,docker,kubernetes}  its executors, where it finds them
#   $PREFIX/share/man/man1/knotless-run*.1            the manual pages
#
# The runner looks for an executor beside itself, then in ../libexec/knotless of its own folder,
# so nothing needs --plugin-dir. An install over an earlier one replaces each file whole (a new
# file moved into place), so a run started meanwhile keeps the binaries it started with.
# Nothing outside $PREFIX is touched; uninstall by removing those files.
#
# Usage: install-user.sh [--bin-dir DIR] [--prefix DIR]
#   --bin-dir DIR   where the built binaries are (default: target/release of the source)
#   --prefix DIR    where to install (default: ~/.local)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin_dir=$(cd "$here/.." && pwd)/target/release
prefix=${HOME:?HOME is not set}/.local

usage() { sed -n '/^# Usage:/,/^#   --prefix/s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
    case $1 in
        --bin-dir) [ $# -ge 2 ] || usage; bin_dir=$2; shift 2 ;;
        --prefix) [ $# -ge 2 ] || usage; prefix=$2; shift 2 ;;
        -h | --help) usage 0 ;;
        *) echo "install-user.sh: unknown argument $1" >&2; usage ;;
    esac
done
case $prefix in
    /*) ;;
    *) echo "install-user.sh: --prefix $prefix: give an absolute path" >&2; exit 2 ;;
esac
for program in knotless-run knotless-executor-shell knotless-executor-docker knotless-executor-kubernetes; do
    if [ ! -x "$bin_dir/$program" ]; then
        echo "install-user.sh: no $program in $bin_dir: build it first (make install-user builds them)" >&2
        exit 1
    fi
done

# Copies $1 to $2 through a temporary file beside it, then renames it into place.
put() {
    local temporary
    temporary=$(mktemp "$2.XXXXXX")
    cp "$1" "$temporary"
    chmod 755 "$temporary"
    mv -f "$temporary" "$2"
    echo "$2"
}

mkdir -p "$prefix/bin" "$prefix/libexec/knotless" "$prefix/share/man/man1"
put "$bin_dir/knotless-run" "$prefix/bin/knotless-run"
for name in shell docker kubernetes; do
    put "$bin_dir/knotless-executor-$name" "$prefix/libexec/knotless/$name"
done
"$prefix/bin/knotless-run" manpage --dir "$prefix/share/man/man1"
case ":${PATH:-}:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on your PATH: add it (export PATH=\"$prefix/bin:\$PATH\")" >&2 ;;
esac
