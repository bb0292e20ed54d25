#!/usr/bin/env bash
# Side-by-side benchmark: direct veth (the ceiling), OpenVPN without a cipher (the userspace
# tunnel users would otherwise pick) and the ipoib-cm tunnel on the software fabric.
#
#   sudo scripts/bench.sh [--json FILE] [--quick]
#
# One run: builds release, then for each path measures iperf3 TCP (1 stream: the median of 3
# runs of 5 s, since veth alone varies by a quarter from run to run; 4 streams: 5 s),
# iperf3 UDP with 64-byte datagrams (unlimited rate, received packets/s: the median of 3 runs
# of 5 s, since a flood measures how two CPUs are split and varies by a third), ping RTT p50/p99
# (1,000 pings at 2 ms), CPU time per GB moved; then the simulated-fabric figures
# (benches/fabric_scale.rs: CM set-up rate, stale-reap rate, heap per RX connection) and the
# provider alone (ipoib-cm perf: bandwidth with 64 KiB and 4 KiB messages, 64 B latency).
# Prints a table with tunnel/veth ratios and the load average next to each section, and
# writes the JSON document to FILE. --quick: 2 s iperf3 runs, 200
# pings (for trying the script out; not for figures).
#
# Paths (all inside namespaces this script creates and deletes; 198.18.0.0/15 only):
#   veth     bnv1 198.18.1.1 <-> bnv2 198.18.1.2, veth MTU 9000
#   peer     OpenVPN 2.6 p2p, --cipher none --auth none --disable-dco, tun 198.19.1.1 <-> .2
#            over that same veth (UDP)
#   relay    examples/naive_relay.rs (TUN <-> UDP, one packet per syscall, no protocol), tun
#            198.19.2.1 <-> .2, MTU 8972, over that same veth: the floor of a userspace tunnel
#            that sleeps between packets (ping and TCP 1 stream only)
#   tunnel   LAB_LINK=pair scripts/lab.sh up 2 (prefix bnt): ib0 198.19.0.1 <-> .2 over one veth
#            pair like the other two paths (no bridge), underlay
#            MTU 9000 (RoCE path MTU 4096); then again with underlay MTU 1500 (prefix bnu);
#            then with --busy-poll 5ms (prefix bnb; ping and TCP 1 stream only)
#   tunnel2w the tunnel (MTU 9000) with --workers 2 on both nodes (prefix bnw), right after the
#            1-worker one; then iperf3 UDP, 4 streams of 1,400-byte datagrams at 100 Mbit/s
#            each for T s, whose out-of-order count (the receiving iperf3's) should be 0
#
# Counts (both tunnel paths, over the TCP single-stream runs): syscalls and context switches of
# both daemons per GB (perf stat -e raw_syscalls:sys_enter,context-switches -p PIDS, as
# scripts/bench/poll.sh counts them; the tracepoint costs the daemons a little, the same for
# both). Around the 4-stream run: both nodes' `status --json`, whose per-worker packet counts
# show whether the streams spread over the workers. Pings lost: sent minus answered.
#
# CPU per GB: utime+stime of the tunnel processes (/proc/PID/stat, both ends) over the TCP
# single-stream runs, divided by the GB iperf3 received in them. Null for veth (no tunnel process).
# Softirq and kernel work done on behalf of the tunnel in other contexts cannot be attributed
# per process, so the whole-machine busy time per GB (/proc/stat, all CPUs, everything but
# idle+iowait; includes iperf3 itself and any other load) is reported next to it as
# vm_cpu_s_per_gb, for all three paths.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

JSON_OUT=""
QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --json) JSON_OUT=${2:?--json needs a file}; shift 2 ;;
        --quick) QUICK=1; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench.sh: needs root (network namespaces)" >&2; exit 2; }

T=5; PINGS=1000; TCP_RUNS=3; UDP_RUNS=3
[ "$QUICK" -eq 1 ] && { T=2; PINGS=200; TCP_RUNS=1; UDP_RUNS=1; }

# shellcheck source=scripts/setup.sh
source scripts/setup.sh demo
extra=()
for p in openvpn python3 jq; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = 'install ok installed' ] \
        || command -v "$p" >/dev/null 2>&1 || extra+=("$p")
