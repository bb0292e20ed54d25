#!/usr/bin/env bash
# Two-node demo on the software fabric (README: `sudo scripts/demo.sh`).
#
# Placeholder: the demo needs the interface daemon, which is not written yet. For now this
# prepares the machine and builds the release binary.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/setup.sh
source scripts/setup.sh

echo "==== cargo build --release ===="
cargo build --release

cat <<'TXT'

Built target/release/ipoib-cm.
The two-node demo (two network namespaces talking IPoIB-CM over the software RoCEv2 fabric)
arrives with the interface daemon; until then there is nothing more to run here.
Run `sudo scripts/test.sh` for the tests.
TXT
