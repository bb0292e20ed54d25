//! Soak on the simulated fabric (virtual time): connect, traffic, SIGKILL, restart, over and
//! over, in SRQ and non-SRQ mode and with each provider quirk; at the end no surviving node
//! may hold a QP beyond its baseline.
//!
//! `SOAK_CYCLES` sets the cycles per mode (default 60, so CI stays quick); `scripts/soak.sh`
//! runs 10,000 per mode in release mode. Each mode prints one figure line.

use std::time::{Duration, Instant};

use ipoib_cm::sim::cluster::{ping4, ping6, Cluster, BASELINE_QPS};
use ipoib_cm::soft::Quirks;

#[derive(Debug, Default)]
struct Figures {
    cycles: usize,
    qp_created: u64,
    qp_destroyed: u64,
    drain_timeouts: u64,
    evicted: u64,
    stale_reaped: u64,
    dreq_reaped: u64,
    delivered: usize,
    leaked: usize,
    /// QPs that existed in a node's provider when it was killed (they die with the process).
    died: u64,
    /// QPs alive at the end.
    live_end: u64,
    /// QPs destroyed drained (`retire_qp`), and of those, any with work outstanding.
    retired: u64,
    retired_undrained: u64,
}

fn cycles() -> usize {
    std::env::var("SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

fn add_counters(f: &mut Figures, c: &ipoib_cm::ipoib::Counters) {
    f.qp_created += c.qp_created;
    f.qp_destroyed += c.qp_destroyed;
    f.drain_timeouts += c.drain_timeouts;
    f.evicted += c.rx_evicted;
    f.stale_reaped += c.rx_stale_reaped;
    f.dreq_reaped += c.rx_dreq_reaped;
}

fn add_soft(f: &mut Figures, s: &ipoib_cm::soft::SoftStats) {
    f.retired += s.qps_retired;
    f.retired_undrained += s.retired_undrained;
}

fn soak(mode: &str, srq: bool, quirks: Quirks, n_cycles: usize) -> Figures {
    const NODES: usize = 4;
    let mut cl = Cluster::new(
        NODES,
        Instant::now(),
        |_, s| s.quirks = quirks,
        |_, c| {
            c.srq = srq;
            c.rx_timeout = Duration::from_secs(1);
            c.drain_timeout = Duration::from_millis(500);
            c.neigh_timeout = Duration::from_secs(2);
            c.max_conn_qp = 2;
        },
    )
    .expect("cluster");
    let mut fig = Figures::default();
    for cycle in 0..n_cycles {
        let victim = cycle % NODES;
        // Everybody talks to everybody (RC connections both ways), IPv4 and IPv6.
        for a in 0..NODES {
            for b in 0..NODES {
                if a != b {
                    let p = if (a + b + cycle) % 2 == 0 {
                        ping4(a, b, 200)
                    } else {
                        ping6(a, b, 200)
                    };
                    cl.inject(a, &p);
                }
            }
        }
        cl.run(Duration::from_millis(300));
        // SIGKILL: the victim's counters die with it.
        fig.died += cl.qp_live(victim) as u64;
        add_soft(&mut fig, &cl.soft_stats(victim));
        if let Some(ep) = cl.ep(victim) {
            add_counters(&mut fig, &ep.counters());
        }
        cl.kill(victim);
        cl.run(Duration::from_millis(1200));
        cl.restart(victim).expect("restart");
        cl.run(Duration::from_millis(100));
        fig.cycles += 1;
    }
    // Quiet: every RX connection goes stale, every neighbour and TX connection ages out.
    cl.run(Duration::from_secs(20));
    for i in 0..NODES {
        let live = cl.qp_live(i);
        add_soft(&mut fig, &cl.soft_stats(i));
        fig.delivered += cl.tun[i].len();
        let ep = cl.ep(i).expect("up");
        add_counters(&mut fig, &ep.counters());
        assert_eq!(ep.rx_count(), 0, "{mode}: node {i} RX connections left");
        assert_eq!(ep.tx_count(), 0, "{mode}: node {i} TX connections left");
        fig.leaked += live.saturating_sub(BASELINE_QPS);
        fig.live_end += live as u64;
    }
    assert_eq!(
        fig.qp_created,
        fig.qp_destroyed + fig.died + fig.live_end,
        "{mode}: every QP created was destroyed, died with its process, or is a baseline QP"
    );
    println!(
        "soak {mode}: cycles {} nodes {NODES} | QPs created {} destroyed {} died-with-process {} \
         leaked {} | \
         retired {} (undrained {}) | \
         stale-reaped {} dreq-reaped {} evicted {} drain-timeouts {} | packets delivered {}",
        fig.cycles,
        fig.qp_created,
        fig.qp_destroyed,
        fig.died,
        fig.leaked,
        fig.retired,
        fig.retired_undrained,
        fig.stale_reaped,
        fig.dreq_reaped,
        fig.evicted,
        fig.drain_timeouts,
        fig.delivered
    );
    assert_eq!(fig.leaked, 0, "{mode}: leaked QPs");
    assert_eq!(
        fig.retired_undrained, 0,
        "{mode}: QPs retired with work outstanding"
    );
    assert!(fig.retired > 0, "{mode}: no QP was retired");
    fig
}

#[test]
fn soak_srq() {
    let f = soak("srq", true, Quirks::default(), cycles());
    assert_eq!(f.drain_timeouts, 0);
}

#[test]
fn soak_non_srq() {
    let f = soak("non-srq", false, Quirks::default(), cycles());
    assert_eq!(f.drain_timeouts, 0);
}

#[test]
fn soak_drain_never() {
    let q = Quirks {
        drain_never: true,
        ..Quirks::default()
    };
    let f = soak("srq+drain-never", true, q, cycles());
    assert!(f.drain_timeouts > 0);
}

#[test]
fn soak_no_last_wqe() {
    let q = Quirks {
        no_last_wqe: true,
        ..Quirks::default()
    };
    let f = soak("srq+no-last-wqe", true, q, cycles());
    assert!(f.drain_timeouts > 0);
}

#[test]
fn soak_dup_last_wqe() {
    let q = Quirks {
        dup_last_wqe: true,
        ..Quirks::default()
    };
    let f = soak("srq+dup-last-wqe", true, q, cycles());
    assert_eq!(f.drain_timeouts, 0);
}

#[test]
fn soak_moves_later() {
    let q = Quirks {
        moves_later: true,
        ..Quirks::default()
    };
    let f = soak("srq+moves-later", true, q, cycles());
    assert_eq!(f.drain_timeouts, 0);
}
