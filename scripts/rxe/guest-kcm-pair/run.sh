#!/bin/sh
# Check `kcm-pair`: two `ipoib-cm up --provider verbs --cm-transport rdmacm` daemons in one
# guest, A on rxe0 and B on rxe1 (--net none), each with its CM on the kernel's ib_cm through
# librdmacm (rdma_cm port 4793, RDMA_PS_IB) and no side channel. Their TUN devices are moved
# into netns na and nb (the daemons and rxe stay in the initial netns, where rdma_cm resolves
# the --bind addresses), so that pings cross the IPoIB link instead of the local table. Static
# neighbours both ways (ARP and ND between two rxe devices of one netns are not what this
# checks). Then: ping IPv4 and IPv6, iperf3, B SIGKILLed (the kernel destroys its ids: A gets
# the DREQ and reaps its RX QP), B restarted (new QPNs, A re-pointed), ping again; a host
# that cannot keep up: B's TUN device takes 2,000 packets a second (--fault-tun-rate), A sends
# as Linux's ipoib_cm does (rnr_retry 0: the first RNR NAK fails its QP), UDP at
# 2.6 times that rate: B drops and counts (rx_buffer_drops), rxe1 sends no RNR NAK and A's
# one connection lives; orderly stops, and no rdma_cm id left. Then the pair again with two
# workers each (RESULT kcm_pair_workers_*).
. /lib/rxelab.sh
[ "$NRXE" = 2 ] || { res kcm_pair FAIL "needs two rxe devices (--net none)"; exit 1; }
B=/extra/ipoib-cm
modprobe tun 2>/dev/null
[ -c /dev/net/tun ] || { mkdir -p /dev/net; mknod /dev/net/tun c 10 200; }
el() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}'; }
ip netns add na && ip netns add nb || { res kcm_pair_netns FAIL; exit 1; }
ip -n na link set lo up; ip -n nb link set lo up

# up NAME DEV BIND IF N [ARGS...]: daemon NAME on DEV (with ARGS), its TUN IF moved into
# netns nNAME with 10.77.0.N and fd77::N; sets PID_NAME and HW_NAME.
up() {
  local name=$1 dev=$2 bind=$3 ifn=$4 n=$5 sock=/tmp/$1.sock hw= i=0
  shift 5
  rm -f $sock
  $B up --provider verbs --ib-dev "$dev" --bind "$bind" --cm-transport rdmacm --ifname "$ifn" \
    --addr 10.77.0.$n/24 --addr fd77::$n/64 --control-socket $sock --drain-timeout 5s \
    --log info "$@" >> /tmp/$name.log 2>&1 &
  eval "PID_$name=$!"
  while [ $i -lt 100 ]; do
    hw=$($B status --control-socket $sock --json 2>/dev/null | grep -o '"hwaddr": *"[^"]*"' | head -1 | sed 's/.*"\([^"]*\)"$/\1/')
    [ -n "$hw" ] && break
    sleep 0.1; i=$((i + 1))
  done
  [ -n "$hw" ] || { cat /tmp/$name.log; return 1; }
  eval "HW_$name=$hw"
  ip link set "$ifn" netns "n$name" || return 1
  ip -n "n$name" addr add 10.77.0.$n/24 dev "$ifn"
  ip -n "n$name" addr add fd77::$n/64 dev "$ifn" nodad
  ip -n "n$name" link set "$ifn" up
}
neigh() { # NAME N HW: daemon NAME's static neighbours 10.77.0.N and fd77::N at HW
  $B neigh add 10.77.0.$2 "$3" --control-socket /tmp/$1.sock > /dev/null &&
    $B neigh add fd77::$2 "$3" --control-socket /tmp/$1.sock > /dev/null
}
st() { $B status --control-socket /tmp/$1.sock --json 2>/dev/null | tr -d ' \n'; }
num() { printf '%s' "$1" | grep -o "\"$2\":[0-9]*" | head -1 | grep -o '[0-9]*$'; }

t0=$(uptime_s)
if up a "$RXE0" "$IP0" iba 1 && up b "$RXE1" "$IP1" ibb 2 && neigh a 2 "$HW_b" && neigh b 1 "$HW_a"; then
  res kcm_pair_up PASS "$(el "$t0")s a=$HW_a b=$HW_b"
else
  res kcm_pair_up FAIL; cat /tmp/a.log /tmp/b.log; exit 1
fi
grep started /tmp/a.log | cut -c1-600
case $HW_a in 0xb0:*|b0:*) ok=PASS ;; *) ok=FAIL ;; esac
res kcm_pair_hwaddr_flag "$ok flags $(echo "$HW_a" | cut -d: -f1) (0x80 connected | 0x20 kernel CM | 0x10 takes a connection per sending worker)"

