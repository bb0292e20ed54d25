#!/bin/sh
# Host side of the softcm check (scripts/rxe/guest-softcm/run.sh), run by the rxe-lab harness
# in the tap netns (--host-cmd): `ipoib-cm rc-pingpong --cm --rdma-cm` on the soft provider
# against the guest kernel's rdma_cm, case by case in the guest's order (which the guest's
# run.sh lists). $IPOIB_CM is the binary. With tcpdump, the RoCE traffic of the whole run is written to $RXE_LAB_RUN/softcm.pcap.
BIN=${IPOIB_CM:?}
G=$RXE_LAB_GUEST_IP
PP="$BIN rc-pingpong --cm --deadline 90"
LOSS="--fault-loss 20 --fault-seed 3"
out=/tmp/rxe-host-softcm.$$
t0=$(date +%s.%N)
took() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
dump=""
if command -v tcpdump > /dev/null; then
  tcpdump -U -s 0 -ni "$RXE_LAB_TAP" -w "$RXE_LAB_RUN/softcm.pcap" udp port 4791 2> /dev/null &
  dump=$!
fi
# CASE EXPECT ARGS...: run our client (retried while the guest is booting or not listening
# yet: "no answer", REJ 8 before the guest's listener exists); EXPECT is `ok` or the text its
# error must contain.
client() {
  local c=$1 want=$2 i=0 rc ok
  shift 2
  t0=$(date +%s.%N)
  while [ $i -lt 300 ]; do
    $PP "$@" "$G" > "$out" 2>&1
    rc=$?
    if [ "$want" = ok ] && [ $rc -eq 0 ]; then break; fi
    if [ "$want" != ok ] && grep -q "$want" "$out"; then break; fi
    grep -q "no answer\|InvalidServiceId\|CM: timed out waiting" "$out" || break
    sleep 0.5; i=$((i + 1))
  done
  cat "$out"
  if [ "$want" = ok ]; then
    ok=FAIL; [ $rc -eq 0 ] && ok=PASS
  else
    ok=FAIL; [ $rc -ne 0 ] && grep -q "$want" "$out" && ok=PASS
  fi
  echo "RESULT softcm_${c}_host $ok $(took)s tries=$((i + 1))"
}
server() { # CASE ARGS...
  local c=$1 ok=FAIL
  shift
  t0=$(date +%s.%N)
  $PP --bind "$RXE_LAB_HOST_IP" "$@" && ok=PASS
  echo "RESULT softcm_${c}_host $ok $(took)s"
}
# Nobody listens on 7999: the kernel's ib_cm answers REJ 8. It also waits for the guest's boot.
i=0
while [ $i -lt 300 ]; do
  $PP --rdma-cm -p 7999 -s 16 -n 1 "$G" > "$out" 2>&1
  grep -q "no answer\|CM: timed out waiting" "$out" || break
  sleep 0.5; i=$((i + 1))
done
cat "$out"
ok=FAIL; grep -q "rejected: InvalidServiceId" "$out" && ok=PASS
echo "RESULT softcm_no_listener_rej8_host $ok tries=$((i + 1))"
client rdma_server ok --rdma-cm -p 7471 -s 16 -n 1
client rdma_server_loss ok --rdma-cm -p 7471 -s 16 -n 1 $LOSS
client ucmatose_server ok --rdma-cm -p 7472 -s 100 -n 10
# Without the cma_hdr the kernel's rdma_cm refuses the REQ: REJ ConsumerDefined (28).
client no_cma_hdr_rej28 "rejected: ConsumerDefined" -p 7471 -s 16 -n 1
# A REQ whose primary path names a GID that is not the guest's (the MAD still goes to rxe0):
# ib_cm's cm_req_handler cannot build the path (cm_init_av_by_path: no route from that
# source address) and answers REJ 12, invalid GID, before rdma_cm sees the REQ.
client wrong_gid_rej12 "rejected: InvalidGid" --rdma-cm -p 7471 -s 16 -n 1 --req-dgid 198.51.100.7
client rdma_server_unframed ok --rdma-cm -p 7471 -s 16 -n 1
# The guest's passive user (our rc-pingpong on the kernel's CM) accepts 3 s late: the kernel's
# rdma_cm arms its delayed MRA, our resent REQ draws it (service timeout 24), and our CM
# waits it out instead of giving up.
client accept_delay_mra ok --rdma-cm -p 7473 -s 16 -n 1 --stats
grep "^cm:" "$out"
ok=FAIL; grep -q "^cm: .* mra_received=[1-9]" "$out" && ok=PASS
echo "RESULT softcm_accept_delay_mra_waited_out_host $ok"
server rdma_client --rdma-cm -p 7471 -s 16 -n 1
server rdma_client_loss --rdma-cm -p 7471 -s 16 -n 1 $LOSS
server ucmatose_client --rdma-cm -p 7472 -s 100 -n 10
rm -f "$out"
[ -z "$dump" ] || { sleep 1; kill "$dump"; }
