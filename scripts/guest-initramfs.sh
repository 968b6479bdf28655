#!/usr/bin/env bash
# Builds a small initramfs for trying hotprobe's guest probes: busybox as
# the userland and an /init that mounts /proc, runs one command on the
# console, and powers the guest off.
#
#   scripts/guest-initramfs.sh OUT_DIR [COMMAND]
#
# COMMAND is a busybox shell line (default: `uname -a`, then `sync` five
# times: `guest count __x64_sys_sync` counts 5; the power-off does not sync). A static
# program can be put in with HOTPROBE_GUEST_PROGRAM=/path/to/prog (it lands
# in /bin and COMMAND can name it). Prints the path of OUT_DIR/initramfs.cpio.
# Needs busybox-static and cpio (scripts/setup.sh installs both); the
# Debian guest kernel setup.sh unpacks is .cache/kernel/vmlinuz.
set -euo pipefail
out=${1:?usage: guest-initramfs.sh OUT_DIR [COMMAND]}
cmd=${2:-'uname -a; for i in 1 2 3 4 5; do sync; done'}
busybox=$(command -v busybox || true)
[ -n "$busybox" ] || { echo "guest-initramfs.sh: busybox not found (apt-get install busybox-static)" >&2; exit 1; }
file "$busybox" 2>/dev/null | grep -q 'statically linked' \
    || { echo "guest-initramfs.sh: $busybox is not static (apt-get install busybox-static)" >&2; exit 1; }
command -v cpio >/dev/null || { echo "guest-initramfs.sh: cpio not found (apt-get install cpio)" >&2; exit 1; }
mkdir -p "$out"
root=$(mktemp -d "$out/root.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/tmp"
cp "$busybox" "$root/bin/busybox"
for a in sh mount uname sync cat echo ls poweroff; do ln -s busybox "$root/bin/$a"; done
if [ -n "${HOTPROBE_GUEST_PROGRAM:-}" ]; then
    install -m 0755 "$HOTPROBE_GUEST_PROGRAM" "$root/bin/"
fi
cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
$cmd
/bin/busybox poweroff -f -n
INIT
chmod 0755 "$root/init"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) > "$out/initramfs.cpio.tmp"
mv "$out/initramfs.cpio.tmp" "$out/initramfs.cpio"
echo "$out/initramfs.cpio"