t1=$(uptime_s)
ok=FAIL; i=0
while [ $i -lt 20 ]; do
  ip netns exec na ping -c 1 -W 2 10.77.0.2 > /dev/null 2>&1 && { ok=PASS; break; }
  i=$((i + 1))
done
res kcm_pair_first_ping4 "$ok $(el "$t1")s"
t1=$(uptime_s)
if ip netns exec na ping -c 10 -i 0.2 -W 3 10.77.0.2 > /tmp/p4 2>&1; then ok=PASS; else ok=FAIL; fi
tail -1 /tmp/p4; res kcm_pair_ping4 "$ok $(el "$t1")s"
t1=$(uptime_s)
if ip netns exec nb ping -6 -c 10 -i 0.2 -W 3 fd77::1 > /tmp/p6 2>&1; then ok=PASS; else ok=FAIL; fi
tail -1 /tmp/p6; res kcm_pair_ping6 "$ok $(el "$t1")s (b -> a)"
if [ -x /extra/iperf3 ]; then
  ip netns exec nb /extra/iperf3 -s -1 -B 10.77.0.2 > /tmp/iperf-s 2>&1 &
  sleep 1
  t1=$(uptime_s)
  if ip netns exec na timeout 40 /extra/iperf3 -c 10.77.0.2 -t 5 -f m > /tmp/iperf 2>&1; then ok=PASS; else ok=FAIL; fi
  grep -E "sender|receiver|error" /tmp/iperf
  echo "PERF kcm_pair_iperf3: $(grep receiver /tmp/iperf | awk '{print $7, $8}')"
  res kcm_pair_iperf3 "$ok $(el "$t1")s"
  # The verbs calls of each daemon so far (mostly the iperf3 run), with the bytes moved: what
  # docs/verbs.md divides into calls per GB.
  for n in a b; do
    echo "CALLS kcm_pair_$n: $(st $n | grep -o '"\(hw_[a-z_]*\|rx_bytes\|tx_bytes\)":[0-9]*' | tr -d '"' | tr '\n' ' ')"
  done
fi
sa=$(st a)
echo "a: rdmacm_events=$(num "$sa" rdmacm_events) rdmacm_ids=$(num "$sa" rdmacm_ids) cm_mads_sent=$(num "$sa" cm_mads_sent) mad_sent=$(num "$sa" mad_sent)"
case $sa in *'"cm_transport":"rdmacm"'*) ok=PASS ;; *) ok=FAIL ;; esac
res kcm_pair_status_transport "$ok"
rdma resource show cm_id | sed 's/^/  /' | head -12

# B dies without a word: the kernel destroys its ids (DREQ for each established one), so A
# reaps the RX QP of B's connection at once (rx_dreq_reaped), not at its rx_timeout.
rx0=$(num "$sa" rx_dreq_reaped)
t1=$(uptime_s)
kill -KILL $PID_b; wait $PID_b 2>/dev/null
ok=FAIL; i=0
while [ $i -lt 100 ]; do
  sa=$(st a)
  rx=$(num "$sa" rx_dreq_reaped)
  case $sa in *'"rx":[]'*) [ "${rx:-0}" -gt "${rx0:-0}" ] && { ok=PASS; break; } ;; esac
  sleep 0.1; i=$((i + 1))
done
res kcm_pair_killed_rx_reaped "$ok $(el "$t1")s rx_dreq_reaped=${rx0:-0}->${rx:-?}"
# Every move of a connection's QP (INIT, RTR, RTS of A's RX and TX QPs, ERR of the one reaped)
# was made on A's QP command thread: the event loop moved only the UD QP, at start.
here=$(num "$sa" hw_modify_qp_calls); thread=$(num "$sa" hw_qp_modifies_off_loop)
if [ "${here:-x}" = 3 ] && [ "${thread:-0}" -ge 7 ]; then ok=PASS; else ok=FAIL; fi
res kcm_pair_moves_off_loop "$ok a: ibv_modify_qp here=${here:-?} (the UD QP) on the thread=${thread:-?}"
grep -E "rx reaped|tx closed|tx failed" /tmp/a.log | tail -3 | cut -c1-300

t1=$(uptime_s)
if up b "$RXE1" "$IP1" ibb 2 && neigh a 2 "$HW_b" && neigh b 1 "$HW_a"; then ok=PASS; else ok=FAIL; fi
res kcm_pair_restart "$ok $(el "$t1")s b=$HW_b"
t1=$(uptime_s)
ok=FAIL; i=0
while [ $i -lt 20 ]; do
  ip netns exec na ping -c 3 -i 0.2 -W 2 10.77.0.2 > /dev/null 2>&1 && { ok=PASS; break; }
  i=$((i + 1))
