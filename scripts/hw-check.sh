#!/usr/bin/env bash
# Proof on real hardware in one command: what ipoib-cm does on this host's RDMA device, as one
# `RESULT hw_check_NAME PASS|FAIL|SKIP (reason and figures)` line per check (docs/hardware.md
# says what each proves and how to send a report).
#
#   sudo scripts/hw-check.sh [--ib-dev DEV] [--port N] [--peer-dev DEV2] [--json FILE]
#                            [--destructive] [--only REGEX]
#
# --ib-dev   the device (default: the first with an ACTIVE port N);
# --port     its port (default 1; the daemon and the conformance suite run on port 1 only);
# --peer-dev the device of the second daemon and of the conformance suite's side b (default:
#            another device on the same fabric, else DEV itself: two daemons on one port);
# --json     where the report goes (default /tmp/hw-check-HOST-TIME.json);
# --destructive  also reset the device under a running daemon (rxe: `rdma link delete` and
#            add; a PCI device: `devlink dev reload`); without it that check SKIPs;
# --only     run only the checks whose names (without `hw_check_`) match REGEX.
#
# With no RDMA device it prints one line and exits 77. Otherwise it prints the facts of the
# port, then the checks, then a summary (counts, the JSON written, the README's unverified
# list with the result that proves each line), and exits 1 if any check FAILed, else 0.
# $IPOIB_CM names the ipoib-cm binary to test (built with --features verbs; nothing is then
# installed or built: a missing tool makes its checks SKIP); without it, scripts/setup.sh hw
# installs what is missing and `cargo build --release --features verbs` builds one.
# Network: every daemon's interface lives in a network namespace of its own (198.19.0.0/24,
# 2001:db8:19::/64); daemons stay in the initial namespace, where the device's rdma_cm and
# GIDs are; where two daemons share one port and its link has one address, 198.18.254.2/32
# is added to the link for the run. Everything is removed at the end, also on failure.
# Testing only: $HW_CHECK_B_ARGS are extra flags of the second daemon (the rxe lab's
# self-test slows it down with --fault-tun-rate 1 and expects FAIL lines).
set -uo pipefail

DEV="" PORT=1 PEER_DEV="" JSON="" DESTRUCTIVE=0 ONLY=""
usage() {
    echo "usage: $0 [--ib-dev DEV] [--port N] [--peer-dev DEV2] [--json FILE] [--destructive] [--only REGEX]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case $1 in
        --ib-dev) DEV=${2:-}; [ -n "$DEV" ] || usage; shift ;;
        --port) PORT=${2:-}; [[ $PORT =~ ^[0-9]+$ ]] || usage; shift ;;
        --peer-dev) PEER_DEV=${2:-}; [ -n "$PEER_DEV" ] || usage; shift ;;
        --json) JSON=${2:-}; [ -n "$JSON" ] || usage; shift ;;
        --destructive) DESTRUCTIVE=1 ;;
        --only) ONLY=${2:-}; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) usage ;;
    esac
    shift
done

SYS=/sys/class/infiniband
# --- no device: one line, exit 77, nothing else (nothing installed, nothing built)
devs=""
for d in "$SYS"/*; do [ -e "$d" ] && devs="$devs ${d##*/}"; done
devs=${devs# }
if [ -z "$devs" ]; then
    echo "hw-check: no RDMA device (looked for $SYS/*${DEV:+ for $DEV}: none; load the HCA's driver, e.g. mlx5_ib)"
    exit 77
fi
if [ -n "$DEV" ] && [ ! -d "$SYS/$DEV" ]; then
    echo "hw-check: no RDMA device $DEV (looked for $SYS/$DEV; present: $devs)"
    exit 77
fi
if [ -z "$DEV" ]; then
    for d in $devs; do
        case $(cat "$SYS/$d/ports/$PORT/state" 2>/dev/null) in *ACTIVE*) DEV=$d; break ;; esac
    done
    [ -n "$DEV" ] || DEV=${devs%% *}
fi
[ -d "$SYS/$DEV/ports/$PORT" ] || { echo "hw-check: $DEV has no port $PORT (looked for $SYS/$DEV/ports/$PORT)"; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "hw-check: needs root (network namespaces, the device, the daemons)" >&2; exit 2; }

