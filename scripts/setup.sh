#!/usr/bin/env bash
# Makes a fresh Debian 12 machine ready to build and test ipoib-cm; does nothing that is
# already done. Sourced by scripts/test.sh and scripts/demo.sh (it puts cargo on PATH), and
# runnable on its own.
#
# - apt packages: build-essential pkg-config iproute2 iputils-ping iperf3 tshark tcpdump ethtool,
#   and
#   for the `verbs` feature (libibverbs provider, librdmacm CM) cmake libclang-dev libibverbs-dev
#   librdmacm-dev libnl-3-dev libnl-route-3-dev python3, and the kernels the rxe lab boots in
#   qemu (never the host): linux-image-amd64 (6.1) and linux-image-6.12-amd64 (the meta package
#   of Debian 12's newest series, which follows its security updates), and for tests/sa_opensm.rs (an SA on a
#   simulated fabric) opensm ibsim-utils infiniband-diags (one `apt-get update`, only when
#   something is missing);
# - a Rust toolchain >= 1.85 with rustfmt and clippy (rustup; installed when there is none).
set -euo pipefail

# The guest kernels of scripts/rxe-interop.sh (scripts/rxe/run.sh boots /boot/vmlinuz-$KV).
IPOIB_RXE_KERNELS=(linux-image-amd64 linux-image-6.12-amd64)
IPOIB_APT_PACKAGES=(build-essential pkg-config iproute2 iputils-ping iperf3 tshark tcpdump ethtool
    cmake libclang-dev libibverbs-dev librdmacm-dev libnl-3-dev libnl-route-3-dev python3 curl
    opensm ibsim-utils infiniband-diags
    "${IPOIB_RXE_KERNELS[@]}")
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
        setup_as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get -o DPkg::Lock::Timeout=600 update
        setup_as_root env DEBIAN_FRONTEND=noninteractive \
            apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
        # The opensm package enables its service; the tests start their own SM on a simulated
        # fabric, and a stray SM must not come up on a host with a real InfiniBand port.
        if [[ " ${missing[*]} " == *" opensm "* ]] && command -v systemctl >/dev/null 2>&1; then
            setup_as_root systemctl disable --now opensm.service >/dev/null 2>&1 || true
        fi
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

setup_main
