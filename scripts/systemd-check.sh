#!/usr/bin/env bash
# The package under a real systemd: boots a Debian 12 tree with systemd as PID 1, installs the
# .deb there and drives the shipped unit ipoib-cm@ib0 against a peer daemon (the package's
# binary, soft provider) in a network namespace of this host: scripts/systemd/guest-check.sh
# says what is checked. Prints `RESULT name PASS|FAIL` lines and exits 1 when one failed, 77
# (with one `skipped: ...` line) when this machine cannot run it, 2 on usage errors.
#
#   sudo scripts/systemd-check.sh [--deb PATH] [--qemu]
#
# --deb: the package to install (default: target/debian/ipoib-cm_*.deb, built by scripts/deb.sh
# when there is none).
# --qemu: boot the tree in qemu (TCG; ACCEL= to change) on a kernel of the rxe lab's cache
# (scripts/rxe/run.sh kernels; KV= picks one) instead of a systemd-nspawn container, and run
# the unit with --provider verbs on a kernel rxe device there, our CM on umad and then the
# kernel's (rdmacm). Only there does systemd enforce the unit's device allowances (cgroup v2
# device programs), and only there are there RDMA devices.
#
# The tree is made once with debootstrap (minbase, the unit's runtime dependencies and systemd;
# about 35 s and 216 MB) into $IPOIB_SYSTEMD_TREE (default
# /var/cache/ipoib-cm/systemd-check/bookworm), a directory only: nothing is installed on this
# host. It stays as made: the container runs on a throwaway overlay of it (--volatile=overlay),
# qemu on a throwaway ext4 image of a copy. Network: the peer's namespace ipoib-sdp-PID joined
# to the container's own namespace by a veth pair (ipsdcPID in the container), or to the
# guest's eth0 by a tap device, 198.18.77.0/24 under the tunnel's 198.19.77.0/24; they go at
# exit, and only the processes started here are stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

