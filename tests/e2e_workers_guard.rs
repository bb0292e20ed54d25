//! The mission's guarantees with `--workers N`, against daemons in network namespaces made by
//! `scripts/lab.sh` (removed by each test; without root they are skipped):
//!
//! - `killed_peers_are_reaped_on_every_worker`: three peers with 4 workers each send flows
//!   that spread over their workers, so their connections land on every worker of node 1
//!   (4 workers, `--rx-timeout 1s`); SIGKILLed, every RX connection of node 1 is reaped within
//!   the stale timeout plus a margin on every worker, `qp_live` comes back to its baseline,
//!   with no drain timeout and nothing retired undrained;
//! - `a_req_burst_over_workers_stays_within_the_global_budget`: four peers connect at once to
//!   node 1 (`--reject --max-conn-qp 2 --max-pending-rx 1`, 4 workers): no sample of its
//!   status shows more live RX connections than the budget and the one half-open allowed,
//!   the burst settles at the budget, and the REQs beyond are rejected;
//! - `under_evict_the_newest_peer_reaches_a_full_node`: node 1 with `--evict --max-conn-qp 2`
//!   and 2 workers, its budget spent by three peers: a fourth reaches it at once;
//! - `a_restarted_peer_loses_its_old_connections_on_every_worker`: node 2 (4 workers)
//!   connected on every worker of node 1 is SIGKILLed and started again; once it reconnects,
//!   none of its old incarnation's RX connections is live on node 1 (long before the stale
//!   timeout of 60 s).
//!
//! Flows: UDP datagrams by bash's `/dev/udp` from a new source port each, to a closed port,
//! which the kernel hashes to TUN queues, so each peer sends on every worker. Every wait and
//! loop is bounded.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::{provider_of, Lab, BIN};

