#!/bin/sh
# Regenerates the compressed fixtures from pattern.bin (tests/common's
# pattern(): 64 KiB of x86-like code), compressed as the kernel's
# scripts/Makefile.lib does, each followed (but gzip) by the 4-byte
# little-endian uncompressed size (size_append).
# Usage: make-fixtures.sh PATTERN.BIN (write it with the `pattern` bytes).
set -eu
src=$1
cd "$(dirname "$0")"
size() { python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<I', $(stat -c %s "$src")))"; }
gzip -n -9 -c "$src" > pattern.gz
{ xz --check=crc32 --x86 --lzma2=dict=1MiB -c "$src"; size; } > pattern.xz
{ lzma -9 -c "$src"; size; } > pattern.lzma
{ zstd -q -22 --ultra -c "$src"; size; } > pattern.zst
{ lz4 -l -9 -c "$src"; size; } > pattern.lz4
