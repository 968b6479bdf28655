#!/usr/bin/env bash
# Installs hotprobe under PREFIX (default /usr/local; DESTDIR honoured, as
# packagers use it): the binary, its man pages and shell completions, and
# the C API (library, header, pkg-config file), so that `man hotprobe`,
# the shells and `pkg-config hotprobe` find them.
#
#   ./scripts/install.sh [PREFIX]           builds the release profile first
#   ./scripts/install.sh --no-build --profile debug PREFIX
#                                           installs what target/debug holds
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
profile=release
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0; shift ;;
        --profile) profile=${2:?--profile needs a name}; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "install.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
PREFIX=${1:-/usr/local}
case "$PREFIX" in
    /*) ;;
    *) echo "install.sh: PREFIX must be an absolute path, not $PREFIX" >&2; exit 2 ;;
esac
DEST="${DESTDIR:-}$PREFIX"
T=${CARGO_TARGET_DIR:-target}/$profile
if [ "$build" = 1 ]; then
    flag=(--profile "$profile")
    cargo build --locked "${flag[@]}" -p hotprobe-cli -p hotprobe-capi
fi
# `cargo build` puts the C library in the profile's directory; a `cargo
# test` run leaves it in deps/ only.
lib() {
    for d in "$T" "$T/deps"; do
        [ -e "$d/$1" ] && { echo "$d/$1"; return; }
    done
    echo "$T/$1"
}
SO=$(lib libhotprobe_c.so)
A=$(lib libhotprobe_c.a)
for f in "$T/hotprobe" "$SO" "$T/man/man1/hotprobe.1" "$T/completions/hotprobe.bash"; do
    [ -e "$f" ] || { echo "install.sh: $f is missing (build the $profile profile first)" >&2; exit 1; }
done
install -Dm755 "$T/hotprobe" "$DEST/bin/hotprobe"
for m in "$T"/man/man1/*.1; do
    install -Dm644 "$m" "$DEST/share/man/man1/$(basename "$m")"
done
install -Dm644 "$T/completions/hotprobe.bash" "$DEST/share/bash-completion/completions/hotprobe"
install -Dm644 "$T/completions/_hotprobe" "$DEST/share/zsh/site-functions/_hotprobe"
install -Dm644 "$T/completions/hotprobe.fish" "$DEST/share/fish/vendor_completions.d/hotprobe.fish"
install -Dm755 "$SO" "$DEST/lib/libhotprobe_c.so"
if [ -e "$A" ]; then install -Dm644 "$A" "$DEST/lib/libhotprobe_c.a"; fi
for h in crates/hotprobe-capi/include/*.h; do
    install -Dm644 "$h" "$DEST/include/$(basename "$h")"
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
mkdir -p "$DEST/lib/pkgconfig"
cat > "$DEST/lib/pkgconfig/hotprobe.pc" <<PC
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: hotprobe
Description: Probes on any instruction of a running Linux process or VM guest kernel, handlers in C
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lhotprobe_c
Libs.private: -lpthread -ldl -lm
PC
echo "install.sh: installed hotprobe $version under $DEST"
