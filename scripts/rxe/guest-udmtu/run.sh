#!/bin/sh
# Guest side of check (i), `ud-mtu`: a datagram-mode daemon (`ipoib-cm up --provider verbs
# --mode datagram`) on rxe0, whose link (--mtu 9000) gives rxe an active MTU of 4096 and the
# interface an MTU of 4092, sends IP packets of 2044 and 4092 bytes (ping -s 2016, -s 4064)
# as UD datagrams to `ipoib-cm up` on the soft provider in the host netns, whose --bind link
# (the tap, set to 1500 there) carries a path MTU of 1024 (scripts/rxe/host-udmtu.sh): what a
# kernel ipoib peer in datagram mode on a 2K or 4K fabric sends to a daemon whose underlay is
# smaller. The host counts what arrived (RESULT udmtu_host_rx_2044, udmtu_host_rx_4092);
# here: the path MTU came from rxe's port and the interface MTU is path MTU - 4
# (RESULT udmtu_guest_path_mtu). Markers on the console pace the host: GUEST_HWADDR (up),
# GUEST_2044_START/DONE, GUEST_4092_DONE, GUEST_DONE.
. /lib/rxelab.sh
B=/extra/ipoib-cm
SOCK=/tmp/ib0.sock
A4=10.77.0.2 H4=10.77.0.1
modprobe tun 2>/dev/null
[ -c /dev/net/tun ] || { mkdir -p /dev/net; mknod /dev/net/tun c 10 200; }
el() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}'; }

t0=$(uptime_s)
ipoib_up $SOCK /tmp/daemon.log --provider verbs --ib-dev "$RXE0" --bind "$IP0" \
  --mode datagram --ifname ib0 --addr $A4/24 --log info
hw=$HW
if [ -z "$hw" ]; then
  cat /tmp/daemon.log
  res udmtu_guest_up FAIL "$(el "$t0")s"
  echo "GUEST_DONE"
  exit 1
fi
line=$(grep -m1 " started" /tmp/daemon.log)
echo "$line" | cut -c1-600
pm=$(printf '%s' "$line" | sed -n 's/.* path_mtu=\([0-9]*\).*/\1/p')
mtu=$(printf '%s' "$line" | sed -n 's/.* mtu=\([0-9]*\).*/\1/p')
ifm=$(cat /sys/class/net/ib0/mtu 2>/dev/null)
echo "info: $RXE0 $(ibv_devinfo -d "$RXE0" 2>/dev/null | grep -E 'active_mtu|max_mtu' | tr -s ' \t' ' ')"
if [ "$pm" = 4096 ] && [ "$mtu" = 4092 ] && [ "$ifm" = 4092 ]; then ok=PASS; else ok=FAIL; fi
res udmtu_guest_path_mtu "$ok path_mtu=${pm:-?} mtu=${mtu:-?} ib0 mtu=${ifm:-?} ($(printf '%s' "$line" | grep -o 'path_mtu_from=[^=]*port_max_mtu=[0-9]*'))"
echo "GUEST_HWADDR $hw"

# The host starts its daemon when it has read our hardware address: small pings until it
# answers (ARP both ways over the multicast group).
t1=$(uptime_s)
ok=FAIL
i=0
while [ $i -lt 90 ]; do
  if ping -c 1 -W 2 $H4 > /dev/null 2>&1; then ok=PASS; break; fi
  i=$((i + 1))
done
res udmtu_first_ping "$ok $(el "$t1")s"
sleep 1
# Echo replies come back over UD at the host's path MTU (1024): the first one of each size is
# too big (the host daemon answers its own kernel with an ICMP), later ones fragmented; only
# the requests are what this check is about (the host counts them).
for size in 2044 4092; do
  # The host reads its counters when it sees the marker (it polls the console).
  [ $size = 2044 ] && { echo "GUEST_2044_START"; sleep 2; }
  ping -c 3 -i 0.5 -W 3 -s $((size - 28)) $H4 > /tmp/ping$size.log 2>&1
  echo "info: ping $size: $(grep -E 'transmitted' /tmp/ping$size.log)"
  echo "GUEST_${size}_DONE"
  sleep 4
done
$B status --control-socket $SOCK | sed 's/^/  /'
echo "hw_counters $RXE0: $(hw_counters "$RXE0")"
kill -TERM $DPID
wait $DPID; rc=$?
if [ $rc -eq 0 ]; then ok=PASS; else ok=FAIL; fi
res udmtu_guest_stop "$ok rc=$rc"
echo "GUEST_DONE"
