#!/usr/bin/env bash
# A lab of N nodes on a simulated InfiniBand fabric: each an ipoib-cm daemon on an InfiniBand
# port of ibsim's fabric (--link-layer infiniband), whose LID, P_Keys, paths and groups come
# from a real subnet manager (opensm) on the same fabric. ibsim carries the MADs; the
# daemons' packets cross the underlay (a bridge), addressed by LID.
#
#   scripts/ib-lab.sh up N [-- DAEMON ARGS]  N from 2 to 8: namespaces ibf1..ibfN on a bridge
#                                            (underlay 198.18.0.K/24), the fabric's namespace
#                                            ibffab (198.18.0.254: ibsim, opensm), ib0 with
#                                            198.19.0.K/24 and 2001:db8:19::K/64 on node K, a
#                                            daemon in each on port Hca<K> (odd K on switch 1,
#                                            even K on switch 2); returns when every daemon
#                                            answers status
#   scripts/ib-lab.sh down                   stop the daemons, the SMs and ibsim; delete all
#   scripts/ib-lab.sh kill|start|stop|status|exec K ...   as scripts/lab.sh
#   scripts/ib-lab.sh sm start|stop|restart [OPENSM ARGS]  the master SM on port HcaSM
#                                            (started by `up`; `restart` keeps its cache, so
#                                            LIDs stay unless ARGS or guid2lid say otherwise)
#   scripts/ib-lab.sh sm standby [OPENSM ARGS]  a second SM on port HcaSM2 at priority 1
#   scripts/ib-lab.sh sm kill-standby           stop it
#   scripts/ib-lab.sh sim CMD...             one line to ibsim's console, e.g.
#                                            `sim Unlink '"Hca3"'` (quote node names)
#
# Settings: IPOIB_CM_BIN, LAB_MTU (default 9000), LAB_PREFIX (default ibf), LAB_STATE (default
# /run/ipoib-cm-<prefix>) as in scripts/lab.sh. Needs root and Debian's ibsim-utils, opensm and
# infiniband-diags (installed when missing). Every process runs in namespaces the script
# creates: no traffic touches the root namespace.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${LAB_PREFIX:-ibf}
[[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,8}$ ]] || { echo "ib-lab.sh: LAB_PREFIX must be 1-9 lowercase letters/digits" >&2; exit 2; }
STATE=${LAB_STATE:-/run/ipoib-cm-$PREFIX}
MTU=${LAB_MTU:-9000}
BR=${PREFIX}br
FAB=${PREFIX}fab
FAB_IP=198.18.0.254
UMAD2SIM=/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so

LAB_NAME=ib-lab.sh
# shellcheck source=scripts/lab-common.sh
source "$here/scripts/lab-common.sh"
# How long a node may take to answer after its start.
READY_SECS=30

ensure_tools() {
    if [ -e "$UMAD2SIM" ] && command -v ibsim >/dev/null && command -v opensm >/dev/null \
        && command -v saquery >/dev/null; then
        return 0
    fi
    # shellcheck source=scripts/setup.sh
    source "$here/scripts/setup.sh" test
}

# `cmd` in namespace `netns` as port `host` of the simulated fabric, in `dir` (umad2sim
# writes its view of sysfs there).
on_fabric() {
    local netns=$1 host=$2 dir=$3
    shift 3
    mkdir -p "$dir"
    (cd "$dir" && exec ip netns exec "$netns" env LD_PRELOAD="$UMAD2SIM" SIM_HOST="$host" \
        IBSIM_SERVER_NAME="$FAB_IP" "$@")
}

