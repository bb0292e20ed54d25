#!/usr/bin/env bash
# Interop checks of ipoib-cm against the Linux kernel's Soft-RoCE (rdma_rxe), booted in a qemu
# guest (TCG) by the rxe-lab harness. Needs root (apt, tap device, network namespace).
#
#   sudo scripts/rxe-interop.sh [--quick] [--iters N] [conformance] [rc-pingpong] [ud-pingpong]
#                               [hw-pingpong] [daemon] [daemon-umad] [rdmacm] [softcm] [kcm-pair]
#                               [ud-mtu] [cm-mtu] [hw-check]
#
# Checks (all by default):
#   conformance  (a) the provider conformance suite (src/verbs/conformance/) over the
#                libibverbs provider HwVerbs on the guest's rxe0 <-> rxe1;
#   rc-pingpong  (b) `ipoib-cm rc-pingpong` on the soft provider in a host netns <-> rdma-core's
#                `ibv_rc_pingpong -g IDX` on rxe0, the guest serving and then the host serving
#                (no flag: rxe sends random IPv4 IDs, which our side solves for from each
#                ICRC; RESULT rc_pingpong_host_icrc: our counters show no ICRC drops); then
#                rxe0's counters must show no ICRC drops and no sequence or retry errors;
#   ud-pingpong  (c) the same with `ipoib-cm ud-pingpong` <-> `ibv_ud_pingpong -s 512`;
#   hw-pingpong  (d') the same with `ipoib-cm rc-pingpong --provider verbs` (HwVerbs) on rxe0
#                instead of ibv_rc_pingpong: our two providers talking over a real wire;
#   daemon       (e) `ipoib-cm up --provider verbs --cm-transport $DAEMON_CM` on rxe0 in the
#                guest <-> `ipoib-cm up` on the soft provider in the host netns, both with
#                --workers 2 (RESULT daemon_*_workers); DAEMON_CM=udp
#                (default): CM MADs over the UDP side channel, port 4792, both sides;
#                DAEMON_CM=rdmacm: the guest on the kernel's CM, the host on our CM over QP1
#                (RESULT daemon_rdmacm_*; needs branch cmservice on the host side); no static
#                neighbours and no --peer (ARP and ND cross as IP multicast,
#                RESULT daemon_discovery_arp_nd); ping IPv4 and IPv6 across, iperf3 (copied
#                into the guest when the host has it), orderly stop of both daemons (rxe never
#                raises LAST_WQE_REACHED: the guest's SRQ RX teardown ends by the drain
#                watchdog on 6.1; 6.12 raises it); RESULT daemon_host_icrc_id_solved: the host
#                daemon logged once that the guest's ICRCs check only with a nonzero IPv4 ID,
#                and dropped none; the guest daemon SIGKILLed, its RX QP reaped on the host
#                (RESULT daemon_host_rx_reaped, from the host's status), restarted, pings again In this guest ib_cm is
#                loaded, so `--cm-transport umad` must fail with one line
#                (RESULT daemon_umad_refused_with_ib_cm). DAEMON_CM (default rdmacm) is the guest
#                daemon's --cm-transport: rdmacm (the kernel's CM, listening on the rdma_cm port,
#                hwaddr flag 0x20) against the host's own CM over QP1; udp: the side channel on
#                both sides. RESULT names are daemon_$DAEMON_CM_* (daemon_* for udp).
#   daemon-umad  (e2) the same, both daemons with --workers 2 (the guest's a libibverbs context
#                per worker on rxe0; RESULT daemon_umad_workers: two workers, both carried
#                packets of iperf3 -P 2), in a guest booted without ib_cm/rdma_cm/rdma_ucm (RXE_LAB_MODS,
#                its own $RXE_LAB_WORK/KERNEL-nocm): the guest daemon's CM on the kernel's QP1
#                through /dev/infiniband/umadN (`--cm-transport umad`, CM class 0x07 registered:
#                RESULT daemon_umad_cm_class_registered) <-> the host daemon's CM on QP1
#                (`--cm-transport qp1`). RESULT names are daemon_umad_*.
#   rdmacm       (f) `ipoib-cm rc-pingpong --provider verbs --rdma-cm` (our QP, the kernel's CM
#                through librdmacm) <-> rdma-core's rdma_server / rdma_client (port 7471, 16
#                bytes each way), our tool client and then server, then against itself; rxe0 <->
#                rxe1 in the guest; a REQ to no listener must draw REJ 8; an AF_IB id fails
#                as native-ib.md section 2 predicts (RESULT afib_negative: the route of an
#                active one and the bind of a passive one, both ENODEV); after each case
#                `rdma resource show cm_id` must be empty (and it is seen non-empty while an
#                rdma_server listens).
#   softcm       (g) `ipoib-cm rc-pingpong --cm --rdma-cm` on the soft provider (our CM over QP1,
#                the REQ framed with rdma_cm's cma_hdr) in the host netns <-> the guest kernel's
#                rdma_cm/ib_cm on rxe0: our side active against `rdma_server` and `ucmatose`,
#                passive against `rdma_client` and `ucmatose -s`, rdma_server/rdma_client again
#                with `--fault-loss 20` on our side; no listener -> REJ 8, a REQ without
#                cma_hdr -> REJ ConsumerDefined (28), a REQ naming a GID that is not the
#                guest's -> REJ 12 (invalid GID); our side waits out the kernel's MRA while
#                the guest's passive user (our rc-pingpong on the kernel's CM,
#                --accept-delay 3s) accepts late. After each case the guest's rxe error
#                counters are zero, `rdma resource show cm_id` is empty and ib_cm's counters
#                are clean (no retries, no duplicates; what that means per case is in
#                scripts/rxe/guest-softcm/run.sh); the RoCE traffic goes to the run's
#                softcm.pcap when tcpdump exists (docs/kernel-cm.md decodes it).
#   kcm-pair     (h) two `ipoib-cm up --provider verbs --cm-transport rdmacm` daemons, rxe0 <->
#                rxe1 in the guest (TUN devices in netns na/nb): both CMs the kernel's, no side
#                channel; ping IPv4/IPv6, iperf3, one SIGKILLed (the other reaps its RX QP on
#                the kernel's DREQ), restarted, ping again, orderly stops, no rdma_cm id left.
#   ud-mtu       (i) a datagram-mode `ipoib-cm up --provider verbs` on rxe0 (the link at MTU 9000:
#                active_mtu 4096, interface MTU 4092) sends IP packets of 2044 and 4092 bytes as UD
#                datagrams to `ipoib-cm up` on the soft provider in the host netns, whose --bind
#                link (the tap, 1500) gives it a path MTU of 1024: all delivered, none dropped
#                for want of buffer room (the UD buffers hold GRH + the port's largest MTU);
#                the start-up lines name where each path MTU came from. RXE_HOST_BIN runs
#                another build's binary on the host side (to compare with main).
#   cm-mtu       (j) the same two links in connected mode: `ipoib-cm up --provider verbs
#                --cm-transport umad` on rxe0 (link 9000, path MTU 4096; a guest without
#                ib_cm) and `ipoib-cm up` on the soft provider (tap 1500, path MTU 1024): the
#                guest's REQ at 4096 draws the host's REJ 26 naming 1024 and goes again at
#                it; 60000-byte pings 5/5 both ways.
#   hw-check     (k) scripts/hw-check.sh as an operator runs it on an HCA, in the guest on rxe0
#                (rxe1 the second daemon's device, --destructive: rdma link delete and add):
#                the facts, then one RESULT hw_check_* line per check (conformance, two
#                daemons per CM transport the guest allows and without SRQ, the QP command
#                times, the reset); on RoCE the InfiniBand-only and kernel-ipoib results SKIP
#                with their reason, the rest must PASS; then its self-test: the second daemon
#                made to take one packet a second (HW_CHECK_B_ARGS), whose ping check must print
#                FAIL (RESULT hw_check_selftest_fail_seen).
# The conformance boot also runs `rc-pingpong --provider verbs` against ibv_rc_pingpong
# (rxe1 <-> rxe0), both directions.
# --quick: 20 round trips instead of 100. Prints `RESULT name@KERNEL PASS|FAIL`, wall times
# and a summary; exits non-zero if anything failed.
#
# Kernels: every check runs on each guest kernel in $RXE_KERNELS (space-separated `uname -r`
# releases, newest first), by default Debian 12's current 6.12 and 6.1, which the harness
# unpacks into its own cache (`scripts/rxe/run.sh kernels`, $RXE_LAB_KERNELS, default
# /var/cache/ipoib-cm/rxe-kernels): nothing is installed into the host's /boot or /lib/modules.
# Each kernel gets its own $RXE_LAB_WORK/KERNEL.
#
# Harness: $RXE_LAB_DIR, else the project's copy in scripts/rxe/ (guest-side scripts always
# come from scripts/rxe/).
# Where each kernel's rxe departs from the verbs contract is a table (RXE_KERNELS in
# src/hw/conformance.rs, chosen by `uname -r` in the guest); a behaviour other than its row
# fails, and a kernel not in the table is held to the contract.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ITERS=100
CHECKS=()
while [ $# -gt 0 ]; do
    case $1 in
        --quick) ITERS=20 ;;
        --iters) ITERS=$2; shift ;;
        conformance|rc-pingpong|ud-pingpong|hw-pingpong|daemon|daemon-umad|rdmacm|softcm|kcm-pair|ud-mtu|cm-mtu|hw-check) CHECKS+=("$1") ;;
        *) echo "usage: $0 [--quick] [--iters N] [conformance] [rc-pingpong] [ud-pingpong] [hw-pingpong] [daemon] [daemon-umad] [rdmacm] [softcm] [kcm-pair] [ud-mtu] [cm-mtu] [hw-check]" >&2; exit 2 ;;
    esac
    shift
