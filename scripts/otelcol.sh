#!/usr/bin/env bash
# Builds a real OpenTelemetry Collector for the OTLP export tests
# (crates/hotprobe-cli/tests/otlp_collector.rs) with the collector builder
# (ocb), from the collector's Go modules: the OTLP receiver (HTTP and gRPC),
# the file exporter (contrib) and the debug exporter, the env/file/yaml
# config providers, and `file` as the default config URI scheme.
#
# The binary goes to a cache outside the work tree, keyed by the release,
#   ${HOTPROBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hotprobe}/otelcol-<release>/otelcol-hotprobe
# and is reused when present, so a fresh clone (CI) does not build it again.
# Prints that path on stdout. `scripts/otelcol.sh --path` prints it without
# building. Needs Go >= 1.26 (the collector modules' go.mod say `go 1.26.0`),
# found in PATH or /usr/local/go/bin (or $HOTPROBE_GO); Debian bookworm's
# Go 1.19 is too old, and the script says so.
set -euo pipefail

# One release for every collector module: contrib's fileexporter passes at
# v0.161.0 (newer were not tried here); core v0.161.0 goes with the stable
# modules v1.67.0.
RELEASE=v0.161.0
STABLE=v1.67.0
GO_MIN=1.26

CACHE=${HOTPROBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hotprobe}
DIR=$CACHE/otelcol-$RELEASE
BIN=$DIR/otelcol-hotprobe

if [ "${1:-}" = "--path" ]; then
    echo "$BIN"
    exit 0
fi
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi

# The Go toolchain: the one in PATH unless it is too old, else /usr/local/go's.
go_version() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p'; }
version_ok() { # $1 >= $GO_MIN (major.minor)
    local have_major=${1%%.*} have_minor=${1#*.} min_major=${GO_MIN%%.*} min_minor=${GO_MIN#*.}
    [ "$have_major" -gt "$min_major" ] || { [ "$have_major" -eq "$min_major" ] && [ "$have_minor" -ge "$min_minor" ]; }
}
# HOTPROBE_GO names the one to use instead.
GO=""
seen=""
if [ -n "${HOTPROBE_GO:-}" ]; then
    candidates=("$HOTPROBE_GO")
else
    candidates=("$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go)
fi
for cand in "${candidates[@]}"; do
    [ -n "$cand" ] || continue
    if [ ! -x "$cand" ]; then
        seen="$seen $cand (not there)"
        continue
    fi
    v=$(go_version "$cand")
    seen="$seen $cand (go${v:-?})"
    if [ -n "$v" ] && version_ok "$v"; then
        GO=$cand
        break
    fi
done
if [ -z "$GO" ]; then
    echo "otelcol.sh: the OpenTelemetry Collector $RELEASE needs Go >= $GO_MIN; found:${seen:- no go at all}." >&2
    echo "otelcol.sh: install Go $GO_MIN or newer (e.g. into /usr/local/go); Debian bookworm's golang-go (1.19) is too old." >&2
    exit 1
fi
export PATH="$(dirname "$GO"):$PATH"

mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "otelcol.sh: building the OpenTelemetry Collector $RELEASE with $GO ($("$GO" env GOVERSION)); this takes a few minutes" >&2

GOBIN="$WORK/bin" "$GO" install "go.opentelemetry.io/collector/cmd/builder@$RELEASE" >&2

cat >"$WORK/builder-config.yaml" <<EOF
dist:
  module: hotprobe.invalid/otelcol-hotprobe
  name: otelcol-hotprobe
  description: OpenTelemetry Collector for hotprobe's OTLP export tests
  output_path: $WORK/dist
  version: "$RELEASE-hotprobe"
conf_resolver:
  default_uri_scheme: file
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver $RELEASE
exporters:
  - gomod: go.opentelemetry.io/collector/exporter/debugexporter $RELEASE
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter $RELEASE
providers:
  - gomod: go.opentelemetry.io/collector/confmap/provider/envprovider $STABLE
  - gomod: go.opentelemetry.io/collector/confmap/provider/fileprovider $STABLE
  - gomod: go.opentelemetry.io/collector/confmap/provider/yamlprovider $STABLE
EOF

"$WORK/bin/builder" --config "$WORK/builder-config.yaml" >&2
"$WORK/dist/otelcol-hotprobe" --version >&2
mv -f "$WORK/dist/otelcol-hotprobe" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
echo "$BIN"
