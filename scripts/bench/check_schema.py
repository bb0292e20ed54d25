#!/usr/bin/env python3
"""Checks that a `scripts/bench.sh --json` document has every figure the README promises.

    python3 scripts/bench/check_schema.py FILE

Each of `veth`, `peer` and `tunnel` must hold a number for every figure that applies to it
(`cpu_s_per_gb` is null for veth, which has no tunnel process), and the simulated-fabric
figures must be numbers. Exits 1 naming each missing figure; the values are not judged.
"""
import json
import sys

PATH_KEYS = ["tcp_gbps", "tcp4_gbps", "udp64_pps", "ping_p50_us", "ping_p99_us", "cpu_s_per_gb"]
TOP_KEYS = ["tunnel_setup_conns_per_s", "tunnel_reap_qps_per_s", "tunnel_rx_conn_bytes"]


def missing(doc):
    out = []
    for path in ["veth", "peer", "tunnel"]:
        figs = doc.get(path)
        if not isinstance(figs, dict):
            out.append(path)
            continue
        for key in PATH_KEYS:
            if key not in figs:
                out.append(f"{path}.{key} (absent)")
            elif figs[key] is None and not (path == "veth" and key == "cpu_s_per_gb"):
                out.append(f"{path}.{key} (null)")
    for key in TOP_KEYS:
        if not isinstance(doc.get(key), (int, float)):
            out.append(key)
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_schema.py FILE")
    with open(sys.argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    gaps = missing(doc)
    if gaps:
        print("bench JSON lacks: " + ", ".join(gaps))
        sys.exit(1)
    print("bench JSON: every figure present (veth, peer, tunnel, fabric)")


if __name__ == "__main__":
    main()
