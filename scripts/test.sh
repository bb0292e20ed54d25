#!/usr/bin/env bash
# All tests (README: `sudo scripts/test.sh`). Installs what a fresh Debian 12 machine lacks,
# then runs formatting, lints, docs, unit, integration and doc tests. Tests that need network
# namespaces run only as root; each builds its own namespaces in 198.18.0.0/15 and deletes
# them, and without root they print "skipped: ..." and pass.
set -euo pipefail
cd "$(dirname "$0")/.."

section() { printf '\n==== %s ====\n' "$*"; }
# Runs a check that exits 77 where this machine cannot run it (saying why in one line): that is
# not a failure; any other non-zero status ends the tests with it.
unless_unsupported() {
    local rc=0
    "$@" || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
}

section "setup"
# shellcheck source=scripts/setup.sh
source scripts/setup.sh test
if [ "$(id -u)" -ne 0 ]; then
    echo "note: not root, so the network-namespace tests will skip; run with sudo for all of them"
fi

section "scripts/hw-check.sh without an RDMA device: one line, exit 77"
if compgen -G '/sys/class/infiniband/*' > /dev/null; then
    echo "skipped: this host has an RDMA device (/sys/class/infiniband is not empty)"
else
    hw_rc=0
    hw_out=$(bash scripts/hw-check.sh 2>&1) || hw_rc=$?
    printf '%s\n' "$hw_out"
    if [ "$hw_rc" -ne 77 ] || [ "$(printf '%s\n' "$hw_out" | wc -l)" -ne 1 ]; then
        echo "scripts/hw-check.sh without a device: exit $hw_rc and the output above (want 77 and one line)"
        exit 1
    fi
fi

section "cargo fmt --check"
cargo fmt --check

section "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

section "cargo clippy --all-targets --features verbs -- -D warnings (libibverbs provider)"
cargo clippy --all-targets --features verbs -- -D warnings

section "cargo build --features verbs"
cargo build --features verbs

section "cargo doc --no-deps (warnings are errors)"
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps

log=$(mktemp)
trap 'rm -f "$log"' EXIT

section "cargo test --doc"
cargo test --doc 2>&1 | tee -a "$log"

section "cargo test --all-targets"
cargo test --all-targets 2>&1 | tee -a "$log"

section "soak (reduced: ${SOAK_CYCLES_CI:-200} simulated cycles and 1 netns cycle per mode)"
bash scripts/soak.sh --cycles "${SOAK_CYCLES_CI:-200}" --netns-cycles 1

section "integrity under impairment (reduced: 32 MiB per transfer)"
if [ "$(id -u)" -eq 0 ]; then
    bash scripts/integrity.sh 32
else
    echo "skipped: integrity needs root"
fi

section "cargo test --features verbs (libibverbs provider; without RDMA: the no-device path)"
cargo test --features verbs --lib hw:: 2>&1 | tee -a "$log"
cargo test --features verbs --test hw_no_device 2>&1 | tee -a "$log"

section "Debian package (scripts/deb.sh: release build with --features verbs, cargo-deb)"
bash scripts/deb.sh

section "the package under systemd (scripts/systemd-check.sh; root only; SKIP_SYSTEMD_CHECK=1 skips)"
if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: scripts/systemd-check.sh needs root (debootstrap, network namespaces, a container)"
elif [ -n "${SKIP_SYSTEMD_CHECK:-}" ]; then
    echo "skipped: SKIP_SYSTEMD_CHECK is set"
else
    unless_unsupported bash scripts/systemd-check.sh
fi

section "rxe interop (kernel Soft-RoCE in qemu; root only; SKIP_RXE_INTEROP=1 skips)"
if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: scripts/rxe-interop.sh needs root (tap device, netns)"
elif [ -n "${SKIP_RXE_INTEROP:-}" ]; then
    echo "skipped: SKIP_RXE_INTEROP is set"
elif ! { [ -c /dev/net/tun ] && ip netns add ipoib-tapprobe-$$ 2>/dev/null &&
         ip -n ipoib-tapprobe-$$ tuntap add dev tap0 mode tap 2>/dev/null; }; then
    ip netns del ipoib-tapprobe-$$ 2>/dev/null || true
    echo "skipped: cannot create a tap device in a network namespace here"
else
    ip netns del ipoib-tapprobe-$$ 2>/dev/null || true
    bash scripts/rxe-interop.sh --quick
    section "the package under systemd in qemu, --provider verbs on rxe (scripts/systemd-check.sh --qemu)"
    unless_unsupported bash scripts/systemd-check.sh --qemu
fi

section "benchmark smoke (scripts/bench.sh --quick; root only; SKIP_BENCH=1 skips)"
# Only that every path of the one-run benchmark still produces its figures: the figures
# themselves are not checked (a 2 s run on a shared machine says nothing about speed).
if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: scripts/bench.sh needs root (network namespaces)"
elif [ -n "${SKIP_BENCH:-}" ]; then
    echo "skipped: SKIP_BENCH is set"
else
    bench_json=$(mktemp)
    bash scripts/bench.sh --quick --json "$bench_json" > "$bench_json.log" 2>&1 \
        || { tail -n 40 "$bench_json.log"; echo "bench.sh --quick failed"; exit 1; }
    sed -n '/^==== report/,$p' "$bench_json.log"
    python3 scripts/bench/check_schema.py "$bench_json"
    rm -f "$bench_json" "$bench_json.log"
fi

section "fuzz targets (${FUZZ_SECONDS:-10} s each)"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"

section "host untouched (set-up installed no kernel, /boot as before)"
setup_host_unchanged

section "all checks passed"
# One closing line over every test binary (cargo prints one `test result:` per binary).
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
