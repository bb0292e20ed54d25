#!/usr/bin/env python3
"""Tables and JSON from the raw files of scripts/bench/scale.sh and scripts/bench/ab.sh.

usage: workers_report.py scale|ab DIR [JSON_OUT]

Both read what scripts/bench/lib.sh's tcp_measure wrote for one measurement BASE: BASE.R.json
(iperf3 -J, one per run), BASE.cpu.json (jiffies of both daemons and of the whole machine,
the load average), BASE.before/after.K.json (node K's status --json) and BASE.counts.txt
(perf stat -x,, where counted).
"""
import json
import sys
from pathlib import Path


def load(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def div(a, b):
    return None if a is None or b in (None, 0) else a / b


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if abs(v) >= 1000:
        return f"{v:,.0f}{unit}"
    if abs(v) >= 10:
        return f"{v:.1f}{unit}"
    return f"{v:.3g}{unit}"


def ratio(v):
    return "-" if v is None else f"{v:.2f}x"


def measurement(base):
    """The figures of one tcp_measure BASE (a path without the suffixes)."""
    base = Path(base)
    runs = []
    for r in range(1, 100):
        t = load(f"{base}.{r}.json")
        if t is None:
            break
        end = t.get("end", {})
        if "sum_received" in end:
            runs.append(end)
    gbps = [r["sum_received"]["bits_per_second"] / 1e9 for r in runs]
    gb = sum(r["sum_received"]["bytes"] for r in runs) / 1e9 or None
    m = {"gbps": median(gbps), "runs_gbps": gbps, "gb": gb,
         "retransmits": sum(r.get("sum_sent", {}).get("retransmits") or 0 for r in runs),
         "cpu_s_per_gb": None, "vm_cpu_s_per_gb": None, "syscalls_per_gb": None,
         "ctxsw_per_gb": None, "load": None}
    c = load(f"{base}.cpu.json")
    if c:
        m["load"] = c.get("load")
        if gb:
            m["cpu_s_per_gb"] = c["proc"] / c["hz"] / gb
            m["vm_cpu_s_per_gb"] = c["busy"] / c["hz"] / gb
    try:
        lines = Path(f"{base}.counts.txt").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        cols = line.split(",")
        if len(cols) < 3 or not gb:
            continue
        try:
            n = float(cols[0])
        except ValueError:
            continue
        if cols[2].startswith("raw_syscalls:sys_enter"):
            m["syscalls_per_gb"] = n / gb
        elif cols[2].startswith("context-switches"):
            m["ctxsw_per_gb"] = n / gb
    workers = []
    for k in (1, 2):
        a, b = load(f"{base}.before.{k}.json"), load(f"{base}.after.{k}.json")
        if not a or not b or "workers" not in b:
            continue
        before = {w["index"]: w for w in a.get("workers", [])}
        for w in b["workers"]:
            w0 = before.get(w["index"], {})
            workers.append({"node": k, "worker": w["index"],
                            "tx_packets": w["tx_packets"] - w0.get("tx_packets", 0),
                            "rx_packets": w["rx_packets"] - w0.get("rx_packets", 0),
                            "cpu_s": w["cpu_seconds"] - w0.get("cpu_seconds", 0)})
    m["workers"] = workers
    m["spread"] = spread_over(workers)
    return m


# A worker carries a stream if it moved at least this share of its node's packets: 4 streams
# over 2 workers give one of them at least a quarter, while the iperf3 control connection and
# neighbour traffic, which also reach a worker without a stream, stay far below 1 %.
MIN_SHARE = 0.10


def spread_over(workers):
    """Whether every worker of both nodes sent and received packets and carried at least
    MIN_SHARE of its node's (None: no per-worker status)."""
    if not workers:
        return None
    total = {}
    for w in workers:
        total[w["node"]] = total.get(w["node"], 0) + w["tx_packets"] + w["rx_packets"]
    return all(w["tx_packets"] > 0 and w["rx_packets"] > 0
               and w["tx_packets"] + w["rx_packets"] >= MIN_SHARE * total[w["node"]]
               for w in workers)


def per_worker(m):
    return ", ".join(f"n{w['node']}w{w['worker']} {w['tx_packets']}/{w['rx_packets']}"
                     for w in m["workers"]) or "-"


def scale(d, out):
    machine = load(d / "machine.json") or {}
    cpus = machine.get("cpus")
    counts = sorted(int(p.name[1:].split(".")[0]) for p in d.glob("w*.pin.json"))
    doc = {"cpus": cpus, "can_show_scaling": bool(cpus and cpus >= 8), "machine": machine,
           "configs": []}
    for n in counts:
        pin = load(d / f"w{n}.pin.json") or {}
        for p in (1, 8):
            m = measurement(d / f"w{n}.p{p}")
            m.update({"workers_n": n, "streams": p, "disjoint": pin.get("disjoint")})
            doc["configs"].append(m)
    one = {c["streams"]: c for c in doc["configs"] if c["workers_n"] == 1}
    for c in doc["configs"]:
        b = one.get(c["streams"])
        c["gbps_vs_1"] = div(c["gbps"], b and b["gbps"])
        c["cpu_s_per_gb_vs_1"] = div(c["cpu_s_per_gb"], b and b["cpu_s_per_gb"])
        c["linear_fraction"] = div(c["gbps_vs_1"], c["workers_n"])
    print(f"{'workers':>7} {'streams':>7} {'Gbit/s':>8} {'vs 1':>6} {'of linear':>9} "
          f"{'CPU s/GB':>9} {'vs 1':>6} {'VM s/GB':>8} {'pinned':>8} {'load':>15}  "
          "packets per worker (node, worker: tx/rx)")
    for c in doc["configs"]:
        print(f"{c['workers_n']:>7} {c['streams']:>7} {fmt(c['gbps']):>8} "
              f"{ratio(c['gbps_vs_1']):>6} {ratio(c['linear_fraction']):>9} "
              f"{fmt(c['cpu_s_per_gb']):>9} {ratio(c['cpu_s_per_gb_vs_1']):>6} "
              f"{fmt(c['vm_cpu_s_per_gb']):>8} "
              f"{'disjoint' if c['disjoint'] else 'shared':>8} {c['load'] or '?':>15}  "
              f"{per_worker(c)}")
    print("(Gbit/s: the median of the runs, each: " + "; ".join(
        f"{c['workers_n']}w -P {c['streams']} " + "/".join(fmt(x) for x in c["runs_gbps"])
        for c in doc["configs"]) + ")")
    if not doc["can_show_scaling"]:
        print(f"\nThis machine has {cpus} CPUs, fewer than 8: it cannot show scaling (both nodes, "
              "their workers and both iperf3 ends share them). The figures above show what "
              "workers cost, not what they buy.")
    else:
        c8 = {c["streams"]: c for c in doc["configs"] if c["workers_n"] == 8}
        c4 = {c["streams"]: c for c in doc["configs"] if c["workers_n"] == 4}
        print("\ntargets (>= 8 cores):")

        def check(name, ok):
            print(f"  [{'PASS' if ok else 'FAIL' if ok is not None else 'n/a '}] {name}")

        def ge(a, b):
            return None if a is None else a >= b

        check("-P 8 with 8 workers >= 5x one worker", ge((c8.get(8) or {}).get("gbps_vs_1"), 5))
        check(">= 0.7x linear at 4 workers (-P 8)", ge((c4.get(8) or {}).get("linear_fraction"), 0.7))
        check(">= 0.7x linear at 8 workers (-P 8)", ge((c8.get(8) or {}).get("linear_fraction"), 0.7))
        check("one stream no slower with 8 workers", ge((c8.get(1) or {}).get("gbps_vs_1"), 1.0))
    if out:
        Path(out).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nJSON written to {out}")


KEYS = [("TCP 1 stream Gbit/s", "p1", "gbps"), ("TCP 4 streams Gbit/s", "p4", "gbps"),
        ("CPU s/GB (1 stream)", "p1", "cpu_s_per_gb"), ("CPU s/GB (4 streams)", "p4", "cpu_s_per_gb"),
        ("VM busy s/GB (1 stream)", "p1", "vm_cpu_s_per_gb"),
        ("syscalls/GB (1 stream)", "p1", "syscalls_per_gb"),
        ("syscalls/GB (4 streams)", "p4", "syscalls_per_gb"),
        ("ctxsw/GB (1 stream)", "p1", "ctxsw_per_gb"), ("ctxsw/GB (4 streams)", "p4", "ctxsw_per_gb")]
CONFIGS = ["base", "w1", "w2"]


def ab(d, out):
    meta = load(d / "meta.json") or {}
    rounds = meta.get("rounds", 0)
    raw = {c: {p: [measurement(d / f"r{r}.{c}.{p}") for r in range(1, rounds + 1)]
               for p in ("p1", "p4")} for c in CONFIGS}
    doc = {"meta": meta, "rounds": {}, "median": {}, "ratios": {}}
    for c in CONFIGS:
        doc["rounds"][c] = raw[c]
        doc["median"][c] = {f"{p}_{k}": median([m[k] for m in raw[c][p]])
                            for _, p, k in KEYS}

    def paired(a, b, p, k):
        """The ratios b/a within each round."""
        return [div(y[k], x[k]) for x, y in zip(raw[a][p], raw[b][p])]

    for a, b in (("base", "w1"), ("w1", "w2")):
        doc["ratios"][f"{b}/{a}"] = {
            f"{p}_{k}": {"of_medians": div(doc["median"][b][f"{p}_{k}"], doc["median"][a][f"{p}_{k}"]),
                         "per_round": paired(a, b, p, k)} for _, p, k in KEYS}

    def spread(c, p, k):
        xs = [m[k] for m in raw[c][p] if m[k] is not None]
        med = median(xs)
        return div(max(xs) - min(xs), med) if xs else None

    print(f"{rounds} rounds of {meta.get('seconds', '?')} s per measurement, order reversed every "
          f"other round; medians over the rounds, ratios of the medians [range of the ratios within "
          f"a round]")
    print(f"{'':26}{'base':>10}{'w1':>10}{'w2':>10}  {'w1/base':>22}  {'w2/w1':>22}  base spread")
    for label, p, k in KEYS:
        med = [doc["median"][c][f"{p}_{k}"] for c in CONFIGS]
        cells = []
        for key in ("w1/base", "w2/w1"):
            r = doc["ratios"][key][f"{p}_{k}"]
            pr = [x for x in r["per_round"] if x is not None]
            rng = f"[{min(pr):.2f}-{max(pr):.2f}]" if pr else ""
            cells.append(f"{ratio(r['of_medians'])} {rng}")
        sp = spread("base", p, k)
        print(f"{label:26}" + "".join(f"{fmt(v):>10}" for v in med)
              + f"  {cells[0]:>22}  {cells[1]:>22}  {'-' if sp is None else f'{sp * 100:.0f} %'}")
    print("each round (Gbit/s 1 stream / 4 streams; load 1/5/15 at the end of the 4-stream run):")
    for r in range(rounds):
        print(f"  round {r + 1}: " + "; ".join(
            f"{c} {fmt(raw[c]['p1'][r]['gbps'])}/{fmt(raw[c]['p4'][r]['gbps'])} "
            f"(load {raw[c]['p4'][r]['load'] or '?'})" for c in CONFIGS))
    print("w2, 4 streams, packets per worker (node, worker: tx/rx), each round:")
    for r, m in enumerate(raw["w2"]["p4"]):
        print(f"  round {r + 1}: {per_worker(m)}")

    def check(name, ok):
        print(f"  [{'PASS' if ok else 'FAIL' if ok is not None else 'n/a '}] {name}")

    def within_noise(key, p, k):
        v = doc["ratios"][key][f"{p}_{k}"]["of_medians"]
        sp = spread("base", p, k)
        if v is None or sp is None:
            return None, None
        tol = max(0.05, sp)
        return abs(v - 1) <= tol, tol

    print("\ntargets:")
    doc["checks"] = {}
    for label, p, k in [("TCP 1 stream", "p1", "gbps"), ("TCP 4 streams", "p4", "gbps"),
                        ("syscalls/GB, 1 stream", "p1", "syscalls_per_gb"),
                        ("context switches/GB, 1 stream", "p1", "ctxsw_per_gb"),
                        ("syscalls/GB, 4 streams", "p4", "syscalls_per_gb"),
                        ("context switches/GB, 4 streams", "p4", "ctxsw_per_gb")]:
        ok, tol = within_noise("w1/base", p, k)
        doc["checks"][f"w1_vs_base_{p}_{k}"] = ok
        check(f"--workers 1 vs base, {label}: within noise"
              + (f" (|ratio - 1| <= {tol:.2f})" if tol is not None else ""), ok)
    r2 = doc["ratios"]["w2/w1"]
    v = r2["p1_gbps"]["of_medians"]
    doc["checks"]["w2_p1_ge_085"] = None if v is None else v >= 0.85
    check("--workers 2 vs 1: 1 stream >= 0.85x", doc["checks"]["w2_p1_ge_085"])
    v = r2["p1_cpu_s_per_gb"]["of_medians"]
    doc["checks"]["w2_cpu_le_115"] = None if v is None else v <= 1.15
    check("--workers 2 vs 1: CPU s/GB (1 stream) <= 1.15x", doc["checks"]["w2_cpu_le_115"])
    sp = [m["spread"] for m in raw["w2"]["p4"]]
    doc["checks"]["w2_p4_spread_rounds"] = sum(1 for s in sp if s)
    ok = None if any(s is None for s in sp) or not sp else all(sp)
    doc["checks"]["w2_p4_spread"] = ok
    check(f"--workers 2: 4 streams on every worker of both nodes (each sent and received, "
          f">= {MIN_SHARE:.0%} of its node's packets; {sum(1 for s in sp if s)} of {len(sp)} rounds)", ok)
    if out:
        Path(out).write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nJSON written to {out}")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("scale", "ab"):
        sys.exit("usage: workers_report.py scale|ab DIR [JSON_OUT]")
    d = Path(sys.argv[2])
    out = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
    (scale if sys.argv[1] == "scale" else ab)(d, out)


if __name__ == "__main__":
    main()