done
command -v perf >/dev/null 2>&1 || extra+=(linux-perf)
if [ ${#extra[@]} -gt 0 ]; then
    echo "[bench] installing: ${extra[*]}"
    setup_apt_install "${extra[@]}"
fi

section() { printf '\n==== %s (load %s) ====\n' "$1" "$(cut -d' ' -f1-3 /proc/loadavg)"; }

section "cargo build --release"
cargo build --release
cargo build --release --example naive_relay
BIN=$here/target/release/ipoib-cm
RELAY=$here/target/release/examples/naive_relay
export IPOIB_CM_BIN=$BIN

OUT=$(mktemp -d /tmp/ipoib-bench.XXXXXX)
VNS=(bnv1 bnv2)
OVPN_PIDS=()
RELAY_PIDS=()
cleanup() {
    local p
    for p in "${OVPN_PIDS[@]}" "${RELAY_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -n "${IPERF_PID:-}" ] && kill "$IPERF_PID" 2>/dev/null || true
    if [ -n "${PERF_PID:-}" ]; then kill -INT "$PERF_PID" 2>/dev/null || true; fi
    LAB_PREFIX=bnt bash scripts/lab.sh down >/dev/null 2>&1 || true
    LAB_PREFIX=bnu bash scripts/lab.sh down >/dev/null 2>&1 || true
    LAB_PREFIX=bnb bash scripts/lab.sh down >/dev/null 2>&1 || true
    LAB_PREFIX=bnw bash scripts/lab.sh down >/dev/null 2>&1 || true
    ip netns del bnv1 2>/dev/null || true
    ip netns del bnv2 2>/dev/null || true
}
trap 'cleanup; rm -rf "$OUT"' EXIT
cleanup

# busy_jiffies, softirq_jiffies, proc_jiffies, count_start/count_stop, lab_status.
# shellcheck source=scripts/bench/lib.sh
source scripts/bench/lib.sh

# child_pids NAME PIDS...: timeout(1) forks the program it runs; the pid of each PID's child
# called NAME (PID itself if there is none), so that the program's own CPU is measured.
child_pids() {
    local name=$1 p c
    shift
    for p in "$@"; do
        c=$(pgrep -P "$p" "$name" || true)
        echo "${c:-$p}"
    done
}

# measure NAME CLIENT_NS SERVER_NS DST [TUNNEL PIDS...]: writes $OUT/NAME.*. With LAB set (the
# lab prefix of a tunnel path) it also counts the daemons' syscalls and context switches over
# the single-stream runs and takes both nodes' status around the 4-stream run.
measure() {
    local name=$1 cns=$2 sns=$3 dst=$4
    shift 4
    local pids=("$@") hz j0 j1 b0 b1 s0 s1
    hz=$(getconf CLK_TCK)
    section "$name: warm-up ping"
    ip netns exec "$cns" ping -n -c 5 -i 0.2 -W 3 "$dst" | tail -n 2
    # Ping first, on an idle path (after the floods below, queues take a while to drain).
    section "$name: ping, $PINGS at 2 ms"
    ip netns exec "$cns" timeout 60 ping -n -c "$PINGS" -i 0.002 -W 1 "$dst" \
        > "$OUT/$name.ping.txt" || true
    tail -n 2 "$OUT/$name.ping.txt"
    ip netns exec "$sns" timeout 300 iperf3 -s -p 5201 >/dev/null 2>&1 &
    IPERF_PID=$!
    sleep 0.5

    section "$name: iperf3 TCP, 1 stream, $TCP_RUNS x ${T} s (the median counts)"
    [ -n "${LAB:-}" ] && count_start "$OUT/$name.counts.txt" "${pids[@]}"
    j0=$(proc_jiffies "${pids[@]}"); b0=$(busy_jiffies); s0=$(softirq_jiffies)
    for ((run = 1; run <= TCP_RUNS; run++)); do
        ip netns exec "$cns" timeout $((T + 20)) iperf3 -c "$dst" -p 5201 -t "$T" -J \
            > "$OUT/$name.tcp.$run.json" || true
        jq -r '.end.sum_received.bits_per_second / 1e9 | "  \(.) Gbit/s"' "$OUT/$name.tcp.$run.json" || true
    done
    j1=$(proc_jiffies "${pids[@]}"); b1=$(busy_jiffies); s1=$(softirq_jiffies)
    [ -n "${LAB:-}" ] && count_stop
    echo "{\"hz\": $hz, \"proc\": $((j1 - j0)), \"busy\": $((b1 - b0)), \"softirq\": $((s1 - s0)), \"procs\": ${#pids[@]}}" \
        > "$OUT/$name.cpu.json"

    if [ "${LATENCY_ONLY:-0}" -eq 0 ]; then
        section "$name: iperf3 TCP, 4 streams, ${T} s"
        [ -n "${LAB:-}" ] && lab_status "$LAB" "$OUT/$name.tcp4.before"
        ip netns exec "$cns" timeout $((T + 20)) iperf3 -c "$dst" -p 5201 -t "$T" -P 4 -J \
            > "$OUT/$name.tcp4.json" || true
        [ -n "${LAB:-}" ] && lab_status "$LAB" "$OUT/$name.tcp4.after"
        jq -r '.end.sum_received.bits_per_second / 1e9 | "  \(.) Gbit/s"' "$OUT/$name.tcp4.json" || true

        section "$name: iperf3 UDP, 64-byte datagrams, unlimited rate, $UDP_RUNS x ${T} s (the median counts)"
        for ((run = 1; run <= UDP_RUNS; run++)); do
            ip netns exec "$cns" timeout $((T + 20)) iperf3 -c "$dst" -p 5201 -t "$T" -u -l 64 -b 0 -J \
                > "$OUT/$name.udp.$run.json" || true
            jq -r '.end.sum | "  \((.packets - .lost_packets) / .seconds) pps received, \(.lost_percent) % lost"' \
                "$OUT/$name.udp.$run.json" || true
        done
    fi
    kill "$IPERF_PID" 2>/dev/null || true
    wait "$IPERF_PID" 2>/dev/null || true
    IPERF_PID=""

    echo "$(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/$name.load"
}

# measure_latency NAME CLIENT_NS SERVER_NS DST [PIDS...]: measure's ping and TCP 1-stream parts.
measure_latency() { LATENCY_ONLY=1 measure "$@"; }

# measure_workers NAME CLIENT_NS SERVER_NS DST [PIDS...]: measure, then iperf3 UDP in 4 streams
# (1,400-byte datagrams, 100 Mbit/s each, T s); the receiving iperf3's JSON (out of order and
# lost, per stream) goes to $OUT/NAME.udpooo.json.
measure_workers() {
    measure "$@"
    local name=$1 cns=$2 sns=$3 dst=$4 sp
    section "$name: iperf3 UDP, 4 streams of 1,400 B at 100 Mbit/s each, ${T} s (out of order?)"
    ip netns exec "$sns" timeout $((T + 30)) iperf3 -s -p 5202 -1 -J > "$OUT/$name.udpooo.json" 2>&1 &
    sp=$!
    sleep 0.5
    ip netns exec "$cns" timeout $((T + 20)) iperf3 -c "$dst" -p 5202 -t "$T" -u -l 1400 -b 100M -P 4 \
        > /dev/null 2>&1 || true
    wait "$sp" 2>/dev/null || true
    jq -r '[.end.streams[].udp] | "  \(map(.out_of_order // 0) | add) out of order, \(map(.lost_packets) | add) lost of \(map(.packets) | add)"' \
        "$OUT/$name.udpooo.json" || true
}

# ---- veth ----------------------------------------------------------------------------------
section "veth: namespaces bnv1/bnv2, MTU 9000"
for n in "${VNS[@]}"; do ip netns add "$n"; ip -n "$n" link set lo up; done
ip -n bnv1 link add eth0 mtu 9000 type veth peer name eth0 mtu 9000 netns bnv2
ip -n bnv1 addr add 198.18.1.1/24 dev eth0
ip -n bnv2 addr add 198.18.1.2/24 dev eth0
ip -n bnv1 link set eth0 up
ip -n bnv2 link set eth0 up
measure veth bnv1 bnv2 198.18.1.2

# ---- provider alone (ipoib-cm perf over the same veth) -------------------------------------
section "provider alone: ipoib-cm perf over the veth (path MTU 4096)"
# provider_perf NAME ARGS...: server in bnv2, client in bnv1; the server's JSON line (its
# figures end at the last receive) goes to $OUT/perf-NAME.json.
provider_perf() {
    local name=$1 i
    shift
    ip netns exec bnv2 timeout 90 "$BIN" perf --json --deadline 60 --bind 198.18.1.2 "$@" \
        > "$OUT/perf-$name-server.txt" 2>&1 &
    local sp=$!
    for ((i = 0; i < 50; i++)); do
        ip netns exec bnv2 ss -ltn 2>/dev/null | grep -q ':18516 ' && break
        sleep 0.1
    done
    ip netns exec bnv1 timeout 90 "$BIN" perf --json --deadline 60 "$@" 198.18.1.2 \
        > "$OUT/perf-$name-client.txt" 2>&1 || true
    wait "$sp" 2>/dev/null || true
    grep -E "^(bw|lat) server" "$OUT/perf-$name-server.txt" || true
    tail -n 1 "$OUT/perf-$name-server.txt" > "$OUT/perf-$name.json" || true
}
provider_perf bw65536 --bw -s 65536 -n 20000
provider_perf bw4096 --bw -s 4096 -n 100000
provider_perf lat64 --lat -s 64 -n 20000

# ---- OpenVPN over the same veth ------------------------------------------------------------
section "peer: OpenVPN $(openvpn --version | head -n 1 | cut -d' ' -f2), p2p, --cipher none --auth none --disable-dco"
ovpn() {
    local me=$1 other=$2 ns=$3
    ip netns exec "$ns" timeout 600 openvpn --dev tun0 --dev-type tun --proto udp \
        --local "198.18.1.$me" --lport 1194 --remote "198.18.1.$other" --rport 1194 \
        --ifconfig "198.19.1.$me" "198.19.1.$other" --cipher none --auth none --disable-dco \
        --verb 3 > "$OUT/openvpn$me.log" 2>&1 &
    OVPN_PIDS+=($!)
}
ovpn 1 2 bnv1
ovpn 2 1 bnv2
for ((i = 0; i < 100; i++)); do
    grep -q "Initialization Sequence Completed" "$OUT/openvpn1.log" 2>/dev/null \
        && grep -q "Initialization Sequence Completed" "$OUT/openvpn2.log" 2>/dev/null && break
    sleep 0.1
done
grep -h "Data Channel" "$OUT"/openvpn*.log | head -n 1 || true
mapfile -t OVPN_REAL < <(child_pids openvpn "${OVPN_PIDS[@]}")
measure peer bnv1 bnv2 198.19.1.2 "${OVPN_REAL[@]}"
for p in "${OVPN_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
OVPN_PIDS=()

# ---- naive relay over the same veth --------------------------------------------------------
section "relay: examples/naive_relay.rs over the veth, tun MTU 8972"
for me in 1 2; do
    other=$((3 - me))
    ip netns exec "bnv$me" timeout 600 "$RELAY" rl0 "198.18.1.$me:5555" "198.18.1.$other:5555" &
    RELAY_PIDS+=($!)
done
for me in 1 2; do
    for ((i = 0; i < 50; i++)); do
        ip -n "bnv$me" link show rl0 >/dev/null 2>&1 && break
        sleep 0.1
    done
    ip -n "bnv$me" addr add "198.19.2.$me/24" dev rl0
    ip -n "bnv$me" link set rl0 mtu 8972 up
done
mapfile -t RELAY_REAL < <(child_pids naive_relay "${RELAY_PIDS[@]}")
measure_latency relay bnv1 bnv2 198.19.2.2 "${RELAY_REAL[@]}"
for p in "${RELAY_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
RELAY_PIDS=()
ip netns del bnv1; ip netns del bnv2

# ---- ipoib-cm ------------------------------------------------------------------------------
tunnel() {
    local name=$1 prefix=$2 mtu=$3 what=$4
    shift 4
    section "$name: ipoib-cm lab of 2, underlay MTU $mtu${*:+, $*}"
    LAB_PREFIX=$prefix LAB_MTU=$mtu LAB_LINK=pair bash scripts/lab.sh up 2 -- "$@"
    local st=/run/ipoib-cm-$prefix
    LAB=$prefix "$what" "$name" "${prefix}1" "${prefix}2" 198.19.0.2 "$(cat "$st/node1.pid")" "$(cat "$st/node2.pid")"
    LAB_PREFIX=$prefix bash scripts/lab.sh status 1 > "$OUT/$name.status.json" || true
    LAB_PREFIX=$prefix bash scripts/lab.sh status 2 > "$OUT/$name.status2.json" || true
    LAB_PREFIX=$prefix bash scripts/lab.sh down
}
tunnel tunnel bnt 9000 measure
# The same with two workers a node (multi-queue TUN, steered sockets), right after it.
tunnel tunnel2w bnw 9000 measure_workers --workers 2
tunnel tunnel1500 bnu 1500 measure
# Latency with busy polling (the daemons spin between events instead of sleeping: no process
# wakeup per packet, at the cost of busy CPUs): ping and a TCP stream only.
tunnel tunnelbp bnb 9000 measure_latency --busy-poll 5ms

# ---- simulated fabric ----------------------------------------------------------------------
section "simulated fabric: cargo bench --bench fabric_scale"
timeout 600 cargo bench --bench fabric_scale 2>&1 | tee "$OUT/fabric.txt" | grep -v '^{' || true
grep '^{' "$OUT/fabric.txt" | tail -n 1 > "$OUT/fabric.json" || true
echo "$(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/fabric.load"

section "report"
python3 scripts/bench/report.py "$OUT" "${JSON_OUT:-}"
