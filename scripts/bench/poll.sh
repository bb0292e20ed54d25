#!/usr/bin/env bash
# The event loop's polling policy, A/B on one build: the same two-node lab (LAB_LINK=pair,
# underlay MTU 9000) once per `--busy-poll` value given (default: 0s, the loop that sleeps
# whenever nothing is ready, and 1ms, the adaptive default), measuring for each
#   - TCP 1 stream (iperf3, RUNS x T s; the median) with both daemons' syscalls and context
#     switches per GB (perf stat -e raw_syscalls:sys_enter,context-switches) and their CPU s/GB;
#   - ping p50/p99 (PINGS at 2 ms);
#   - 64-byte UDP datagrams, unlimited rate (received pps);
#   - a steady 100 Mbit/s TCP stream for T s: both daemons' CPU s/GB there;
#   - idle: both daemons' CPU over IDLE s with no traffic, and with one ping a second.
# Counts move little from run to run; times here move by a third.
#
#   sudo scripts/bench/poll.sh [BUSY_POLL...]      (RUNS=3 T=5 PINGS=1000 IDLE=10)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "poll.sh: needs root (network namespaces)" >&2; exit 2; }
command -v perf > /dev/null || { echo "poll.sh: needs perf (linux-perf)" >&2; exit 2; }
RUNS=${RUNS:-3} T=${T:-5} PINGS=${PINGS:-1000} IDLE=${IDLE:-10}
MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(0s 1ms)

cargo build --release -q
export IPOIB_CM_BIN=$PWD/target/release/ipoib-cm
PREFIX=bpl ST=/run/ipoib-cm-bpl
OUT=$(mktemp -d /tmp/ipoib-poll.XXXXXX)
IPERF_PID=
cleanup() {
    [ -n "$IPERF_PID" ] && kill "$IPERF_PID" 2>/dev/null || true
    LAB_PREFIX=$PREFIX bash scripts/lab.sh down > /dev/null 2>&1 || true
}
trap 'cleanup; rm -rf "$OUT"' EXIT
cleanup

