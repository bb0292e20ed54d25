#!/usr/bin/env python3
"""Turns the raw files scripts/bench.sh collected into the table and the JSON document.

usage: report.py DIR [JSON_OUT]
"""
import json
import re
import sys
from pathlib import Path

from workers_report import MIN_SHARE, spread_over

D = Path(sys.argv[1])
OUT = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] else None
PATHS = ["veth", "peer", "tunnel", "tunnel1500"]
# The tunnel at MTU 9000 with --workers 2 (doc key tunnel_workers2), against "tunnel" (1 worker).
W2 = "tunnel2w"
# Measured for latency only (ping, TCP 1 stream): the tunnel with --busy-poll 5ms, and the
# naive relay (examples/naive_relay.rs), the floor of a userspace tunnel that sleeps.
BUSY = "tunnelbp"
RELAY = "relay"


def load(name):
    try:
        return json.loads((D / name).read_text())
    except (OSError, ValueError):
        return None


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = min(len(xs) - 1, max(0, int(round(q / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def path_figures(p):
    f = {k: None for k in ["tcp_gbps", "tcp4_gbps", "udp64_pps", "ping_p50_us",
                           "ping_p99_us", "cpu_s_per_gb"]}
    extra = {}
    runs = []
    for name in sorted(D.glob(f"{p}.tcp.*.json")):
        t = load(name.name)
        if t and "end" in t and "sum_received" in t["end"]:
            runs.append(t["end"])
    gb = None
    if runs:
        gbps = sorted(r["sum_received"]["bits_per_second"] / 1e9 for r in runs)
        f["tcp_gbps"] = gbps[len(gbps) // 2]
        gb = sum(r["sum_received"]["bytes"] for r in runs) / 1e9
        extra["tcp_runs_gbps"] = gbps
        extra["tcp_retransmits"] = sum(r.get("sum_sent", {}).get("retransmits") or 0 for r in runs)
    t = load(f"{p}.tcp4.json")
    if t and "end" in t and "sum_received" in t["end"]:
        f["tcp4_gbps"] = t["end"]["sum_received"]["bits_per_second"] / 1e9
    udp = []
    for name in sorted(D.glob(f"{p}.udp.*.json")):
        t = load(name.name)
        s = t["end"].get("sum", {}) if t and "end" in t else {}
        if s.get("seconds"):
            udp.append(((s["packets"] - s["lost_packets"]) / s["seconds"], s.get("lost_percent")))
    if udp:
        udp.sort(key=lambda r: r[0])
        f["udp64_pps"], extra["udp64_lost_pct"] = udp[len(udp) // 2]
        extra["udp64_runs_pps"] = [r[0] for r in udp]
    try:
        rtts = [float(m) * 1000.0 for m in
                re.findall(r"time=([0-9.]+) ms", (D / f"{p}.ping.txt").read_text())]
    except OSError:
        rtts = []
    if rtts:
        f["ping_p50_us"] = pct(rtts, 50)
        f["ping_p99_us"] = pct(rtts, 99)
        extra["ping_replies"] = len(rtts)
    c = load(f"{p}.cpu.json")
    if c and gb:
        if c["procs"] > 0:
            f["cpu_s_per_gb"] = c["proc"] / c["hz"] / gb
        extra["vm_cpu_s_per_gb"] = c["busy"] / c["hz"] / gb
        extra["softirq_s_per_gb"] = c["softirq"] / c["hz"] / gb
    try:
        extra["load"] = (D / f"{p}.load").read_text().strip()
    except OSError:
        pass
    try:
        m = re.search(r"(\d+) packets transmitted, (\d+) received",
                      (D / f"{p}.ping.txt").read_text())
    except OSError:
        m = None
    if m:
        extra["ping_sent"] = int(m.group(1))
        extra["ping_lost"] = int(m.group(1)) - int(m.group(2))
    return f, extra


def perf_counts(p, gb):
    """Syscalls and context switches per GB of the TCP single-stream runs (perf stat -x,)."""
    out = {"syscalls_per_gb": None, "ctxsw_per_gb": None}
    try:
        lines = (D / f"{p}.counts.txt").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        cols = line.split(",")
        if len(cols) < 3 or not gb:
            continue
        try:
            n = float(cols[0])
        except ValueError:
            continue
        if cols[2].startswith("raw_syscalls:sys_enter"):
            out["syscalls_per_gb"] = n / gb
        elif cols[2].startswith("context-switches"):
            out["ctxsw_per_gb"] = n / gb
    return out


def tcp_gb(p):
    total = 0
    for name in sorted(D.glob(f"{p}.tcp.*.json")):
        t = load(name.name)
        if t and "end" in t and "sum_received" in t["end"]:
            total += t["end"]["sum_received"]["bytes"]
    return total / 1e9 or None


def worker_spread(p):
    """Per node and worker, the packets sent and received during the 4-stream run."""
    rows = []
    for k in (1, 2):
        a, b = load(f"{p}.tcp4.before.{k}.json"), load(f"{p}.tcp4.after.{k}.json")
        if not a or not b:
            continue
        before = {w["index"]: w for w in a.get("workers", [])}
        for w in b.get("workers", []):
            w0 = before.get(w["index"], {})
            rows.append({"node": k, "worker": w["index"],
                         "tx_packets": w["tx_packets"] - w0.get("tx_packets", 0),
                         "rx_packets": w["rx_packets"] - w0.get("rx_packets", 0)})
    return rows


def udp_order(p):
    """The receiving iperf3's out-of-order, lost and received counts over its UDP streams."""
    t = load(f"{p}.udpooo.json")
    if not t or "end" not in t:
        return None, None, None
    udp = [s["udp"] for s in t["end"].get("streams", []) if "udp" in s]
    if not udp:
        return None, None, None
    return (sum(u.get("out_of_order", 0) for u in udp), sum(u.get("lost_packets", 0) for u in udp),
            sum(u.get("packets", 0) for u in udp))


doc = {}
extras = {}
for p in PATHS:
    doc[p], extras[p] = path_figures(p)
fab = load("fabric.json") or {}
doc["tunnel_setup_conns_per_s"] = fab.get("setup_conns_per_s")
doc["tunnel_reap_qps_per_s"] = fab.get("reap_qps_per_s")
rx = [x for x in (fab.get("rx_conn_bytes"), fab.get("rx_conn_bytes_big")) if x is not None]
doc["tunnel_rx_conn_bytes"] = max(rx) if rx else None
doc["tunnel_mtu1500"] = doc.pop("tunnel1500")
doc["tunnel"].update(perf_counts("tunnel", tcp_gb("tunnel")))
w2, extras[W2] = path_figures(W2)
w2.update(perf_counts(W2, tcp_gb(W2)))
w2["ping_lost"] = extras[W2].get("ping_lost")
w2["udp_out_of_order"], extras[W2]["udp_lost"], extras[W2]["udp_packets"] = udp_order(W2)
spread = worker_spread(W2)
extras[W2]["tcp4_workers"] = spread
# Every worker of both nodes carried a stream during the 4-stream run.
w2["tcp4_spread"] = (spread_over(spread)
                     if len({(r["node"], r["worker"]) for r in spread}) >= 4 else None)
doc["tunnel_workers2"] = w2
RATIO_KEYS = ["tcp_gbps", "tcp4_gbps", "udp64_pps", "ping_p50_us", "ping_p99_us", "cpu_s_per_gb",
              "syscalls_per_gb", "ctxsw_per_gb"]


def div(a, b):
    return None if a is None or b in (None, 0) else a / b


doc["workers2_vs_1"] = {k: div(w2[k], doc["tunnel"][k]) for k in RATIO_KEYS}
doc["workers2_vs_1"]["vm_cpu_s_per_gb"] = div(extras[W2].get("vm_cpu_s_per_gb"),
                                              extras["tunnel"].get("vm_cpu_s_per_gb"))
doc["tunnel_busy_poll"], extras[BUSY] = path_figures(BUSY)
doc["relay"], extras[RELAY] = path_figures(RELAY)
doc["extra"] = {p: extras[p] for p in PATHS + [BUSY, RELAY, W2]}
doc["extra"]["fabric"] = fab
try:
    doc["extra"]["fabric"]["load"] = (D / "fabric.load").read_text().strip()
except OSError:
    pass
prov = {}
for name in ("bw65536", "bw4096", "lat64"):
    prov[name] = load(f"perf-{name}.json")
doc["extra"]["provider_perf"] = prov


def fmt(v, unit=""):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}{unit}"
    if abs(v) >= 10:
        return f"{v:.1f}{unit}"
    return f"{v:.3g}{unit}"


def ratio(a, b):
    if a is None or b in (None, 0):
        return "-"
    return f"{a / b:.2f}x"


rows = [("TCP 1 stream Gbit/s", "tcp_gbps"), ("TCP 4 streams Gbit/s", "tcp4_gbps"),
        ("UDP 64 B recv pps", "udp64_pps"), ("ping p50 us", "ping_p50_us"),
        ("ping p99 us", "ping_p99_us"), ("CPU s/GB (tunnel procs)", "cpu_s_per_gb")]
hdr = f"{'':26}{'veth':>10}{'OpenVPN':>10}{'ipoib9000':>10}{'ipoib1500':>10}" \
      f"{'t/veth':>8}{'t/ovpn':>8}{'t1500/veth':>11}"
print(hdr)
t15 = doc["tunnel_mtu1500"]
for label, k in rows:
    v, o, t = doc["veth"][k], doc["peer"][k], doc["tunnel"][k]
    print(f"{label:26}{fmt(v):>10}{fmt(o):>10}{fmt(t):>10}{fmt(t15[k]):>10}"
          f"{ratio(t, v):>8}{ratio(t, o):>8}{ratio(t15[k], v):>11}")
# Latency-only paths: ping and TCP 1 stream, against veth and OpenVPN.
for title, fig in [("with --busy-poll 5ms:", doc["tunnel_busy_poll"]),
                   ("naive relay (floor):", doc["relay"])]:
    print(f"{title:26}")
    for label, k in [("  TCP 1 stream Gbit/s", "tcp_gbps"), ("  ping p50 us", "ping_p50_us"),
                     ("  ping p99 us", "ping_p99_us")]:
        print(f"{label:26}{fmt(doc['veth'][k]):>10}{fmt(doc['peer'][k]):>10}{fmt(fig[k]):>10}"
              f"{'':>10}{ratio(fig[k], doc['veth'][k]):>8}{ratio(fig[k], doc['peer'][k]):>8}")
print("TCP 1 stream, each run (Gbit/s; the median above): " + ", ".join(
    f"{p} " + "/".join(fmt(x) for x in extras[p].get("tcp_runs_gbps", []))
    for p in PATHS + [BUSY, RELAY]))
print("UDP 64 B, each run (pps; the median above): " + ", ".join(
    f"{p} " + "/".join(fmt(x) for x in extras[p].get("udp64_runs_pps", [])) for p in PATHS))
label = "whole-VM busy s/GB"
vm = [extras[p].get("vm_cpu_s_per_gb") for p in PATHS]
print(f"{label:26}" + "".join(f"{fmt(x):>10}" for x in vm)
      + f"{ratio(vm[2], vm[0]):>8}{ratio(vm[2], vm[1]):>8}{ratio(vm[3], vm[0]):>11}")
print("load average (1/5/15) at the end of each path: "
      + ", ".join(f"{p} {extras[p].get('load', '?')}" for p in PATHS + [W2])
      + f", fabric {doc['extra']['fabric'].get('load', '?')}")

print(f"\n{'workers (MTU 9000)':26}{'1 worker':>10}{'2 workers':>10}{'2w/1w':>8}")
T1 = doc["tunnel"]
for label, k in rows + [("syscalls/GB (TCP 1)", "syscalls_per_gb"),
                        ("ctxsw/GB (TCP 1)", "ctxsw_per_gb")]:
    print(f"{label:26}{fmt(T1[k]):>10}{fmt(w2[k]):>10}{ratio(w2[k], T1[k]):>8}")
vm1, vm2 = extras["tunnel"].get("vm_cpu_s_per_gb"), extras[W2].get("vm_cpu_s_per_gb")
print(f"{'whole-VM busy s/GB':26}{fmt(vm1):>10}{fmt(vm2):>10}{ratio(vm2, vm1):>8}")
print(f"2 workers: pings lost {w2['ping_lost']} of {extras[W2].get('ping_sent', '?')}; "
      f"iperf3 UDP 4 x 100 Mbit/s: {w2['udp_out_of_order']} out of order, "
      f"{extras[W2]['udp_lost']} lost of {extras[W2]['udp_packets']}; "
      f"4 TCP streams, packets per worker (tx/rx): " + ", ".join(
          f"node{r['node']} w{r['worker']} {r['tx_packets']}/{r['rx_packets']}" for r in spread))
print(f"load average (1/5/15): 1 worker {extras['tunnel'].get('load', '?')}, "
      f"2 workers {extras[W2].get('load', '?')}")
print()
print(f"simulated fabric: {fab.get('setup_conns', '?')} connections set up (burst) at "
      f"{fmt(doc['tunnel_setup_conns_per_s'])} conn/s ({fmt(fab.get('setup_virtual_s'))} s virtual, "
      f"{fmt(fab.get('setup_wall_s'))} s wall, {fab.get('setup_req_retransmits', '?')} CM retransmits); "
      f"paced {fab.get('setup_paced_batch', '?')} at a time: {fmt(fab.get('setup_paced_conns_per_s'))} conn/s")
print(f"simulated fabric: {fab.get('reap_qps', '?')} stale RX QPs reaped in "
      f"{fmt(fab.get('reap_cpu_s'))} s CPU / {fmt(fab.get('reap_wall_s'))} s wall = "
      f"{fmt(doc['tunnel_reap_qps_per_s'])} QP/s; hub heap per idle RX connection (SRQ) "
      f"{fmt(doc['tunnel_rx_conn_bytes'])} B")
print(f"simulated fabric: a node with the defaults and {fab.get('cluster_peers', '?')} peers "
      f"({fab.get('cluster_batch', '?')} at a time): {fab.get('cluster_inbound', '?')} reached it, "
      f"it reached {fab.get('cluster_outbound', '?')}, in {fmt(fab.get('cluster_virtual_s'))} s virtual "
      f"({fmt(fab.get('cluster_cpu_s'))} s CPU, all nodes); its QPs {fab.get('cluster_hub_qps', '?')}, "
      f"neighbours {fab.get('cluster_neighbours', '?')}, heap {fmt(fab.get('cluster_peer_bytes'))} B per peer "
      f"(RX + TX connection + neighbour); evicted {fab.get('cluster_rx_evicted', '?')} RX, "
      f"{fab.get('cluster_half_open_evicted', '?')} half-open, {fab.get('cluster_neigh_evicted', '?')} neighbours")
for name, v in prov.items():
    if not v:
        print(f"provider alone (ipoib-cm perf {name}): no result")
    elif v.get("mode") == "bw":
        print(f"provider alone (ipoib-cm perf --bw, {v.get('size')} B messages): "
              f"{fmt(v.get('gbit_s'))} Gbit/s, {fmt(v.get('msg_per_s'))} msg/s")
    else:
        print(f"provider alone (ipoib-cm perf --lat, {v.get('size')} B): one-way p50 "
              f"{fmt(v.get('lat_p50_us'))} us, p99 {fmt(v.get('lat_p99_us'))} us")

# Targets.
T, V, O = doc["tunnel"], doc["veth"], doc["peer"]


def check(name, ok):
    print(f"  [{'PASS' if ok else 'FAIL' if ok is not None else 'n/a '}] {name}")


def ge(a, b):
    return None if a is None or b is None else a >= b


def le(a, b):
    return None if a is None or b is None else a <= b


print("\ntargets:")
check("TCP >= 0.6x veth", ge(T["tcp_gbps"], V["tcp_gbps"] and 0.6 * V["tcp_gbps"]))
check("TCP >= 10x OpenVPN", ge(T["tcp_gbps"], O["tcp_gbps"] and 10 * O["tcp_gbps"]))
check("ping p50 <= veth p50 + 30 us",
      le(T["ping_p50_us"], V["ping_p50_us"] and V["ping_p50_us"] + 30))
check("ping p99 <= 3x p50", le(T["ping_p99_us"], T["ping_p50_us"] and 3 * T["ping_p50_us"]))
B = doc["tunnel_busy_poll"]
check("ping p50 <= veth p50 + 30 us, with --busy-poll 5ms",
      le(B["ping_p50_us"], V["ping_p50_us"] and V["ping_p50_us"] + 30))
check("ping p99 <= 3x p50, with --busy-poll 5ms",
      le(B["ping_p99_us"], B["ping_p50_us"] and 3 * B["ping_p50_us"]))
R = doc["relay"]
if R["ping_p50_us"] is not None and T["ping_p50_us"] is not None:
    print(f"  (context: the naive relay's ping p50 is {fmt(R['ping_p50_us'])} us, the tunnel's "
          f"{fmt(T['ping_p50_us'])} us: {fmt(T['ping_p50_us'] - R['ping_p50_us'])} us above the "
          f"floor of a tunnel that sleeps between packets)")
check(">= 150k pps of 64-byte UDP", ge(T["udp64_pps"], 150_000))
check("1,000 connections established <= 1 s (burst)",
      le(fab.get("setup_wall_s") and max(fab["setup_wall_s"], fab.get("setup_virtual_s", 0)), 1.0))
check("10,000 stale RX QPs reaped <= 1 s CPU", le(fab.get("reap_cpu_s"), 1.0))
check("<= 2 KiB heap per idle RX connection (SRQ)", le(doc["tunnel_rx_conn_bytes"], 2048))
R2 = doc["workers2_vs_1"]
check("--workers 2: TCP 1 stream >= 0.85x 1 worker", ge(R2["tcp_gbps"], 0.85))
check("--workers 2: CPU s/GB <= 1.15x 1 worker", le(R2["cpu_s_per_gb"], 1.15))
check(f"--workers 2: 4 TCP streams on every worker of both nodes (>= {MIN_SHARE:.0%} of its "
      "node's packets each)", w2["tcp4_spread"])
check("--workers 2: 0 pings lost", None if w2["ping_lost"] is None else w2["ping_lost"] == 0)
check("--workers 2: iperf3 UDP 0 out of order",
      None if w2["udp_out_of_order"] is None else w2["udp_out_of_order"] == 0)

if OUT:
    Path(OUT).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nJSON written to {OUT}")
