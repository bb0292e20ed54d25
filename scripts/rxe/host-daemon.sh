#!/bin/sh
# Host side of check (e), run by the rxe-lab harness in the tap netns (--host-cmd): waits for
# the guest daemon's `GUEST_HWADDR` console line (it is up), then runs `ipoib-cm up
# --cm-transport udp` on the soft provider, with no static neighbour and no --peer (the guest
# is found through the multicast broadcast group), and an iperf3 server, until the guest
# prints `GUEST_DONE`. No --no-icrc-v4: the daemon solves for the IPv4 ID rxe picked from
# each ICRC, logs that once for the guest, and counts no ICRC drops
# (RESULT ${P}_host_icrc_id_solved). $IPOIB_CM is the binary.
BIN=${IPOIB_CM:?}
# CM: the guest's transport (guest-daemon/run.sh). udp pairs with udp; any other meets our CM
# over QP1 here (the guest's kernel CM at its rdma_cm port: its hwaddr has flag 0x20).
CM=${CM:-udp}
P=daemon; HCM=udp
[ "$CM" = udp ] || { P=daemon_$CM; HCM=qp1; }
CON=${RXE_LAB_RUN:?}/console.raw
SOCK=/tmp/rxe-host-ib0.$$.sock
el() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
t0=$(date +%s.%N)
hw=
i=0
while [ $i -lt 1500 ]; do   # the guest boots first (~1-2 min under TCG)
  hw=$(tr -d '\r' < "$CON" 2>/dev/null | sed -n 's/.*GUEST_HWADDR \([0-9a-f:]*\).*/\1/p' | head -1)
  [ -n "$hw" ] && break
  grep -q GUEST_DONE "$CON" 2>/dev/null && break
  sleep 0.2; i=$((i + 1))
done
[ -n "$hw" ] || { echo "RESULT ${P}_host_up FAIL no GUEST_HWADDR after $(el "$t0")s"; exit 1; }
ip link set lo up 2>/dev/null
"$BIN" up --bind "$RXE_LAB_HOST_IP" --cm-transport $HCM --ifname ib0 \
  --addr 10.77.0.1/24 --addr fd77::1/64 \
  --control-socket $SOCK --drain-timeout 5s --rx-timeout 8s --log info \
  ${WORKERS:+--workers "$WORKERS"} > /tmp/rxe-host-daemon.$$ 2>&1 &
DPID=$!
sleep 1
if kill -0 $DPID 2>/dev/null; then
  echo "RESULT ${P}_host_up PASS $(el "$t0")s guest $hw"
else
  cat /tmp/rxe-host-daemon.$$
  echo "RESULT ${P}_host_up FAIL"; exit 1
fi
# Discovery the other way: we resolve the guest (ARP and ND to 239.255.255.255, which the
# guest's rxe receives because its provider joined the group) instead of waiting to be asked.
t1=$(date +%s.%N)
ok=FAIL
i=0
while [ $i -lt 30 ]; do
  if ping -c 1 -W 2 10.77.0.2 > /dev/null 2>&1; then
    ping -6 -c 1 -W 3 fd77::2 > /dev/null 2>&1 && ok=PASS
    break
  fi
  i=$((i + 1))
done
"$BIN" status --control-socket $SOCK | grep -A3 '^neighbours'
echo "RESULT ${P}_host_discovery_arp_nd $ok $(el "$t1")s (the host resolves the rxe guest)"
IPID=
if command -v iperf3 > /dev/null; then
  iperf3 -s -1 -B 10.77.0.1 > /tmp/rxe-host-iperf.$$ 2>&1 &
  IPID=$!
fi
# The guest daemon is SIGKILLed: its RX QP here must be reaped (status: no RX connection
# left, a reap counted), within the guest's KILL_WAIT (15 s).
i=0
while [ $i -lt 1500 ] && ! grep -q GUEST_KILLED "$CON" 2>/dev/null; do sleep 0.2; i=$((i + 1)); done
js0=$("$BIN" status --json --control-socket $SOCK 2>&1 | tr -d ' \n')
t1=$(date +%s.%N)
ok=FAIL
i=0
while [ $i -lt 70 ]; do
  js=$("$BIN" status --json --control-socket $SOCK 2>&1 | tr -d ' \n')
  case $js in *'"rx":[]'*) ok=PASS; break ;; esac
  sleep 0.2; i=$((i + 1))
done
reaps() { printf '%s' "$1" | grep -o '"rx_\(dreq\|stale\)_reaped":[0-9]*' | grep -o '[0-9]*$' | awk '{s += $1} END {print s + 0}'; }
echo "RESULT ${P}_host_rx_reaped $ok $(el "$t1")s reaps $(reaps "$js0")->$(reaps "$js") ($(printf '%s' "$js" | grep -o '"rx_dreq_reaped":[0-9]*'))"
i=0
while [ $i -lt 1500 ] && ! grep -q GUEST_DONE "$CON" 2>/dev/null; do sleep 0.2; i=$((i + 1)); done
"$BIN" status --control-socket $SOCK
js=$("$BIN" status --json --control-socket $SOCK 2>&1)
num() { echo "$js" | sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" | head -1; }
bad=$(num rx_bad_icrc); solved=$(num rx_icrc_id_solved)
[ -z "$IPID" ] || kill $IPID 2>/dev/null
t1=$(date +%s.%N)
kill -TERM $DPID
wait $DPID; rc=$?
grep -E "stopped|WARN|ERROR" /tmp/rxe-host-daemon.$$ | tail -5 | cut -c1-400
[ -n "${SHOW_EVENTS:-}" ] && grep -E "ipoib_cm::event" /tmp/rxe-host-daemon.$$ | tail -40 | cut -c1-200
# Exactly one line for the guest (logged once per peer), and every rxe datagram accepted.
lines=$(grep -c "ICRCs check only with a nonzero IP ID" /tmp/rxe-host-daemon.$$)
grep "ICRCs check only with a nonzero IP ID" /tmp/rxe-host-daemon.$$ | head -2 | cut -c1-400
ok=FAIL
[ "$lines" = 1 ] && [ "${bad:-x}" = 0 ] && [ "${solved:-0}" -gt 0 ] && ok=PASS
echo "RESULT ${P}_host_icrc_id_solved $ok log_lines=$lines rx_bad_icrc=${bad:-?} rx_icrc_id_solved=${solved:-?} (no --no-icrc-v4)"
rm -f /tmp/rxe-host-daemon.$$ /tmp/rxe-host-iperf.$$
echo "RESULT ${P}_host_stop $([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc $(el "$t1")s"
[ $rc -eq 0 ]
