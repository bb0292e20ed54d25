#!/usr/bin/env bash
# Soak: connect / traffic / SIGKILL / restart cycles, in SRQ and non-SRQ mode and with each
# provider quirk, then a check that no surviving node holds a QP beyond its baseline.
#
#   scripts/soak.sh [--cycles N] [--netns-cycles M] [--nodes K] [--workers "W..."]
#
# Two parts, each per mode (srq, non-srq, drain-never, no-last-wqe, dup-last-wqe, moves-later):
# 1. N cycles (default 10000) of 4 endpoints on the simulated fabric in virtual time (the
#    tests/soak_sim.rs harness, release build): it checks created = destroyed + died with a
#    killed process + baseline, and zero leaked QPs.
# 2. M cycles (default 20) with real daemons in a lab of K network namespaces (default 3):
#    every node pings every other, a node is SIGKILLed, the survivors must reap their RX QPs
#    within rx_timeout + drain bound and return to their baseline qp_live (taken before the
#    first cycle), the node restarts. Then again with each --workers count (default "1 2 4";
#    counts above 1 run the modes srq, non-srq and no-last-wqe, and every node also sends
#    flows from 8 source ports to every other, so that connections land on every worker).
#    Every mode checks that nothing was retired undrained (retired_undrained) either.
# Prints one figure line per mode and part; exits non-zero on any leak or failure. Needs root
# for part 2 (it is skipped otherwise). Bounded in count and time.
set -euo pipefail
cd "$(dirname "$0")/.."

CYCLES=10000
NETNS_CYCLES=20
NODES=3
WORKERS="1 2 4"
while [ $# -gt 0 ]; do
    case "$1" in
        --cycles) CYCLES=$2; shift 2 ;;
        --netns-cycles) NETNS_CYCLES=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        *) echo "usage: $0 [--cycles N] [--netns-cycles M] [--nodes K] [--workers \"W...\"]" >&2; exit 2 ;;
    esac
done
for v in "$CYCLES" "$NETNS_CYCLES" "$NODES"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { echo "soak.sh: counts must be numbers" >&2; exit 2; }
done
[ "$NODES" -ge 2 ] && [ "$NODES" -le 20 ] || { echo "soak.sh: --nodes 2..20" >&2; exit 2; }
for w in $WORKERS; do
    [[ "$w" =~ ^(1|2|4|8|16|32|64)$ ]] || { echo "soak.sh: --workers: powers of two 1..64" >&2; exit 2; }
done

echo "==== part 1: simulated fabric, $CYCLES cycles per mode ===="
out=$(mktemp)
trap 'rm -f "$out"' EXIT
sim_ok=0
SOAK_CYCLES=$CYCLES cargo test --release --test soak_sim -- --nocapture --test-threads=2 \
    > "$out" 2>&1 || sim_ok=$?
grep -E '^soak |panicked|FAILED' "$out" || true
if [ "$sim_ok" -ne 0 ]; then
    tail -n 30 "$out" >&2
    echo "soak.sh: simulated soak FAILED" >&2
    exit 1
fi

if [ "$NETNS_CYCLES" -eq 0 ]; then
    echo "soak: netns part skipped (--netns-cycles 0)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "soak: netns part skipped (needs root)"
    exit 0
fi

echo "==== part 2: daemons in $NODES namespaces, $NETNS_CYCLES cycles per mode ===="
cargo build --release --quiet
export IPOIB_CM_BIN=$PWD/target/release/ipoib-cm
export LAB_PREFIX=soak
export LAB_STATE=/run/ipoib-cm-soak
lab() { bash scripts/lab.sh "$@"; }
trap 'lab down >/dev/null 2>&1 || true; rm -f "$out"' EXIT

jget() { python3 -c 'import json,sys; d=json.load(sys.stdin); k=sys.argv[1]; print(d["counters"][k] if k in d["counters"] else d["provider"].get(k, 0) if k not in d else len(d[k]))' "$1"; }
status_of() { lab status "$1" 2>/dev/null; }
# Node K's qp_live once every worker has reported (before its first report a worker's QPs are
# not in the status yet); bounded to 5 s.
baseline_of() {
    local k=$1 i s=""
    for ((i = 0; i < 50; i++)); do
        s=$(status_of "$k") && printf '%s' "$s" | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if all(w["cpu_seconds"] > 0 for w in d["workers"]) else 1)' && break
        sleep 0.1
    done
    printf '%s' "$s" | jget qp_live
}

