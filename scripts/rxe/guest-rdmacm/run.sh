#!/bin/sh
# Guest side of check (f), rdmacm: `rc-pingpong --provider verbs --rdma-cm` (our QP on HwVerbs,
# connected by the kernel's CM through librdmacm) against rdma-core's rdma_server and
# rdma_client (port 7471, one 16-byte SEND each way), our tool client and server, then against
# itself for $ITERS round trips; rxe0 <-> rxe1 (--net none). After each case the kernel must
# hold no rdma_cm id (`rdma resource show cm_id` empty): RESULT <case>_cm_ids; a listening
# rdma_server first shows that the check sees ids. An AF_IB id fails as native-ib.md section 2
# predicts (RESULT afib_negative).
. /lib/rxelab.sh
[ "$NRXE" = 2 ] || { res rdmacm FAIL "needs two rxe devices (--net none)"; exit 1; }
N=${ITERS:-100}
PORT=7471
PP="/extra/ipoib-cm rc-pingpong --provider verbs --rdma-cm --deadline 30s -p $PORT"

# no_cm_ids NAME: RESULT NAME_cm_ids PASS once the kernel lists no rdma_cm id (2 s at most).
no_cm_ids() {
  local n=0 out
  while [ $n -lt 20 ]; do
    out=$(rdma resource show cm_id 2>&1)
    [ -z "$out" ] && { res "$1_cm_ids" PASS; return 0; }
    sleep 0.1; n=$((n + 1))
  done
  echo "$out"
  res "$1_cm_ids" FAIL "rdma resource show cm_id not empty"
  return 1
}

# /tmp/after-listen SRV_OUT CMD...: runs CMD once our server printed "listening" into SRV_OUT
# (run_pair's /tmp/NAME.srv), at most 20 s later (no TCP port to wait for with rdma_cm).
cat > /tmp/after-listen <<'EOS'
#!/bin/sh
f=$1; shift; n=0
while [ $n -lt 200 ] && ! grep -q '^listening on' "$f" 2>/dev/null; do sleep 0.1; n=$((n + 1)); done
exec "$@"
EOS
chmod +x /tmp/after-listen

# cm_counters IBDEV: the guest's non-zero ib_cm message counters (sent, received, retries,
# duplicates: their sysfs place moved around 5.13), on one line.
cm_counters() {
  local base d f v
  for base in /sys/class/infiniband/"$1"/ports/1 /sys/class/infiniband_cm/"$1"/1; do
    [ -d "$base/cm_tx_msgs" ] || continue
    for d in cm_tx_msgs cm_rx_msgs cm_tx_retries cm_rx_duplicates; do
      for f in "$base/$d"/*; do
        v=$(cat "$f" 2>/dev/null) && [ "$v" != 0 ] && printf '%s/%s=%s ' "$d" "${f##*/}" "$v"
      done
    done
    echo; return
  done
  echo "(no ib_cm counters in sysfs)"
}

bad=0
# The check can fail: while an rdma_server listens, the kernel lists its id.
rdma_server -p $((PORT + 1)) > /tmp/neg.srv 2>&1 &
npid=$!
sleep 1
if [ -n "$(rdma resource show cm_id 2>&1)" ]; then res rdmacm_cm_ids_seen_while_listening PASS
else res rdmacm_cm_ids_seen_while_listening FAIL "a listening rdma_server's id is not listed"; bad=1
fi
kill $npid; wait $npid
no_cm_ids rdmacm_listener_killed || bad=1
# No listener: the kernel's CM answers our REQ with REJ 8 (invalid service ID); the tool says
# so in one line and exits 1.
out=$(timeout 60 $PP -d $RXE1 --bind $IP1 -s 16 -n 1 $IP0 2>&1); rc=$?
echo "$out"
case "$rc:$out" in
  1:*"connection rejected (reason 8)"*) res rdmacm_no_listener_rej8 PASS ;;
  *) res rdmacm_no_listener_rej8 FAIL "rc=$rc"; bad=1 ;;
esac
no_cm_ids rdmacm_no_listener || bad=1
# AF_IB on RoCE (native-ib.md section 2, docs/kernel-cm.md): an AF_IB id resolving rxe0's GID
# with IPoIB-CM's service ID of a QPN resolves the address but not the route
# (cma_resolve_iboe_route: no bound_dev_if, -ENODEV); binding an AF_IB id to rxe0's GID
# fails (cma_acquire_dev_by_src_ip -> cma_validate_port refuses ARPHRD_INFINIBAND on a
# RoCE port, -ENODEV). RESULT afib_negative PASS when both fail that way.
afib=0
out=$(timeout 30 $PP -d $RXE1 --bind $IP1 --af-ib -s 16 -n 1 $IP0 2>&1); rc=$?
echo "$out"
case "$rc:$out" in
  1:*"ADDR_RESOLVED: ok"*"rdma_resolve_route: No such device"*) res afib_active_route_enodev PASS ;;
  *) res afib_active_route_enodev FAIL "rc=$rc"; afib=1 ;;
esac
out=$(timeout 30 $PP -d $RXE0 --bind $IP0 --af-ib -s 16 -n 1 2>&1); rc=$?
echo "$out"
case "$rc:$out" in
  1:*"rdma_bind_addr (AF_IB): No such device"*) res afib_passive_bind_enodev PASS ;;
  *) res afib_passive_bind_enodev FAIL "rc=$rc"; afib=1 ;;
esac
res afib_negative "$([ $afib -eq 0 ] && echo PASS || echo FAIL)"
[ $afib -eq 0 ] || bad=1
no_cm_ids afib || bad=1
run_pair rdmacm_client_vs_rdma_server 60 "rdma_server -p $PORT" \
  "$PP -d $RXE1 --bind $IP1 -s 16 -n 1 $IP0" none
no_cm_ids rdmacm_client_vs_rdma_server || bad=1
c=rdmacm_server_vs_rdma_client
run_pair $c 60 "$PP -d $RXE0 --bind $IP0 -s 16 -n 1" \
  "/tmp/after-listen /tmp/$c.srv rdma_client -s $IP0 -p $PORT" none
no_cm_ids $c || bad=1
c=rdmacm_ours_both_sides
run_pair $c 120 "$PP -d $RXE0 --bind $IP0 -s 4096 -n $N" \
  "/tmp/after-listen /tmp/$c.srv $PP -d $RXE1 --bind $IP1 -s 4096 -n $N $IP0" none
no_cm_ids $c || bad=1
for d in $RXE0 $RXE1; do
  echo "hw_counters $d: $(hw_counters "$d")"
  echo "cm_counters $d: $(cm_counters "$d")"
done
[ "$bad" -eq 0 ]
