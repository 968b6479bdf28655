#!/usr/bin/env bash
# Installs every system package hotprobe needs on Debian 12 (run as root; idempotent).
# - build tools and the tracee compilers (gcc, g++; rustc and go if missing), gdb,
#   peers for the benchmarks
# - QEMU 10 from bookworm-backports (its gdbstub and TCG plugin API), busybox-static, cpio
# - a Debian linux-image package, downloaded and unpacked into .cache/ (never installed)
# - rsvg-convert (flame graph tests) and the git-ignored .venv/ with opentelemetry-proto and
#   duckdb (the OTLP receiver and Parquet reader of the CLI tests), and the hotprobe
#   Python package (crates/hotprobe-py) built with maturin and installed into it
# - an OpenTelemetry Collector for the OTLP export test, built once by scripts/otelcol.sh
#   (Go >= 1.26) into ~/.cache/hotprobe/otelcol-<release>/ and reused from there
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# 1. A bookworm-backports entry beside the existing Debian entry, same mirror address.
SRC=/etc/apt/sources.list.d/debian.sources
BP=/etc/apt/sources.list.d/hotprobe-backports.sources
if [ ! -f "$BP" ]; then
    uri=""
    if [ -f "$SRC" ]; then
        # The URIs of the stanza whose Suites name plain 'bookworm'.
        uri=$(awk 'BEGIN{RS="";FS="\n"} /Suites:[^\n]*bookworm( |$|\n)/ {for(i=1;i<=NF;i++) if($i ~ /^URIs:/){sub(/^URIs:[ ]*/,"",$i); print $i; exit}}' "$SRC")
    fi
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list)
    fi
    if [ -z "$uri" ]; then
        echo "setup.sh: cannot find the Debian bookworm mirror in $SRC or /etc/apt/sources.list" >&2
        exit 1
    fi
    $SUDO tee "$BP" >/dev/null <<EOT
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOT
    NEED_UPDATE=1
fi

stamp=/var/lib/apt/periodic/hotprobe-update-stamp
if [ "${NEED_UPDATE:-0}" = 1 ] || [ ! -f "$stamp" ] || [ -n "$(find "$stamp" -mmin +1440 2>/dev/null)" ]; then
    $SUDO apt-get update -qq
    $SUDO mkdir -p "$(dirname "$stamp")" && $SUDO touch "$stamp"
fi

export DEBIAN_FRONTEND=noninteractive
PKGS=(build-essential gcc g++ make pkg-config libc6-dbg gdb cpio busybox-static man-db groff-base
      uftrace bpftrace babeltrace2 strace python3 python3-pip python3-venv librsvg2-bin
      zlib1g-dev libsqlite3-dev sqlite3 jq nginx-light systemtap-sdt-dev)
# The reliability tests compile Rust and Go programs too: Debian's
# toolchains unless one is there already (rustup's, Go's own in /usr/local/go).
command -v rustc >/dev/null 2>&1 || PKGS+=(rustc)
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
    PKGS+=(golang-go)
fi
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# QEMU 10 from backports (7.2's gdbstub and plugin API are not enough).
qver=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
case "$qver" in
    1[0-9]:*|1:1[0-9]*) ;;
    *) $SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null ;;
esac

# Rust toolchain pieces used by the checks.
if command -v rustup >/dev/null 2>&1; then
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
fi

# 2. A Debian guest kernel, unpacked (not installed) into the git-ignored cache.
KDIR=$ROOT/.cache/kernel
if [ ! -f "$KDIR/vmlinuz" ]; then
    mkdir -p "$KDIR/deb"
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    if [ -z "$pkg" ]; then echo "setup.sh: cannot resolve linux-image-amd64" >&2; exit 1; fi
    (cd "$KDIR/deb" && rm -f ./*.deb && apt-get download "$pkg" >/dev/null 2>&1)
    rm -rf "$KDIR/root" && dpkg -x "$KDIR"/deb/*.deb "$KDIR/root"
    cp "$(ls "$KDIR"/root/boot/vmlinuz-* | head -n1)" "$KDIR/vmlinuz"
    rm -rf "$KDIR/root"
fi
# 3. Frida (a benchmark peer, not needed by the tests) from PyPI into a
#    git-ignored virtualenv; best effort: the benchmarks skip it if missing.
VENV=$ROOT/.cache/peers-venv
if [ ! -x "$VENV/bin/python3" ] || ! "$VENV/bin/python3" -c 'import frida' >/dev/null 2>&1; then
    python3 -m venv "$VENV" >/dev/null 2>&1 \
        && "$VENV/bin/pip" install -q frida >/dev/null 2>&1 \
        || echo "setup.sh: warning: could not install frida into $VENV (benchmark peer only)" >&2
fi

# 4. The Python packages the CLI tests talk to: the OTLP receiver
#    (crates/hotprobe-cli/tests/otlp_receiver.py) decodes with
#    opentelemetry-proto, DuckDB reads the Parquet export.
PYVENV=$ROOT/.venv
if [ ! -x "$PYVENV/bin/python" ] \
    || ! "$PYVENV/bin/python" -c 'import duckdb, opentelemetry.proto.trace.v1.trace_pb2' >/dev/null 2>&1; then
    python3 -m venv "$PYVENV"
    "$PYVENV/bin/pip" install -q opentelemetry-proto duckdb
fi

# 5. The hotprobe Python package (crates/hotprobe-py: PyO3, built by maturin
#    from PyPI) into .venv, so that `.venv/bin/python -c 'import hotprobe'`
#    works. Rebuilt on every run (cargo rebuilds only what changed); the
#    wheel goes to the git-ignored target/wheels.
if [ ! -x "$PYVENV/bin/maturin" ]; then
    "$PYVENV/bin/pip" install -q 'maturin>=1.5,<2'
fi
rm -f "$ROOT"/target/wheels/hotprobe-*.whl
"$PYVENV/bin/maturin" build -q --release --locked -m "$ROOT/crates/hotprobe-py/Cargo.toml" \
    -o "$ROOT/target/wheels" -i "$PYVENV/bin/python"
"$PYVENV/bin/pip" install -q --no-deps --force-reinstall "$ROOT"/target/wheels/hotprobe-*.whl
"$PYVENV/bin/python" -c 'import hotprobe' \
    || { echo "setup.sh: the hotprobe Python package does not import" >&2; exit 1; }

# 6. tracefs (record --kernel, issue 25: the syscall tracepoints' ids are
#    read there): mounted where it is missing, left alone where it is
#    (debugfs's tracing directory counts too).
if [ ! -d /sys/kernel/tracing/events/raw_syscalls ] \
    && [ ! -d /sys/kernel/debug/tracing/events/raw_syscalls ]; then
    mount -t tracefs nodev /sys/kernel/tracing \
        || echo "setup.sh: warning: cannot mount tracefs on /sys/kernel/tracing (record --kernel needs it)" >&2
fi

# 7. A real OpenTelemetry Collector (crates/hotprobe-cli/tests/otlp_collector.rs),
#    built with the collector builder into a cache outside the work tree keyed by
#    its release (~/.cache/hotprobe/otelcol-<release>), so that a fresh clone
#    reuses it; about 5 minutes the first time. Fails, saying why, on a Go older
#    than the collector needs (Debian's 1.19).
OTELCOL=$("$ROOT/scripts/otelcol.sh") \
    || { echo "setup.sh: cannot build the OpenTelemetry Collector (scripts/otelcol.sh, above)" >&2; exit 1; }

echo "setup.sh: done ($(qemu-system-x86_64 --version | head -n1); collector $OTELCOL)"