hz=$(getconf CLK_TCK)
# cpu_s PIDS...: utime+stime of the pids, in seconds.
cpu_s() {
    local p t=0
    for p in "$@"; do t=$((t + $(cut -d')' -f2- "/proc/$p/stat" | awk '{print $12 + $13}'))); done
    awk -v t="$t" -v hz="$hz" 'BEGIN { printf "%.3f", t / hz }'
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

printf '%-8s %10s %12s %12s %9s %9s %10s %10s %11s %9s\n' busy_poll 'TCP Gb/s' 'syscalls/GB' \
    'ctxsw/GB' 'CPU s/GB' 'ping p50' 'ping p99' '64B pps' 'idle %core' '100M s/GB' > "$OUT/table"
for mode in "${MODES[@]}"; do
    echo "== --busy-poll $mode"
    LAB_PREFIX=$PREFIX LAB_MTU=9000 LAB_LINK=pair bash scripts/lab.sh up 2 -- --busy-poll "$mode" > /dev/null
    pids=("$(cat "$ST/node1.pid")" "$(cat "$ST/node2.pid")")
    c=${PREFIX}1 s=${PREFIX}2 dst=198.19.0.2
    ip netns exec "$c" ping -n -c 5 -i 0.2 -W 3 "$dst" > /dev/null

    # idle, then one ping a second
    c0=$(cpu_s "${pids[@]}"); sleep "$IDLE"; c1=$(cpu_s "${pids[@]}")
    idle=$(awk -v a="$c0" -v b="$c1" -v t="$IDLE" 'BEGIN { printf "%.2f", (b - a) / t / 2 * 100 }')
    c0=$(cpu_s "${pids[@]}")
    ip netns exec "$c" ping -n -c "$IDLE" -i 1 -W 1 "$dst" > /dev/null || true
    c1=$(cpu_s "${pids[@]}")
    idle1=$(awk -v a="$c0" -v b="$c1" -v t="$IDLE" 'BEGIN { printf "%.2f", (b - a) / t / 2 * 100 }')

    ip netns exec "$c" timeout 60 ping -n -c "$PINGS" -i 0.002 -W 1 "$dst" > "$OUT/ping" || true
    p50=$(grep -o 'time=[0-9.]*' "$OUT/ping" | cut -d= -f2 | sort -g | awk '{a[NR]=$1} END {printf "%d", a[int(NR*0.5)]*1000}')
    p99=$(grep -o 'time=[0-9.]*' "$OUT/ping" | cut -d= -f2 | sort -g | awk '{a[NR]=$1} END {printf "%d", a[int(NR*0.99)]*1000}')

    ip netns exec "$s" timeout 600 iperf3 -s -p 5201 > /dev/null 2>&1 &
    IPERF_PID=$!
    sleep 0.5
    c0=$(cpu_s "${pids[@]}")
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$(IFS=,; echo "${pids[*]}")" \
        -o "$OUT/perf" -- sleep $((RUNS * (T + 1) + 1)) &
    perf_pid=$!
    sleep 0.2
    bytes=0
    for ((r = 1; r <= RUNS; r++)); do
        ip netns exec "$c" timeout $((T + 20)) iperf3 -c "$dst" -p 5201 -t "$T" -J > "$OUT/tcp.$r" || true
        jq -r '.end.sum_received.bits_per_second / 1e9' "$OUT/tcp.$r" >> "$OUT/tcp.gbps"
        bytes=$((bytes + $(jq -r '.end.sum_received.bytes' "$OUT/tcp.$r")))
    done
    c1=$(cpu_s "${pids[@]}")
    wait "$perf_pid" || true
    gbps=$(median < "$OUT/tcp.gbps"); rm -f "$OUT/tcp.gbps"
    gb=$(awk -v b="$bytes" 'BEGIN { print b / 1e9 }')
    sc=$(awk -F, '/raw_syscalls:sys_enter/ { print $1 }' "$OUT/perf")
    cs=$(awk -F, '/context-switches/ { print $1 }' "$OUT/perf")
    per_gb() { awk -v n="$1" -v gb="$gb" 'BEGIN { printf "%.0f", n / gb }'; }
    cpu_gb=$(awk -v a="$c0" -v b="$c1" -v gb="$gb" 'BEGIN { printf "%.2f", (b - a) / gb }')

    for ((r = 1; r <= RUNS; r++)); do
        ip netns exec "$c" timeout $((T + 20)) iperf3 -c "$dst" -p 5201 -t "$T" -u -l 64 -b 0 -J \
            > "$OUT/udp" || true
        jq -r '.end.sum | (.packets - .lost_packets) / .seconds' "$OUT/udp" >> "$OUT/udp.pps"
    done
    pps=$(median < "$OUT/udp.pps" | awk '{ printf "%.0f", $1 }'); rm -f "$OUT/udp.pps"

    c0=$(cpu_s "${pids[@]}")
    ip netns exec "$c" timeout $((T + 20)) iperf3 -c "$dst" -p 5201 -t "$T" -b 100M -J \
        > "$OUT/steady" || true
    c1=$(cpu_s "${pids[@]}")
    steady=$(jq -r '.end.sum_received.bytes' "$OUT/steady" \
        | awk -v a="$c0" -v b="$c1" '$1 > 0 { printf "%.2f", (b - a) / ($1 / 1e9) }')
    kill "$IPERF_PID" 2>/dev/null || true; wait "$IPERF_PID" 2>/dev/null || true; IPERF_PID=
    LAB_PREFIX=$PREFIX bash scripts/lab.sh down > /dev/null
    printf '%-8s %10.2f %12s %12s %9s %9s %10s %10s %5s/%-5s %9s\n' "$mode" "$gbps" \
        "$(per_gb "$sc")" "$(per_gb "$cs")" "$cpu_gb" "$p50" "$p99" "$pps" "$idle" "$idle1" \
        "${steady:--}" >> "$OUT/table"
done
echo
echo "(ping in µs; idle: % of a core per daemon, with no traffic / with one ping a second; 100M: both"
echo " daemons' CPU s per GB of a steady 100 Mbit/s TCP stream; load $(cut -d' ' -f1-3 /proc/loadavg))"
cat "$OUT/table"
