#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready for one purpose; does nothing that is already done.
# Sourced with the purpose as its argument (it puts cargo on PATH), or run on its own:
#
#   source scripts/setup.sh demo   # scripts/demo.sh, scripts/bench.sh: build and run the daemon
#   source scripts/setup.sh test   # scripts/test.sh (the default): everything the tests need
#   source scripts/setup.sh hw     # scripts/hw-check.sh: build with --features verbs, run on an HCA
#
# - demo: apt packages build-essential pkg-config iproute2 iputils-ping iperf3;
# - test: those, and tshark tcpdump ethtool python3 curl; for the `verbs` feature (libibverbs
#   provider, librdmacm CM) cmake libclang-dev libibverbs-dev librdmacm-dev libnl-3-dev
#   libnl-route-3-dev; for tests/sa_opensm.rs (an SA on a simulated fabric) opensm ibsim-utils
#   infiniband-diags; for scripts/systemd-check.sh (the package under systemd in a container)
#   debootstrap systemd-container. The rxe lab's guest kernels are never installed on the host:
#   scripts/rxe/run.sh unpacks them into a cache of its own (`run.sh kernels`);
# - hw: the demo's, the `verbs` build's (as for test) and the libibverbs providers and
#   ibverbs-utils (ibv_devinfo); no opensm, no simulator: a host with an HCA has its fabric's SM;
# - all: a Rust toolchain >= 1.85 with rustfmt and clippy (rustup; installed when there is none).
#
# One `apt-get update`, only when something is missing. Services that packages bring are neither
# started nor left enabled (a stray opensm must not come up on a host with a real InfiniBand
# port): the install runs under a policy-rc.d that refuses every start, and units the install
# enabled are disabled again.
set -euo pipefail

IPOIB_SETUP_PURPOSE=${1:-test}
IPOIB_APT_PACKAGES=(build-essential pkg-config iproute2 iputils-ping iperf3)
case $IPOIB_SETUP_PURPOSE in
    demo) ;;
    test) IPOIB_APT_PACKAGES+=(tshark tcpdump ethtool python3 curl
              cmake libclang-dev libibverbs-dev librdmacm-dev libnl-3-dev libnl-route-3-dev
              opensm ibsim-utils infiniband-diags debootstrap systemd-container) ;;
    hw) IPOIB_APT_PACKAGES+=(cmake libclang-dev libibverbs-dev librdmacm-dev libnl-3-dev
              libnl-route-3-dev ibverbs-providers ibverbs-utils) ;;
    *) printf '[setup] unknown purpose %s (demo, test or hw)\n' "$IPOIB_SETUP_PURPOSE" >&2; return 2 2>/dev/null || exit 2 ;;
esac
IPOIB_MIN_RUST_MINOR=85

setup_say() { printf '[setup] %s\n' "$*"; }

setup_as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        setup_say "needs root for: $*" >&2
        return 1
    fi
}

