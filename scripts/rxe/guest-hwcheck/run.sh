#!/bin/sh
# Check `hw-check`: scripts/hw-check.sh as an operator runs it, in the guest (--net none),
# on rxe0 with rxe1 as the second daemon's device, --destructive (rxe's reset is `rdma link
# delete` and add). RoCE: the InfiniBand-only and kernel-ipoib results SKIP, the rest must
# PASS. Its own RESULT lines (hw_check_*) are the check's; its exit status is RESULT
# hw_check_exit. Then the self-test: the same script with the second daemon made to take one
# packet a second from the fabric (HW_CHECK_B_ARGS=--fault-tun-rate 1), only the rdmacm round's
# up and ping4: its output goes to the console prefixed (its FAIL is expected, not the
# check's), and RESULT hw_check_selftest_fail_seen PASSes when it printed
# `RESULT hw_check_rdmacm_ping4 FAIL` and exited 1.
# /extra holds bash, hw-check.sh, ipoib-cm and iperf3 (copied by scripts/rxe-interop.sh).
# shellcheck source=scripts/rxe/guest-lib.sh
. /lib/rxelab.sh
[ "$NRXE" = 2 ] || { res hw_check_lab FAIL "needs two rxe devices (--net none)"; exit 1; }
modprobe tun 2>/dev/null
[ -c /dev/net/tun ] || { mkdir -p /dev/net; mknod /dev/net/tun c 10 200; }
export IPOIB_CM=/extra/ipoib-cm PATH="/extra:$PATH"
el() { awk -v a="$1" -v b="$(uptime_s)" 'BEGIN {printf "%.1f", b - a}'; }

t0=$(uptime_s)
/extra/bash /extra/hw-check.sh --ib-dev "$RXE0" --peer-dev "$RXE1" --json /tmp/hw-check.json --destructive
rc=$?
[ $rc -eq 0 ] && ok=PASS || ok=FAIL
res hw_check_exit "$ok exit $rc (0: no check failed), $(el "$t0") s"
echo "--- /tmp/hw-check.json"
cat /tmp/hw-check.json

t0=$(uptime_s)
HW_CHECK_B_ARGS="--fault-tun-rate 1" /extra/bash /extra/hw-check.sh --ib-dev "$RXE0" \
  --peer-dev "$RXE1" --json /tmp/selftest.json --only '^rdmacm_(up|ping4)$' > /tmp/selftest.out 2>&1
src=$?
sed 's/^/selftest| /' /tmp/selftest.out
line=$(grep '^RESULT hw_check_rdmacm_ping4 ' /tmp/selftest.out | cut -c1-160)
if [ $src -eq 1 ] && grep -q '^RESULT hw_check_rdmacm_ping4 FAIL' /tmp/selftest.out; then ok=PASS; else ok=FAIL; fi
# (the inner verdict word is quoted so that this line names no failure of its own)
res hw_check_selftest_fail_seen "$ok second daemon slowed to 1 packet/s: exit $src, saw: $(echo "${line#RESULT }" | sed 's/ FAIL / [fail] /'), $(el "$t0") s"
