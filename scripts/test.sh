#!/usr/bin/env bash
# Runs the whole hotprobe test suite: formatting, lints, then every test of
# every crate (real gcc-compiled tracees, libc, and a Linux guest under QEMU).
# Runs scripts/setup.sh first (as root: it installs what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

# Disk: a full run takes several GB under target/. Say what there is, so a
# run that fails on a full disk says so at its top. A one-shot build (CI,
# or a fresh clone: no target/ before setup.sh makes one) has no use for
# incremental caches (GBs of their own): leave them out there. (Not
# always: a later plain `cargo test` would then rebuild the workspace.)
df -h "$PWD" | awk 'NR == 2 {print "== disk: " $4 " free on " $6}'
if [[ -n "${CI:-}" || ! -d target ]]; then
    export CARGO_INCREMENTAL=0
fi

# Make sure the system packages and the guest kernel are there (idempotent,
# quick when they are): a fresh clone has no .cache/kernel yet.
./scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
# incompatible_msrv named: the workspace declares rust-version 1.88, and an
# API newer than that must fail here, not on a user's older toolchain.
cargo clippy --workspace --all-targets --locked -- -D warnings -D clippy::incompatible_msrv
echo "== cargo test"
# Every test binary runs under a time limit: a hang fails that binary
# (SIGTERM, then SIGKILL; guests and tracees go with its process group)
# and the other binaries still run, instead of the whole run stalling.
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="timeout --kill-after=20 ${HOTPROBE_TEST_BINARY_LIMIT:-900}"
# Both steps run whatever the first gives, so that a failing workspace test
# does not hide the release check's result; the script fails if either did.
status=0
cargo test --workspace --locked --no-fail-fast || status=$?
echo "== the agent's release build: no vector register on its hot path"
cargo test --release --locked -p hotprobe-agent --test hotpatch fast_path_uses_no_vector_registers || status=$?
df -h "$PWD" | awk 'NR == 2 {print "== disk: " $4 " free on " $6 " at the end"}'
du -sh target 2>/dev/null | awk '{print "== target/ takes " $1}'
exit "$status"