done
[ ${#CHECKS[@]} -gt 0 ] || CHECKS=(conformance rc-pingpong ud-pingpong hw-pingpong daemon daemon-umad rdmacm softcm kcm-pair ud-mtu cm-mtu hw-check)

if [ -n "${RXE_LAB_DIR:-}" ]; then LAB=$RXE_LAB_DIR
else LAB=$ROOT/scripts/rxe
fi
LAB_WORK=${RXE_LAB_WORK:-/tmp/rxe-lab-work}
[ "$(id -u)" -eq 0 ] || { echo "rxe-interop: needs root (tap device, netns, apt)" >&2; exit 2; }

now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
T0=$(now)
LOG=$(mktemp -d /tmp/rxe-interop.XXXXXX)
echo "rxe-interop: harness $LAB, logs $LOG"

# Build deps (scripts/setup.sh) + the lab's packages (the harness's `deps` list, through
# setup.sh's installer: no service started or left enabled); the guest kernels come below.
# shellcheck source=scripts/setup.sh
source scripts/setup.sh test > "$LOG/setup.log" 2>&1 || { cat "$LOG/setup.log"; exit 1; }
set +e   # setup.sh turns on errexit; this script counts failures itself
missing=()
for p in qemu-system-x86 busybox-static rdma-core ibverbs-utils \
         ibverbs-providers perftest rdmacm-utils iproute2 kmod cpio python3; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = 'install ok installed' ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    t=$(now); setup_apt_install "${missing[@]}" > "$LOG/deps.log" 2>&1 || { tail -20 "$LOG/deps.log"; exit 1; }
    echo "rxe-interop: lab packages installed in $(dt "$t") s"
fi

# A debug build by default (shared with scripts/test.sh; a cold --release build of ibverbs-sys
# compiles all of rdma-core again, ~3.5 min): RXE_PROFILE=release for optimised binaries.
PROFILE=${RXE_PROFILE:-debug}
t=$(now)
if [ "$PROFILE" = release ]; then
    cargo build --release --features verbs > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
else
    cargo build --features verbs > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
fi
BIN=$ROOT/target/$PROFILE/ipoib-cm
echo "rxe-interop: cargo build ($PROFILE) --features verbs in $(dt "$t") s"

RESULTS=$LOG/results
: > "$RESULTS"
if [ -z "${RXE_KERNELS:-}" ]; then
    t=$(now)
    RXE_KERNELS=$(bash "$LAB/run.sh" kernels 2> "$LOG/kernels.log" | tr '\n' ' ' | sed 's/ $//') ||
        { tail -20 "$LOG/kernels.log"; exit 1; }
    echo "rxe-interop: guest kernels unpacked into the lab's cache in $(dt "$t") s"
fi
[ -n "${RXE_KERNELS:-}" ] || { echo "rxe-interop: no guest kernel with rdma_rxe (scripts/rxe/run.sh kernels)" >&2; exit 1; }
echo "rxe-interop: guest kernels: $RXE_KERNELS"
# Guest modules without any kernel CM (no rdma_ucm, so no rdma_cm and no ib_cm).
NOCM_MODS="crc32_generic crc32-pclmul veth tun virtio_pci virtio_net rdma_rxe ib_umad ib_uverbs"
run_lab() { # NAME GUEST_DIR ARGS... (for the kernel $KV; RESULT names get @$KV, and with
    # $RESULT_AS a RESULT name's leading `daemon_` becomes `$RESULT_AS_`; $WORK_SUFFIX
    # names the harness work directory of a guest built with other modules, $RXE_LAB_MODS)
    local name=$1 src=$2 dir t rc
    shift 2
    name=$name@$KV
    dir=$(mktemp -d "$LOG/$name.XXXX")
    cp "$src"/run.sh "$dir/"
    cp "$BIN" "$dir/ipoib-cm"
    for b in ${EXTRA_BINS:-}; do cp "$b" "$dir/"; done
    t=$(now)
    for boot in 1 2; do
        KV=$KV RXE_LAB_MODS=${RXE_LAB_MODS:-} RXE_LAB_WORK=$LAB_WORK/$KV${WORK_SUFFIX:-} bash "$LAB/run.sh" guest "$dir" "$@" 2>&1 |
            sed -E -e "s/^RESULT ([^ ]+)/RESULT \1@$KV/" \
                -e "${RESULT_AS:+s/^RESULT daemon_/RESULT ${RESULT_AS}_/}" > "$LOG/$name.log"
        rc=${PIPESTATUS[0]}
        # A guest kernel that panicked while booting, before the lab's init ran (TCG on a
        # loaded host: seen in sched_clock_cpu at 1.8 s), ran nothing of ours: boot it once
        # more, and say so. Any later failure stands.
        if [ "$rc" -ne 0 ] && [ "$boot" -eq 1 ] && grep -q 'Kernel panic' "$LOG/$name.log" \
            && ! grep -q '=== RXE-LAB init start' "$LOG/$name.log"; then
            mv "$LOG/$name.log" "$LOG/$name.boot-panic.log"
            echo "rxe-interop: $name: the guest kernel panicked while booting, before the lab's init ($LOG/$name.boot-panic.log): booting it again"
            continue
        fi
        break
    done
    grep -E '^RESULT |PERF|hw_counters|cm_counters|udp InDatagrams|^guest\| (info|conformance|fact|== |  - )|== rxe-lab' "$LOG/$name.log"
    grep -E '^RESULT ' "$LOG/$name.log" >> "$RESULTS"
    echo "RESULT lab_$name $([ $rc -eq 0 ] && echo PASS || echo FAIL) $(dt "$t")s" | tee -a "$RESULTS"
}

for KV in $RXE_KERNELS; do
echo "== guest kernel $KV"
tk=$(now)
for c in "${CHECKS[@]}"; do
    case $c in
        conformance)
            echo "== (a) conformance suite over HwVerbs, rxe0 <-> rxe1 in the guest"
            run_lab conformance scripts/rxe/guest-conformance --net none --timeout 400 \
                --env "ITERS=$ITERS" ;;
        rc-pingpong|ud-pingpong|hw-pingpong)
            pp=${c%-pingpong}
            case $pp in
                rc) echo "== (b) rc-pingpong: soft provider (host netns) <-> ibv_rc_pingpong on rxe0, $ITERS iterations" ;;
                ud) echo "== (c) ud-pingpong: soft provider (host netns) <-> ibv_ud_pingpong on rxe0, $ITERS iterations" ;;
                hw) echo "== (d') rc-pingpong: soft provider (host netns) <-> rc-pingpong --provider verbs on rxe0, $ITERS iterations" ;;
            esac
            run_lab "$c" scripts/rxe/guest-pingpong --net tap --timeout 400 \
                --env "ITERS=$ITERS" --env "PP=$pp" \
                --host-cmd "IPOIB_CM=$BIN ITERS=$ITERS PP=$pp exec $ROOT/scripts/rxe/host-pingpong.sh" ;;
        daemon)
            echo "== (e) daemon: ipoib-cm up on the soft provider (host netns) <-> ipoib-cm up --provider verbs on rxe0"
            # DAEMON_CM: the guest daemon's --cm-transport (udp: the side channel both sides;
            # rdmacm: the kernel's CM against the host's own CM over QP1).
            dcm=${DAEMON_CM:-rdmacm}
            EXTRA_BINS=$(command -v iperf3 || true) run_lab "daemon-$dcm" scripts/rxe/guest-daemon --net tap --timeout 400 \
                --env "CM=$dcm" --env WORKERS=2 \
                --host-cmd "IPOIB_CM=$BIN CM=$dcm WORKERS=2 SHOW_EVENTS=1 exec $ROOT/scripts/rxe/host-daemon.sh" ;;
        daemon-umad)
            echo "== (e2) daemon-umad: ipoib-cm up --workers 2 (soft, our CM on QP1) <-> ipoib-cm up --workers 2 --provider verbs --cm-transport umad on rxe0, a guest without ib_cm"
            EXTRA_BINS=$(command -v iperf3 || true) RXE_LAB_MODS=$NOCM_MODS WORK_SUFFIX=-nocm \
                run_lab daemon-umad scripts/rxe/guest-daemon --net tap --timeout 400 \
                --env CM=umad --env WORKERS=2 \
                --host-cmd "IPOIB_CM=$BIN CM=umad WORKERS=2 SHOW_EVENTS=1 exec $ROOT/scripts/rxe/host-daemon.sh" ;;
        rdmacm)
            echo "== (f) rdmacm: rc-pingpong --provider verbs --rdma-cm <-> rdma_server / rdma_client, rxe0 <-> rxe1 in the guest"
            run_lab rdmacm scripts/rxe/guest-rdmacm --net none --timeout 400 --env "ITERS=$ITERS" ;;
        kcm-pair)
            echo "== (h) kcm-pair: ipoib-cm up --cm-transport rdmacm <-> itself, rxe0 <-> rxe1 in the guest"
            EXTRA_BINS=$(command -v iperf3 || true) run_lab kcm-pair scripts/rxe/guest-kcm-pair \
                --net none --timeout 300 ;;
        ud-mtu)
            echo "== (i) ud-mtu: datagram-mode ipoib-cm up --provider verbs on rxe0 (MTU 9000) -> ipoib-cm up (soft, --bind link 1500): 2044/4092-byte UD datagrams"
            run_lab ud-mtu scripts/rxe/guest-udmtu --net tap --mtu 9000 --timeout 300 \
                --host-cmd "IPOIB_CM=${RXE_HOST_BIN:-$BIN} exec $ROOT/scripts/rxe/host-udmtu.sh" ;;
        cm-mtu)
            echo "== (j) cm-mtu: ipoib-cm up --provider verbs --cm-transport umad on rxe0 (MTU 9000) <-> ipoib-cm up (soft, --bind link 1500): 60000-byte pings both ways"
            RXE_LAB_MODS=$NOCM_MODS WORK_SUFFIX=-nocm \
                run_lab cm-mtu scripts/rxe/guest-cmmtu --net tap --mtu 9000 --timeout 300 \
                --host-cmd "IPOIB_CM=${RXE_HOST_BIN:-$BIN} exec $ROOT/scripts/rxe/host-cmmtu.sh" ;;
        hw-check)
            echo "== (k) hw-check: scripts/hw-check.sh in the guest, rxe0 <-> rxe1 (RoCE: the InfiniBand-only results SKIP), and its self-test"
            EXTRA_BINS="$(command -v iperf3 || true) $(command -v bash) $ROOT/scripts/hw-check.sh" \
                run_lab hw-check scripts/rxe/guest-hwcheck --net none --timeout 580 ;;
        softcm)
            echo "== (g) softcm: rc-pingpong --cm --rdma-cm (soft provider, our CM) <-> the kernel's rdma_cm on rxe0"
            run_lab softcm scripts/rxe/guest-softcm --net tap --timeout 500 \
                --host-cmd "IPOIB_CM=$BIN exec $ROOT/scripts/rxe/host-softcm.sh" ;;
    esac
done
echo "rxe-interop: kernel $KV: $(dt "$tk") s"
done

count() { grep -cE "^RESULT [^ ]+ $1( |\$)" "$RESULTS" || true; }   # the verdict word only
pass=$(count PASS); fail=$(count FAIL); skip=$(count SKIP)
echo "== rxe-interop: $pass pass, $fail fail, $skip skip on $RXE_KERNELS, $(dt "$T0") s (logs $LOG)"
[ "$fail" -eq 0 ]
