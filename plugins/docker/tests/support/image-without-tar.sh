#!/usr/bin/env bash
# Makes, once, the image knotless-test/busybox-without-tar:1 from the test image: its /bin/sh is
# the host's dash (which, unlike BusyBox's standalone shell, finds no tar applet) and it has no
# tar, the case of an image whose uploads go through `docker cp`. Only the docker CLI: there is
# no registry. Prints the image's name.
set -euo pipefail
base=knotless-test/busybox:1
image=knotless-test/busybox-without-tar:1
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
dash=$(readlink -f "$(command -v dash)")
work=$(mktemp -d)
maker=knotless-test-image-maker-$$
trap 'rm -rf "$work"; docker rm --force "$maker" >/dev/null 2>&1 || :' EXIT
# dash, the libraries it loads, and /bin/sh pointing at it.
mkdir -p "$work/root/bin"
cp "$dash" "$work/root/bin/dash"
ln -s dash "$work/root/bin/sh"
for library in $(ldd "$dash" | grep -o '/[^ ]*'); do
  mkdir -p "$work/root$(dirname "$library")"
  cp -L "$library" "$work/root$library"
done
docker create --name "$maker" "$base" /bin/busybox rm /bin/tar >/dev/null
tar -C "$work/root" -cf - . | docker cp - "$maker:/"
docker start --attach "$maker" >/dev/null
docker commit --change 'CMD ["/bin/sh"]' "$maker" "$image" >/dev/null
echo "$image"