# Puts an existing cargo on PATH: PATH itself, ~/.cargo/bin, or (under sudo) the invoking
# user's ~/.cargo/bin with that user's rustup toolchains.
setup_find_cargo() {
    command -v cargo >/dev/null 2>&1 && return 0
    if [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
        export PATH="${HOME:-/root}/.cargo/bin:$PATH"
        return 0
    fi
    if [ -n "${SUDO_USER:-}" ]; then
        local home
        home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
        if [ -n "$home" ] && [ -x "$home/.cargo/bin/cargo" ]; then
            export PATH="$home/.cargo/bin:$PATH"
            export RUSTUP_HOME="${RUSTUP_HOME:-$home/.rustup}"
            return 0
        fi
    fi
    return 1
}

# True when the rustc on PATH is at least 1.$IPOIB_MIN_RUST_MINOR.
setup_rust_new_enough() {
    local minor
    minor=$(rustc --version 2>/dev/null | sed -n 's/^rustc 1\.\([0-9]*\)\..*/\1/p')
    [ -n "$minor" ] && [ "$minor" -ge "$IPOIB_MIN_RUST_MINOR" ]
}

# Lists the services enabled on this host: systemd units (links under
# /etc/systemd/system/*.wants) and SysV scripts started in a multi-user runlevel (sysv:NAME).
setup_enabled_units() {
    {
        find /etc/systemd/system -path '*.wants/*' -printf '%f\n' 2>/dev/null
        find /etc/rc2.d /etc/rc3.d /etc/rc4.d /etc/rc5.d -name 'S[0-9][0-9]*' -printf 'sysv:%f\n' \
            2>/dev/null | sed -E 's/^sysv:S[0-9]{2}/sysv:/'
    } | sort -u
}

# apt-get install PACKAGES with no service started (policy-rc.d answers 101, "action
# forbidden", to every invoke-rc.d/deb-systemd-invoke) and every unit the install enabled
# disabled again. An existing policy-rc.d is left as it is.
setup_apt_install() {
    local before policy=/usr/sbin/policy-rc.d ours=0 unit
    before=$(setup_enabled_units)
    if [ ! -e "$policy" ]; then
        setup_as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
        ours=1
    fi
    local rc=0
    setup_as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get -o DPkg::Lock::Timeout=600 update || rc=$?
    [ $rc -ne 0 ] || setup_as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "$@" || rc=$?
    [ $ours -eq 0 ] || setup_as_root rm -f "$policy"
    for unit in $(comm -13 <(printf '%s\n' "$before") <(setup_enabled_units)); do
        setup_say "disabling $unit (enabled by the install)"
        case $unit in
            sysv:*) setup_as_root update-rc.d "${unit#sysv:}" disable >/dev/null 2>&1 || true ;;
            *) setup_as_root systemctl disable "$unit" >/dev/null 2>&1 ||
                   setup_as_root find /etc/systemd/system -path "*.wants/$unit" -delete ;;
        esac
    done
    return $rc
}

# What set-up must never change on the host: its kernel packages and its /boot.
setup_host_kernels() {
    dpkg-query -W -f='${Package} ${Version} ${Status}\n' 'linux-image-*' 2>/dev/null | grep ' installed$' || true
    ls -l --time-style=+%s /boot 2>/dev/null || true
}

# Fails with a line saying what changed when the host's kernel packages or /boot differ from
# what they were when this file was sourced.
setup_host_unchanged() {
    local now
    now=$(setup_host_kernels)
    if [ "$now" != "$IPOIB_HOST_KERNELS_BEFORE" ]; then
        setup_say "the host's kernel packages or /boot changed:"
        diff <(printf '%s\n' "$IPOIB_HOST_KERNELS_BEFORE") <(printf '%s\n' "$now") || true
        return 1
    fi
    setup_say "host untouched: $(printf '%s\n' "$now" | grep -c '^linux-image') linux-image packages and /boot as before"
}

setup_main() {
    local need_rustup=0 missing=() p
    if ! setup_find_cargo || ! setup_rust_new_enough; then
        command -v rustup >/dev/null 2>&1 || need_rustup=1
    fi
    local wanted=("${IPOIB_APT_PACKAGES[@]}")
    [ "$need_rustup" -eq 0 ] || wanted+=(curl ca-certificates)
    for p in "${wanted[@]}"; do
        [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = 'install ok installed' ] \
            || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        setup_say "installing: ${missing[*]}"
        setup_apt_install "${missing[@]}"
    else
        setup_say "apt packages present"
    fi

    if [ "$need_rustup" -eq 1 ]; then
        setup_say "installing Rust (rustup, stable, minimal profile)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
            | sh -s -- -y --profile minimal --component rustfmt,clippy
        export PATH="${HOME:-/root}/.cargo/bin:$PATH"
    elif ! setup_rust_new_enough; then
        setup_say "rustc older than 1.$IPOIB_MIN_RUST_MINOR: updating the stable toolchain"
        rustup toolchain install stable --profile minimal --component rustfmt,clippy
        rustup default stable
    fi
    cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
    cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
    setup_say "$(cargo --version)"
}

IPOIB_HOST_KERNELS_BEFORE=${IPOIB_HOST_KERNELS_BEFORE:-$(setup_host_kernels)}
setup_main
