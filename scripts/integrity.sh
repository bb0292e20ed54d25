#!/usr/bin/env bash
# Data integrity through the tunnel under impairment: a TCP transfer of SIZE_MB (default 1024)
# through ipoib-cm between two lab namespaces, with faults injected on the software fabric;
# sha256 of what was sent and what arrived must be equal, and the longest receive stall is
# reported (goal: under 1 s). Then the same with corruption injected: every corrupted frame
# must be caught by the ICRC check (the receivers' rx_bad_icrc equals the senders'
# fault_corrupted).
#
#   scripts/integrity.sh [SIZE_MB]
#
# Needs root; all traffic stays in the namespaces the lab creates. Bounded: each transfer is
# killed after 600 s.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${1:-1024}
[[ "$SIZE_MB" =~ ^[0-9]+$ ]] && [ "$SIZE_MB" -ge 1 ] || { echo "usage: $0 [SIZE_MB]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "integrity.sh: needs root" >&2; exit 2; }

cargo build --release --quiet
export IPOIB_CM_BIN=$PWD/target/release/ipoib-cm
export LAB_PREFIX=integ
export LAB_STATE=/run/ipoib-cm-integ
lab() { bash scripts/lab.sh "$@"; }
work=$(mktemp -d)
trap 'lab down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

cat > "$work/recv.py" <<'PY'
import hashlib, json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.19.0.2", 5555)); s.listen(1); s.settimeout(60)
c, _ = s.accept(); c.settimeout(120)
h = hashlib.sha256(); n = 0; last = time.monotonic(); start = last; stall = 0.0
while True:
    b = c.recv(1 << 20)
    now = time.monotonic()
    if not b:
        break
    stall = max(stall, now - last); last = now
    h.update(b); n += len(b)
print(json.dumps({"bytes": n, "sha256": h.hexdigest(), "seconds": last - start, "max_stall_s": stall}))
PY
cat > "$work/send.py" <<'PY'
import hashlib, json, socket, sys, time
size = int(sys.argv[1]) << 20
block = hashlib.sha256(b"ipoib-cm").digest() * 2048  # 64 KiB pattern base
h = hashlib.sha256(); sent = 0; i = 0
s = socket.create_connection(("198.19.0.2", 5555), timeout=30); s.settimeout(120)
start = time.monotonic()
while sent < size:
    chunk = (i.to_bytes(8, "big") + block)[: min(65536, size - sent)]
    s.sendall(chunk); h.update(chunk); sent += len(chunk); i += 1
s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
print(json.dumps({"bytes": sent, "sha256": h.hexdigest(), "seconds": time.monotonic() - start}))
PY

run() {
    local name=$1; shift
    lab down >/dev/null 2>&1 || true
    lab up 2 -- --qp-timeout 10 "$@" >/dev/null
    lab exec 2 timeout 600 python3 "$work/recv.py" > "$work/$name.recv" &
    local rpid=$!
    sleep 0.5
    lab exec 1 timeout 600 python3 "$work/send.py" "$SIZE_MB" > "$work/$name.send"
    wait "$rpid"
    lab status 1 > "$work/$name.s1"
    lab status 2 > "$work/$name.s2"
    python3 - "$name" "$work" <<'PY'
import json, sys
name, w = sys.argv[1], sys.argv[2]
snd = json.load(open(f"{w}/{name}.send")); rcv = json.load(open(f"{w}/{name}.recv"))
s1 = json.load(open(f"{w}/{name}.s1"))["provider"]; s2 = json.load(open(f"{w}/{name}.s2"))["provider"]
ok = snd["sha256"] == rcv["sha256"] and snd["bytes"] == rcv["bytes"]
corrupt = s1.get("fault_corrupted", 0) + s2.get("fault_corrupted", 0)
caught = s1.get("rx_bad_icrc", 0) + s2.get("rx_bad_icrc", 0)
print(f"integrity {name}: {rcv['bytes'] >> 20} MiB in {rcv['seconds']:.1f} s "
      f"({rcv['bytes'] * 8 / max(rcv['seconds'], 1e-9) / 1e6:.0f} Mbit/s), sha256 "
      f"{'equal' if ok else 'DIFFERENT'}, longest stall {rcv['max_stall_s'] * 1000:.0f} ms | "
      f"injected: loss {s1.get('fault_dropped',0)+s2.get('fault_dropped',0)} "
      f"reorder {s1.get('fault_reordered',0)+s2.get('fault_reordered',0)} "
      f"dup {s1.get('fault_duplicated',0)+s2.get('fault_duplicated',0)} corrupt {corrupt}; "
      f"ICRC caught {caught}; retransmits {s1.get('tx_retransmits',0)+s2.get('tx_retransmits',0)}")
bad = not ok or (corrupt and caught < corrupt)
sys.exit(1 if bad else 0)
PY
}

fail=0
run impaired --fault-loss 5 --fault-reorder 5 --fault-dup 1 || fail=1
run corrupted --fault-corrupt 1 --fault-loss 1 || fail=1
[ "$fail" -eq 0 ] || { echo "integrity.sh: FAILED" >&2; exit 1; }
echo "integrity: all transfers intact"
