#!/usr/bin/env bash
# Builds hotprobe-guest's test initramfs: busybox-static, the static workload
# and init.sh as /init. Usage: build-initramfs.sh OUT_DIR  (prints the cpio path)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-initramfs.sh OUT_DIR}
mkdir -p "$out"
root=$(mktemp -d "$out/root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/tmp"
busybox=$(command -v busybox || true)
[ -n "$busybox" ] || { echo "build-initramfs.sh: busybox not found (apt-get install busybox-static)" >&2; exit 1; }
cp "$busybox" "$root/bin/busybox"
for a in sh mount mkdir grep stty poweroff cat echo; do ln -sf busybox "$root/bin/$a"; done
gcc -static -O2 -o "$root/workload" "$here/workload.c"
install -m 0755 "$here/init.sh" "$root/init"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) > "$out/initramfs.cpio.tmp"
mv "$out/initramfs.cpio.tmp" "$out/initramfs.cpio"
echo "$out/initramfs.cpio"
