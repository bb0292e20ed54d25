#!/usr/bin/env bash
# Two-node demo on the software fabric (README: `sudo scripts/demo.sh`).
#
# Installs what a fresh Debian 12 machine lacks for it (scripts/setup.sh demo: a compiler,
# iproute2, ping, iperf3, Rust), builds the release binary, brings up a
# two-node lab (network namespaces demo1 and demo2 on a bridge, underlay 198.18.0.K, an
# ipoib-cm daemon in each with interface ib0 = 198.19.0.K/24 and 2001:db8:19::K/64), pings
# over IPv4 and IPv6, runs a short iperf3, prints both nodes' status, and tears everything
# down again. Nothing runs outside the namespaces it creates.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/setup.sh
source scripts/setup.sh demo

section() { printf '\n==== %s ====\n' "$*"; }

section "cargo build --release"
cargo build --release

export LAB_PREFIX=demo
export IPOIB_CM_BIN="$PWD/target/release/ipoib-cm"
lab() { bash scripts/lab.sh "$@"; }
trap 'lab down >/dev/null 2>&1 || true' EXIT
lab down >/dev/null 2>&1 || true

section "two nodes up"
lab up 2

section "ping IPv4 node 1 -> node 2 (first packet: ARP, CM REQ/REP/RTU)"
lab exec 1 ping -n -c 3 -i 0.2 -W 3 198.19.0.2

section "ping IPv6 node 2 -> node 1 (Neighbor Discovery over UD)"
lab exec 2 ping -6 -n -c 3 -i 0.2 -W 3 2001:db8:19::1

section "ping with 65000-byte payloads (one RC message each)"
lab exec 1 ping -n -c 3 -i 0.2 -W 3 -s 65000 198.19.0.2

section "iperf3 TCP, 3 s"
lab exec 2 iperf3 -s -1 >/dev/null 2>&1 &
sleep 0.5
lab exec 1 iperf3 -c 198.19.0.2 -t 3 | tail -n 4
wait || true

section "status, node 1"
"$IPOIB_CM_BIN" status --control-socket "/run/ipoib-cm-demo/node1.sock"

section "status, node 2"
"$IPOIB_CM_BIN" status --control-socket "/run/ipoib-cm-demo/node2.sock"

section "tear down"
lab down
trap - EXIT
setup_host_unchanged
echo "demo done"
