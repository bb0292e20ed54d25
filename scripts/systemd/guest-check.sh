#!/bin/bash
# Runs inside a Debian 12 system booted with systemd as PID 1 (scripts/systemd-check.sh starts
# it as ipoib-cm-check.service once the system is up) and drives the packaged unit
# ipoib-cm@IFNAME through what an operator does: install the .deb, start (READY), traffic to
# the peer, reload a changed file, a stopped main process restarted by the watchdog, stop
# (the peer counts the DREQs), a bad file (exit 2, not restarted, one line in the journal), and
# --provider verbs (ready and traffic where there is an RDMA device, its one-line error where
# there is none). Prints `RESULT name PASS|FAIL (why)` lines and the daemon's journal on the
# console; the unit powers the system off when this exits. Settings come from /check/env.
set -uo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin SYSTEMD_PAGER= SYSTEMD_COLORS=0
# shellcheck source=/dev/null
. /check/env
# IFNAME BIND PEER_BIND PREFIX ADDR PEER_ADDR UNDERLAY_IF RDMA: the settings (RDMA=rxe: make an
# rxe device on UNDERLAY_IF and run --provider verbs on it; RDMA=none: no RDMA device here).
UNIT=ipoib-cm@$IFNAME.service
CONF=/etc/ipoib-cm/$IFNAME.toml
fails=0
# How long the first ping may take (a connection to set up; slower in qemu without KVM).
PING_WAIT=30
[ "$RDMA" = none ] || PING_WAIT=90

