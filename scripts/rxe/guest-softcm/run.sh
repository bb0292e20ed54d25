#!/bin/sh
# Guest side of the softcm check: the kernel's rdma_cm/ib_cm on rxe0 against
# `ipoib-cm rc-pingpong --cm --rdma-cm` on the soft provider in the host netns
# (scripts/rxe/host-softcm.sh). The two sides run the same list of cases in the same order:
#   1-4  the guest serves (rdma_server, rdma_server with the host's 20% loss, ucmatose, and an
#        rdma_server that first gets the host's unframed REQ, then a framed one);
#   5-7  the guest connects (rdma_client, rdma_client against the lossy host, ucmatose).
# (The host's REJ 8 case, a REQ to a port nobody listens on, needs nothing here.)
# After each case rxe0's error counters must be zero, and no rdma_cm id may be left
# (`rdma resource show cm_id`); ib_cm's port counters are printed.
. /lib/rxelab.sh
echo "info: kernel $(uname -r)"
cnt() { cat /sys/class/infiniband/"$RXE0"/ports/1/hw_counters/"$1" 2>/dev/null || echo 0; }
cm_counters() { # ib_cm's per-port counters that are not zero (their sysfs place moved in 5.13)
  for d in /sys/class/infiniband/"$RXE0"/ports/1/cm_*/ /sys/class/infiniband_cm/"$RXE0"/1/*/; do
    [ -d "$d" ] || continue
    for f in "$d"*; do
      v=$(cat "$f" 2>/dev/null) || continue
      [ "$v" = 0 ] || printf '%s/%s=%s ' "$(basename "$d")" "$(basename "$f")" "$v"
    done
  done
}
after() { # CASE: the checks after each case
  local c=$1 i=0 ids errs=0 v
  while [ $i -lt 50 ]; do
    ids=$(rdma resource show cm_id 2>/dev/null | grep -v '^$')
    [ -z "$ids" ] && break
    sleep 0.2; i=$((i + 1))
  done
  for k in rcvd_seq_err out_of_seq_request retry_exceeded_err retry_rnr_exceeded_err send_err; do
    v=$(cnt $k); [ "$v" = 0 ] || { echo "counter $k=$v"; errs=$((errs + 1)); }
  done
  echo "info: $c: ib_cm $(cm_counters)"
  echo "info: $c: rxe completer_retry_err=$(cnt completer_retry_err) duplicate_request=$(cnt duplicate_request)"
  if [ -z "$ids" ] && [ $errs -eq 0 ]; then
    res "softcm_${c}_guest_clean" PASS
  else
    echo "cm_id left: $ids"
    res "softcm_${c}_guest_clean" FAIL "cm_ids: $(echo "$ids" | wc -l) rxe error counters: $errs"
  fi
}
serve() { # CASE TIMEOUT CMD...: one server run, the host connects
  local c=$1 to=$2 rc
  shift 2
  echo "--- $c: $*"
  timeout "$to" "$@" > /tmp/"$c".log 2>&1
  rc=$?
  cat /tmp/"$c".log
  res "softcm_${c}_guest" "$([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc"
  after "$c"
}
connect() { # CASE CMD...: a client run, retried while the host is not listening yet
  local c=$1 rc i=0
  shift
  echo "--- $c: $*"
  sleep 2
  while [ $i -lt 20 ]; do
    timeout 60 "$@" > /tmp/"$c".log 2>&1
    rc=$?
    [ $rc -eq 0 ] && break
    sleep 1; i=$((i + 1))
  done
  cat /tmp/"$c".log
  res "softcm_${c}_guest" "$([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc tries=$((i + 1))"
  after "$c"
}
serve rdma_server 240 rdma_server -p 7471
serve rdma_server_loss 240 rdma_server -p 7471
serve ucmatose_server 240 ucmatose -p 7472 -C 10 -S 100
serve rdma_server_unframed 240 rdma_server -p 7471
connect rdma_client rdma_client -s "$PEER_IP" -p 7471
connect rdma_client_loss rdma_client -s "$PEER_IP" -p 7471
connect ucmatose_client ucmatose -s "$PEER_IP" -p 7472 -C 10 -S 100
