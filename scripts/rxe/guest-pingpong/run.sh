#!/bin/sh
# Guest side of checks (b) and (c): ibv_${PP}_pingpong on rxe0 (kernel rxe) against
# `ipoib-cm ${PP}-pingpong` on the soft provider in the host netns (scripts/rxe/host-pingpong.sh),
# PP=rc (default) or ud, both directions:
#   1. the guest serves, the host connects;  2. the host serves, the guest connects.
# Then rxe0's counters must show traffic and no sequence/retry errors, and every RoCE
# datagram that reached the guest's UDP layer must have been accepted by rxe (a bad ICRC is
# dropped silently: UDP InDatagrams rises, rcvd_pkts does not).
. /lib/rxelab.sh
N=${ITERS:-100}
PP=${PP:-rc}
X=""; [ "$PP" = ud ] && X="-s 512"   # UD messages must fit the 1024-byte path MTU
# PP=hw: our libibverbs provider (rc-pingpong --provider verbs) instead of rdma-core's tool
G="ibv_${PP}_pingpong -d $RXE0 -g $GID0"
[ "$PP" = hw ] && G="/extra/ipoib-cm rc-pingpong --provider verbs -d $RXE0 -g $GID0"
udp_in() { awk '/^Udp:/ {n++} /^Udp:/ && n == 2 {print $2}' /proc/net/snmp; }
cnt() { cat /sys/class/infiniband/"$RXE0"/ports/1/hw_counters/"$1" 2>/dev/null || echo 0; }
u0=$(udp_in); p0=$(cnt rcvd_pkts)
run_pair ${PP}_pingpong_guest_server 120 "$G -n $N $X" "true" 18515
# run_pair's client is a no-op: the host connects to us; wait for the server to finish
# (run_pair waits for it).
t1=$(uptime_s)
ok=FAIL
i=0
while [ $i -lt 600 ]; do
  if timeout 60 $G -n "$N" $X "$PEER_IP" > /tmp/cli.log 2>&1; then ok=PASS; break; fi
  grep -qi "couldn't connect" /tmp/cli.log || break
  sleep 0.2; i=$((i + 1))
done
cat /tmp/cli.log
res ${PP}_pingpong_guest_client "$ok $(awk -v a="$t1" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}')s"
u1=$(udp_in); p1=$(cnt rcvd_pkts)
echo "hw_counters $RXE0: $(hw_counters "$RXE0")"
echo "udp InDatagrams +$((u1 - u0)), rxe rcvd_pkts +$((p1 - p0))"
errs=0
# Retransmissions after an ACK timeout (completer_retry_err here, duplicate_request for the
# peer's) happen under TCG when a side is slow to ACK: reported, not errors.
echo "info: completer_retry_err=$(cnt completer_retry_err) duplicate_request=$(cnt duplicate_request)"
for c in rcvd_seq_err out_of_seq_request retry_exceeded_err \
         retry_rnr_exceeded_err send_err; do
  v=$(cnt $c); [ "$v" = 0 ] || { echo "counter $c=$v"; errs=$((errs + 1)); }
done
if [ $((p1 - p0)) -gt 0 ] && [ $((u1 - u0)) -eq $((p1 - p0)) ] && [ $errs -eq 0 ]; then
  res ${PP}_rxe_counters PASS "rcvd_pkts +$((p1 - p0)), no ICRC drops, no sequence/retry errors"
else
  res ${PP}_rxe_counters FAIL "udp +$((u1 - u0)) rcvd_pkts +$((p1 - p0)) error counters $errs"
fi