case $JSON in ""|/*) ;; *) JSON=$PWD/$JSON ;; esac
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
W=$(mktemp -d /tmp/hw-check.XXXXXX)
[ -n "$JSON" ] || JSON=/tmp/hw-check-$(hostname)-$(date +%Y%m%d-%H%M%S).json
NSP=hwc$$                       # namespace prefix: $NSP-a, $NSP-b, $NSP-k
say() { printf 'hw-check: %s\n' "$*"; }
up_s() { cut -d' ' -f1 /proc/uptime; }
el() { awk -v a="$1" -v b="$(up_s)" 'BEGIN {printf "%.1f", b - a}'; }
T0=$(up_s)

# --- what it needs: the binary (built with --features verbs) and the tools
if [ -z "${IPOIB_CM:-}" ]; then
    say "installing what is missing (scripts/setup.sh hw) and building (cargo build --release --features verbs); log $W/setup.log"
    # shellcheck source=scripts/setup.sh
    if ! (source scripts/setup.sh hw && cargo build --release --features verbs) > "$W/setup.log" 2>&1; then
        tail -20 "$W/setup.log"; say "set-up failed (log $W/setup.log)"; exit 2
    fi
    IPOIB_CM=$ROOT/target/release/ipoib-cm
fi
[ -x "$IPOIB_CM" ] || { say "no ipoib-cm binary at $IPOIB_CM"; exit 2; }
have() { command -v "$1" > /dev/null 2>&1; }

# --- results and facts, printed and kept for the JSON
declare -a F_KEYS=() F_VALS=() R_NAMES=() R_VERDICTS=() R_INFOS=()
fact() { F_KEYS+=("$1"); F_VALS+=("$2"); printf 'fact %-16s %s\n' "$1" "$2"; }
want() { [ -z "$ONLY" ] || [[ $1 =~ $ONLY ]]; }
want_any() { local n; for n in "$@"; do want "$n" && return 0; done; return 1; }
res() { # NAME PASS|FAIL|SKIP INFO (printed only when --only wants NAME)
    want "$1" || return 0
    printf 'RESULT hw_check_%s %s (%s)\n' "$1" "$2" "${3:-}"
    R_NAMES+=("hw_check_$1"); R_VERDICTS+=("$2"); R_INFOS+=("${3:-}")
}
skip_all() { # REASON NAME...
    local why=$1 n; shift
    for n in "$@"; do res "$n" SKIP "$why"; done
}
verdict_of() { # NAME: its verdict, "not run" when it did not run
    local i
    for i in "${!R_NAMES[@]}"; do [ "${R_NAMES[$i]}" = "$1" ] && { echo "${R_VERDICTS[$i]}"; return; }; done
    echo "not run"
}

# --- cleanup: every daemon and server this script started (by pid), its namespaces, its
# addresses and interfaces
declare -A DPID=() HW=()
EXTRA_PIDS=() NETNS=() TEMP_ADDRS=() TEMP_LINKS=()
cleanup() {
    local p n a
    {
        for n in "${!DPID[@]}"; do
            p=${DPID[$n]}
            [ -n "$p" ] && kill -0 "$p" && kill -KILL "$p"
        done
        for p in "${EXTRA_PIDS[@]}"; do kill -0 "$p" && kill -KILL "$p"; done
        wait
    } 2>/dev/null
    for n in "${TEMP_LINKS[@]}"; do ip link del "$n" 2>/dev/null; done
    for n in "${NETNS[@]}"; do ip netns del "$n" 2>/dev/null; done
    # shellcheck disable=SC2086 # "ADDR dev LINK", split on purpose
    for a in "${TEMP_ADDRS[@]}"; do ip addr del $a 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
netns() { # NAME: create it (once), loopback up
    local ns=$NSP-$1
    if [ ! -e "/run/netns/$ns" ]; then
        ip netns add "$ns" || return 1
        NETNS+=("$ns")
        ip -n "$ns" link set lo up
    fi
}

# ============================================================================ facts
port=$SYS/$DEV/ports/$PORT
rd() { local v; v=$(cat "$1" 2>/dev/null) || { echo "?"; return; }; echo "${v:--}"; }  # ? absent, - empty
LINK=$(rd "$port/link_layer")
IB=0; [ "$LINK" = InfiniBand ] && IB=1
driver_of() { # DEV: the kernel driver (rxe and siw have no PCI device)
    local d
    d=$(readlink -f "$SYS/$1/device/driver" 2>/dev/null)
    if [ -n "$d" ]; then basename "$d"
    else
        case $1 in rxe*) echo rxe ;; siw*) echo siw ;; *) [ -e "$SYS/$1/parent" ] && echo "rxe or siw" || echo unknown ;; esac
    fi
}
netdev_of() { # DEV PORT: the netdev rdma names for the port (RoCE: its Ethernet link; IB: ipoib)
    rdma link show "$1/$2" 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p' | head -1
}
ipv4_of() { ip -4 -o addr show dev "$1" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | grep -v '^198\.18\.254\.' | head -1; }
devinfo() { # DEV PORT FIELD (ibv_devinfo)
    have ibv_devinfo || { echo "? (no ibv_devinfo)"; return; }
    ibv_devinfo -d "$1" -i "$2" 2>/dev/null | awk -v f="$3:" '$1 == f {print $2; exit}'
}
DRIVER=$(driver_of "$DEV")
PCI=$(readlink -f "$SYS/$DEV/device" 2>/dev/null); PCI=${PCI##*/}
case $PCI in *:*) ;; *) PCI="" ;; esac
NETDEV=$(netdev_of "$DEV" "$PORT")
ACTIVE_MTU=$(devinfo "$DEV" "$PORT" active_mtu); MAX_MTU=$(devinfo "$DEV" "$PORT" max_mtu)
pkeys=""; for f in "$port"/pkeys/*; do v=$(cat "$f" 2>/dev/null) || continue
    case $v in 0x0000|0) ;; *) pkeys="$pkeys ${f##*/}:$v" ;; esac; done
gids=""; for f in "$port"/gids/*; do v=$(cat "$f" 2>/dev/null) || continue
    case $v in 0000:0000:0000:0000:0000:0000:0000:0000|"") continue ;; esac
    i=${f##*/}
    gids="$gids $i:$v$(t=$(cat "$port/gid_attrs/types/$i" 2>/dev/null) && echo "($t)")$(n=$(cat "$port/gid_attrs/ndevs/$i" 2>/dev/null) && echo "@$n")"
done
mods=""; for m in ib_ipoib ib_cm rdma_ucm rdma_cm ib_umad ib_uverbs; do
    [ -d "/sys/module/$m" ] && mods="$mods $m" || mods="$mods !$m"; done
# kernel ipoib interfaces on this device and port: type 32 (ARPHRD_INFINIBAND), the
# device's netdevs, dev_port = port - 1 (the daemon's own test)
KIPOIB=() kinfo=""
for n in /sys/class/net/*; do
    [ "$(cat "$n/type" 2>/dev/null)" = 32 ] || continue
    [ -e "$n/device/infiniband/$DEV" ] || [ "$(netdev_of "$DEV" "$PORT")" = "${n##*/}" ] || continue
    [ "$(( $(cat "$n/dev_port" 2>/dev/null || echo 0) + 1 ))" = "$PORT" ] || continue
    KIPOIB+=("${n##*/}")
    kinfo="$kinfo ${n##*/}(mode $(rd "$n/mode"), pkey $(rd "$n/pkey"), mtu $(rd "$n/mtu"), $(cat "$n/operstate" 2>/dev/null))"
done
# the CM transports this host allows the daemon
umad_ok=0
for u in /sys/class/infiniband_mad/umad*; do
    [ "$(cat "$u/ibdev" 2>/dev/null)" = "$DEV" ] && [ "$(cat "$u/port" 2>/dev/null)" = "$PORT" ] && umad_ok=1
done
TRANSPORTS=() tinfo=""
if [ -c /dev/infiniband/rdma_cm ]; then TRANSPORTS+=(rdmacm); tinfo="rdmacm"; else tinfo="!rdmacm (no /dev/infiniband/rdma_cm: rdma_ucm not loaded)"; fi
if [ $umad_ok = 1 ] && [ ! -d /sys/module/ib_cm ]; then TRANSPORTS+=(umad); tinfo="$tinfo umad"
elif [ $umad_ok = 1 ]; then tinfo="$tinfo !umad (ib_cm is loaded)"
else tinfo="$tinfo !umad (no umad device for $DEV port $PORT)"; fi
if [ $IB = 0 ]; then TRANSPORTS+=(udp); tinfo="$tinfo udp"; else tinfo="$tinfo !udp (RoCE only)"; fi

# the second daemon's device and the two --bind addresses
if [ -z "$PEER_DEV" ]; then
    PEER_DEV=$DEV
    for d in $devs; do
        [ "$d" = "$DEV" ] && continue
        case $(cat "$SYS/$d/ports/1/state" 2>/dev/null) in *ACTIVE*) ;; *) continue ;; esac
        [ "$(rd "$SYS/$d/ports/1/link_layer")" = "$LINK" ] || continue
        if [ $IB = 1 ]; then  # the same subnet: same SM, same GID prefix
            if [ "$(rd "$SYS/$d/ports/1/sm_lid")" != "$(rd "$port/sm_lid")" ] ||
                [ "$(cut -c1-19 "$SYS/$d/ports/1/gids/0")" != "$(cut -c1-19 "$port/gids/0")" ]; then
                continue
            fi
        else                   # both links' first IPv4 in one /24 (the lab's veth pair)
            a=$(ipv4_of "$(netdev_of "$d" 1)"); b=$(ipv4_of "$NETDEV")
            if [ -z "$a" ] || [ -z "$b" ] || [ "${a%.*}" != "${b%.*}" ]; then continue; fi
        fi
        PEER_DEV=$d; break
    done
