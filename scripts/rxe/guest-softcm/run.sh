#!/bin/sh
# Guest side of the softcm check: the kernel's rdma_cm/ib_cm on rxe0 against
# `ipoib-cm rc-pingpong --cm --rdma-cm` on the soft provider in the host netns
# (scripts/rxe/host-softcm.sh). The two sides run the same list of cases in the same order:
#   1-4  the guest serves (rdma_server, rdma_server with the host's 20% loss, ucmatose, and an
#        rdma_server that first gets the host's unframed REQ and its REQ naming a wrong GID,
#        then a framed one);
#   5    the guest serves with our own `rc-pingpong --provider verbs --rdma-cm
#        --accept-delay 3s`: the kernel's rdma_cm arms its delayed MRA, the host's resent REQ
#        draws it, the host waits it out and the connection completes;
#   6-8  the guest connects (rdma_client, rdma_client against the lossy host, ucmatose).
# (The host's REJ 8 case, a REQ to a port nobody listens on, needs nothing here.)
# After each case rxe0's error counters must be zero, and no rdma_cm id may be left
# (`rdma resource show cm_id`): RESULT softcm_<case>_guest_clean.
#
# ib_cm's port counters (/sys/class/infiniband_cm/rxe0/1/{cm_tx_msgs,cm_tx_retries,cm_rx_msgs,
# cm_rx_duplicates}/<message>, before 5.13 under /sys/class/infiniband/rxe0/ports/1/) are
# read before and after each case and the change printed. "Clean" (RESULT
# softcm_<case>_ib_cm_clean) means, for the change over the case:
#   - lossless cases: every cm_tx_retries/* and every cm_rx_duplicates/* is 0 (the kernel
#     resent nothing and received nothing twice);
#   - the MRA case: cm_tx_msgs/mra at least 1 (RESULT softcm_accept_delay_mra_kernel_sent_mra);
#     duplicates only of the REQ (the host's resent REQ is what draws the MRA) and retries
#     only of the MRA: cm_send_handler counts a MAD sent in answer to a received one (no
#     cm_id in context[0]), other than a REJ, as "manually retried" (msg->retries = 1), so the
#     one MRA on the wire reads cm_tx_msgs/mra=+2 cm_tx_retries/mra=+1;
#   - the --fault-loss cases (*_loss): no assertion; the change is printed (retries and
#     duplicates are expected there).
. /lib/rxelab.sh
echo "info: kernel $(uname -r)"
# rdma_cm takes its REQ's packet rate from this (cma_resolve_iboe_route: iboe_get_rate).
echo "info: $NETDEV0 speed: $(cat /sys/class/net/"$NETDEV0"/speed 2>/dev/null || echo unreadable)"
cnt() { cat /sys/class/infiniband/"$RXE0"/ports/1/hw_counters/"$1" 2>/dev/null || echo 0; }
CMDIR=
for d in /sys/class/infiniband_cm/"$RXE0"/1 /sys/class/infiniband/"$RXE0"/ports/1; do
  [ -d "$d/cm_tx_msgs" ] && { CMDIR=$d; break; }
done
cm_snap() { # FILE: every ib_cm counter of rxe0's port 1, "group/message value" a line
  local g f
  : > "$1"
  [ -n "$CMDIR" ] || return 0
  for g in cm_tx_msgs cm_tx_retries cm_rx_msgs cm_rx_duplicates; do
    for f in "$CMDIR/$g"/*; do echo "$g/${f##*/} $(cat "$f" 2>/dev/null || echo 0)" >> "$1"; done
  done
}
cm_delta() { # BEFORE AFTER: the counters that changed, "group/message=+N ..."
  awk 'NR == FNR {b[$1] = $2; next} $2 != b[$1] {printf "%s=+%d ", $1, $2 - b[$1]}' "$1" "$2"
}
cm_snap /tmp/cm.before
after() { # CASE [lossless|loss|mra]: the checks after each case
  local c=$1 mode=${2:-lossless} i=0 ids errs=0 v d bad
  while [ $i -lt 50 ]; do
    ids=$(rdma resource show cm_id 2>/dev/null | grep -v '^$')
    [ -z "$ids" ] && break
    sleep 0.2; i=$((i + 1))
  done
  for k in rcvd_seq_err out_of_seq_request retry_exceeded_err retry_rnr_exceeded_err send_err; do
    v=$(cnt $k); [ "$v" = 0 ] || { echo "counter $k=$v"; errs=$((errs + 1)); }
  done
  cm_snap /tmp/cm.after
  d=$(cm_delta /tmp/cm.before /tmp/cm.after)
  cp /tmp/cm.after /tmp/cm.before
  echo "info: $c: ib_cm change: $d"
  echo "info: $c: rxe completer_retry_err=$(cnt completer_retry_err) duplicate_request=$(cnt duplicate_request)"
  if [ -z "$ids" ] && [ $errs -eq 0 ]; then
    res "softcm_${c}_guest_clean" PASS
  else
    echo "cm_id left: $ids"
    res "softcm_${c}_guest_clean" FAIL "cm_ids: $(echo "$ids" | wc -l) rxe error counters: $errs"
  fi
  [ -n "$CMDIR" ] || { res "softcm_${c}_ib_cm_clean" FAIL "no ib_cm counters in sysfs"; return; }
  case $mode in
    loss) return ;;
    mra)
      bad=$(echo "$d" | tr ' ' '\n' | grep -E '^cm_tx_retries/|^cm_rx_duplicates/' |
        grep -vE '^cm_rx_duplicates/req=|^cm_tx_retries/mra=')
      case " $d" in
        *" cm_tx_msgs/mra=+"*) res "softcm_${c}_kernel_sent_mra" PASS ;;
        *) res "softcm_${c}_kernel_sent_mra" FAIL "no cm_tx_msgs/mra" ;;
      esac ;;
    *) bad=$(echo "$d" | tr ' ' '\n' | grep -E '^cm_tx_retries/|^cm_rx_duplicates/') ;;
  esac
  if [ -z "$bad" ]; then res "softcm_${c}_ib_cm_clean" PASS
  else res "softcm_${c}_ib_cm_clean" FAIL "$(echo $bad)"
  fi
}
serve() { # CASE MODE TIMEOUT CMD...: one server run, the host connects
  local c=$1 mode=$2 to=$3 rc
  shift 3
  echo "--- $c: $*"
  timeout "$to" "$@" > /tmp/"$c".log 2>&1
  rc=$?
  cat /tmp/"$c".log
  res "softcm_${c}_guest" "$([ $rc -eq 0 ] && echo PASS || echo FAIL) rc=$rc"
  after "$c" "$mode"
}
connect() { # CASE MODE CMD...: a client run, retried while the host is not listening yet
  local c=$1 mode=$2 rc i=0
  shift 2
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
  after "$c" "$mode"
}
serve rdma_server lossless 240 rdma_server -p 7471
serve rdma_server_loss loss 240 rdma_server -p 7471
serve ucmatose_server lossless 240 ucmatose -p 7472 -C 10 -S 100
serve rdma_server_unframed lossless 240 rdma_server -p 7471
serve accept_delay_mra mra 240 /extra/ipoib-cm rc-pingpong --provider verbs --rdma-cm \
  --accept-delay 3s --bind "$IP0" -p 7473 -s 16 -n 1 --deadline 200s
connect rdma_client lossless rdma_client -s "$PEER_IP" -p 7471
connect rdma_client_loss loss rdma_client -s "$PEER_IP" -p 7471
connect ucmatose_client lossless ucmatose -s "$PEER_IP" -p 7472 -C 10 -S 100
