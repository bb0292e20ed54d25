#!/bin/sh
# Host side of check (j), `cm-mtu`, run by the rxe-lab harness in the tap netns (--host-cmd):
# waits for the guest daemon's `GUEST_HWADDR` console line, sets the tap's MTU to 1500 (the
# guest's side stays at 9000, so rxe's port carries 4096), then runs `ipoib-cm up` on the soft
# provider with --bind on the tap: its path MTU is 1024 (RESULT cmmtu_host_path_mtu). The
# guest's REQ at 4096 gets REJ 26 naming 1024 (RESULT cmmtu_host_rej26); when the guest has
# pinged us (`GUEST_PINGED`), 60000-byte pings go the other way (RESULT
# cmmtu_host_ping_60000). $IPOIB_CM is the binary.
BIN=${IPOIB_CM:?}
# shellcheck source=scripts/rxe/host-lib.sh
. "$(dirname "$0")/host-lib.sh"
SOCK=/tmp/rxe-host-cmmtu.$$.sock
LOGF=/tmp/rxe-host-cmmtu.$$
num() { # NAME: a number of the status document
  "$BIN" status --json --control-socket $SOCK 2>/dev/null | tr -d ' \n' | grep -o "\"$1\":[0-9]*" \
    | head -1 | grep -o '[0-9]*$'
}
t0=$(date +%s.%N)
wait_for GUEST_HWADDR || { echo "RESULT cmmtu_host_up FAIL no GUEST_HWADDR after $(el "$t0")s"; exit 1; }
ip link set lo up 2>/dev/null
ip link set "${RXE_LAB_TAP:?}" mtu 1500
"$BIN" up --bind "$RXE_LAB_HOST_IP" --ifname ib0 --addr 10.77.0.1/24 \
  --control-socket $SOCK --log info > $LOGF 2>&1 &
DPID=$!
sleep 1
if ! kill -0 $DPID 2>/dev/null; then
  cat $LOGF
  echo "RESULT cmmtu_host_up FAIL"; exit 1
fi
pm=$(num path_mtu)
echo "RESULT cmmtu_host_path_mtu $([ "$pm" = 1024 ] && echo PASS || echo FAIL) path_mtu=${pm:-?} tap mtu $(cat /sys/class/net/"$RXE_LAB_TAP"/mtu)"
wait_for GUEST_PINGED || { echo "RESULT cmmtu_host_ping_60000 FAIL the guest never pinged"; kill $DPID; exit 1; }
rej=$(num rx_mtu_rejected)
grep "rx rejected.*reason=path-mtu" $LOGF | head -1 | cut -c1-300
echo "RESULT cmmtu_host_rej26 $([ "${rej:-0}" -ge 1 ] && echo PASS || echo FAIL) rx_mtu_rejected=${rej:-0}"
ping -c 5 -i 0.5 -W 5 -s 60000 10.77.0.2 > $LOGF.ping 2>&1
got=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' $LOGF.ping)
echo "RESULT cmmtu_host_ping_60000 $([ "${got:-0}" = 5 ] && echo PASS || echo FAIL) ${got:-0} of 5"
wait_for GUEST_DONE
"$BIN" status --control-socket $SOCK | head -12
kill -TERM $DPID
wait $DPID; rc=$?
grep -E "WARN|ERROR" $LOGF | tail -3 | cut -c1-300
rm -f $LOGF $LOGF.ping
echo "RESULT cmmtu_host_stop $([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc"
[ $rc -eq 0 ]