fail=0
for workers in $WORKERS; do
modes="srq non-srq drain-never no-last-wqe dup-last-wqe moves-later"
[ "$workers" -gt 1 ] && modes="srq non-srq no-last-wqe"
for mode in $modes; do
    case $mode in
        srq) extra=() ;;
        non-srq) extra=(--no-srq) ;;
        *) extra=(--quirk "$mode") ;;
    esac
    lab down >/dev/null 2>&1 || true
    lab up "$NODES" -- --rx-timeout 1s --drain-timeout 1s --neigh-timeout 2s \
        --workers "$workers" "${extra[@]}" >/dev/null
    baseline=()
    for ((k = 1; k <= NODES; k++)); do baseline[k]=$(baseline_of "$k"); done
    start=$(date +%s)
    pings=0; ping_fail=0; reap_fail=0; max_reap_ms=0
    for ((c = 0; c < NETNS_CYCLES; c++)); do
        for ((a = 1; a <= NODES; a++)); do
            for ((b = 1; b <= NODES; b++)); do
                [ "$a" -eq "$b" ] && continue
                pings=$((pings + 1))
                lab exec "$a" ping -n -q -c 1 -W 3 "198.19.0.$b" >/dev/null 2>&1 \
                    || ping_fail=$((ping_fail + 1))
                # Flows from 8 source ports: the kernel spreads them over the TUN queues.
                [ "$workers" -gt 1 ] && lab exec "$a" bash -c \
                    "for p in 1 2 3 4 5 6 7 8; do echo x > /dev/udp/198.19.0.$b/4000\$p; done" \
                    >/dev/null 2>&1 || true
            done
        done
        victim=$(( (c % NODES) + 1 ))
        lab kill "$victim"
        t0=$(date +%s%N)
        for ((k = 1; k <= NODES; k++)); do
            [ "$k" -eq "$victim" ] && continue
            ok=0
            for ((i = 0; i < 100; i++)); do
                s=$(status_of "$k") || true
                rx=$(printf '%s' "$s" | jget rx 2>/dev/null || echo -1)
                [ "$rx" = "0" ] && { ok=1; break; }
                sleep 0.1
            done
            [ "$ok" -eq 1 ] || reap_fail=$((reap_fail + 1))
        done
        ms=$(( ($(date +%s%N) - t0) / 1000000 ))
        [ "$ms" -gt "$max_reap_ms" ] && max_reap_ms=$ms
        lab start "$victim" >/dev/null
        baseline[victim]=$(baseline_of "$victim")
    done
    # Quiet: neighbours and TX connections age out; then every node must be at its baseline.
    sleep 4
    leaked=0; created=0; destroyed=0; timeouts=0; evicted=0; stale=0; undrained=0
    for ((k = 1; k <= NODES; k++)); do
        s=$(status_of "$k")
        live=$(printf '%s' "$s" | jget qp_live)
        [ "$live" -gt "${baseline[k]}" ] && leaked=$((leaked + live - baseline[k]))
        undrained=$((undrained + $(printf '%s' "$s" | jget retired_undrained)))
        created=$((created + $(printf '%s' "$s" | jget qp_created)))
        destroyed=$((destroyed + $(printf '%s' "$s" | jget qp_destroyed)))
        timeouts=$((timeouts + $(printf '%s' "$s" | jget drain_timeouts)))
        evicted=$((evicted + $(printf '%s' "$s" | jget rx_evicted)))
        stale=$((stale + $(printf '%s' "$s" | jget rx_stale_reaped)))
    done
    lab down >/dev/null
    echo "soak netns $mode workers $workers: cycles $NETNS_CYCLES nodes $NODES ($(( $(date +%s) - start )) s) | pings $pings failed $ping_fail | reap waits failed $reap_fail, slowest ${max_reap_ms} ms | QPs (current processes) created $created destroyed $destroyed leaked $leaked retired-undrained $undrained | stale-reaped $stale evicted $evicted drain-timeouts $timeouts"
    if [ "$leaked" -ne 0 ] || [ "$reap_fail" -ne 0 ] || [ "$undrained" -ne 0 ]; then fail=1; fi
done
done
trap - EXIT
[ "$fail" -eq 0 ] || { echo "soak.sh: LEAK, QP retired undrained or reap failure" >&2; exit 1; }
echo "soak: no leaked QPs"
