# shellcheck shell=bash
# Measurement helpers of the benchmarks that compare daemon builds and worker counts
# (scripts/bench.sh, scripts/bench/scale.sh, scripts/bench/ab.sh). Sourced from the repository
# root; the caller sets OUT (a directory for the raw files) and cleans up after itself.
#
# tcp_measure is the one measurement: iperf3 TCP from the lab's node 1 to node 2 through ib0,
# the daemons' CPU, whole-machine busy time, optionally their syscalls and context switches,
# and both nodes' status before and after; scripts/bench/workers_report.py reads what it
# writes.

# Whole-machine busy jiffies (all CPUs): everything but idle and iowait.
busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
softirq_jiffies() { awk '/^cpu /{print $8}' /proc/stat; }
# utime+stime jiffies of the given pids (all their threads), summed.
proc_jiffies() {
    local p t=0 f
    for p in "$@"; do
        f=$(cut -d')' -f2- "/proc/$p/stat" 2>/dev/null) || continue
        t=$((t + $(echo "$f" | awk '{print $12 + $13}')))
    done
    echo "$t"
}
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# count_start FILE PIDS...: perf stat counts the pids' syscalls and context switches (every
# thread they have now) into FILE until count_stop. The tracepoint costs the counted processes
# a little; compare only figures counted the same way.
PERF_PID=""
count_start() {
    local file=$1
    shift
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$(IFS=,; echo "$*")" \
        -o "$file" > /dev/null 2>&1 &
    PERF_PID=$!
    sleep 0.3
}
count_stop() {
    [ -n "$PERF_PID" ] || return 0
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
    PERF_PID=""
}

# lab_status PREFIX BASE: both nodes' `status --json` of lab PREFIX to BASE.K.json.
lab_status() {
    local k
    for k in 1 2; do
        LAB_PREFIX=$1 bash scripts/lab.sh status "$k" > "$2.$k.json" 2>/dev/null || true
    done
}

# lab_pids PREFIX: the two daemons' pids, one a line.
lab_pids() { cat "/run/ipoib-cm-$1/node1.pid" "/run/ipoib-cm-$1/node2.pid"; }

# tcp_measure BASE PREFIX STREAMS RUNS SECONDS COUNT [CPU]: RUNS runs of iperf3 -P STREAMS for
# SECONDS from PREFIX1 to 198.19.0.2:5201 (a server must be listening in PREFIX2), the client
# pinned to CPU if given. Writes BASE.R.json (iperf3), BASE.cpu.json (jiffies of both daemons
# and of the machine, the load average), BASE.before/after.K.json (status) and, with COUNT 1,
# BASE.counts.txt (perf stat -x,).
tcp_measure() {
    local base=$1 prefix=$2 streams=$3 runs=$4 secs=$5 count=$6 cpu=${7:-} r j0 j1 b0 b1
    local pids pin=()
    mapfile -t pids < <(lab_pids "$prefix")
    [ -n "$cpu" ] && pin=(taskset -c "$cpu")
    lab_status "$prefix" "$base.before"
    [ "$count" -eq 1 ] && count_start "$base.counts.txt" "${pids[@]}"
    j0=$(proc_jiffies "${pids[@]}"); b0=$(busy_jiffies)
    for ((r = 1; r <= runs; r++)); do
        ip netns exec "${prefix}1" timeout $((secs + 20)) "${pin[@]}" iperf3 -c 198.19.0.2 \
            -p 5201 -t "$secs" -P "$streams" -J > "$base.$r.json" || true
    done
    j1=$(proc_jiffies "${pids[@]}"); b1=$(busy_jiffies)
    count_stop
    lab_status "$prefix" "$base.after"
    printf '{"hz": %d, "proc": %d, "busy": %d, "load": "%s"}\n' "$(getconf CLK_TCK)" \
        $((j1 - j0)) $((b1 - b0)) "$(loadavg)" > "$base.cpu.json"
    jq -r '.end.sum_received.bits_per_second / 1e9 | "    \(.) Gbit/s"' "$base".[0-9]*.json 2>/dev/null || true
}
