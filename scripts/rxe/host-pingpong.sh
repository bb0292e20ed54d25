#!/bin/sh
# Host side of checks (b) and (c), run by the rxe-lab harness in the tap netns (--host-cmd):
# first the client of the guest's ibv_${PP}_pingpong server, then the server for the guest's
# client. $IPOIB_CM is the binary, $ITERS the round trips, $PP rc (default) or ud. No
# --no-icrc-v4: our side solves for the IPv4 ID rxe picked from each ICRC; for rc, the
# `--stats` lines must show no ICRC drops (RESULT ${PP}_pingpong_host_icrc).
N=${ITERS:-100}
PP=${PP:-rc}
TOOL=$PP; [ "$PP" = hw ] && TOOL=rc   # the guest runs our verbs provider; we stay on soft
X=""; [ "$PP" = ud ] && X="-s 512"
STATS=""; [ "$TOOL" = rc ] && STATS="--stats"
BIN=${IPOIB_CM:?}
t0=$(date +%s.%N)
ok=FAIL
i=0
while [ $i -lt 900 ]; do   # the guest boots first: retry the TCP connect for up to ~3 min
  if "$BIN" "$TOOL-pingpong" -g 1 -n "$N" $X --deadline 60 $STATS "$RXE_LAB_GUEST_IP" > /tmp/rxe-host-cli.$$ 2>&1; then
    ok=PASS; break
  fi
  grep -q "exchange" /tmp/rxe-host-cli.$$ || break
  sleep 0.2; i=$((i + 1))
done
cat /tmp/rxe-host-cli.$$; grep '^soft-rc:' /tmp/rxe-host-cli.$$ > /tmp/rxe-host-stats.$$; rm -f /tmp/rxe-host-cli.$$
echo "RESULT ${PP}_pingpong_host_client $ok $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
t0=$(date +%s.%N)
"$BIN" "$TOOL-pingpong" -g 1 -n "$N" $X --deadline 120 --bind "$RXE_LAB_HOST_IP" $STATS > /tmp/rxe-host-srv.$$ 2>&1
rc=$?
cat /tmp/rxe-host-srv.$$; grep '^soft-rc:' /tmp/rxe-host-srv.$$ >> /tmp/rxe-host-stats.$$; rm -f /tmp/rxe-host-srv.$$
if [ $rc -eq 0 ]; then ok=PASS; else ok=FAIL; fi
echo "RESULT ${PP}_pingpong_host_server $ok $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')s"
if [ -n "$STATS" ]; then
  # Both runs' counters: every datagram from rxe (random IPv4 IDs) passed the ICRC check.
  runs=$(grep -c . /tmp/rxe-host-stats.$$)
  bad=$(sed -n 's/.* rx_bad_icrc=\([0-9]*\).*/\1/p' /tmp/rxe-host-stats.$$ | awk '{s += $1} END {print s + 0}')
  ok=FAIL; [ "$runs" -eq 2 ] && [ "$bad" -eq 0 ] && ok=PASS
  echo "RESULT ${PP}_pingpong_host_icrc $ok runs=$runs rx_bad_icrc=$bad (no --no-icrc-v4)"
fi
rm -f /tmp/rxe-host-stats.$$