# The topology: two switches; the SM's ports on switch 1; node K's port on switch 1 (odd K)
# or 2 (even K).
write_topology() {
    local n=$1 k s1=() s2=()
    s1+=("[1] \"HcaSM\"[1]" "[2] \"HcaSM2\"[1]" "[3] \"Switch2\"[3]")
    s2+=("[3] \"Switch1\"[3]")
    for ((k = 1; k <= n; k++)); do
        if ((k % 2)); then s1+=("[$((k + 3))] \"Hca$k\"[1]"); else s2+=("[$((k + 3))] \"Hca$k\"[1]"); fi
    done
    {
        echo 'Switch 12 "Switch1"'
        printf '%s\n' "${s1[@]}"
        echo
        echo 'Switch 12 "Switch2"'
        printf '%s\n' "${s2[@]}"
        echo
        for h in HcaSM HcaSM2; do
            local p=1; [ "$h" = HcaSM2 ] && p=2
            printf 'Hca 1 "%s"\n[1] "Switch1"[%d]\n\n' "$h" "$p"
        done
        for ((k = 1; k <= n; k++)); do
            if ((k % 2)); then printf 'Hca 1 "Hca%d"\n[1] "Switch1"[%d]\n\n' "$k" $((k + 3))
            else printf 'Hca 1 "Hca%d"\n[1] "Switch2"[%d]\n\n' "$k" $((k + 3)); fi
        done
    } > "$STATE/net"
}

start_ibsim() {
    rm -f "$STATE/console"
    mkfifo "$STATE/console"
    # A holder keeps the console open between commands (ibsim ends at its end of file).
    (exec 3> "$STATE/console"; exec sleep infinity) > /dev/null 2>&1 &
    echo $! > "$STATE/console.pid"
    (cd "$STATE" && exec ip netns exec "$FAB" ibsim -r -s net < "$STATE/console" \
        >> "$STATE/ibsim.log" 2>&1) &
    echo $! > "$STATE/ibsim.pid"
    local i
    for ((i = 0; i < 100; i++)); do
        if on_fabric "$FAB" HcaSM "$STATE/probe" timeout 5 ibstat >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    die "ibsim did not answer; its log: $(tail -n 5 "$STATE/ibsim.log")"
}

# opensm on `host` as `name` (sm or sm2) with ARGS; waits for MASTER or STANDBY.
start_sm() {
    local name=$1 host=$2
    shift 2
    local dir="$STATE/$name"
    mkdir -p "$dir"
    printf 'sminfo_polling_timeout 500\npolling_retry_number 2\n' > "$STATE/opensm.conf"
    : > "$dir/out"
    (cd "$dir" && exec ip netns exec "$FAB" env LD_PRELOAD="$UMAD2SIM" SIM_HOST="$host" \
        IBSIM_SERVER_NAME="$FAB_IP" OSM_TMP_DIR="$dir" OSM_CACHE_DIR="$dir" \
        opensm -F "$STATE/opensm.conf" -f "$dir/osm.log" "$@" >> "$dir/out" 2>&1 < /dev/null) &
    echo $! > "$dir/pid"
    local i
    for ((i = 0; i < 150; i++)); do
        grep -q "Entering \(MASTER\|STANDBY\) state" "$dir/out" && return 0
        sleep 0.1
    done
    die "opensm ($name) did not come up: $(tail -n 5 "$dir/out")"
}

start_node() {
    local k=$1 args=() extra=()
    shift
    extra=("$@")
    if [ -s "$STATE/args" ]; then
        mapfile -t args < "$STATE/args"
    fi
    rm -f "$STATE/node$k.pid"
    (
        mkdir -p "$STATE/node$k"
        # `exec` all the way down: the pid is the daemon's.
        (cd "$STATE/node$k" && exec ip netns exec "$(ns "$k")" env LD_PRELOAD="$UMAD2SIM" \
            SIM_HOST="Hca$k" IBSIM_SERVER_NAME="$FAB_IP" "$(bin)" up \
            --ifname ib0 --addr "198.19.0.$k/24" --addr "2001:db8:19::$k/64" \
            --bind "198.18.0.$k" --link-layer infiniband --control-socket "$(sock "$k")" \
            "${args[@]}" "${extra[@]}" >> "$STATE/node$k.log" 2>&1 < /dev/null) &
        echo $! > "$STATE/node$k.pid"
        status=0
        wait $! || status=$?
        echo "ipoib-cm exited with status $status" >> "$STATE/node$k.log"
    ) > /dev/null 2>&1 &
    local i
    for ((i = 0; i < 100; i++)); do
        [ -s "$STATE/node$k.pid" ] && return 0
        sleep 0.02
    done
    die "node $k did not start"
}