/// Starts flows from node `from` to `to` for `secs` seconds: every 0.1 s a datagram from
/// each of 8 new source ports (bounded by `timeout`).
fn flows(lab: &Lab, from: usize, to: &str, secs: u32) -> Child {
    let script = format!(
        "end=$((SECONDS + {secs})); while [ $SECONDS -lt $end ]; do \
         for p in 1 2 3 4 5 6 7 8; do echo x 2>/dev/null > /dev/udp/{to}/$((40000 + p)); done; \
         sleep 0.1; done 2>/dev/null"
    );
    Command::new("ip")
        .args(["netns", "exec", &format!("{}{from}", lab.prefix)])
        .args(["timeout", &(secs + 5).to_string(), "bash", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("flows")
}

/// Waits for flows started by [`flows`] (bounded by their own `timeout`).
fn finish(children: Vec<Child>) {
    for c in children {
        let _ = common::child::output_within(c, Duration::from_secs(30));
    }
}

/// Node `k`'s status by the binary itself (faster than through `lab.sh`, for sampling);
/// `None` when it does not answer.
fn sample(lab: &Lab, k: usize) -> Option<serde_json::Value> {
    let mut c = Command::new(BIN);
    c.args(["status", "--json", "--control-socket"])
        .arg(lab.socket(k));
    let out = common::lab::run_within(c, Duration::from_secs(10));
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// The live RX connections of a status.
fn live_rx(s: &serde_json::Value) -> Vec<&serde_json::Value> {
    s["rx"]
        .as_array()
        .map(|r| r.iter().filter(|c| c["state"] == "live").collect())
        .unwrap_or_default()
}

/// Each worker's `rx_conns`, by index.
fn rx_per_worker(s: &serde_json::Value) -> Vec<u64> {
    s["workers"]
        .as_array()
        .map(|w| {
            w.iter()
                .map(|w| w["rx_conns"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

fn counter(s: &serde_json::Value, name: &str) -> u64 {
    s["counters"][name].as_u64().unwrap_or(0)
}

#[test]
fn killed_peers_are_reaped_on_every_worker() {
    const RX_TIMEOUT: Duration = Duration::from_secs(1);
    // The stale timer fires within one rx_timeout of the last packet, and a teardown ends
    // within the drain bound (1 s): two seconds more is the margin for a loaded machine.
    const REAP_LIMIT: Duration = Duration::from_secs(4);
    let Some(lab) = Lab::up(
        "gdrp",
        4,
        &[
            "--workers",
            "4",
            "--rx-timeout",
            "1s",
            "--drain-timeout",
            "1s",
            "--neigh-timeout",
            "2s",
        ],
    ) else {
        return;
    };
    // Once every worker has reported (before, its QPs are not in the status).
    let reported = |s: &serde_json::Value| {
        s["workers"].as_array().is_some_and(|w| {
            w.len() == 4 && w.iter().all(|w| w["cpu_seconds"].as_f64() > Some(0.0))
        })
    };
    assert!(lab.wait_for(Duration::from_secs(5), |l| reported(&l.status(1))));
    let baseline = counter(&lab.status(1), "qp_live");
    let traffic: Vec<Child> = (2..=4).map(|k| flows(&lab, k, "198.19.0.1", 6)).collect();
    // Every peer connected on several workers, and node 1's connections on every worker.
    let mut spread = Vec::new();
    let spread_ok = lab.wait_for(Duration::from_secs(5), |l| {
        let Some(s) = sample(l, 1) else {
            return false;
        };
        spread = rx_per_worker(&s);
        let peers: BTreeSet<String> = live_rx(&s)
            .iter()
            .filter_map(|c| c["peer"].as_str().map(str::to_owned))
            .collect();
        peers.len() == 3 && spread.iter().filter(|n| **n > 0).count() == 4
    });
    let before = lab.status(1);
    let conns = live_rx(&before).len();
    assert!(
        spread_ok,
        "node 1's RX connections per worker {spread:?}, {}",
        before["rx"]
    );
    for k in 2..=4 {
        assert!(lab.sh(&["kill", &k.to_string()]).status.success());
    }
    let killed = Instant::now();
    let mut last = Vec::new();
    let reaped = lab.wait_for(REAP_LIMIT + Duration::from_secs(4), |l| {
        let Some(s) = sample(l, 1) else {
            return false;
        };
        last = rx_per_worker(&s);
        s["rx"].as_array().is_some_and(Vec::is_empty) && last.iter().all(|n| *n == 0)
    });
    let reap_time = killed.elapsed();
    finish(traffic);
    // TX connections to the dead peers go with their neighbours (2 s unused).
    let back = lab.wait_for(Duration::from_secs(10), |l| {
        sample(l, 1).is_some_and(|s| counter(&s, "qp_live") == baseline)
    });
    let after = lab.status(1);
    println!(
        "reaping on every worker: {conns} RX connections from 3 peers over node 1's workers \
         {spread:?}; all reaped {reap_time:?} after the SIGKILL (rx_timeout {RX_TIMEOUT:?}); \
         qp_live baseline {baseline} now {}; rx_stale_reaped {} drain_timeouts {} \
         retired_undrained {} qps_retired {}",
        counter(&after, "qp_live"),
        counter(&after, "rx_stale_reaped"),
        counter(&after, "drain_timeouts"),
        provider_of(&after, "retired_undrained"),
        provider_of(&after, "qps_retired"),
    );
    assert!(
        reaped,
        "per worker {last:?} {:?} after the SIGKILL: {}",
        killed.elapsed(),
        after["rx"]
    );
    assert!(
        reap_time <= REAP_LIMIT,
        "reaped after {reap_time:?} (limit {REAP_LIMIT:?})"
    );
    assert!(
        back,
        "qp_live {} (baseline {baseline}); tx {}; workers {}; rx {}",
        after["counters"]["qp_live"], after["tx"], after["workers"], after["rx"]
    );
    assert!(counter(&after, "rx_stale_reaped") >= conns as u64);
    assert_eq!(
        counter(&after, "drain_timeouts"),
        0,
        "{}",
        after["counters"]
    );
    assert_eq!(
        provider_of(&after, "retired_undrained"),
        0,
        "{}",
        after["provider"]
    );
}

/// Node 1 restarted with `node1_args` in a lab of `nodes` daemons with `--workers workers`.
fn budget_lab(prefix: &str, nodes: usize, workers: &str, node1_args: &[&str]) -> Option<Lab> {
    let lab = Lab::up(prefix, nodes, &["--workers", workers])?;
    assert!(lab.sh(&["stop", "1"]).status.success());
    let mut start = vec!["start", "1", "--"];
    start.extend_from_slice(node1_args);
    let out = lab.sh(&start);
    assert!(
        out.status.success(),
        "start 1: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(lab)
}

#[test]
fn a_req_burst_over_workers_stays_within_the_global_budget() {
    const MAX_CONN_QP: usize = 2;
    const MAX_PENDING_RX: usize = 1;
    let Some(lab) = budget_lab(
        "gdbr",
        5,
        "4",
        &["--reject", "--max-conn-qp", "2", "--max-pending-rx", "1"],
    ) else {
        return;
    };
    // Four peers, each on its 4 workers, at once.
    let traffic: Vec<Child> = (2..=5).map(|k| flows(&lab, k, "198.19.0.1", 4)).collect();
    let start = Instant::now();
    let mut samples = 0;
    let mut most = 0;
    let mut over_budget = 0;
    let mut workers_used = BTreeSet::new();
    while start.elapsed() < Duration::from_secs(5) {
        let Some(s) = sample(&lab, 1) else {
            continue;
        };
        samples += 1;
        let live = live_rx(&s).len();
        most = most.max(live);
        over_budget += usize::from(live > MAX_CONN_QP);
        for (w, n) in rx_per_worker(&s).iter().enumerate() {
            if *n > 0 {
                workers_used.insert(w);
            }
        }
        // Established connections are at most the budget; a connection between its REP and
        // its RTU (half-open) shows as live too, and at most MAX_PENDING_RX are, one more per
        // other worker (a worker that holds none of them takes its REQ all the same).
        assert!(
            live <= MAX_CONN_QP + MAX_PENDING_RX + 3,
            "sample {samples} at {:?}: {live} live RX connections: {}",
            start.elapsed(),
            s["rx"]
        );
    }
    finish(traffic);
    let settled = lab.status(1);
    let live = live_rx(&settled).len();
    println!(
        "REQ burst over workers: {samples} samples in 5 s, most live RX connections {most} \
         (max_conn_qp {MAX_CONN_QP}, max_pending_rx {MAX_PENDING_RX}; {over_budget} samples \
         above the budget, each with one half-open), on workers {workers_used:?}; settled \
         {live} live; rx_accepted {} rx_rejected {} cm_rej_sent {} rx_half_open_evicted {}",
        counter(&settled, "rx_accepted"),
        provider_of(&settled, "rx_rejected"),
        provider_of(&settled, "cm_rej_sent"),
        provider_of(&settled, "rx_half_open_evicted"),
    );
    assert!(live <= MAX_CONN_QP, "{}", settled["rx"]);
    // Connections established at once on several workers over the budget each tear
    // themselves down under `reject` (docs/multi-queue.md): what is left may be none.
    assert!(
        counter(&settled, "rx_accepted") >= 1,
        "nothing admitted: {}",
        settled["rx"]
    );
    assert!(
        provider_of(&settled, "rx_rejected") >= 1 && provider_of(&settled, "cm_rej_sent") >= 1,
        "{}",
        settled["provider"]
    );
}

#[test]
fn under_evict_the_newest_peer_reaches_a_full_node() {
    const MAX_CONN_QP: usize = 2;
    let Some(lab) = budget_lab("gdev", 5, "2", &["--evict", "--max-conn-qp", "2"]) else {
        return;
    };
    // Three peers one after another, each on its 2 workers: the budget is spent.
    for k in 2..=4 {
        finish(vec![flows(&lab, k, "198.19.0.1", 1)]);
    }
    let full = lab.status(1);
    // The newest: one ping at once, then more.
    let first = lab.exec(
        5,
        &["ping", "-n", "-c", "1", "-W", "3", "198.19.0.1"],
        Duration::from_secs(10),
    );
    let more = lab.exec(
        5,
        &[
            "ping",
            "-n",
            "-c",
            "10",
            "-i",
            "0.2",
            "-W",
            "2",
            "198.19.0.1",
        ],
        Duration::from_secs(20),
    );
    let after = lab.status(1);
    let summary = String::from_utf8_lossy(&more.stdout)
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or("?")
        .to_owned();
    println!(
        "evict: before node 5 live RX {} per worker {:?}; node 5's first ping {}, then \
         {summary}; after live RX {} per worker {:?}, rx_evicted {} rx_rejected {}",
        live_rx(&full).len(),
        rx_per_worker(&full),
        if first.status.success() {
            "answered"
        } else {
            "lost"
        },
        live_rx(&after).len(),
        rx_per_worker(&after),
        counter(&after, "rx_evicted"),
        provider_of(&after, "rx_rejected"),
    );
    // The budget, and one more on a worker that holds no other (it keeps its newest).
    assert!(live_rx(&full).len() <= MAX_CONN_QP + 1, "{}", full["rx"]);
    assert!(counter(&full, "rx_evicted") >= 1, "{}", full["counters"]);
    assert!(
        first.status.success() && more.status.success() && summary.contains(" 0% packet loss"),
        "node 5 did not reach node 1: {summary}\n{}",
        lab.log(1)
    );
    assert!(live_rx(&after).len() <= MAX_CONN_QP + 1, "{}", after["rx"]);
}

#[test]
fn a_restarted_peer_loses_its_old_connections_on_every_worker() {
    let Some(lab) = Lab::up("gdrs", 2, &["--workers", "4"]) else {
        return;
    };
    finish(vec![flows(&lab, 2, "198.19.0.1", 2)]);
    let before = lab.status(1);
    let old: BTreeSet<u64> = live_rx(&before)
        .iter()
        .filter_map(|c| c["qpn"].as_u64())
        .collect();
    let spread = rx_per_worker(&before);
    assert!(
        spread.iter().filter(|n| **n > 0).count() >= 2,
        "node 2 connected on workers {spread:?} of node 1 only"
    );
    assert!(lab.sh(&["kill", "2"]).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let out = lab.sh(&["start", "2"]);
    assert!(
        out.status.success(),
        "start 2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It reconnects: one flow, on one of its workers.
    let restarted = Instant::now();
    lab.ping_ok(2, "198.19.0.1", &[]);
    let mut left = old.clone();
    let closed = lab.wait_for(Duration::from_secs(3), |l| {
        let Some(s) = sample(l, 1) else {
            return false;
        };
        left = live_rx(&s)
            .iter()
            .filter_map(|c| c["qpn"].as_u64())
            .filter(|q| old.contains(q))
            .collect();
        left.is_empty()
    });
    let after = lab.status(1);
    println!(
        "restart with workers: node 2's old incarnation had {} RX connections on node 1's \
         workers {spread:?}; {} of them live {:?} after the restart; node 1 peer_restarts {} \
         rx_stale_reaped {} per worker now {:?}",
        old.len(),
        left.len(),
        restarted.elapsed(),
        provider_of(&after, "peer_restarts"),
        counter(&after, "rx_stale_reaped"),
        rx_per_worker(&after),
    );
    assert!(
        closed,
        "old incarnation's RX connections still live: {left:?}\n{}",
        after["rx"]
    );
    assert!(
        provider_of(&after, "peer_restarts") >= 1,
        "{}",
        after["provider"]
    );
    // The new incarnation's connections stay and carry traffic both ways.
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    let now = lab.status(1);
    let new: Vec<_> = live_rx(&now)
        .iter()
        .filter_map(|c| c["qpn"].as_u64())
        .collect();
    println!("restart with workers: the new incarnation's live RX connections {new:?}");
    assert!(
        !new.is_empty() && new.iter().all(|q| !old.contains(q)),
        "{}",
        now["rx"]
    );
}
