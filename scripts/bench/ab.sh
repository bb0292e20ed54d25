#!/usr/bin/env bash
# Interleaved A/B of daemon builds and worker counts on the two-node lab of the one-run
# benchmark (LAB_LINK=pair scripts/lab.sh up 2, underlay MTU 9000, prefix bab):
#   base  the binary given with --base (e.g. the commit before multi-queue), default settings
#   w1    this tree's release build with --workers 1
#   w2    this tree's release build with --workers 2
# in ROUNDS rounds, the order reversed every other round (base w1 w2, w2 w1 base, ...) so that
# a machine that drifts favours none. Each configuration gets a fresh lab and, per round,
# iperf3 TCP 1 stream and 4 streams (T s each) from node 1 to node 2 through ib0, with both
# daemons' CPU s/GB (utime+stime, all threads), whole-machine busy s/GB, their syscalls and
# context switches per GB (perf stat -e raw_syscalls:sys_enter,context-switches, as bench.sh and
# poll.sh count them) and the packets each worker carried (status --json before and after).
#
#   sudo scripts/bench/ab.sh --base BIN [--rounds R] [--quick] [--json FILE]
#
# A base binary, e.g. of 301d3a4 (main before multi-queue), built apart from this tree:
#   git worktree add --detach /tmp/ipoib-base 301d3a4
#   (cd /tmp/ipoib-base && CARGO_TARGET_DIR=/tmp/ipoib-base/target cargo build --release)
#   sudo scripts/bench/ab.sh --base /tmp/ipoib-base/target/release/ipoib-cm
#
# Prints the medians over the rounds, the ratios w1/base and w2/w1 (of the medians, and the
# range of the ratios within a round), and checks: w1 against base within noise (the larger of
# 5 % and base's own spread over the rounds, (max - min) / median) for TCP and for syscalls and
# context switches per GB; w2 against w1: 1 stream >= 0.85x, CPU s/GB <= 1.15x, and the 4
# streams on every worker of both nodes (each sent and received packets) in every round.
# --rounds: 3..20, default 4; T=5 s; --quick: 3 rounds of 2 s (for trying the script out; not
# for figures). Everything runs in namespaces it creates and deletes (198.18.0.0/15 only);
# every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

JSON_OUT="" QUICK=0 BASE_BIN="" ROUNDS=4
while [ $# -gt 0 ]; do
    case "$1" in
        --base) BASE_BIN=${2:?--base needs a binary}; shift 2 ;;
        --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
        --json) JSON_OUT=${2:?--json needs a file}; shift 2 ;;
        --quick) QUICK=1; shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "ab.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "ab.sh: needs root (network namespaces)" >&2; exit 2; }
if [ -z "$BASE_BIN" ] || [ ! -x "$BASE_BIN" ]; then
    echo "ab.sh: --base BIN (an executable ipoib-cm) is needed" >&2
    exit 2
fi
if ! [[ "$ROUNDS" =~ ^[0-9]+$ ]] || [ "$ROUNDS" -lt 3 ] || [ "$ROUNDS" -gt 20 ]; then
    echo "ab.sh: --rounds must be 3..20" >&2
    exit 2
fi
for c in iperf3 jq python3 perf; do
    command -v "$c" > /dev/null || { echo "ab.sh: needs $c" >&2; exit 2; }
done
T=${T:-5}
[ "$QUICK" -eq 1 ] && { ROUNDS=3; T=2; }
[[ "$T" =~ ^[1-9][0-9]?$ ]] || { echo "ab.sh: T must be 1..99" >&2; exit 2; }

cargo build --release -q
B_BIN=$PWD/target/release/ipoib-cm
PREFIX=bab
OUT=$(mktemp -d /tmp/ipoib-ab.XXXXXX)
IPERF_PID=""
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh
cleanup() {
    count_stop
    if [ -n "$IPERF_PID" ]; then kill "$IPERF_PID" 2>/dev/null || true; fi
    LAB_PREFIX=$PREFIX bash scripts/lab.sh down > /dev/null 2>&1 || true
}
trap 'cleanup; rm -rf "$OUT"' EXIT
cleanup

# run_config ROUND NAME: one configuration's lab, its two measurements, the lab gone.
run_config() {
    local r=$1 name=$2 args=()
    case $name in
        base) export IPOIB_CM_BIN=$BASE_BIN ;;
        w1) export IPOIB_CM_BIN=$B_BIN; args=(--workers 1) ;;
        w2) export IPOIB_CM_BIN=$B_BIN; args=(--workers 2) ;;
    esac
    printf '  -- %s (%s%s; load %s)\n' "$name" "$IPOIB_CM_BIN" "${args[*]:+ ${args[*]}}" "$(loadavg)"
    LAB_PREFIX=$PREFIX LAB_MTU=9000 LAB_LINK=pair bash scripts/lab.sh up 2 -- "${args[@]}" > /dev/null
    ip netns exec "${PREFIX}1" ping -n -c 5 -i 0.2 -W 3 198.19.0.2 > /dev/null
    ip netns exec "${PREFIX}2" timeout 300 iperf3 -s -p 5201 > /dev/null 2>&1 &
    IPERF_PID=$!
    sleep 0.5
    tcp_measure "$OUT/r$r.$name.p1" "$PREFIX" 1 1 "$T" 1
    tcp_measure "$OUT/r$r.$name.p4" "$PREFIX" 4 1 "$T" 1
    kill "$IPERF_PID" 2>/dev/null || true
    wait "$IPERF_PID" 2>/dev/null || true
    IPERF_PID=""
    LAB_PREFIX=$PREFIX bash scripts/lab.sh down
}

printf '{"rounds": %d, "seconds": %d, "base": "%s", "b": "%s", "cpus": %d}\n' "$ROUNDS" "$T" \
    "$BASE_BIN" "$B_BIN" "$(nproc)" > "$OUT/meta.json"
for ((r = 1; r <= ROUNDS; r++)); do
    order=(base w1 w2)
    [ $((r % 2)) -eq 0 ] && order=(w2 w1 base)
    printf '\n==== round %d of %d: %s (load %s) ====\n' "$r" "$ROUNDS" "${order[*]}" "$(loadavg)"
    for name in "${order[@]}"; do run_config "$r" "$name"; done
done

printf '\n==== report (load %s) ====\n' "$(loadavg)"
python3 scripts/bench/workers_report.py ab "$OUT" "${JSON_OUT:-}"