fi
BIND_A=$(ipv4_of "$NETDEV")
if [ "$PEER_DEV" = "$DEV" ]; then
    BIND_B=198.18.254.2
    if [ -n "$NETDEV" ] && ! ip -4 -o addr show dev "$NETDEV" | grep -q " $BIND_B/"; then
        ip addr add "$BIND_B/32" dev "$NETDEV" && TEMP_ADDRS+=("$BIND_B/32 dev $NETDEV")
    fi
    PEER_NETDEV=$NETDEV
else
    PEER_NETDEV=$(netdev_of "$PEER_DEV" 1)
    BIND_B=$(ipv4_of "$PEER_NETDEV")
fi
# On RoCE a --bind address is a GID of its device: wait for the added one (10 s).
gid_of_ip() { # DEV IPV4: is the IPv4-mapped GID on port 1?
    local want
    want=$(echo "$2" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
    grep -qx "$want" "$SYS/$1"/ports/1/gids/* 2>/dev/null
}
if [ $IB = 0 ] && [ -n "$BIND_B" ]; then
    for _ in $(seq 100); do gid_of_ip "$PEER_DEV" "$BIND_B" && break; sleep 0.1; done
fi

fact device "$DEV port $PORT (driver $DRIVER${PCI:+, pci $PCI}, $(rd "$SYS/$DEV/node_type"))"
fact firmware "$(rd "$SYS/$DEV/fw_ver") (board $(rd "$SYS/$DEV/board_id"), hca $(rd "$SYS/$DEV/hca_type"))"
fact link_layer "$LINK"
fact state "$(rd "$port/state"), phys $(rd "$port/phys_state"), rate $(rd "$port/rate")"
fact active_mtu "$ACTIVE_MTU"
fact max_mtu "$MAX_MTU"
fact lid "$(rd "$port/lid") (lmc $(rd "$port/lid_mask_count"))"
fact sm_lid "$(rd "$port/sm_lid") (sm_sl $(rd "$port/sm_sl"))"
fact pkeys "${pkeys# }"
fact gids "${gids# }"
fact modules "${mods# }"
if [ -n "$kinfo" ]; then fact kernel_ipoib "${kinfo# }"; else fact kernel_ipoib "none on $DEV port $PORT"; fi
fact cm_transports "$tinfo"
fact netdev "${NETDEV:-none} (${BIND_A:-no IPv4})"
fact peer "$PEER_DEV${PEER_NETDEV:+ on $PEER_NETDEV} (${BIND_B:-no IPv4})$([ "$PEER_DEV" = "$DEV" ] && echo ': two daemons on one port')"
fact kernel "$(uname -r)"
fact ipoib_cm "$IPOIB_CM ($("$IPOIB_CM" --version 2>/dev/null))"

# ============================================================================ helpers
st() { # NAME: daemon NAME's status, one line ({"key":value,...}; spaces inside strings kept)
    "$IPOIB_CM" status --control-socket "$W/$1.sock" --json 2>/dev/null | tr -d '\n' |
        sed -e 's/" *: */":/g' -e 's/, *"/,"/g' -e 's/\([[{]\) */\1/g' -e 's/ *\([]}]\)/\1/g'
}
num() { printf '%s' "$1" | grep -o "\"$2\":[0-9]*" | head -1 | grep -o '[0-9]*$'; }
str() { printf '%s' "$1" | grep -o "\"$2\":\"[^\"]*\"" | head -1 | sed 's/.*:"\(.*\)"$/\1/'; }
arr() { printf '%s' "$1" | sed -n "s/.*\"$2\":\[\([^]]*\)\].*/\1/p"; }
live_in() { arr "$1" "$2" | grep -o '"state":"live"' | wc -l | tr -d ' '; }

# daemon_up NAME DEV BIND N TRANSPORT [ARGS...]: daemon NAME on DEV, its interface hwcNAME
# moved into netns $NSP-NAME with 198.19.0.N/24 and 2001:db8:19::N/64; sets DPID and HW.
daemon_up() {
    local name=$1 dev=$2 bind=$3 n=$4 tr=$5 i=0 hw="" ifn=hwc$1 ns=$NSP-$1
    shift 5
    rm -f "$W/$name.sock"
    echo "--- up $name: $dev --bind $bind --cm-transport $tr $*" >> "$W/$name.log"
    "$IPOIB_CM" up --provider verbs --ib-dev "$dev" --bind "$bind" --cm-transport "$tr" \
        --ifname "$ifn" --addr "198.19.0.$n/24" --addr "2001:db8:19::$n/64" \
        --control-socket "$W/$name.sock" --drain-timeout 5s --rx-timeout 8s --log info "$@" \
        >> "$W/$name.log" 2>&1 < /dev/null &
    DPID[$name]=$!
    while [ $i -lt 200 ]; do
        hw=$(str "$(st "$name")" hwaddr)
        [ -n "$hw" ] && break
        kill -0 "${DPID[$name]}" 2>/dev/null || break
        sleep 0.1; i=$((i + 1))
    done
    [ -n "$hw" ] || { tail -3 "$W/$name.log" | cut -c1-300 | sed 's/^/  /'; return 1; }
    HW[$name]=$hw
    netns "$name" || return 1
    ip link set "$ifn" netns "$ns" || return 1
    ip -n "$ns" addr add "198.19.0.$n/24" dev "$ifn" &&
        ip -n "$ns" addr add "2001:db8:19::$n/64" dev "$ifn" nodad &&
        ip -n "$ns" link set "$ifn" up
}
neigh() { # NAME N HWADDR: daemon NAME's static neighbours 198.19.0.N and 2001:db8:19::N
    "$IPOIB_CM" neigh add "198.19.0.$2" "$3" --control-socket "$W/$1.sock" > /dev/null &&
        "$IPOIB_CM" neigh add "2001:db8:19::$2" "$3" --control-socket "$W/$1.sock" > /dev/null
}
daemon_stop() { # NAME [SIG]: signal (TERM), wait at most 20 s (then KILL); DRC = exit status
    local p=${DPID[$1]:-} i=0
    DRC=""
    [ -n "$p" ] || return 0
    {   # (bash's own line for a job killed by a signal is not ours to show)
        kill "-${2:-TERM}" "$p"
        while [ $i -lt 200 ] && kill -0 "$p"; do sleep 0.1; i=$((i + 1)); done
        kill -0 "$p" && kill -KILL "$p"
        wait "$p"; DRC=$?
    } 2>/dev/null
    DPID[$1]=""
}
# ping_in NAME COUNT SIZE DEST [-6]: from netns NAME; sets P_SENT, P_RECV, P_AVG (ms)
ping_in() {
    local out fam=()
    [ -z "${5:-}" ] || fam=("$5")
    out=$(ip netns exec "$NSP-$1" timeout $(( $2 + 25 )) ping "${fam[@]}" -c "$2" -i 0.2 -w $(( $2 + 10 )) -s "$3" "$4" 2>&1)
    P_SENT=$(printf '%s\n' "$out" | sed -n 's/^\([0-9]*\) packets transmitted.*/\1/p')
    P_RECV=$(printf '%s\n' "$out" | sed -n 's/.*transmitted, \([0-9]*\) .*/\1/p')
    P_AVG=$(printf '%s\n' "$out" | awk -F' = ' '/min\/avg/ {split($2, v, "/"); print v[2]}')
    P_SENT=${P_SENT:-0} P_RECV=${P_RECV:-0} P_AVG=${P_AVG:--}
    printf '%s\n' "$out" >> "$W/ping.log"
}
# first_ping NAME DEST [-6]: single pings until one is answered (20 tries); P_FIRST = seconds
first_ping() {
    local t i=0 fam=()
    t=$(up_s)
    [ -z "${3:-}" ] || fam=("$3")
    while [ $i -lt 20 ]; do
        ip netns exec "$NSP-$1" timeout 5 ping "${fam[@]}" -c 1 -w 2 "$2" > /dev/null 2>&1 && { P_FIRST=$(el "$t"); return 0; }
        i=$((i + 1))
    done
    P_FIRST=$(el "$t"); return 1
}
# iperf_in SERVER_NS SERVER_IP CLIENT_NS SECS [CLIENT ARGS]: IPERF = receiver Mbit/s
iperf_in() {
    local sns=$1 sip=$2 cns=$3 secs=$4 spid i=0
    shift 4
    IPERF=""
    ip netns exec "$NSP-$sns" timeout $((secs + 40)) iperf3 -s -1 -B "$sip" > "$W/iperf-s.log" 2>&1 &
    spid=$!; EXTRA_PIDS+=("$spid")
    while [ $i -lt 50 ] && ! grep -q 'listening' "$W/iperf-s.log" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    ip netns exec "$NSP-$cns" timeout $((secs + 30)) iperf3 -c "$sip" -t "$secs" -f m "$@" > "$W/iperf-c.log" 2>&1
    local rc=$?
    IPERF=$(awk '/receiver/ {for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") v = $(i - 1)} END {print v}' "$W/iperf-c.log")
    { kill -0 "$spid" && kill "$spid"; wait "$spid"; } 2>/dev/null
    cat "$W/iperf-c.log" >> "$W/iperf.log"
    [ $rc -eq 0 ] && [ -n "$IPERF" ]
}
pass_if() { if "$@"; then echo PASS; else echo FAIL; fi; }
# the address and flags of the pair's daemons: A on DEV (n=1), B on PEER_DEV (n=2)
pair_up() { # TRANSPORT [ARGS for both]: A and B up with static neighbours both ways
    local tr=$1; shift
    # shellcheck disable=SC2086
    daemon_up a "$DEV" "$BIND_A" 1 "$tr" "$@" &&
        daemon_up b "$PEER_DEV" "$BIND_B" 2 "$tr" "$@" ${HW_CHECK_B_ARGS:-} &&
        { [ "${NO_NEIGH:-0}" = 1 ] || { neigh a 2 "${HW[b]}" && neigh b 1 "${HW[a]}"; }; }
}
pair_down() { daemon_stop a; daemon_stop b; ip netns del "$NSP-a" 2>/dev/null; ip netns del "$NSP-b" 2>/dev/null; }

# ============================================================================ checks
# --- the verbs conformance suite on the device: side a on DEV, side b on PEER_DEV
check_conformance() {
    want conformance || return 0
    [ "$PORT" = 1 ] || { res conformance SKIP "the suite opens port 1 only"; return 0; }
    local args=(--dev-a "$DEV" --dev-b "$PEER_DEV" --settle-ms 50) t rc pass fail bad held
    [ $IB = 0 ] && args+=(--ip-a "$BIND_A" --ip-b "$BIND_B")
    case $DRIVER in
        rxe) args+=(--rxe-kernel "$(uname -r)"); held="rxe's row for kernel $(uname -r)" ;;
        *) held="the verbs contract (src/hw/conformance.rs has no row for $DRIVER: what departed is named)" ;;
    esac
    t=$(up_s)
    timeout 900 "$IPOIB_CM" conformance "${args[@]}" > "$W/conformance.log" 2>&1; rc=$?
    sed -e 's/^RESULT //' -e 's/^/  conformance: /' "$W/conformance.log" | cut -c1-300
    pass=$(grep -c '^RESULT conformance_[^ ]* PASS' "$W/conformance.log")
    fail=$(grep -c '^RESULT conformance_[^ ]* FAIL' "$W/conformance.log")
    bad=$(grep '^RESULT conformance_[^ ]* FAIL' "$W/conformance.log" | awk '{sub("conformance_", "", $2); printf "%s ", $2}')
    # its info lines, side a then b: "... X us a create, Y us a destroy", "... (Z us each)"
    local cr de mo
    cr=$(sed -n 's/.* \([0-9-]*\) us a create.*/\1/p' "$W/conformance.log" | tr '\n' / | sed 's:/$::')
    de=$(sed -n 's/.* \([0-9-]*\) us a destroy.*/\1/p' "$W/conformance.log" | tr '\n' / | sed 's:/$::')
    mo=$(sed -n 's/.*(\([0-9-]*\) us each).*/\1/p' "$W/conformance.log" | tr '\n' / | sed 's:/$::')
    CONF_US=""
    [ -z "$cr$de$mo" ] || CONF_US="create ${cr:-?} us, modify ${mo:-?} us, destroy ${de:-?} us (side a/b)"
    if [ $rc -eq 0 ] && [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]; then
        res conformance PASS "$pass checks as expected, held to $held; $DEV <-> $PEER_DEV; $(el "$t") s; QP commands on the thread: ${CONF_US:-no figures}"
    else
        res conformance FAIL "$pass as expected, $fail not (${bad% }), exit $rc, held to $held; $(el "$t") s; log $W/conformance.log"
    fi
}

