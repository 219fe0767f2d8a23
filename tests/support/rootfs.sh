#!/usr/bin/env bash
# Builds a tiny root filesystem from Debian's busybox-static package and writes it as a tar
# archive: the image of the Docker tests (`docker import`) and the pod root of the fake Kubernetes API server.
# Usage: rootfs.sh OUTPUT.tar   (cached: an existing OUTPUT is kept)
set -euo pipefail
out=${1:?usage: rootfs.sh OUTPUT.tar}
[ -s "$out" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download busybox-static >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  apt-get download busybox-static >/dev/null
fi
dpkg-deb -x busybox-static_*.deb pkg
root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,tmp,proc,sys,dev,etc,root,work,steps,outputs}
chmod 1777 "$root/tmp"
cp pkg/bin/busybox "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
tar -C "$root" --numeric-owner -cf "$out.partial" .
mv "$out.partial" "$out"
