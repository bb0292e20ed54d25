#!/bin/sh
# Host side of check (b), run by the rxe-lab harness in the tap netns (--host-cmd): first the
# client of the guest's ibv_rc_pingpong server, then the server for the guest's client.
# $IPOIB_CM is the binary; $ITERS the round trips.
N=${ITERS:-100}
BIN=${IPOIB_CM:?}
t0=$(date +%s.%N)
ok=FAIL
i=0
while [ $i -lt 900 ]; do   # the guest boots first: retry the TCP connect for up to ~3 min
  if "$BIN" rc-pingpong --no-icrc-v4 -g 1 -n "$N" --deadline 60 "$RXE_LAB_GUEST_IP" > /tmp/rxe-host-cli.$$ 2>&1; then
    ok=PASS; break
  fi
  grep -q "exchange" /tmp/rxe-host-cli.$$ || break
  sleep 0.2; i=$((i + 1))
done
cat /tmp/rxe-host-cli.$$; rm -f /tmp/rxe-host-cli.$$
echo "RESULT rc_pingpong_host_client $ok $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
t0=$(date +%s.%N)
if "$BIN" rc-pingpong --no-icrc-v4 -g 1 -n "$N" --deadline 120 --bind "$RXE_LAB_HOST_IP" --stats; then ok=PASS; else ok=FAIL; fi
echo "RESULT rc_pingpong_host_server $ok $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
