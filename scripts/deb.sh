#!/usr/bin/env bash
# Builds target/debian/ipoib-cm_VERSION_ARCH.deb with cargo-deb (`cargo install cargo-deb
# --locked` if it is missing: about 40 s of compiling on 2 cores): the release binary with the
# libibverbs provider (`--features verbs`, so the one package serves the software fabric, RoCE
# and InfiniBand), the systemd unit, the example configuration, and the man pages and shell
# completions generated from the command's own definitions. The package is described by
# `[package.metadata.deb]` in Cargo.toml (tests/contrib.rs checks that its assets exist); its
# dependencies are what dpkg-shlibdeps finds the binary linked to (`$auto`): libc6, libgcc-s1,
# libibverbs1 and librdmacm1, all from Debian main. Building needs the `verbs` feature's
# build dependencies (scripts/setup.sh test). Prints the package's path last.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb > /dev/null || cargo install cargo-deb --locked
cargo build --release --features verbs
rm -rf target/release/assets
target/release/ipoib-cm generate man target/release/assets/man
target/release/ipoib-cm generate completions target/release/assets/completions
cargo deb --no-build "$@"
