#!/bin/sh
# Guest side of check (a): the provider conformance suite over HwVerbs on rxe0 <-> rxe1.
. /lib/rxelab.sh
[ "$NRXE" = 2 ] || { res conformance FAIL "needs two rxe devices (--net none)"; exit 1; }
t0=$(uptime_s)
timeout 300 /extra/ipoib-cm conformance --dev-a "$RXE0" --ip-a "$IP0" --dev-b "$RXE1" --ip-b "$IP1" \
  --settle-ms "${SETTLE_MS:-50}"
rc=$?
echo "conformance rc=$rc in $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}') s"
for d in $RXE0 $RXE1; do echo "hw_counters $d: $(hw_counters "$d")"; done
exit $rc
