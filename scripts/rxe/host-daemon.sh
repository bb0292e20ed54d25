#!/bin/sh
# Host side of check (e), run by the rxe-lab harness in the tap netns (--host-cmd): waits for
# the guest daemon's `GUEST_HWADDR` console line (it is up), then runs `ipoib-cm up
# --cm-transport udp` on the soft provider, with no static neighbour and no --peer (the guest
# is found through the multicast broadcast group), and an iperf3 server, until the guest
# prints `GUEST_DONE`. No --no-icrc-v4: the daemon solves for the IPv4 ID rxe picked from
# each ICRC, logs that once for the guest, and counts no ICRC drops
# (RESULT daemon_host_icrc_id_solved). $IPOIB_CM is the binary.
# CM=umad (check `daemon-umad`): the guest's CM runs on its kernel's QP1 through umad, so ours
# runs on QP1 too (`--cm-transport qp1`); RESTART=1: at the guest's GUEST_PRE_KILL the RX
# connections from it are noted, and at GUEST_REPINGED (after its SIGKILL and restart) none of
# them may be left, exactly one RX connection from it live, and peer_restarts counted.
BIN=${IPOIB_CM:?}
CM=${CM:-udp}
case $CM in umad) HOST_CM=qp1 ;; *) HOST_CM=$CM ;; esac
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
[ -n "$hw" ] || { echo "RESULT daemon_host_up FAIL no GUEST_HWADDR after $(el "$t0")s"; exit 1; }
ip link set lo up 2>/dev/null
"$BIN" up --bind "$RXE_LAB_HOST_IP" --cm-transport "$HOST_CM" --ifname ib0 \
  --addr 10.77.0.1/24 --addr fd77::1/64 \
  --control-socket $SOCK --drain-timeout 5s --log info > /tmp/rxe-host-daemon.$$ 2>&1 &
DPID=$!
sleep 1
if kill -0 $DPID 2>/dev/null; then
  echo "RESULT daemon_host_up PASS $(el "$t0")s guest $hw"
else
  cat /tmp/rxe-host-daemon.$$
  echo "RESULT daemon_host_up FAIL"; exit 1
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
echo "RESULT daemon_host_discovery_arp_nd $ok $(el "$t1")s (the host resolves the rxe guest)"
IPID=
if command -v iperf3 > /dev/null; then
  iperf3 -s -1 -B 10.77.0.1 > /tmp/rxe-host-iperf.$$ 2>&1 &
  IPID=$!
fi
# Waits (up to ~5 min) for the console marker $1; false if GUEST_DONE comes first.
wait_marker() {
  j=0
  while [ $j -lt 1500 ]; do
    grep -q "$1" "$CON" 2>/dev/null && return 0
    grep -q GUEST_DONE "$CON" 2>/dev/null && return 1
    sleep 0.2; j=$((j + 1))
  done
  return 1
}
# The QPNs of our RX connections (one a line), and a counter, from the status JSON on stdin.
rx_qpns() { python3 -c 'import json,sys; [print(c.get("qpn")) for c in json.load(sys.stdin).get("rx", [])]'; }
rx_live() { python3 -c 'import json,sys; print(sum(1 for c in json.load(sys.stdin).get("rx", []) if c.get("state") == "live"))'; }
counter() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("counters", {}).get(sys.argv[1], d.get("provider", {}).get(sys.argv[1], 0)))' "$1"; }
if [ "${RESTART:-0}" = 1 ]; then
  ok=FAIL old= new= live= pr0= pr=
  if wait_marker GUEST_PRE_KILL; then
    js=$("$BIN" status --json --control-socket $SOCK 2>/dev/null)
    old=$(echo "$js" | rx_qpns | tr '\n' ' '); pr0=$(echo "$js" | counter peer_restarts)
    if wait_marker GUEST_REPINGED; then
      js=$("$BIN" status --json --control-socket $SOCK 2>/dev/null)
      new=$(echo "$js" | rx_qpns | tr '\n' ' '); live=$(echo "$js" | rx_live)
      pr=$(echo "$js" | counter peer_restarts)
      ok=PASS
      [ -n "$old" ] || ok=FAIL
      for q in $old; do case " $new " in *" $q "*) ok=FAIL ;; esac; done
      [ "$live" = 1 ] || ok=FAIL
      [ "${pr:-0}" -gt "${pr0:-0}" ] || ok=FAIL
    fi
  fi
  echo "RESULT daemon_host_rx_reaped_after_kill $ok rx_before=[${old% }] rx_after=[${new% }] live=${live:-?} peer_restarts=${pr0:-?}->${pr:-?}"
fi
wait_marker GUEST_DONE
"$BIN" status --control-socket $SOCK
js=$("$BIN" status --json --control-socket $SOCK 2>&1)
num() { echo "$js" | sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" | head -1; }
bad=$(num rx_bad_icrc); solved=$(num rx_icrc_id_solved)
[ -z "$IPID" ] || kill $IPID 2>/dev/null
t1=$(date +%s.%N)
kill -TERM $DPID
wait $DPID; rc=$?
grep -E "stopped|WARN|ERROR" /tmp/rxe-host-daemon.$$ | tail -5 | cut -c1-400
# Exactly one line for the guest (logged once per peer), and every rxe datagram accepted.
lines=$(grep -c "ICRCs check only with a nonzero IP ID" /tmp/rxe-host-daemon.$$)
grep "ICRCs check only with a nonzero IP ID" /tmp/rxe-host-daemon.$$ | head -2 | cut -c1-400
ok=FAIL
[ "$lines" = 1 ] && [ "${bad:-x}" = 0 ] && [ "${solved:-0}" -gt 0 ] && ok=PASS
echo "RESULT daemon_host_icrc_id_solved $ok log_lines=$lines rx_bad_icrc=${bad:-?} rx_icrc_id_solved=${solved:-?} (no --no-icrc-v4)"
rm -f /tmp/rxe-host-daemon.$$ /tmp/rxe-host-iperf.$$
echo "RESULT daemon_host_stop $([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc $(el "$t1")s"
[ $rc -eq 0 ]
