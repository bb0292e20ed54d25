#!/bin/sh
# Host side of check (i), `ud-mtu`, run by the rxe-lab harness in the tap netns (--host-cmd):
# waits for the guest daemon's `GUEST_HWADDR` console line, sets the tap's MTU to 1500 (the
# guest's side stays at 9000, so rxe's port carries 4096), then runs `ipoib-cm up` on the soft
# provider with --bind on the tap: its path MTU is 1024 (RESULT udmtu_host_path_mtu), its UD
# receive buffers hold the GRH and the port's largest MTU (4096). The guest's datagram-mode
# daemon sends 3 IP packets of 2044 bytes, then 3 of 4092, as UD datagrams: each must be
# delivered to the TUN device, none dropped by the provider for want of room
# (RESULT udmtu_host_rx_2044, udmtu_host_rx_4092; before, with buffers of GRH + path MTU,
# rx_ud_dropped counted them and nothing arrived). $IPOIB_CM is the binary.
BIN=${IPOIB_CM:?}
# shellcheck source=scripts/rxe/host-lib.sh
. "$(dirname "$0")/host-lib.sh"
SOCK=/tmp/rxe-host-udmtu.$$.sock
LOGF=/tmp/rxe-host-udmtu.$$
t0=$(date +%s.%N)
wait_for GUEST_HWADDR || { echo "RESULT udmtu_host_up FAIL no GUEST_HWADDR after $(el "$t0")s"; exit 1; }
ip link set lo up 2>/dev/null
ip link set "${RXE_LAB_TAP:?}" mtu 1500
"$BIN" up --bind "$RXE_LAB_HOST_IP" --ifname ib0 --addr 10.77.0.1/24 \
  --control-socket $SOCK --log info > $LOGF 2>&1 &
DPID=$!
sleep 1
if ! kill -0 $DPID 2>/dev/null; then
  cat $LOGF
  echo "RESULT udmtu_host_up FAIL"; exit 1
fi
line=$(grep -m1 " started" $LOGF)
echo "$line" | cut -c1-600
pm=$(printf '%s' "$line" | sed -n 's/.* path_mtu=\([0-9]*\).*/\1/p')
ok=FAIL
[ "$pm" = 1024 ] && printf '%s' "$line" | grep -q "path_mtu_from=--bind link mtu 1500" && ok=PASS
echo "RESULT udmtu_host_path_mtu $ok path_mtu=${pm:-?} tap mtu $(cat /sys/class/net/"$RXE_LAB_TAP"/mtu)"
# The totals of the status document: IP packets and bytes written to the TUN device, and the
# provider's UD datagrams dropped for want of a (big enough) receive buffer.
snap() {
  js=$("$BIN" status --json --control-socket $SOCK 2>&1)
  num() { printf '%s' "$js" | tr -d ' \n' | grep -o "\"$1\":[0-9]*" | head -1 | grep -o '[0-9]*$'; }
  p=$(num rx_packets); b=$(num rx_bytes); d=$(num rx_ud_dropped)
  echo "${p:-0} ${b:-0} ${d:-0}"
}
check() { # NAME SIZE BEFORE AFTER
  set -- "$1" "$2" $3 $4
  dp=$(($6 - $3)); db=$(($7 - $4)); dd=$(($8 - $5))
  ok=FAIL
  [ $dp -ge 3 ] && [ $db -ge $((3 * $2)) ] && [ $dd -eq 0 ] && ok=PASS
  echo "RESULT $1 $ok 3 datagrams of $2 bytes of IP sent: rx_packets +$dp rx_bytes +$db rx_ud_dropped +$dd"
}
wait_for GUEST_2044_START || { echo "RESULT udmtu_host_rx_2044 FAIL guest never pinged"; kill $DPID; exit 1; }
s0=$(snap)
wait_for GUEST_2044_DONE && sleep 1
s1=$(snap)
check udmtu_host_rx_2044 2044 "$s0" "$s1"
wait_for GUEST_4092_DONE && sleep 1
s2=$(snap)
check udmtu_host_rx_4092 4092 "$s1" "$s2"
wait_for GUEST_DONE
"$BIN" status --control-socket $SOCK | head -8
kill -TERM $DPID
wait $DPID; rc=$?
grep -E "WARN|ERROR" $LOGF | tail -3 | cut -c1-300
rm -f $LOGF
echo "RESULT udmtu_host_stop $([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc"
[ $rc -eq 0 ]
