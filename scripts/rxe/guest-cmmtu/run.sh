#!/bin/sh
# Guest side of check (j), `cm-mtu`: a connected-mode daemon (`ipoib-cm up --provider verbs
# --cm-transport umad`, our CM on the kernel's QP1, in a guest without ib_cm) on rxe0, whose
# link (--mtu 9000) gives rxe an active MTU of 4096, and `ipoib-cm up` on the soft provider in
# the host netns, whose --bind link (the tap, set to 1500 there) carries 1024
# (scripts/rxe/host-cmmtu.sh): two ends whose links differ. Our REQ at 4096 draws the host's
# REJ 26 naming 1024 in its ARI and goes again at 1024 from the same QP
# (RESULT cmmtu_guest_mtu_lowered); 60000-byte pings cross to the host (5 of 5,
# RESULT cmmtu_guest_ping_60000), then the host's cross to us (we count the bytes
# that arrive, RESULT cmmtu_guest_rx_60000). Markers on the console pace the host:
# GUEST_HWADDR (up), GUEST_PINGED, GUEST_DONE.
. /lib/rxelab.sh
B=/extra/ipoib-cm
SOCK=/tmp/ib0.sock
A4=10.77.0.2 H4=10.77.0.1
modprobe tun 2>/dev/null
[ -c /dev/net/tun ] || { mkdir -p /dev/net; mknod /dev/net/tun c 10 200; }
el() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}'; }
num() { # NAME: a number of the status document
  $B status --json --control-socket $SOCK 2>/dev/null | tr -d ' \n' | grep -o "\"$1\":[0-9]*" \
    | head -1 | grep -o '[0-9]*$'
}

t0=$(uptime_s)
ipoib_up $SOCK /tmp/daemon.log --provider verbs --ib-dev "$RXE0" --bind "$IP0" \
  --cm-transport umad --ifname ib0 --addr $A4/24 --log info
hw=$HW
if [ -z "$hw" ]; then
  cat /tmp/daemon.log
  res cmmtu_guest_up FAIL "$(el "$t0")s"
  echo "GUEST_DONE"
  exit 1
fi
pm=$(num path_mtu)
res cmmtu_guest_up "$([ "$pm" = 4096 ] && echo PASS || echo FAIL) path_mtu=${pm:-?} $(el "$t0")s"
echo "GUEST_HWADDR $hw"

t1=$(uptime_s)
ok=FAIL
i=0
while [ $i -lt 90 ]; do
  if ping -c 1 -W 2 $H4 > /dev/null 2>&1; then ok=PASS; break; fi
  i=$((i + 1))
done
res cmmtu_first_ping "$ok $(el "$t1")s"
ping -c 5 -i 0.5 -W 5 -s 60000 $H4 > /tmp/ping.log 2>&1
# busybox: "5 packets transmitted, 5 packets received, ..."
got=$(grep -o '[0-9]* packets received' /tmp/ping.log | grep -o '^[0-9]*')
res cmmtu_guest_ping_60000 "$([ "${got:-0}" = 5 ] && echo PASS || echo FAIL) ${got:-0} of 5"
retries=$(num tx_mtu_retries)
grep "tx mtu lowered" /tmp/daemon.log | head -1 | cut -c1-300
if [ "${retries:-0}" -ge 1 ] && grep -q "tx mtu lowered.*path_mtu=1024" /tmp/daemon.log; then ok=PASS; else ok=FAIL; fi
res cmmtu_guest_mtu_lowered "$ok tx_mtu_retries=${retries:-0}"

# The host pings us with 60000 bytes, five times: wait for their bytes (at most 90 s).
b0=$(num rx_bytes)
echo "GUEST_PINGED"
t2=$(uptime_s)
ok=FAIL
i=0
while [ $i -lt 450 ]; do
  b=$(num rx_bytes)
  if [ $(( ${b:-0} - ${b0:-0} )) -ge 300000 ]; then ok=PASS; break; fi
  sleep 0.2; i=$((i + 1))
done
res cmmtu_guest_rx_60000 "$ok rx_bytes +$(( ${b:-0} - ${b0:-0} )) in $(el "$t2")s"
sleep 2
$B status --control-socket $SOCK | sed 's/^/  /' | head -12
echo "hw_counters $RXE0: $(hw_counters "$RXE0")"
kill -TERM $DPID
wait $DPID; rc=$?
res cmmtu_guest_stop "$([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc"
echo "GUEST_DONE"