# --- two daemons, one round per CM transport (and one without SRQ): LABEL TRANSPORT ARGS...
ROUND_NAMES=(up ping4 ping6 ping_65000 connected_both_ways iperf3 killed_peer_reaped)
QP_TIMES_DONE=0
round() {
    local l=$1 tr=$2 t sa sb ok info n
    shift 2
    want_any "${ROUND_NAMES[@]/#/${l}_}" qp_command_times || return 0
    t=$(up_s)
    if ! pair_up "$tr" "$@"; then
        res "${l}_up" FAIL "a daemon did not start or answer (logs $W/a.log, $W/b.log)"
        pair_down; return 0
    fi
    sa=$(st a)
    res "${l}_up" PASS "$(el "$t") s; a on $DEV ${HW[a]}, b on $PEER_DEV ${HW[b]}; cm_transport $(str "$sa" cm_transport), mode $(str "$sa" mode), path_mtu $(num "$sa" path_mtu) ($(str "$sa" path_mtu_from))"
    if want "${l}_ping4"; then
        first_ping a 198.19.0.2
        ping_in a 10 56 198.19.0.2
        ok=$(pass_if [ "$P_RECV" = 10 ])
        res "${l}_ping4" "$ok" "a -> b $P_RECV/$P_SENT answered, avg ${P_AVG} ms; first answered after $P_FIRST s"
    fi
    if want "${l}_ping6"; then
        first_ping b 2001:db8:19::1 -6
        ping_in b 10 56 2001:db8:19::1 -6
        res "${l}_ping6" "$(pass_if [ "$P_RECV" = 10 ])" "b -> a $P_RECV/$P_SENT answered, avg ${P_AVG} ms"
    fi
    if want "${l}_ping_65000"; then
        ping_in a 3 65000 198.19.0.2; info="a -> b $P_RECV/$P_SENT (avg $P_AVG ms)"; ok=$P_RECV
        ping_in b 3 65000 198.19.0.1; info="$info, b -> a $P_RECV/$P_SENT (avg $P_AVG ms)"
        res "${l}_ping_65000" "$(pass_if [ "$ok" = 3 ] && [ "$P_RECV" = 3 ])" "65000-byte payloads: $info"
    fi
    if want "${l}_connected_both_ways"; then
        sa=$(st a); sb=$(st b)
        info="a: mode $(str "$sa" mode), tx live $(live_in "$sa" tx), rx live $(live_in "$sa" rx); b: mode $(str "$sb" mode), tx live $(live_in "$sb" tx), rx live $(live_in "$sb" rx)"
        ok=FAIL
        [ "$(str "$sa" mode)" = connected ] && [ "$(str "$sb" mode)" = connected ] &&
            [ "$(live_in "$sa" tx)" -ge 1 ] && [ "$(live_in "$sa" rx)" -ge 1 ] &&
            [ "$(live_in "$sb" tx)" -ge 1 ] && [ "$(live_in "$sb" rx)" -ge 1 ] && ok=PASS
        res "${l}_connected_both_ways" "$ok" "$info"
    fi
    if want "${l}_iperf3"; then
        if ! have iperf3; then res "${l}_iperf3" SKIP "no iperf3 on this host"
        else
            iperf_in b 198.19.0.2 a 10
            ok=$?
            sa=$(st a)
            res "${l}_iperf3" "$(pass_if [ $ok -eq 0 ])" "TCP a -> b 10 s: ${IPERF:-no figure} Mbit/s; a: tx_failed $(num "$sa" tx_failed), tx_stalled $(num "$sa" tx_stalled)"
        fi
    fi
    if want "${l}_killed_peer_reaped"; then
        local d0 s0 rx="" d1 s1 live0
        first_ping b 198.19.0.1   # B -> A: A's RX connection from B is live now
        sa=$(st a); live0=$(live_in "$sa" rx)
        d0=$(num "$sa" rx_dreq_reaped); s0=$(num "$sa" rx_stale_reaped)
        t=$(up_s)
        daemon_stop b KILL
        ok=FAIL; n=0
        while [ $n -lt 300 ]; do
            sa=$(st a); rx=$(arr "$sa" rx)
            [ -z "$rx" ] && printf '%s' "$sa" | grep -q '"rx":\[\]' && break
            sleep 0.1; n=$((n + 1))
        done
        d1=$(num "$sa" rx_dreq_reaped); s1=$(num "$sa" rx_stale_reaped)
        [ -z "$rx" ] && [ "$live0" -ge 1 ] && [ $(( ${d1:-0} + ${s1:-0} )) -gt $(( ${d0:-0} + ${s0:-0} )) ] && ok=PASS
        res "${l}_killed_peer_reaped" "$ok" "b SIGKILLed with a's RX connection from it live ($live0): gone after $(el "$t") s (rx_dreq_reaped ${d0:-?} -> ${d1:-?}, rx_stale_reaped ${s0:-?} -> ${s1:-?}; --rx-timeout 8s)"
    fi
    # after the traffic and the reap: A's QPs were created, moved and destroyed
    if [ $QP_TIMES_DONE = 0 ] && want qp_command_times; then
        sleep 0.5; qp_times a; QP_TIMES_DONE=1
    fi
    pair_down
}
# qp_times NAME: what daemon NAME's QP command thread took per command, from its status
qp_times() {
    local s c m d cu mu du fl v
    s=$(st "$1")
    c=$(num "$s" hw_qps_created_off_loop); m=$(num "$s" hw_qp_modifies_off_loop); d=$(num "$s" hw_qps_destroyed_off_loop)
    cu=$(num "$s" hw_qp_create_us_off_loop); mu=$(num "$s" hw_qp_modify_us_off_loop); du=$(num "$s" hw_qp_destroy_us_off_loop)
    fl=$(num "$s" hw_qp_commands_failed_off_loop)
    if [ -z "$cu" ]; then
        res qp_command_times SKIP "this ipoib-cm does not time its QP commands (no hw_qp_create_us_off_loop in its status)"
        return
    fi
    per() { if [ "${2:-0}" -gt 0 ]; then echo "$(( $1 / $2 )) us"; else echo "-"; fi; }
    # The moves and destroys are always the thread's; a create is only from the second QP of
    # a kind on (the first of each kind is created on the loop, the next ones ahead of need),
    # so a round with one connection each way may time none: the conformance suite's line
    # gives the create time then.
    v=$(pass_if [ "${m:-0}" -gt 0 ] && [ "${fl:-1}" = 0 ])
    res qp_command_times "$v" "daemon a on the thread: create $(per "$cu" "$c") ($c), modify $(per "$mu" "$m") ($m), destroy $(per "$du" "$d") ($d), $fl failed; on the loop: ibv_create_qp $(num "$s" hw_create_qp_calls), ibv_modify_qp $(num "$s" hw_modify_qp_calls), ibv_destroy_qp $(num "$s" hw_destroy_qp_calls); the conformance suite: ${CONF_US:-not run}"
}

