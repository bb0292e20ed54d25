#!/usr/bin/env bash
# Builds target/debian/ipoib-cm_VERSION_ARCH.deb with cargo-deb (`cargo install cargo-deb` if it
# is missing: a few minutes of compiling, which is why scripts/test.sh does not run this): the
# release binary, the systemd unit, the example configuration, and the man pages and shell
# completions generated from the command's own definitions. The package is described by
# `[package.metadata.deb]` in Cargo.toml (tests/contrib.rs checks that its assets exist).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb > /dev/null || cargo install cargo-deb --locked
cargo build --release
rm -rf target/release/assets
target/release/ipoib-cm generate man target/release/assets/man
target/release/ipoib-cm generate completions target/release/assets/completions
cargo deb --no-build "$@"