done
res kcm_pair_ping4_after_restart "$ok $(el "$t1")s"

# A host that cannot keep up, next to a sender configured as Linux's. B's SRQ (1,024) holds
# 200 ms of A's 5,200 datagrams a second: what arrives while B's loop is off the CPU (tens of
# ms under TCG) is the SRQ's to hold; the spares keep the TUN device's backlog out of it. With
# the default 256, one run in several saw an RNR NAK after such a stall. A keeps 7 transport
# retries (Linux sends 0): under TCG rxe's ACKs can come later than the local ACK timeout, and
# a QP without retries fails on that (seen on 6.1: 2 failures, no RNR NAK), which is not what
# this checks.
hwc() { cat /sys/class/infiniband/"$1"/ports/1/hw_counters/$2 2>/dev/null || echo 0; }
if [ -x /extra/iperf3 ]; then
  kill -TERM $PID_a $PID_b; wait $PID_a; wait $PID_b
  t1=$(uptime_s)
  if up a "$RXE0" "$IP0" iba 1 --tx-rnr-retry 0 &&
     up b "$RXE1" "$IP1" ibb 2 --srq-depth 1024 --rx-spare 16 --fault-tun-rate 2000 &&
     neigh a 2 "$HW_b" && neigh b 1 "$HW_a" &&
     ip netns exec na ping -c 3 -i 0.2 -W 2 10.77.0.2 > /dev/null 2>&1; then
    ok=PASS
  else
    ok=FAIL
  fi
  res kcm_pair_slow_up "$ok $(el "$t1")s"
  nak0=$(hwc "$RXE1" send_rnr_err); exc0=$(hwc "$RXE0" retry_rnr_exceeded_err)
  rex0=$(hwc "$RXE0" retry_exceeded_err)
  ip netns exec nb /extra/iperf3 -s -1 -B 10.77.0.2 > /tmp/iperf-s 2>&1 &
  sleep 1
  ip netns exec na timeout 40 /extra/iperf3 -c 10.77.0.2 -u -b 50M -l 1200 -t 5 -f m \
    > /tmp/iperf-u 2>&1
  grep -E "sender|receiver|error" /tmp/iperf-u
  sa=$(st a); sb=$(st b)
  nak=$(( $(hwc "$RXE1" send_rnr_err) - nak0 ))
  exc=$(( $(hwc "$RXE0" retry_rnr_exceeded_err) - exc0 ))
  rex=$(( $(hwc "$RXE0" retry_exceeded_err) - rex0 ))
  est=$(num "$sa" tx_established); fail=$(num "$sa" tx_failed)
  drops=$(num "$sb" rx_buffer_drops); wrote=$(num "$sb" tun_written)
  echo "PERF kcm_pair_slow_tun: rx_buffer_drops=$drops tun_written=$wrote rxe1 RNR NAKs sent +$nak, rxe0 retry_rnr_exceeded_err +$exc retry_exceeded_err +$rex, a: tx_established=$est tx_failed=$fail"
  [ "${drops:-0}" -gt 0 ] && [ "$nak" -eq 0 ] && [ "$exc" -eq 0 ] && [ "$est" = 1 ] &&
    [ "$fail" = 0 ] && ok=PASS || ok=FAIL
  res kcm_pair_slow_tun_no_rnr "$ok drops=$drops rnr_naks=$nak a: established=$est failed=$fail"
  ip netns exec na ping -c 3 -i 0.2 -W 2 10.77.0.2 > /dev/null 2>&1 && ok=PASS || ok=FAIL
  res kcm_pair_slow_tun_ping_after "$ok"
fi

# B's device removed under it (`rdma link delete`, as a driver reload or a device reset does):
# the removal must not wait on the daemon, which exits 3 with one line (the kernel's CM ids
# belong to the device: the service manager restarts it); added back, B starts again and
# reaches A. rxe has no disassociate_ucontext: the kernel waits for every user of the device
# to let go (`link_delete` bounds the wait: B is SIGKILLed after 30 s).
link_delete "$RXE1" $PID_b
grep -E "WARN|ERROR|error" /tmp/b.log | tail -4 | cut -c1-300
echo "INFO kcm_pair_link_delete: rdma link delete: $LD_DELETE after ${LD_SECS}s; B exit status $LD_EXIT"
[ "$LD_DELETE" = 0 ] && [ "$LD_EXIT" = 3 ] && ok=PASS || ok=FAIL
res kcm_pair_link_delete "$ok delete=$LD_DELETE ${LD_SECS}s b_exit=$LD_EXIT"
t1=$(uptime_s)
if rdma link add "$RXE1" type rxe netdev "$NETDEV1" &&
   up b "$RXE1" "$IP1" ibb 2 && neigh a 2 "$HW_b" && neigh b 1 "$HW_a" &&
   ip netns exec na ping -c 3 -i 0.2 -W 2 10.77.0.2 > /dev/null 2>&1; then
  ok=PASS