check_pairs() {
    local tr
    if [ "$PORT" != 1 ]; then
        for tr in rdmacm umad udp nosrq; do skip_all "the daemon runs on port 1 only" "${ROUND_NAMES[@]/#/${tr}_}"; done
        res qp_command_times SKIP "the daemon runs on port 1 only"; return 0
    fi
    if [ -z "$BIND_A" ] || [ -z "$BIND_B" ]; then
        for tr in rdmacm umad udp nosrq; do skip_all "no IPv4 address on ${NETDEV:-its netdev} for --bind (rdma_cm and RoCE GIDs are named by it)" "${ROUND_NAMES[@]/#/${tr}_}"; done
        res qp_command_times SKIP "no daemon ran"; return 0
    fi
    for tr in rdmacm umad udp; do
        case " ${TRANSPORTS[*]} " in
            *" $tr "*) round "$tr" "$tr" ;;
            *) skip_all "this host does not allow --cm-transport $tr ($tinfo)" "${ROUND_NAMES[@]/#/${tr}_}" ;;
        esac
    done
    if [ ${#TRANSPORTS[@]} -gt 0 ]; then
        # rings for 32 connections (16 receives each): the default budget's 400 MiB a daemon
        # is more than the rxe lab's guest holds for two
        round "nosrq_${TRANSPORTS[0]}" "${TRANSPORTS[0]}" --no-srq --max-conn-qp 16 --max-pending-rx 16
    fi
}

# --- InfiniBand only: the SA, LIDs, MLIDs, partitions
IB_NAMES=(ib_sa_paths ib_sa_joins ib_unicast_by_lid ib_mlid_delivery ib_sa_first_contact ib_path_mtu ib_partition)
check_ib() {
    want_any "${IB_NAMES[@]}" || return 0
    if [ $IB = 0 ]; then
        skip_all "link layer $LINK (RoCE): no subnet manager, no LIDs, no SA; routed by GRH" "${IB_NAMES[@]}"
        return 0
    fi
    local out rc sa sb tr=${TRANSPORTS[0]:-} pk t
    if want ib_sa_paths; then
        out=$(timeout 30 "$IPOIB_CM" sa path --ca "$DEV" --port "$PORT" --dgid "$(cat "$SYS/$PEER_DEV/ports/1/gids/0")" 2>&1); rc=$?
        echo "$out" | sed 's/^/  sa path: /' | head -20
        res ib_sa_paths "$(pass_if [ $rc -eq 0 ])" "PathRecord $DEV -> $PEER_DEV from the SM at LID $(rd "$port/sm_lid"): $(echo "$out" | tr '\n' ' ' | cut -c1-240)"
    fi
    if want ib_sa_joins; then
        local shared=(); [ ${#KIPOIB[@]} -gt 0 ] && shared=(--shared)
        out=$(timeout 30 "$IPOIB_CM" sa join --ca "$DEV" --port "$PORT" "${shared[@]}" 2>&1); rc=$?
        echo "$out" | sed 's/^/  sa join: /' | head -20
        res ib_sa_joins "$(pass_if [ $rc -eq 0 ])" "the broadcast group of P_Key 0xffff${shared:+ (shared with kernel ipoib: no DELETE)}: $(echo "$out" | tr '\n' ' ' | cut -c1-240)"
    fi
    if [ "$PORT" != 1 ] || [ -z "$tr" ] || [ -z "$BIND_A" ]; then
        skip_all "no daemon pair here (port $PORT, transports: $tinfo, --bind ${BIND_A:-none})" ib_unicast_by_lid ib_mlid_delivery ib_sa_first_contact ib_path_mtu ib_partition
        return 0
    fi
    # connected mode, no static neighbours: ARP through the broadcast group (MLID), the
    # PathRecord asked at first contact, RC by LID
    if want_any ib_mlid_delivery ib_sa_first_contact ib_path_mtu; then
        t=$(up_s)
        if NO_NEIGH=1 pair_up "$tr"; then
            first_ping a 198.19.0.2; rc=$?
            sa=$(st a); sb=$(st b)
            res ib_mlid_delivery "$(pass_if [ $rc -eq 0 ] && printf '%s' "$sa" | grep -q '"reachable":[1-9]')" "ARP over the IPv4 broadcast group without static neighbours: a reached b after $P_FIRST s; a: sa_answered $(num "$sa" sa_answered), mcast_groups_joined $(num "$sa" mcast_groups_joined)"
            res ib_sa_first_contact "$(pass_if [ $rc -eq 0 ] && [ "$(num "$sa" path_failed_drops)" = 0 ])" "first ping after $P_FIRST s; a: path_wait_held $(num "$sa" path_wait_held), path_wait_drops $(num "$sa" path_wait_drops), path_failed_drops $(num "$sa" path_failed_drops), sa_timeouts $(num "$sa" sa_timeouts)"
            ping_in a 3 65000 198.19.0.2
            res ib_path_mtu "$(pass_if [ "$P_RECV" = 3 ] && [ "$(num "$sa" path_mtu)" = "$ACTIVE_MTU" ])" "port active_mtu $ACTIVE_MTU max_mtu $MAX_MTU; a: path_mtu $(num "$sa" path_mtu) ($(str "$sa" path_mtu_from)); RC 65000-byte pings $P_RECV/3"
        else
            skip_all "the pair did not start (logs $W/a.log, $W/b.log)" ib_mlid_delivery ib_sa_first_contact ib_path_mtu
        fi
        pair_down
    fi
    if want ib_unicast_by_lid; then
        if pair_up "$tr" --mode datagram; then
            ping_in a 10 56 198.19.0.2
            res ib_unicast_by_lid "$(pass_if [ "$P_RECV" = 10 ])" "datagram mode (UD unicast, address vectors by LID): $P_RECV/$P_SENT, avg $P_AVG ms; RC by LID: the ${tr}_* results"
        else res ib_unicast_by_lid FAIL "the datagram-mode pair did not start (logs $W/a.log, $W/b.log)"; fi
        pair_down
    fi
    if want ib_partition; then
        pk=$(for f in "$port"/pkeys/*; do cat "$f"; done 2>/dev/null | grep -v -i -x -E '0x0000|0xffff|0x7fff' | head -1)
        if [ -z "$pk" ]; then res ib_partition SKIP "the port's P_Key table holds the default partition only"
        else
            pk=$(printf '0x%04x' $(( pk | 0x8000 )))
            if pair_up "$tr" --pkey "$pk"; then
                first_ping a 198.19.0.2; ping_in a 10 56 198.19.0.2
                res ib_partition "$(pass_if [ "$P_RECV" = 10 ])" "P_Key $pk: $P_RECV/$P_SENT, avg $P_AVG ms"
            else res ib_partition FAIL "the pair on P_Key $pk did not start (logs $W/a.log, $W/b.log)"; fi
            pair_down
        fi
    fi
}

# --- next to kernel ipoib on the port: a child interface of the kernel's (same P_Key) in
# netns $NSP-k (198.19.0.3), our daemon A in $NSP-a
K_NAMES=(kipoib_datagram_to_kernel kipoib_datagram_from_kernel kipoib_connected_to_kernel kipoib_connected_from_kernel kipoib_datagram_2044_4092 kipoib_broadcast_after_stop kipoib_slow_receiver)
kernel_child() { # MODE: kernel ipoib child hwck$$ of ${KIPOIB[0]} in netns k, mode MODE
    local k=hwck$$ parent=${KIPOIB[0]} pk
    ip netns exec "$NSP-k" ip link del "$k" 2>/dev/null
    pk=$(cat "/sys/class/net/$parent/pkey" 2>/dev/null || echo 0xffff)
    ip link add link "$parent" name "$k" type ipoib pkey "$pk" mode "$1" || return 1
    netns k || return 1
    ip link set "$k" netns "$NSP-k" || { ip link del "$k"; return 1; }
    ip -n "$NSP-k" addr add 198.19.0.3/24 dev "$k" &&
        ip -n "$NSP-k" addr add 2001:db8:19::3/64 dev "$k" nodad &&
        ip -n "$NSP-k" link set "$k" up
}
check_kernel_ipoib() {
    want_any "${K_NAMES[@]}" || return 0
    if [ ${#KIPOIB[@]} -eq 0 ]; then
        skip_all "no kernel ipoib interface on $DEV port $PORT$([ $IB = 0 ] && echo " (link layer $LINK: kernel ipoib attaches to InfiniBand ports only)")" "${K_NAMES[@]}"
        return 0
    fi
    local tr=${TRANSPORTS[0]:-} mode ok s0 s1 a0 a1 sz out
    if [ "$PORT" != 1 ] || [ -z "$tr" ] || [ -z "$BIND_A" ]; then
        skip_all "no daemon here (port $PORT, transports: $tinfo, --bind ${BIND_A:-none})" "${K_NAMES[@]}"
        return 0
    fi
    for mode in datagram connected; do
        want_any "kipoib_${mode}_to_kernel" "kipoib_${mode}_from_kernel" kipoib_datagram_2044_4092 || continue
        if ! kernel_child "$mode"; then
            skip_all "could not add a $mode-mode child of ${KIPOIB[0]} (ip link add ... type ipoib)" "kipoib_${mode}_to_kernel" "kipoib_${mode}_from_kernel"
            continue
        fi
        if ! daemon_up a "$DEV" "$BIND_A" 1 "$tr"; then
            res "kipoib_${mode}_to_kernel" FAIL "our daemon did not start (log $W/a.log)"; pair_down; continue
        fi
        first_ping a 198.19.0.3; ping_in a 10 56 198.19.0.3
        out="ping $P_RECV/$P_SENT avg $P_AVG ms (first after $P_FIRST s)"; ok=$P_RECV
        if have iperf3 && iperf_in k 198.19.0.3 a 10; then out="$out; iperf3 TCP 10 s: $IPERF Mbit/s"; else have iperf3 && { out="$out; iperf3 gave no figure"; ok=0; }; fi
        res "kipoib_${mode}_to_kernel" "$(pass_if [ "$ok" = 10 ])" "our daemon ($tr) -> kernel ipoib in $mode mode: $out"
        ping_in k 10 56 198.19.0.1
        out="ping $P_RECV/$P_SENT avg $P_AVG ms"; ok=$P_RECV
        if have iperf3 && iperf_in a 198.19.0.1 k 10; then out="$out; iperf3 TCP 10 s: $IPERF Mbit/s"; else have iperf3 && { out="$out; iperf3 gave no figure"; ok=0; }; fi
        res "kipoib_${mode}_from_kernel" "$(pass_if [ "$ok" = 10 ])" "kernel ipoib in $mode mode -> our daemon: $out"
        if [ "$mode" = datagram ] && want kipoib_datagram_2044_4092; then
            s0=$(st a); out=""; ok=PASS
            for sz in 2016 4064; do  # 2044 and 4092 bytes of IP
                if [ $(( sz + 28 )) -gt "$(cat "/sys/class/net/${KIPOIB[0]}/mtu" 2>/dev/null || echo 0)" ] &&
                   [ $(( sz + 28 )) -gt "$(ip netns exec "$NSP-k" cat /sys/class/net/hwck$$/mtu 2>/dev/null || echo 0)" ]; then
                    out="$out $((sz + 28)): larger than the kernel's datagram MTU;"; continue
                fi
                ping_in k 3 "$sz" 198.19.0.1
                out="$out $((sz + 28)): $P_RECV/3;"; [ "$P_RECV" = 3 ] || ok=FAIL
            done
            s1=$(st a)
            res kipoib_datagram_2044_4092 "$ok" "kernel datagram-mode pings of IP size${out% ;} (our rx_ud_dropped $(num "$s0" rx_ud_dropped) -> $(num "$s1" rx_ud_dropped))"
        fi
        daemon_stop a; ip netns del "$NSP-a" 2>/dev/null
    done
    if want kipoib_broadcast_after_stop; then
        # A stops (on a port with kernel ipoib its memberships are shared: no DELETE); B, new,
        # must still find the kernel's interface by ARP through the broadcast group.
        if kernel_child datagram && NO_NEIGH=1 daemon_up a "$DEV" "$BIND_A" 1 "$tr" && first_ping a 198.19.0.3; then
            daemon_stop a; a0=$DRC
            if daemon_up b "$PEER_DEV" "$BIND_B" 2 "$tr" && first_ping b 198.19.0.3; then ok=PASS; else ok=FAIL; fi
            res kipoib_broadcast_after_stop "$ok" "daemon a stopped (exit $a0); kernel ipoib still answered ARP through the broadcast group: first ping from a new daemon after $P_FIRST s"
        else
            res kipoib_broadcast_after_stop FAIL "set-up: the kernel child or daemon a did not reach each other (log $W/a.log)"
        fi
        pair_down
    fi
    if want kipoib_slow_receiver; then
        # A kernel sender in connected mode (ipoib_cm: rnr_retry 0) into our daemon made slow.
        if ! have iperf3; then res kipoib_slow_receiver SKIP "no iperf3 on this host"
        elif kernel_child connected && daemon_up a "$DEV" "$BIND_A" 1 "$tr" --srq-depth 1024 --rx-spare 16 --fault-tun-rate 2000 && first_ping k 198.19.0.1; then
            s0=$(st a); a0=$(num "$s0" rx_accepted)
            iperf_in a 198.19.0.1 k 5 -u -b 50M -l 1200
            ping_in k 3 56 198.19.0.1
            s1=$(st a); a1=$(num "$s1" rx_accepted)
            res kipoib_slow_receiver "$(pass_if [ "$a0" = "$a1" ] && [ "$P_RECV" = 3 ] && [ "$(num "$s1" rx_buffer_drops)" -gt 0 ])" "kernel sender (connected mode) -> our daemon taking 2,000 packets a second: rx_accepted $a0 -> $a1 (the kernel's connection kept), rx_buffer_drops $(num "$s1" rx_buffer_drops), ping after $P_RECV/3"
        else
            res kipoib_slow_receiver FAIL "set-up: the connected-mode kernel child or daemon a did not reach each other (log $W/a.log)"
        fi
        pair_down
    fi
    ip netns exec "$NSP-k" ip link del "hwck$$" 2>/dev/null
}

# --- --destructive: the device reset under a running daemon
check_device_reset() {
    want device_reset || return 0
    [ $DESTRUCTIVE = 1 ] || { res device_reset SKIP "without --destructive"; return 0; }
    local method="" tr=${TRANSPORTS[0]:-} t i ok rc info
    if [ "$PORT" != 1 ] || [ -z "$tr" ] || [ -z "$BIND_A" ]; then
        res device_reset SKIP "no daemon here (port $PORT, transports: $tinfo)"; return 0
    fi
    if [ "$DRIVER" = rxe ] && [ -n "$NETDEV" ]; then method="rdma link delete $DEV; rdma link add $DEV type rxe netdev $NETDEV"
    elif [ -n "$PCI" ] && have devlink && devlink dev show "pci/$PCI" > /dev/null 2>&1; then method="devlink dev reload pci/$PCI"
    else res device_reset SKIP "no reset that the $DRIVER driver offers here (rxe: rdma link; PCI: devlink dev reload)"; return 0; fi
    if ! pair_up "$tr" || ! first_ping a 198.19.0.2; then
        res device_reset FAIL "the pair did not start or reach each other (logs $W/a.log, $W/b.log)"; pair_down; return 0
    fi
    t=$(up_s)
    timeout 60 sh -c "$method" > "$W/reset.log" 2>&1; rc=$?
    info="$method: exit $rc after $(el "$t") s"
    i=0; while [ $i -lt 600 ] && kill -0 "${DPID[a]}" 2>/dev/null; do
        [ $i -ge 100 ] && [ "$DRIVER" != rxe ] && break  # a driver that disassociates: survived in place?
        sleep 0.1; i=$((i + 1)); done
    for _ in $(seq 300); do case $(cat "$port/state" 2>/dev/null) in *ACTIVE*) break ;; esac; sleep 0.2; done
    [ $IB = 1 ] || for _ in $(seq 100); do gid_of_ip "$DEV" "$BIND_A" && break; sleep 0.1; done
    if kill -0 "${DPID[a]}" 2>/dev/null; then
        if first_ping a 198.19.0.2; then ok=PASS; info="$info; daemon a survived in place, ping after $P_FIRST s"
        else ok=FAIL; info="$info; daemon a still running and not reaching b"; fi
    else
        wait "${DPID[a]}" 2>/dev/null; rc=$?; DPID[a]=""
        info="$info; daemon a exited $rc after $(el "$t") s"
        ok=FAIL
        if [ $rc = 3 ]; then
            [ "$PEER_DEV" = "$DEV" ] && { daemon_stop b; daemon_up b "$PEER_DEV" "$BIND_B" 2 "$tr"; }
            if daemon_up a "$DEV" "$BIND_A" 1 "$tr" && neigh a 2 "${HW[b]}" && neigh b 1 "${HW[a]}" && first_ping a 198.19.0.2; then
                ok=PASS; info="$info (as documented), restarted: ping after $P_FIRST s"
            else info="$info (as documented), but restarted it did not reach b"; fi
        fi
    fi
    res device_reset "$ok" "$info"
    pair_down
}

echo "== checks ($DEV port $PORT <-> $PEER_DEV; logs $W)"
check_conformance
check_pairs
check_ib
check_kernel_ipoib
check_device_reset

# ============================================================================ summary, JSON
np=0 nf=0 ns=0
for v in "${R_VERDICTS[@]}"; do case $v in PASS) np=$((np + 1)) ;; FAIL) nf=$((nf + 1)) ;; SKIP) ns=$((ns + 1)) ;; esac; done
# The README's "Unverified, needs InfiniBand hardware" list, each line with its results.
UNVERIFIED=(
    "forwarding by LID (unicast datagrams and RC connections)|hw_check_ib_unicast_by_lid hw_check_ib_path_mtu"
    "delivery by MLID|hw_check_ib_mlid_delivery"
    "interoperation with kernel ipoib_cm in either direction|hw_check_kipoib_connected_to_kernel hw_check_kipoib_connected_from_kernel"
    "AF_IB connections to its service IDs|hw_check_kipoib_connected_to_kernel"
    "partitions other than the default on a real port|hw_check_ib_partition"
    "port events as a real SM raises them (SM failover, LID changes)|none: hw-check raises no SM event (restart the SM by hand, then run it again)"
    "coexistence with kernel ipoib's group memberships on one port|hw_check_kipoib_broadcast_after_stop hw_check_ib_sa_joins"
    "the active_mtu and max_mtu an HCA reports; RC at a 4096-byte path MTU from a PathRecord|hw_check_ib_path_mtu"
    "datagrams of 2044/4092 bytes from a kernel ipoib peer in datagram mode|hw_check_kipoib_datagram_2044_4092"
    "first contact with a real SA's timing|hw_check_ib_sa_first_contact hw_check_ib_sa_paths"
    "a kernel ipoib_cm sender (rnr_retry 0) into a slow receiver keeping its connection|hw_check_kipoib_slow_receiver"
    "mlx5 cleaning a destroyed QP's completions and handing its SRQ WQEs back|hw_check_conformance"
    "a device reset|hw_check_device_reset"
    "what the QP command thread saves on a ConnectX|hw_check_qp_command_times"
)
echo "== summary: $np PASS, $nf FAIL, $ns SKIP in $(el "$T0") s ($DEV port $PORT, $LINK, kernel $(uname -r))"
echo "== the README's unverified list:"
for u in "${UNVERIFIED[@]}"; do
    line=${u%%|*} names=${u#*|} v=""
    case $names in none:*) v=" $names" ;; *) for n in $names; do v="$v $n $(verdict_of "$n"),"; done; v=${v%,} ;; esac
    echo "  - $line:$v"
done

jstr() { printf '"%s"' "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr '\n\t' '  ')"; }
{
    printf '{\n  "tool": "hw-check", "schema": 1,\n  "host": %s, "kernel": %s, "date": %s,\n' \
        "$(jstr "$(hostname)")" "$(jstr "$(uname -r)")" "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
    printf '  "device": %s, "port": %s, "peer_device": %s, "destructive": %s,\n' \
        "$(jstr "$DEV")" "$PORT" "$(jstr "$PEER_DEV")" "$([ $DESTRUCTIVE = 1 ] && echo true || echo false)"
    printf '  "facts": {\n'
    for i in "${!F_KEYS[@]}"; do
        printf '    %s: %s%s\n' "$(jstr "${F_KEYS[$i]}")" "$(jstr "${F_VALS[$i]}")" "$([ "$i" -lt $((${#F_KEYS[@]} - 1)) ] && echo ,)"
    done
    printf '  },\n  "results": [\n'
    for i in "${!R_NAMES[@]}"; do
        printf '    {"name": %s, "verdict": %s, "info": %s}%s\n' "$(jstr "${R_NAMES[$i]}")" \
            "$(jstr "${R_VERDICTS[$i]}")" "$(jstr "${R_INFOS[$i]}")" "$([ "$i" -lt $((${#R_NAMES[@]} - 1)) ] && echo ,)"
    done
    printf '  ],\n  "summary": {"pass": %d, "fail": %d, "skip": %d, "seconds": %s},\n' "$np" "$nf" "$ns" "$(el "$T0")"
    printf '  "unverified": [\n'
    for i in "${!UNVERIFIED[@]}"; do
        u=${UNVERIFIED[$i]}
        printf '    {"line": %s, "results": %s}%s\n' "$(jstr "${u%%|*}")" "$(jstr "${u#*|}")" "$([ "$i" -lt $((${#UNVERIFIED[@]} - 1)) ] && echo ,)"
    done
    printf '  ]\n}\n'
} > "$JSON"
echo "== JSON: $JSON (logs $W)"
[ "$nf" -eq 0 ]
