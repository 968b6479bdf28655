#!/bin/busybox sh
# /init of hotprobe-guest's test initramfs: print the kernel's text symbols
# between markers, run the workload on the console, print a final marker.
/bin/busybox mkdir -p /proc /sys /tmp /dev
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev 2>/dev/null
/bin/busybox stty -F /dev/console -echo 2>/dev/null
echo hello-from-guest > /tmp/probe-me.txt
echo "@KALLSYMS-BEGIN"
/bin/busybox grep -E ' [tT] | _etext$| _stext$| _sdata$| __start_rodata$| __start___jump_table$| __stop___jump_table$' /proc/kallsyms
echo "@KALLSYMS-END"
/workload < /dev/console > /dev/console 2>&1
echo "@FINAL rc=$?"
/bin/busybox poweroff -f