cmd_up() {
    local n=${1:-}; shift || true
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 8 ] || die "up N: N must be 2..8"
    if [ "${1:-}" = "--" ]; then shift; fi
    [ -e "$STATE/nodes" ] && die "a lab is already up (scripts/ib-lab.sh down first)"
    ensure_tools
    mkdir -p "$STATE"
    chmod 700 "$STATE"
    echo "$n" > "$STATE/nodes"
    : > "$STATE/args"
    if [ "$#" -gt 0 ]; then printf "%s\n" "$@" > "$STATE/args"; fi
    write_topology "$n"
    ip netns add "$BR"
    ip -n "$BR" link add br0 type bridge
    ip -n "$BR" link set br0 mtu "$MTU" up
    local k
    for ((k = 1; k <= n + 1; k++)); do
        local name ip
        if ((k <= n)); then name=$(ns "$k"); ip="198.18.0.$k"; else name=$FAB; ip=$FAB_IP; fi
        ip netns add "$name"
        ip -n "$name" link add eth0 mtu "$MTU" type veth peer name "v$k" mtu "$MTU" netns "$BR"
        ip -n "$BR" link set "v$k" master br0 up
        ip -n "$name" link set lo up
        ip -n "$name" addr add "$ip/24" dev eth0
        ip -n "$name" link set eth0 up
    done
    start_ibsim
    start_sm sm HcaSM -p 10
    for ((k = 1; k <= n; k++)); do start_node "$k"; done
    for ((k = 1; k <= n; k++)); do wait_ready "$k" "$READY_SECS" || { cmd_down; exit 1; }; done
    echo "ib lab up: $n nodes ($(ns 1)..$(ns "$n")) on ibsim with opensm, ib0 = 198.19.0.K/24, 2001:db8:19::K/64"
}

cmd_down() {
    local n k
    n=$(nodes)
    for ((k = 1; k <= n; k++)); do stop_pidfile "$STATE/node$k.pid"; done
    stop_pidfile "$STATE/sm2/pid"
    stop_pidfile "$STATE/sm/pid"
    stop_pidfile "$STATE/ibsim.pid"
    stop_pidfile "$STATE/console.pid"
    for ((k = 1; k <= n; k++)); do ip netns del "$(ns "$k")" 2>/dev/null || true; done
    ip netns del "$FAB" 2>/dev/null || true
    ip netns del "$BR" 2>/dev/null || true
    rm -rf "$STATE"
}

cmd_sm() {
    local what=${1:-}; shift || true
    case "$what" in
        start) start_sm sm HcaSM -p 10 "$@" ;;
        stop) stop_pidfile "$STATE/sm/pid" ;;
        restart) stop_pidfile "$STATE/sm/pid"; start_sm sm HcaSM -p 10 "$@" ;;
        standby) start_sm sm2 HcaSM2 -p 1 "$@" ;;
        kill-standby) stop_pidfile "$STATE/sm2/pid" ;;
        *) die "usage: ib-lab.sh sm start|stop|restart|standby|kill-standby [OPENSM ARGS]" ;;
    esac
}

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    kill | stop | start | status | exec) node_verb "$@" ;;
    sm) shift; cmd_sm "$@" ;;
    sim) shift; [ -p "$STATE/console" ] || die "no lab is up"; echo "$*" > "$STATE/console" ;;
    *) die "usage: ib-lab.sh up N [-- ARGS] | down | kill K | stop K | start K | status K | exec K CMD... | sm ... | sim CMD..." ;;
esac
