#!/bin/sh
# Guest side of check (a): the provider conformance suite over HwVerbs on rxe0 <-> rxe1.
# Checks listed in $XFAIL (comma-separated) are known gaps of the guest kernel's rxe: their
# FAIL is reported as XFAIL (and a PASS as XPASS) and does not fail the run.
. /lib/rxelab.sh
[ "$NRXE" = 2 ] || { res conformance FAIL "needs two rxe devices (--net none)"; exit 1; }
t0=$(uptime_s)
timeout 300 /extra/ipoib-cm conformance --dev-a "$RXE0" --ip-a "$IP0" --dev-b "$RXE1" --ip-b "$IP1" \
  --settle-ms "${SETTLE_MS:-50}" > /tmp/conf.out 2>&1
rc=$?
bad=0
while IFS= read -r line; do
  case $line in
    "RESULT conformance_"*)
      set -- $line; name=${2#conformance_}; verdict=$3; shift 3
      case ",${XFAIL:-}," in
        *",$name,"*) [ "$verdict" = FAIL ] && verdict=XFAIL || verdict=XPASS ;;
      esac
      [ "$verdict" = FAIL ] && bad=$((bad + 1))
      res "conformance_$name" "$verdict" "$*" ;;
    *) echo "$line" ;;
  esac
done < /tmp/conf.out
echo "conformance rc=$rc, $bad unexpected failures, $(awk -v a="$t0" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}') s"
for d in $RXE0 $RXE1; do echo "hw_counters $d: $(hw_counters "$d")"; done
[ "$bad" -eq 0 ] && [ "$rc" -le 1 ]
