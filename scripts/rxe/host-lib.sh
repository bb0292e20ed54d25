# Shell functions of the host-side scripts that pace themselves by the guest's console
# markers (sourced; needs $RXE_LAB_RUN from the rxe-lab harness).
CON=${RXE_LAB_RUN:?}/console.raw
# el T0: seconds since T0 (a `date +%s.%N`), one decimal.
el() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
# seen MARKER: the guest printed MARKER on its console.
seen() { tr -d '\r' < "$CON" 2>/dev/null | grep -q "$1"; }
# wait_for MARKER: up to 5 min, or until the guest is done; whether MARKER came.
wait_for() {
  i=0
  while [ $i -lt 1500 ] && ! seen "$1"; do
    seen GUEST_DONE && return 1
    sleep 0.2; i=$((i + 1))
  done
  seen "$1"
}
