#!/usr/bin/env bash
# A lab of N nodes, each an ipoib-cm daemon in its own network namespace, on one bridge.
#
#   scripts/lab.sh up N [-- DAEMON ARGS]   namespaces ibl1..iblN, underlay 198.18.0.K/24 on a
#                                          bridge, interface ib0 with 198.19.0.K/24 and
#                                          2001:db8:19::K/64, a daemon in each; returns when
#                                          every daemon answers status
#   scripts/lab.sh down                    stop the daemons (SIGTERM, then SIGKILL), delete all
#   scripts/lab.sh kill K                  SIGKILL node K's daemon
#   scripts/lab.sh start K [-- ARGS]       start node K's daemon again (same arguments, plus
#                                          ARGS for this start only)
#   scripts/lab.sh stop K                  SIGTERM node K's daemon and wait for it to exit
#   scripts/lab.sh status K                print node K's `ipoib-cm status --json`
#   scripts/lab.sh exec K CMD...           run CMD in node K's namespace
#
# Settings: IPOIB_CM_BIN (the binary; default target/release/ipoib-cm, else target/debug),
# LAB_MTU (underlay MTU, default 9000, which gives RoCE path MTU 4096), LAB_LINK (bridge, the
# default; pair: two nodes on one veth pair, no bridge; routed: two nodes, each on a veth pair
# to a middle namespace PREFIXrt that forwards between them, answering ARP for the other
# node, where a caller may divert the traffic through a device of its own: see
# scripts/bench/impaired.sh), LAB_PREFIX (namespace
# prefix, default ibl; tests use their own so labs can coexist), LAB_STATE (state directory,
# default /run/ipoib-cm-<prefix>). Needs root. Everything lives in namespaces the script
# creates: no traffic touches the root namespace.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${LAB_PREFIX:-ibl}
[[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,8}$ ]] || { echo "lab.sh: LAB_PREFIX must be 1-9 lowercase letters/digits" >&2; exit 2; }
STATE=${LAB_STATE:-/run/ipoib-cm-$PREFIX}
MTU=${LAB_MTU:-9000}
LINK=${LAB_LINK:-bridge}
[[ "$LINK" =~ ^(bridge|pair|routed)$ ]] || { echo "lab.sh: LAB_LINK must be bridge, pair or routed" >&2; exit 2; }
BR=${PREFIX}br
RT=${PREFIX}rt

LAB_NAME=lab.sh
# shellcheck source=scripts/lab-common.sh
source "$here/scripts/lab-common.sh"
# How long a node may take to answer after its start.
READY_SECS=20

start_node() {
    local k=$1 n peers=() args=() extra=()
    shift
    extra=("$@")
    n=$(nodes)
    for ((j = 1; j <= n; j++)); do
        [ "$j" -ne "$k" ] && peers+=(--peer "198.18.0.$j")
    done
    if [ -s "$STATE/args" ]; then
        mapfile -t args < "$STATE/args"
    fi
    rm -f "$STATE/node$k.pid"
    # The daemon's pid goes to the pid file; its exit status to the log when it ends (128 + N
    # for signal N: 137 is SIGKILL). `|| status=$?` keeps set -e from ending the subshell at a
    # non-zero wait.
    (
        ip netns exec "$(ns "$k")" "$(bin)" up \
            --ifname ib0 --addr "198.19.0.$k/24" --addr "2001:db8:19::$k/64" \
            --bind "198.18.0.$k" "${peers[@]}" --control-socket "$(sock "$k")" \
            "${args[@]}" "${extra[@]}" >> "$STATE/node$k.log" 2>&1 < /dev/null &
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

stop_node() { stop_pidfile "$STATE/node$1.pid"; }

cmd_up() {
    local n=${1:-}; shift || true
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 2 ] && [ "$n" -le 200 ] || die "up N: N must be 2..200"
    [ "$LINK" = bridge ] || [ "$n" -eq 2 ] || die "LAB_LINK=$LINK needs exactly 2 nodes"
    if [ "${1:-}" = "--" ]; then shift; fi
    [ -e "$STATE/nodes" ] && die "a lab is already up (scripts/lab.sh down first)"
    mkdir -p "$STATE"
    chmod 700 "$STATE"
    echo "$n" > "$STATE/nodes"
    : > "$STATE/args"
    if [ "$#" -gt 0 ]; then printf "%s\n" "$@" > "$STATE/args"; fi
    if [ "$LINK" = pair ]; then
        # Two nodes, one veth pair between them: no bridge (the benchmark's underlay, the
        # same as its direct-veth and OpenVPN paths).
        ip netns add "$(ns 1)"
        ip netns add "$(ns 2)"
        ip -n "$(ns 1)" link add eth0 mtu "$MTU" type veth peer name eth0 mtu "$MTU" netns "$(ns 2)"
    elif [ "$LINK" = routed ]; then
        # Node K's eth0 to the middle's vK; the middle forwards by host routes, answers ARP
        # for the other node (proxy ARP), and checks no source (a caller's device may hand
        # packets back to it).
        ip netns add "$RT"
        ip -n "$RT" link set lo up
        for k in 1 2; do
            ip netns add "$(ns "$k")"
            ip -n "$(ns "$k")" link add eth0 mtu "$MTU" type veth peer name "v$k" mtu "$MTU" netns "$RT"
            ip -n "$RT" addr add "198.18.1.$k/32" dev "v$k"
            ip -n "$RT" link set "v$k" up
            ip netns exec "$RT" sysctl -qw "net.ipv4.conf.v$k.proxy_arp=1" "net.ipv4.conf.v$k.rp_filter=0"
            ip -n "$RT" route add "198.18.0.$k/32" dev "v$k"
        done
        ip netns exec "$RT" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
            net.ipv4.conf.default.rp_filter=0
    else
        ip netns add "$BR"
        ip -n "$BR" link add br0 type bridge
        ip -n "$BR" link set br0 mtu "$MTU" up
    fi
    for ((k = 1; k <= n; k++)); do
        if [ "$LINK" = bridge ]; then
            ip netns add "$(ns "$k")"
            ip -n "$(ns "$k")" link add eth0 mtu "$MTU" type veth peer name "v$k" mtu "$MTU" netns "$BR"
            ip -n "$BR" link set "v$k" master br0 up
        fi
        ip -n "$(ns "$k")" link set lo up
        ip -n "$(ns "$k")" addr add "198.18.0.$k/24" dev eth0
        ip -n "$(ns "$k")" link set eth0 up
    done
    for ((k = 1; k <= n; k++)); do start_node "$k"; done
    for ((k = 1; k <= n; k++)); do wait_ready "$k" "$READY_SECS" || { cmd_down; exit 1; }; done
    echo "lab up: $n nodes ($(ns 1)..$(ns "$n")), ib0 = 198.19.0.K/24, 2001:db8:19::K/64"
}

cmd_down() {
    local n k
    n=$(nodes)
    for ((k = 1; k <= n; k++)); do stop_node "$k"; done
    for ((k = 1; k <= n; k++)); do ip netns del "$(ns "$k")" 2>/dev/null || true; done
    ip netns del "$BR" 2>/dev/null || true
    ip netns del "$RT" 2>/dev/null || true
    rm -rf "$STATE"
}

[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    kill | stop | start | status | exec) node_verb "$@" ;;
    *) die "usage: lab.sh up N [-- ARGS] | down | kill K | stop K | start K | status K | exec K CMD..." ;;
esac