result() {   # result NAME PASS|FAIL [WHY]
    echo "RESULT $1 $2${3:+ ($3)}"
    [ "$2" = PASS ] || fails=$((fails + 1))
}
say() { echo "check: $*"; }
prop() { systemctl show -p "$1" --value "$UNIT"; }
# The daemon's own lines (stderr, through journald) since the cursor CUR: those of the unit's
# main processes (journald cannot attribute the lines of one that exited at once to the unit).
daemon_lines() { journalctl -q -o cat --after-cursor="$1" -u "$UNIT" --no-pager | grep -v "^$UNIT: \|ipoib-cm@$IFNAME.service - " ; }
cursor() { journalctl -q -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'; }
# wait_for SECONDS CMD...: true once CMD succeeds, polled every 0.5 s.
wait_for() {
    local end=$((SECONDS + $1)); shift
    until "$@"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.5
    done
}
pings() { ping -c 1 -W 2 "$PEER_ADDR" > /dev/null 2>&1; }
active_pid_other_than() {
    [ "$(prop ActiveState)" = active ] && [ "$(prop SubState)" = running ] &&
        local p && p=$(prop MainPID) && [ "$p" != 0 ] && [ "$p" != "$1" ]
}
write_conf() {   # write_conf [EXTRA LINE...]
    mkdir -p /etc/ipoib-cm
    {
        echo "bind = \"$BIND\""
        echo "addr = [\"$ADDR/$PREFIX\"]"
        # The soft provider reaches the peer by its address; the verbs provider has no peer
        # list, and ARP crosses to the peer as IP multicast (rxe's broadcast group).
        if [ "$RDMA" = none ]; then
            echo "peer = [\"$PEER_BIND\"]"
            echo "no_multicast = true"
        fi
        printf '%s\n' "$@"
    } > "$CONF"
    chmod 600 "$CONF"
}

say "systemd $(systemctl --version | head -1 | cut -d' ' -f2) as PID 1 ($(cat /proc/1/comm)), $(uname -r), virtualization $(systemd-detect-virt || true)"

# --- the underlay: an address on UNDERLAY_IF where the host did not set one (in qemu the NIC's
# driver and TUN first: this tree has no udev to load them)
[ "$RDMA" = none ] || modprobe -a virtio_net tun crc32_generic crc32-pclmul
wait_for 10 ip link show "$UNDERLAY_IF" > /dev/null 2>&1
if ! ip -o addr show | grep -q " $BIND/"; then
    ip link set "$UNDERLAY_IF" up && ip addr add "$BIND/24" dev "$UNDERLAY_IF"
fi
ip link set lo up

# --- the package: installed by dpkg with its dependencies from the tree (no network)
if dpkg -i /check/ipoib-cm.deb > /tmp/dpkg.log 2>&1 && [ -x /usr/bin/ipoib-cm ] &&
   [ -f /lib/systemd/system/ipoib-cm@.service ]; then
    result deb_install PASS "$(dpkg-query -W -f='${Package} ${Version}; Depends: ${Depends}' ipoib-cm)"
else
    cat /tmp/dpkg.log
    result deb_install FAIL "dpkg -i"
fi
if out=$(systemd-analyze verify --man=no "$UNIT" 2>&1) && [ -z "$out" ]; then
    result unit_verify PASS
else
    result unit_verify FAIL "systemd-analyze verify: $(echo "$out" | head -3 | tr '\n' ' ')"
fi
say "systemd-analyze security: $(systemd-analyze security "$UNIT" --no-pager 2>/dev/null | tail -1)"

# Whether this system enforces a unit's device allowances (a container's systemd may not
# have the devices controller): a service denied /dev/net/tun tries to open it.
if systemd-run --wait --quiet --collect -p DevicePolicy=closed -p DeviceAllow=/dev/null \
        sh -c 'exec 3<> /dev/net/tun' > /dev/null 2>&1; then
    say "DevicePolicy=closed is not enforced here (a service without DeviceAllow=/dev/net/tun opened it)"
else
    say "DevicePolicy=closed is enforced here (a service without DeviceAllow=/dev/net/tun cannot open it)"
fi

# --- RDMA: an rxe device on the underlay for --provider verbs
provider_lines=()
if [ "$RDMA" = rxe ]; then
    # First our CM on the kernel's QP1 (umad: /dev/infiniband/umad0), which needs ib_cm not
    # loaded; rdma_ucm (the kernel's CM, /dev/infiniband/rdma_cm) comes after the bad file.
    modprobe -a rdma_rxe ib_umad
    if rdma link add rxe0 type rxe netdev "$UNDERLAY_IF" &&
       wait_for 10 test -e /dev/infiniband/uverbs0; then
        say "rxe0 on $UNDERLAY_IF: $(ls /dev/infiniband | tr '\n' ' '); /proc/devices: $(grep infiniband /proc/devices | tr '\n' ' ')"
        provider_lines=('provider = "verbs"' 'ib_dev = "rxe0"' 'cm_transport = "umad"')
    else
        result rxe_setup FAIL "rdma link add rxe0"
    fi
fi

# --- start: Type=notify, so `systemctl start` returns once the daemon sent READY=1
write_conf "${provider_lines[@]}"
c=$(cursor)
if timeout 60 systemctl start "$UNIT" && [ "$(prop ActiveState)/$(prop SubState)" = active/running ]; then
    result start_ready PASS "$(daemon_lines "$c" | grep -o ' started .*provider=[a-z]*' | head -1)"
else
    result start_ready FAIL "$(prop ActiveState)/$(prop SubState) $(prop Result)"
    journalctl -q -o cat -u "$UNIT" -n 20 --no-pager | sed 's/^/journal| /'
    echo "=== SYSTEMD-CHECK done: the unit did not start, nothing else checked"
    exit 1
fi
if wait_for "$PING_WAIT" pings; then
    result traffic PASS "ping $PEER_ADDR over $IFNAME"
else
    result traffic FAIL "no answer from $PEER_ADDR in $PING_WAIT s"
fi
ipoib-cm status 2>&1 | sed 's/^/status| /'

# --- reload: a changed live setting, the same process, the connection kept
pid=$(prop MainPID)
write_conf "${provider_lines[@]}" 'rx_timeout = "45s"'
c=$(cursor)
if timeout 30 systemctl reload "$UNIT" &&
   wait_for 10 bash -c "journalctl -q -o cat --after-cursor='$c' -u $UNIT | grep -q 'configuration reloaded: changed rx_timeout'" &&
   [ "$(prop MainPID)" = "$pid" ] && [ "$(prop ActiveState)" = active ] && pings; then
    result reload PASS "$(daemon_lines "$c" | grep -o 'SIGHUP: configuration reloaded.*' | head -1)"
else
    result reload FAIL "pid $pid -> $(prop MainPID), $(prop ActiveState); $(daemon_lines "$c" | tail -2 | tr '\n' ' ')"
fi

# --- watchdog: a stopped main process is killed after WatchdogSec and restarted
pid=$(prop MainPID)
restarts=$(prop NRestarts)
c=$(cursor)
t0=$SECONDS
if [ "$pid" -gt 1 ] && kill -STOP "$pid" && wait_for 60 active_pid_other_than "$pid"; then
    wd=$(journalctl -q -o cat --after-cursor="$c" -u "$UNIT" | grep -m1 -i 'watchdog timeout')
    if [ -n "$wd" ] && [ "$(prop NRestarts)" -gt "$restarts" ]; then
        result watchdog_restart PASS "pid $pid stopped, restarted as $(prop MainPID) after $((SECONDS - t0)) s: $wd"
    else
        result watchdog_restart FAIL "restarted but no watchdog line or NRestarts $restarts -> $(prop NRestarts)"
    fi
else
    [ "$pid" -le 1 ] || kill -CONT "$pid" 2>/dev/null
    result watchdog_restart FAIL "not restarted in 60 s: $(prop ActiveState)/$(prop SubState)"
fi
if wait_for "$PING_WAIT" pings; then
    result traffic_after_restart PASS
else
    result traffic_after_restart FAIL "no answer from $PEER_ADDR in $PING_WAIT s"
fi

# --- stop: the orderly teardown (DREQs; the peer counts them), exit 0, the interface gone
c=$(cursor)
if timeout 60 systemctl stop "$UNIT" && [ "$(prop Result)" = success ] &&
   [ "$(prop ExecMainStatus)" = 0 ] && ! ip link show "$IFNAME" > /dev/null 2>&1 &&
   daemon_lines "$c" | grep -q '^.* stopped uptime_s='; then
    result stop PASS "exit 0; $(daemon_lines "$c" | grep -o 'stopped uptime_s=[0-9]*' | head -1)"
else
    result stop FAIL "$(prop Result) status $(prop ExecMainStatus)"
fi
echo "MARK stopped"

# --- a bad file: exit 2, not restarted, one line on stderr (in the journal)
write_conf "${provider_lines[@]}" 'rx_timeout = "banana"'
c=$(cursor)
timeout 60 systemctl start "$UNIT" > /dev/null 2>&1
restarts=$(prop NRestarts)
sleep 5   # RestartSec=2s: a restart would have happened by now
lines=$(daemon_lines "$c")
if [ "$(prop ExecMainStatus)" = 2 ] && [ "$(prop ActiveState)" = failed ] &&
   [ "$(prop NRestarts)" = "$restarts" ] && [ "$(echo "$lines" | grep -c .)" = 1 ] &&
   [[ $lines == *"ipoib-cm up: config: rx_timeout: "* ]]; then
    result bad_config PASS "exit 2, failed, not restarted; journal: $lines"
else
    result bad_config FAIL "status $(prop ExecMainStatus), $(prop ActiveState), restarts $restarts -> $(prop NRestarts); lines: $lines"
fi
systemctl reset-failed "$UNIT"

# --- --provider verbs with no RDMA device: one line, exit 2, not restarted
if [ "$RDMA" = none ]; then
    write_conf 'provider = "verbs"'
    c=$(cursor)
    timeout 60 systemctl start "$UNIT" > /dev/null 2>&1
    sleep 3
    lines=$(daemon_lines "$c")
    if [ "$(prop ExecMainStatus)" = 2 ] && [ "$(prop ActiveState)" = failed ] &&
       [ "$(echo "$lines" | grep -c .)" = 1 ] && [[ $lines == *"no RDMA device"* ]]; then
        result verbs_no_device PASS "exit 2; journal: $lines"
    else
        result verbs_no_device FAIL "status $(prop ExecMainStatus), $(prop ActiveState); lines: $lines"
    fi
    systemctl reset-failed "$UNIT"
fi

# --- the device allowances count: with only uverbs0 and TUN allowed (a drop-in), our CM on
# umad cannot open /dev/infiniband/umad0 and the daemon stops at start in one line
if [ "$RDMA" = rxe ]; then
    mkdir -p "/run/systemd/system/$UNIT.d"
    printf '[Service]\nDeviceAllow=\nDeviceAllow=/dev/net/tun rw\nDeviceAllow=/dev/infiniband/uverbs0 rw\n' \
        > "/run/systemd/system/$UNIT.d/no-umad.conf"
    systemctl daemon-reload
    write_conf "${provider_lines[@]}"
    c=$(cursor)
    timeout 60 systemctl start "$UNIT" > /dev/null 2>&1
    lines=$(daemon_lines "$c")
    if [ "$(prop ExecMainStatus)" = 2 ] && [ "$(prop ActiveState)" = failed ] &&
       [ "$(echo "$lines" | grep -c .)" = 1 ] && [[ $lines == *umad0* ]]; then
        result umad_needs_allowance PASS "without it: $lines"
    else
        result umad_needs_allowance FAIL "status $(prop ExecMainStatus), $(prop ActiveState); lines: $lines"
        systemctl stop "$UNIT" 2>/dev/null
    fi
    rm -r "/run/systemd/system/$UNIT.d"
    systemctl daemon-reload
    systemctl reset-failed "$UNIT"
fi

# --- --provider verbs on the kernel's CM (rdma_cm): start, traffic, stop
if [ "$RDMA" = rxe ]; then
    modprobe rdma_ucm
    write_conf 'provider = "verbs"' 'ib_dev = "rxe0"' 'cm_transport = "rdmacm"'
    c=$(cursor)
    if timeout 60 systemctl start "$UNIT" && [ "$(prop ActiveState)/$(prop SubState)" = active/running ] &&
       wait_for "$PING_WAIT" pings && timeout 60 systemctl stop "$UNIT" && [ "$(prop Result)" = success ]; then
        result verbs_rdmacm PASS "$(daemon_lines "$c" | grep -o 'cm_transport=[a-z]* provider=[a-z]*' | head -1), ping, stop"
    else
        result verbs_rdmacm FAIL "$(prop ActiveState)/$(prop SubState) $(prop Result)"
        systemctl stop "$UNIT" 2>/dev/null
    fi
fi

journalctl -q -o short-monotonic -u "$UNIT" --no-pager | tail -n 80 | sed 's/^/journal| /'
echo "=== SYSTEMD-CHECK done: $fails failed"
[ "$fails" -eq 0 ]
