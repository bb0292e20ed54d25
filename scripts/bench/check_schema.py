#!/usr/bin/env python3
"""Checks that a `scripts/bench.sh --json` document has every figure the README promises.

    python3 scripts/bench/check_schema.py FILE

Each of `veth`, `peer` and `tunnel` must hold a number for every figure that applies to it
(`cpu_s_per_gb` is null for veth, which has no tunnel process), and the simulated-fabric
figures must be numbers. The tunnel with two workers (`tunnel_workers2`) must hold those figures,
the daemons' syscalls and context switches per GB (also in `tunnel`), pings lost, iperf3 UDP's
out-of-order count and whether the 4 streams spread over the workers (a boolean);
`workers2_vs_1` its ratios against one worker. Exits 1 naming each missing figure; the values
are not judged.
"""
import json
import sys

PATH_KEYS = ["tcp_gbps", "tcp4_gbps", "udp64_pps", "ping_p50_us", "ping_p99_us", "cpu_s_per_gb"]
TOP_KEYS = ["tunnel_setup_conns_per_s", "tunnel_reap_qps_per_s", "tunnel_rx_conn_bytes"]
COUNT_KEYS = ["syscalls_per_gb", "ctxsw_per_gb"]
WORKERS_KEYS = PATH_KEYS + COUNT_KEYS + ["ping_lost", "udp_out_of_order"]
RATIO_KEYS = ["tcp_gbps", "tcp4_gbps", "cpu_s_per_gb"] + COUNT_KEYS


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
    for path, keys in [("tunnel", COUNT_KEYS), ("tunnel_workers2", WORKERS_KEYS),
                       ("workers2_vs_1", RATIO_KEYS)]:
        figs = doc.get(path)
        if not isinstance(figs, dict):
            out.append(path)
            continue
        for key in keys:
            if not isinstance(figs.get(key), (int, float)) or isinstance(figs.get(key), bool):
                out.append(f"{path}.{key}")
    if not isinstance((doc.get("tunnel_workers2") or {}).get("tcp4_spread"), bool):
        out.append("tunnel_workers2.tcp4_spread")
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
    print("bench JSON: every figure present (veth, peer, tunnel, tunnel_workers2, fabric)")


if __name__ == "__main__":
    main()
