#!/usr/bin/env bash
# Records the compatibility transcripts of a release (README.md beside this script): the
# release's runner runs workflow/ through each of its executors, with compat-record between
# them, into tests/compat/RELEASE/EXECUTOR.jsonl, and the run's flags into EXECUTOR.args.
#
# Usage: record.sh RELEASE [COMMIT]
#   RELEASE  the folder the transcripts go in (the release's version, as 0.1.0)
#   COMMIT   build that commit's binaries (its sources from git, built under target/compat/);
#            without it, this tree's binaries in target/debug
# The Docker executor's transcript needs a Docker engine and knotless-test/busybox:1
# (plugins/docker/tests/support/engine.sh); the Kubernetes executor's runs on this tree's fake
# API server, for a release whose executor speaks to the API (not 0.1.0's, which ran kubectl).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_root=$(cd "$here/../.." && pwd)
release=${1:?usage: record.sh RELEASE [COMMIT]}
commit=${2:-}
target=${CARGO_TARGET_DIR:-$source_root/target}
case $release in */* | .* | '') echo "record.sh: $release is not a release's name" >&2; exit 2 ;; esac

cargo build --quiet --manifest-path "$source_root/Cargo.toml" -p knotless-tests --bin compat-record \
  -p knotless-fake-apiserver
recorder=$target/debug/compat-record
if [ -n "$commit" ]; then
  sources=$target/compat/src-$commit
  if [ ! -d "$sources" ]; then
    mkdir -p "$sources.partial"
    git -C "$source_root" archive "$commit" | tar -x -C "$sources.partial"
    mv "$sources.partial" "$sources"
  fi
  CARGO_TARGET_DIR=$target/compat/target cargo build --quiet --manifest-path "$sources/Cargo.toml" --bins \
    -p knotless-run -p knotless-executor-shell -p knotless-executor-docker -p knotless-executor-kubernetes
  bin_dir=$target/compat/target/debug
  executors=(shell docker)
  [ -d "$sources/tests/fake-kubectl" ] || executors+=(kubernetes)
else
  executors=(shell docker kubernetes)
  cargo build --quiet --manifest-path "$source_root/Cargo.toml" --bins \
    -p knotless-run -p knotless-executor-shell -p knotless-executor-docker -p knotless-executor-kubernetes
  bin_dir=$target/debug
fi

out=$here/$release
mkdir -p "$out"
server=
root=
trap '[ -z "$server" ] || kill "$server" 2>/dev/null || true; [ -z "$root" ] || rm -rf "$root"' EXIT
for executor in "${executors[@]}"; do
  root=$(mktemp -d /tmp/knotless-compat.XXXXXX)
  mkdir -p "$root/bin" "$root/plugins" "$root/home" "$root/tmp" "$root/run" "$root/repo"
  chmod 0700 "$root/run"
  # The runner alone in its folder, so that the executor it finds is the recorder.
  cp "$bin_dir/knotless-run" "$root/bin/"
  printf '#!/bin/sh\nexec %q %q %q %q\n' "$recorder" "$root/transcript.jsonl" "$root" \
    "$bin_dir/knotless-executor-$executor" > "$root/plugins/$executor"
  chmod 0755 "$root/plugins/$executor"
  cp -R "$here/workflow/." "$root/repo/"
  git -C "$root/repo" init --quiet --initial-branch main
  git -C "$root/repo" add --all
  git -C "$root/repo" -c user.name=compat -c user.email=compat@knotless.invalid commit --quiet -m compat
  case $executor in
    shell) flags=() ;;
    docker) flags=(--image knotless-test/busybox:1) ;;
    kubernetes)
      # This tree's fake API server, one node; its kubeconfig copied into the recording's folder.
      bash "$source_root/tests/support/rootfs.sh" "$target/debug/knotless-rootfs.tar"
      # Its stdin is a FIFO held open here (fd 5): it ends when that closes, or at TERM.
      mkfifo "$root/hold"
      exec 5<> "$root/hold"
      mkdir -p "$root/cluster"
      "$target/debug/knotless-fake-apiserver" --state "$root/cluster" --rootfs "$target/debug/knotless-rootfs.tar" \
        --grace 2s --nodes 1 < "$root/hold" > "$root/cluster.out" 5>&- &
      server=$!
      for _ in $(seq 1 300); do
        if read -r word kubeconfig < "$root/cluster.out" 2>/dev/null && [ "$word" = ready ]; then break; fi
        sleep 0.05
      done
      cp "${kubeconfig:?the fake API server did not start}" "$root/kubeconfig"
      flags=(--kubeconfig "$root/kubeconfig" --namespace knotless-runs --image busybox) ;;
  esac
  args=(run "$root/repo" --executor-plugin "$root/plugins/$executor" --runner-id compat --secret COMPAT_TOKEN "${flags[@]}")
  if ! env -i PATH="$PATH" HOME="$root/home" TMPDIR="$root/tmp" XDG_RUNTIME_DIR="$root/run" \
    XDG_CONFIG_HOME="$root/home/.config" XDG_CACHE_HOME="$root/home/.cache" XDG_STATE_HOME="$root/home/.state" \
    COMPAT_TOKEN=compat-token-value "$root/bin/knotless-run" "${args[@]}"; then
    echo "record.sh: the $release run through the $executor executor failed; nothing recorded" >&2
    exit 1
  fi
  mv "$root/transcript.jsonl" "$out/$executor.jsonl"
  # The run's flags, one a line, for the replay to run with.
  : > "$out/$executor.args"
  for flag in "${flags[@]}"; do printf '%s\n' "${flag//$root/\$ROOT}" >> "$out/$executor.args"; done
  if [ -n "$server" ]; then
    exec 5>&-
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=
  fi
  rm -rf "$root"
  root=
  echo "recorded $out/$executor.jsonl"
done
