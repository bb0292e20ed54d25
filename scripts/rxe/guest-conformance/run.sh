#!/bin/sh
# Guest side of check (a): the provider conformance suite over HwVerbs on rxe0 <-> rxe1, then
# `rc-pingpong --provider verbs` against ibv_rc_pingpong (both on rxe, both directions).
# The suite holds rxe to what this kernel's rxe is known to do (`--rxe-kernel $(uname -r)`: its
# row of RXE_KERNELS in src/hw/conformance.rs, the verbs contract for a kernel not listed).
# RXE_ROW=RELEASE holds it to another release's row instead (RXE_ROW=0.0: the contract).
. /lib/rxelab.sh
[ "$NRXE" = 2 ] || { res conformance FAIL "needs two rxe devices (--net none)"; exit 1; }
t0=$(uptime_s)
timeout 300 /extra/ipoib-cm conformance --dev-a "$RXE0" --ip-a "$IP0" --dev-b "$RXE1" --ip-b "$IP1" \
  --settle-ms "${SETTLE_MS:-50}" --rxe-kernel "${RXE_ROW:-$(uname -r)}" > /tmp/conf.out 2>&1
rc=$?
bad=0
while IFS= read -r line; do
  case $line in
    "RESULT conformance_"*)
      set -- $line; name=${2#conformance_}; verdict=$3; shift 3
      [ "$verdict" = FAIL ] && bad=$((bad + 1))
      res "conformance_$name" "$verdict" "$*" ;;
    *) echo "$line" ;;
  esac
done < /tmp/conf.out
echo "conformance rc=$rc, $bad unexpected failures, $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}') s"
# rc-pingpong on HwVerbs against rdma-core's ibv_rc_pingpong, both on kernel rxe, both ways.
N=${ITERS:-100}
run_pair hw_rc_pingpong_client_vs_ibv_server 120 "ibv_rc_pingpong -d $RXE0 -g $GID0 -n $N" \
  "/extra/ipoib-cm rc-pingpong --provider verbs -d $RXE1 -g $GID1 -n $N $IP0"
run_pair hw_rc_pingpong_server_vs_ibv_client 120 \
  "/extra/ipoib-cm rc-pingpong --provider verbs -d $RXE0 -g $GID0 --bind $IP0 -n $N" \
  "ibv_rc_pingpong -d $RXE1 -g $GID1 -n $N $IP0"
for d in $RXE0 $RXE1; do echo "hw_counters $d: $(hw_counters "$d")"; done
[ "$bad" -eq 0 ] && [ "$rc" -le 1 ]