else
  ok=FAIL
fi
res kcm_pair_link_readd "$ok $(el "$t1")s"

t1=$(uptime_s)
kill -TERM $PID_a $PID_b
wait $PID_a; ra=$?
wait $PID_b; rb=$?
grep -E "stopped|WARN|ERROR" /tmp/a.log /tmp/b.log | tail -6 | cut -c1-300
[ $ra -eq 0 ] && [ $rb -eq 0 ] && ok=PASS || ok=FAIL
res kcm_pair_stop "$ok rc=$ra,$rb $(el "$t1")s"
n=0
while [ $n -lt 30 ] && [ -n "$(rdma resource show cm_id 2>&1)" ]; do sleep 0.1; n=$((n + 1)); done
out=$(rdma resource show cm_id 2>&1)
[ -z "$out" ] && ok=PASS || { ok=FAIL; echo "$out"; }
res kcm_pair_cm_ids "$ok"

# The same pair with two workers each (--workers 2): every worker's kernel CM ids on its
# daemon's one event channel, each worker's QPs on a context of its own; pings both ways,
# iperf3 with four streams; B killed: A's RX QPs are reaped on every worker (the kernel's DREQ
# for each of B's ids reaches the worker whose id it is); no rdma_cm id left.
t1=$(uptime_s)
if up a "$RXE0" "$IP0" iba 1 --workers 2 && up b "$RXE1" "$IP1" ibb 2 --workers 2 \
    && neigh a 2 "$HW_b" && neigh b 1 "$HW_a"; then ok=PASS; else ok=FAIL; fi
res kcm_pair_workers_up "$ok $(el "$t1")s"
ok=FAIL; i=0
while [ $i -lt 20 ]; do
  ip netns exec na ping -c 1 -W 2 10.77.0.2 > /dev/null 2>&1 && { ok=PASS; break; }
  i=$((i + 1))
done
res kcm_pair_workers_ping4 "$ok $(el "$t1")s"
if ip netns exec nb ping -6 -c 5 -i 0.2 -W 3 fd77::1 > /tmp/p6 2>&1; then ok=PASS; else ok=FAIL; fi
tail -1 /tmp/p6; res kcm_pair_workers_ping6 "$ok (b -> a)"
if [ -x /extra/iperf3 ]; then
  ip netns exec nb /extra/iperf3 -s -1 -B 10.77.0.2 > /tmp/iperf-s 2>&1 &
  sleep 0.5
  if ip netns exec na timeout 40 /extra/iperf3 -c 10.77.0.2 -t 4 -P 4 -f m > /tmp/iperf 2>&1; then ok=PASS; else ok=FAIL; fi
  echo "PERF kcm_pair_workers_iperf3: $(grep receiver /tmp/iperf | tail -1 | awk '{print $(NF-2), $(NF-1)}')"
  res kcm_pair_workers_iperf3 "$ok"
fi
sa=$(st a)
ws=$(printf '%s' "$sa" | sed -n 's/.*"workers":\[\(.*\)\].*/\1/p')
n=$(printf '%s' "$ws" | grep -o '"cpu_seconds"' | wc -l)
busy=$(printf '%s' "$ws" | sed 's/},{/}\n{/g' | grep -c '"\(rx\|tx\)_conns":[1-9]')
[ "$n" = 2 ] && ok=PASS || ok=FAIL
res kcm_pair_workers_status "$ok a: $n workers, $busy with connections: $(printf '%s' "$ws" | cut -c1-300)"
t1=$(uptime_s)
kill -KILL $PID_b; wait $PID_b 2>/dev/null
ok=FAIL; i=0
while [ $i -lt 100 ]; do
  case $(st a) in *'"rx":[]'*) ok=PASS; break ;; esac
  sleep 0.1; i=$((i + 1))
done
res kcm_pair_workers_killed_rx_reaped "$ok $(el "$t1")s"
kill -TERM $PID_a; wait $PID_a; ra=$?
[ $ra -eq 0 ] && ok=PASS || ok=FAIL
grep -E "WARN|ERROR" /tmp/a.log | tail -3 | cut -c1-300
res kcm_pair_workers_stop "$ok rc=$ra"
n=0
while [ $n -lt 30 ] && [ -n "$(rdma resource show cm_id 2>&1)" ]; do sleep 0.1; n=$((n + 1)); done
out=$(rdma resource show cm_id 2>&1)
[ -z "$out" ] && ok=PASS || { ok=FAIL; echo "$out"; }
res kcm_pair_workers_cm_ids "$ok"
