#!/usr/bin/env bash
# Does the tunnel scale with workers? Two daemons (LAB_LINK=pair scripts/lab.sh up 2, underlay
# MTU 9000, prefix bsc) with --workers N for N in 1, 2, 4, 8, each N measured with iperf3 TCP
# -P 1 and -P 8 from node 1 to node 2 through ib0 (RUNS runs of T s each; the median), the
# daemons' CPU s/GB (utime+stime of both, all threads, over the runs) and the whole machine's
# busy s/GB, the packets each worker carried, and the ratios against one worker.
#
#   sudo scripts/bench/scale.sh [--quick] [--force] [--json FILE] [--workers "1 2 4 8"]
#
# Only worker counts up to the machine's CPU count run, unless --force. --quick: one 2 s run
# each (for trying the script out; not for figures). RUNS=3 T=5 by default.
#
# Pinning: the machine's CPUs are split into two halves, one per node, as if each node were a
# host of its own. In its half, node K's worker W (the daemon's main thread for W = 0, which
# is also its control side; thread ipoib-wW otherwise, as /proc/PID/task/*/comm names them) is
# pinned to CPU W of the half and the iperf3 end of that node (client on node 1, server on
# node 2) to CPU N, so that daemons and iperf3 never share a CPU. A half of fewer than N + 1
# CPUs cannot do that: the workers then go round the half's CPUs and iperf3 shares the last,
# which the table says ("shared"). The whole daemon (any other thread) may run anywhere in its
# half. iperf3 3.12 sends and receives every stream on one thread: at -P 8, one CPU per end.
#
# Fewer than 8 CPUs cannot show scaling (with 2, each node has one CPU for all its workers):
# the script says so, and the figures then measure only what workers cost. Everything runs in
# namespaces it creates and deletes (198.18.0.0/15 only); every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

JSON_OUT="" QUICK=0 FORCE=0 COUNTS="1 2 4 8"
while [ $# -gt 0 ]; do
    case "$1" in
        --json) JSON_OUT=${2:?--json needs a file}; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --force) FORCE=1; shift ;;
        --workers) COUNTS=${2:?--workers needs a list}; shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "scale.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "scale.sh: needs root (network namespaces)" >&2; exit 2; }
for c in iperf3 jq python3 taskset; do
    command -v "$c" > /dev/null || { echo "scale.sh: needs $c" >&2; exit 2; }
done
RUNS=${RUNS:-3} T=${T:-5}
[ "$QUICK" -eq 1 ] && { RUNS=1; T=2; }
[[ "$RUNS" =~ ^[1-9][0-9]?$ && "$T" =~ ^[1-9][0-9]?$ ]] || { echo "scale.sh: RUNS and T must be 1..99" >&2; exit 2; }

CPUS=$(nproc)
WORKERS=()
for n in $COUNTS; do
    [[ "$n" =~ ^(1|2|4|8|16|32|64)$ ]] || { echo "scale.sh: worker counts are powers of two 1..64, not $n" >&2; exit 2; }
    if [ "$n" -gt "$CPUS" ] && [ "$FORCE" -eq 0 ]; then
        echo "scale.sh: skipping $n workers: only $CPUS CPUs (--force runs it anyway)"
        continue
    fi
    WORKERS+=("$n")
done
[ ${#WORKERS[@]} -gt 0 ] || { echo "scale.sh: no worker count to run" >&2; exit 2; }
if [ "$CPUS" -lt 8 ]; then
    echo "scale.sh: this machine has $CPUS CPUs, fewer than 8: it cannot show scaling (both nodes,"
    echo "          their workers and both iperf3 ends share them); the figures show only the cost of workers."
fi

cargo build --release -q
export IPOIB_CM_BIN=$PWD/target/release/ipoib-cm
PREFIX=bsc
OUT=$(mktemp -d /tmp/ipoib-scale.XXXXXX)
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

HALF=$((CPUS / 2))
[ "$HALF" -ge 1 ] || HALF=1
# host_cpu K I: the I-th CPU of node K's half (I taken modulo the half's size).
host_cpu() {
    local k=$1 i=$2
    if [ "$CPUS" -lt 2 ]; then echo 0; return; fi
    echo $(((k - 1) * HALF + i % HALF))
}

# pin_node K N: node K's daemon into its half, worker W's thread onto host_cpu K W.
pin_node() {
    local k=$1 pid t tid comm w
    pid=$(sed -n "${k}p" < <(lab_pids "$PREFIX"))
    taskset -a -p -c "$(host_cpu "$k" 0)-$(host_cpu "$k" $((HALF - 1)))" "$pid" > /dev/null
    for t in "/proc/$pid/task/"*; do
        tid=${t##*/}
        comm=$(cat "$t/comm" 2>/dev/null) || continue
        if [ "$tid" = "$pid" ]; then
            w=0
        elif [[ "$comm" =~ ^ipoib-w([0-9]+)$ ]]; then
            w=${BASH_REMATCH[1]}
        else
            continue
        fi
        taskset -p -c "$(host_cpu "$k" "$w")" "$tid" > /dev/null
        echo "    node$k worker $w (tid $tid, $comm) on CPU $(host_cpu "$k" "$w")"
    done
}

printf '{"cpus": %d, "runs": %d, "seconds": %d, "iperf3": "%s", "load_start": "%s"}\n' "$CPUS" \
    "$RUNS" "$T" "$(iperf3 --version | head -n 1)" "$(loadavg)" > "$OUT/machine.json"
for n in "${WORKERS[@]}"; do
    printf '\n==== %d worker(s) (load %s) ====\n' "$n" "$(loadavg)"
    LAB_PREFIX=$PREFIX LAB_MTU=9000 LAB_LINK=pair bash scripts/lab.sh up 2 -- --workers "$n" > /dev/null
    pin_node 1 "$n"
    pin_node 2 "$n"
    disjoint=false
    [ "$HALF" -ge $((n + 1)) ] && disjoint=true
    icpu1=$(host_cpu 1 "$n") icpu2=$(host_cpu 2 "$n")
    echo "    iperf3 client on CPU $icpu1, server on CPU $icpu2 (disjoint from the workers: $disjoint)"
    printf '{"workers": %d, "disjoint": %s, "client_cpu": %d, "server_cpu": %d}\n' "$n" "$disjoint" \
        "$icpu1" "$icpu2" > "$OUT/w$n.pin.json"
    ip netns exec "${PREFIX}1" ping -n -c 5 -i 0.2 -W 3 198.19.0.2 > /dev/null
    ip netns exec "${PREFIX}2" timeout 600 taskset -c "$icpu2" iperf3 -s -p 5201 > /dev/null 2>&1 &
    IPERF_PID=$!
    sleep 0.5
    for p in 1 8; do
        echo "  iperf3 -P $p, $RUNS x $T s"
        tcp_measure "$OUT/w$n.p$p" "$PREFIX" "$p" "$RUNS" "$T" 0 "$icpu1"
    done
    kill "$IPERF_PID" 2>/dev/null || true
    wait "$IPERF_PID" 2>/dev/null || true
    IPERF_PID=""
    LAB_PREFIX=$PREFIX bash scripts/lab.sh down
done

printf '\n==== report (load %s) ====\n' "$(loadavg)"
python3 scripts/bench/workers_report.py scale "$OUT" "${JSON_OUT:-}"