MIRROR=${IPOIB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TREE=${IPOIB_SYSTEMD_TREE:-/var/cache/ipoib-cm/systemd-check/bookworm}
# In the tree: systemd as init, the package's runtime dependencies (dpkg -i there has no
# network), the programs guest-check.sh uses, and the rdma tool and rxe provider for a guest
# with an rxe device.
TREE_PACKAGES=systemd,systemd-sysv,dbus,iproute2,iputils-ping,procps,kmod,libibverbs1,librdmacm1,ibverbs-providers
IFNAME=ib0
C_BIND=198.18.77.1 P_BIND=198.18.77.2 C_ADDR=198.19.77.1 P_ADDR=198.19.77.2 PREFIX=24
TIMEOUT=${IPOIB_SYSTEMD_CHECK_TIMEOUT:-600}
ACCEL=${ACCEL:-tcg,thread=multi}
# One vCPU: with two under TCG, the 6.12 guest once hit an int3 Oops in netif_rx_internal
# while a static key was being patched (rxe's multicast send), and panicked.
SMP=${SMP:-1}
KCACHE=${RXE_LAB_KERNELS:-/var/cache/ipoib-cm/rxe-kernels}
# The guest kernel's modules the image gets (dependencies follow): the root file system's
# (loaded by the initramfs), the NIC, TUN, and the RDMA stack (rxe, its CRC32, verbs, umad,
# rdma_cm).
INITRD_MODS="virtio_blk ext4"
GUEST_MODS="crc32_generic crc32-pclmul virtio_net tun rdma_rxe ib_uverbs ib_umad rdma_ucm"

say() { printf 'systemd-check: %s\n' "$*" >&2; }
skip() { echo "skipped: $*"; exit 77; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
since() { local ms=$(( $(now_ms) - $1 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }

DEB= VARIANT=nspawn
while [ $# -gt 0 ]; do
    case $1 in
        --deb) DEB=${2:?--deb needs a path}; shift 2 ;;
        --qemu) VARIANT=qemu; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "systemd-check: unknown argument $1" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" -eq 0 ] || skip "systemd-check needs root (debootstrap, network namespaces, a container)"
TOOLS=(debootstrap systemd-nspawn)
[ "$VARIANT" = nspawn ] || TOOLS=(debootstrap qemu-system-x86_64 busybox mkfs.ext4 cpio)
for tool in "${TOOLS[@]}"; do
    command -v "$tool" > /dev/null || skip "$tool is missing (scripts/setup.sh test installs it)"
done

# The ipoib-cm-check unit in the tree: runs /check/run.sh (bound in per run) once the system is
# up, its output on the console, and powers the system off when it ends, whatever its result.
CHECK_UNIT='[Unit]
Description=ipoib-cm systemd check (scripts/systemd/guest-check.sh)
ConditionPathExists=/check/run.sh
After=multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/check/run.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
TimeoutStartSec=15min

[Install]
WantedBy=multi-user.target'
# What the tree is made of: a tree with another recipe is made again.
RECIPE="bookworm minbase $TREE_PACKAGES
$CHECK_UNIT"

# make_tree: debootstrap into TREE.new, add the check unit, mask the gettys (the console is
# the check's), and move it into place.
make_tree() {
    local t0 new=$TREE.new
    t0=$(now_ms)
    rm -rf "$new"
    mkdir -p "$(dirname "$TREE")"
    say "debootstrap bookworm into $new ($MIRROR)"
    debootstrap --variant=minbase --include="$TREE_PACKAGES" bookworm "$new" "$MIRROR" \
        > "$new.log" 2>&1 || { tail -n 20 "$new.log" >&2; rm -rf "$new"; return 1; }
    printf '%s\n' "$CHECK_UNIT" > "$new/etc/systemd/system/ipoib-cm-check.service"
    ln -sf /etc/systemd/system/ipoib-cm-check.service \
        "$new/etc/systemd/system/multi-user.target.wants/ipoib-cm-check.service"
    local u
    for u in console-getty.service getty@tty1.service serial-getty@ttyS0.service \
             apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer; do
        ln -sf /dev/null "$new/etc/systemd/system/$u"
    done
    echo ipoib-check > "$new/etc/hostname"
    rm -f "$new/etc/machine-id"; : > "$new/etc/machine-id"
    apt-get -o Dir="$new" clean 2>/dev/null || rm -f "$new"/var/cache/apt/archives/*.deb
    printf '%s\n' "$RECIPE" > "$new/.ipoib-cm-recipe"
    rm -rf "$TREE" "$new.log"
    mv "$new" "$TREE"
    say "tree made in $(since "$t0") s ($(du -sh "$TREE" | cut -f1))"
}

T0=$(now_ms)
mkdir -p "$(dirname "$TREE")"
exec 8> "$(dirname "$TREE")/.lock"
flock 8
if [ "$(cat "$TREE/.ipoib-cm-recipe" 2>/dev/null)" != "$RECIPE" ]; then
    make_tree || skip "debootstrap failed (no Debian mirror reachable at $MIRROR?)"
else
    say "tree cached: $TREE"
fi

if [ -z "$DEB" ]; then
    DEB=$(ls -t target/debian/ipoib-cm_*.deb 2>/dev/null | head -1 || true)
    if [ -z "$DEB" ]; then
        say "no package yet: scripts/deb.sh"
        bash scripts/deb.sh > /dev/null
        DEB=$(ls -t target/debian/ipoib-cm_*.deb | head -1)
    fi
fi
[ -f "$DEB" ] || { echo "systemd-check: $DEB: no such package" >&2; exit 2; }
say "package $DEB"

RUN=$(mktemp -d /tmp/ipoib-systemd-check.XXXXXX)
NS_P=ipoib-sdp-$$ C_IF=ipsdc$$
PEER_PID= BOOT_PID=
cleanup() {
    local rc=$?
    [ -z "$BOOT_PID" ] || kill "$BOOT_PID" 2>/dev/null || true
    if [ -n "$PEER_PID" ] && kill -0 "$PEER_PID" 2>/dev/null; then
        kill -TERM "$PEER_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$PEER_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$PEER_PID" 2>/dev/null || true
    fi
    ip link del "$C_IF" 2>/dev/null || true
    ip netns del "$NS_P" 2>/dev/null || true
    rm -rf "$RUN"
    return $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The package's own binary runs the peer.
dpkg-deb -x "$DEB" "$RUN/deb"
BIN=$RUN/deb/usr/bin/ipoib-cm

mkdir -p "$RUN/check"
cp "$DEB" "$RUN/check/ipoib-cm.deb"
install -m 755 scripts/systemd/guest-check.sh "$RUN/check/run.sh"
if [ "$VARIANT" = nspawn ]; then UNDERLAY_IF=$C_IF RDMA=none; else UNDERLAY_IF=eth0 RDMA=rxe; fi
cat > "$RUN/check/env" <<EOF
IFNAME=$IFNAME BIND=$C_BIND PEER_BIND=$P_BIND PREFIX=$PREFIX ADDR=$C_ADDR PEER_ADDR=$P_ADDR
UNDERLAY_IF=$UNDERLAY_IF RDMA=$RDMA
EOF

ip netns add "$NS_P"
ip -n "$NS_P" link set lo up
if [ "$VARIANT" = nspawn ]; then
    # The container's end is made here without an address and moved into the container's
    # own network namespace by nspawn (--network-interface, which also gives the container a
    # sysfs of that namespace); guest-check.sh gives it its address.
    ip link add "$C_IF" type veth peer name sdp0 netns "$NS_P"
else
    ip -n "$NS_P" tuntap add dev sdp0 mode tap
fi
ip -n "$NS_P" addr add "$P_BIND/$PREFIX" dev sdp0
ip -n "$NS_P" link set sdp0 up

# The peer finds the container by --peer; the guest's verbs provider (no peer list) by the
# broadcast group as IP multicast on the tap.
PEER_ARGS=(--peer "$C_BIND" --no-multicast)
[ "$VARIANT" = nspawn ] || PEER_ARGS=()
ip netns exec "$NS_P" setsid "$BIN" up --ifname "$IFNAME" --bind "$P_BIND" \
    --addr "$P_ADDR/$PREFIX" "${PEER_ARGS[@]}" > "$RUN/peer.log" 2>&1 < /dev/null &
PEER_PID=$!
for _ in $(seq 100); do
    grep -q ' started ' "$RUN/peer.log" && break
    kill -0 "$PEER_PID" 2>/dev/null || break
    sleep 0.1
done
grep -q ' started ' "$RUN/peer.log" || { cat "$RUN/peer.log" >&2; echo "RESULT peer_start FAIL"; exit 1; }

# kmods ROOT MODULE...: the module files, dependencies first, of the kernel in ROOT.
kmods() {
    local root=$1 m; shift
    for m in "$@"; do modprobe -d "$root" -S "$KV" --show-depends "$m"; done |
        awk '$1 == "insmod" && !seen[$2]++ {print $2}'
}

# boot_nspawn: the tree in a container, on a throwaway overlay.
boot_nspawn() {
    say "booting the tree with systemd-nspawn (overlay, private network with $C_IF)"
    # nspawn waits for udev to initialise a moved interface wherever /sys is writable, and
    # this host runs no udev: nspawn runs in a mount namespace of its own where /sys is
    # read-only (as in a container, where nspawn skips the wait); this host's /sys stays as is.
    timeout "$TIMEOUT" unshare --mount --propagation private sh -c \
        'mount -o remount,bind,ro /sys && exec "$@"' nspawn \
        systemd-nspawn --quiet --directory="$TREE" --volatile=overlay \
        --register=no --keep-unit --machine="ipoib-check-$$" \
        --network-interface="$C_IF" --bind-ro="$RUN/check:/check" \
        --console=read-only --boot > "$RUN/console.raw" 2>&1 < /dev/null &
    BOOT_PID=$!
}

# boot_qemu: the tree, /check and the RDMA modules in an ext4 image, booted on a kernel of the
# rxe lab's cache by an initramfs that loads the image's driver and file system and hands over
# to systemd.
boot_qemu() {
    local kvs kroot t f d=$RUN/initrd r=$RUN/root
    kvs=$(bash scripts/rxe/run.sh kernels) || skip "no guest kernel (scripts/rxe/run.sh kernels failed)"
    KV=${KV:-$(head -n 1 <<< "$kvs")}
    kroot=$KCACHE/$KV
    [ -r "$kroot/boot/vmlinuz-$KV" ] || skip "kernel $KV not in $KCACHE"
    t=$(now_ms)
    mkdir -p "$d"/{bin,dev,proc,sys,newroot}
    cp "$(command -v busybox)" "$d/bin/busybox"
    # (uncompressed: busybox's insmod hands the kernel an .xz as it is, then retries)
    kmods "$kroot" $INITRD_MODS | while read -r f; do
        t=${f#"$kroot"}; t=${t%.xz}
        mkdir -p "$d$(dirname "$t")"
        case $f in *.xz) xz -dc "$f" > "$d$t" ;; *) cp "$f" "$d$t" ;; esac
        echo "$t" >> "$d/modules.order"
    done
    cat > "$d/init" <<'EOF'
#!/bin/busybox sh
bb=/bin/busybox
$bb mount -t proc proc /proc; $bb mount -t sysfs sysfs /sys; $bb mount -t devtmpfs dev /dev
while read -r m; do $bb insmod "$m"; done < /modules.order
i=0; while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do $bb sleep 0.1; i=$((i + 1)); done
$bb mount -t ext4 /dev/vda /newroot || { echo "initrd: cannot mount /dev/vda"; $bb poweroff -f; }
for m in dev proc sys; do $bb mount --move /$m /newroot/$m; done
exec $bb switch_root /newroot /sbin/init
EOF
    chmod 755 "$d/init"
    (cd "$d" && find . | cpio -o -H newc -R 0:0 --quiet | gzip -1) > "$RUN/initrd.img"
    rm -rf "$d"
    mkdir -p "$r"
    cp -a "$TREE/." "$r/"
    cp -a "$RUN/check" "$r/check"
    kmods "$kroot" $GUEST_MODS $INITRD_MODS | while read -r f; do
        mkdir -p "$r$(dirname "${f#"$kroot"}")"; cp "$f" "$r${f#"$kroot"}"
    done
    cp "$kroot/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$r/lib/modules/$KV/" 2>/dev/null || true
    depmod -b "$r" "$KV"
    mkfs.ext4 -q -F -L ipoib-check -d "$r" "$RUN/root.img" 1G
    rm -rf "$r"
    say "image and initramfs made in $(since "$t") s; booting kernel $KV in qemu ($ACCEL, $SMP cpu)"
    local qargs=(-accel "$ACCEL" -cpu max -smp "$SMP" -m 1024 -nodefaults -no-user-config
                 -display none -serial stdio -no-reboot
                 -kernel "$kroot/boot/vmlinuz-$KV" -initrd "$RUN/initrd.img"
                 -append "console=ttyS0 panic=-1 quiet loglevel=4 no_timer_check net.ifnames=0"
                 -drive "file=$RUN/root.img,format=raw,if=virtio,cache=unsafe"
                 -netdev tap,id=n0,ifname=sdp0,script=no,downscript=no
                 -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56,romfile=)
    [ ! -f /usr/share/qemu/qboot.rom ] || qargs+=(-bios /usr/share/qemu/qboot.rom)
    timeout "$TIMEOUT" ip netns exec "$NS_P" qemu-system-x86_64 "${qargs[@]}" \
        > "$RUN/console.raw" 2>&1 < /dev/null &
    BOOT_PID=$!
}

T1=$(now_ms)
"boot_$VARIANT"
tail -n +1 -s 0.2 -F --pid="$BOOT_PID" "$RUN/console.raw" 2>/dev/null |
    sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e '/^RESULT /!s/^/guest| /' &
TAIL_PID=$!
BRC=0
wait "$BOOT_PID" || BRC=$?
BOOT_PID=
wait "$TAIL_PID" 2>/dev/null || true
say "$VARIANT ran $(since "$T1") s (exit $BRC)"

# The stop's DREQs, as the peer counted them: RX connections torn down on a DREQ.
dreqs=$(ip netns exec "$NS_P" "$BIN" status --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"]["rx_dreq_reaped"])' 2>/dev/null || echo "?")
if [[ $dreqs =~ ^[0-9]+$ ]] && [ "$dreqs" -ge 1 ]; then
    echo "RESULT stop_dreq PASS (the peer tore down $dreqs RX connection(s) on a DREQ)"
else
    echo "RESULT stop_dreq FAIL (the peer's rx_dreq_reaped: $dreqs)"
fi | tee -a "$RUN/console.raw"

results=$(sed -e 's/\r//g' "$RUN/console.raw" | grep -E '^RESULT ' || true)
pass=$(grep -c ' PASS' <<< "$results" || true)
fail=$(grep -c ' FAIL' <<< "$results" || true)
done_marker=no
grep -q '^=== SYSTEMD-CHECK done' <(sed 's/\r//g' "$RUN/console.raw") && done_marker=yes
verdict=PASS
{ [ "$fail" -eq 0 ] && [ "$done_marker" = yes ] && [ "$pass" -ge 10 ]; } || verdict=FAIL
if [ "$verdict" = FAIL ]; then
    say "peer log:"; sed 's/^/peer | /' "$RUN/peer.log" | tail -n 30 >&2
fi
echo "== systemd-check ($VARIANT): $verdict ($pass pass, $fail fail; done marker: $done_marker; $(since "$T0") s in all)"
[ "$verdict" = PASS ]
