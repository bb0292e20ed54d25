//! QP moves done later than asked (the software provider's `moves_later`, as the verbs
//! provider's command thread does them): a REP waits for its QP's RTS, an RTU for its QP's,
//! a connection torn down while its QP moves leaks nothing, and the reaper's moves to ERR
//! drain as before.

use super::*;
use crate::soft::MOVES_LATER_BY;
use crate::verbs::Gid;
use crate::wire::cm::{ipoib_service_id, IpoibCmData};
use std::net::Ipv4Addr;

fn later() -> Quirks {
    Quirks {
        moves_later: true,
        ..Quirks::default()
    }
}

/// Node `to`'s CM gets a REQ for its IPoIB-CM service from a GID that is no node.
fn forge_req(n: &mut Net, to: usize, k: u32) {
    let from = Gid::from(Ipv4Addr::from(0xC612_8000 + k));
    let hw = n.ep(to).hwaddr();
    let data = IpoibCmData {
        qpn: QpNum::new(0x5000 + k),
        mtu: IPOIB_CM_BUF_SIZE,
    }
    .to_bytes();
    let sid = ipoib_service_id(hw.qpn, true);
    let mad = forged_req(n, to, from, 0x100 + k, 20, sid, &data);
    let now = n.now();
    n.ep(to).handle_mad(now, from, &mad);
    // The endpoint acts on the CM's events in its next turn.
    n.run(Duration::from_micros(10));
}

/// Runs `n` in steps of 50 µs until `f` holds, for at most `limit`; whether it held.
fn run_until(n: &mut Net, limit: Duration, mut f: impl FnMut(&mut Net) -> bool) -> bool {
    for _ in 0..limit.as_micros() / 50 {
        if f(n) {
            return true;
        }
        n.run(Duration::from_micros(50));
    }
    f(n)
}

fn preparing(n: &mut Net, i: usize) -> usize {
    let ep = n.ep(i);
    ep.rx
        .qpns()
        .iter()
        .filter(|q| ep.rx.get(q).is_some_and(|r| r.preparing.is_some()))
        .count()
}

/// Both nodes' moves later: a ping each way crosses, every connection is set up through the
/// later path (none moved at once), and when the peer vanishes its RX connection is reaped
/// by Last WQE and the drain WR (SRQ) or the flushed ring, drained, without a watchdog.
fn both_later(srq: bool) {
    let mut n = Net::new(
        2,
        |_, s| s.quirks = later(),
        |_, c| {
            c.srq = srq;
            c.max_conn_qp = default_max_conn_qp(srq);
        },
    );
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    n.inject(0, &ping4(0, 1, 64));
    n.run(Duration::from_millis(100));
    assert_eq!((n.tun[0].len(), n.tun[1].len()), (1, 1));
    for i in 0..2 {
        let c = n.ep(i).counters();
        assert_eq!(
            (c.tx_established, c.rx_accepted, c.tx_failed),
            (1, 1, 0),
            "{c:?}"
        );
        let s = n.soft_stats(i);
        assert!(s.moves_started >= 2, "{s:?}");
    }
    let live_before = n.qp_live(0);
    n.kill(1);
    n.run(Duration::from_secs(6));
    let c = n.ep(0).counters();
    assert_eq!(n.ep(0).rx_count(), 0);
    assert_eq!(c.rx_stale_reaped, 1, "{c:?}");
    assert_eq!(c.drain_timeouts, 0, "{c:?}");
    assert_eq!(c.last_wqe_events, u64::from(srq), "{c:?}");
    assert!(n.qp_live(0) < live_before);
    let s = n.soft_stats(0);
    assert_eq!(s.retired_undrained, 0, "{s:?}");
    assert!(s.qps_retired >= 1, "{s:?}");
}

#[test]
fn connections_set_up_and_reaped_with_moves_later_in_srq_mode() {
    both_later(true);
}

#[test]
fn connections_set_up_and_reaped_with_moves_later_without_srq() {
    both_later(false);
}

/// The REP of a REQ goes out only once its QP is in RTS: until the moves end, the connection
/// is half-open and preparing, and the CM has sent nothing.
#[test]
fn the_rep_waits_for_the_rx_qp_moves() {
    let mut n = Net::new(
        2,
        |i, s| {
            if i == 0 {
                s.quirks = later();
            }
        },
        |_, _| {},
    );
    let sent_before = n.ep(0).cm_stats().mads_sent;
    forge_req(&mut n, 0, 1);
    assert_eq!(preparing(&mut n, 0), 1);
    assert_eq!(n.ep(0).rx.half_open_count(), 1);
    n.run(MOVES_LATER_BY / 2);
    assert_eq!(preparing(&mut n, 0), 1);
    assert!(n.soft_stats(0).moves_started >= 1);
    assert_eq!(n.ep(0).cm_stats().mads_sent, sent_before, "no REP yet");
    assert_eq!(n.ep(0).counters().rx_accepted, 0);
    n.run(MOVES_LATER_BY);
    assert_eq!(preparing(&mut n, 0), 0);
    assert_eq!(n.ep(0).counters().rx_accepted, 1);
    assert_eq!(n.ep(0).cm_stats().mads_sent, sent_before + 1, "the REP");
}

/// A preparing connection evicted by a newer REQ (`max_pending_rx` 1) before its moves end
/// sends no REP but a REJ, and its QP is destroyed; the newer one is accepted.
#[test]
fn a_connection_torn_down_while_its_qp_moves_sends_no_rep() {
    let mut n = Net::new(1, |_, s| s.quirks = later(), |_, c| c.max_pending_rx = 1);
    forge_req(&mut n, 0, 1);
    forge_req(&mut n, 0, 2);
    let c = n.ep(0).counters();
    assert_eq!((c.rx_half_open_evicted, c.rx_accepted), (1, 0), "{c:?}");
    n.run(Duration::from_millis(10));
    let c = n.ep(0).counters();
    assert_eq!(c.rx_accepted, 1, "{c:?}");
    assert_eq!(n.ep(0).cm_stats().rej_sent, 1);
    assert_eq!(n.ep(0).rx_count(), 1);
    assert_eq!(n.qp_live(0), BASELINE_QPS + 1);
    let s = n.soft_stats(0);
    assert_eq!(s.retired_undrained, 0, "{s:?}");
}

/// A TX connection whose peer's REP came is not usable until its QP is in RTS: its packets
/// wait in its queue, the RTU follows the moves, then the queue goes out in order. Shut down
/// while its QP moves, the connection closes and its QP is destroyed.
#[test]
fn a_tx_connection_waits_for_its_qp_and_closes_cleanly_while_it_moves() {
    let mut n = Net::new(
        2,
        |i, s| {
            if i == 1 {
                s.quirks = later();
            }
        },
        |_, _| {},
    );
    for k in 0..3 {
        n.inject(1, &ping4(1, 0, 64 + k));
    }
    let moving = |n: &mut Net| {
        let ep = n.ep(1);
        ep.tx
            .qpns()
            .iter()
            .any(|q| ep.tx.get(q).is_some_and(|t| t.moving.is_some()))
    };
    assert!(run_until(&mut n, Duration::from_millis(50), moving));
    assert_eq!(n.tun[0].len(), 0);
    assert_eq!(n.ep(1).counters().tx_established, 0);
    n.run(Duration::from_millis(20));
    let lens: Vec<usize> = n.tun[0].iter().map(Vec::len).collect();
    assert_eq!(lens, vec![92, 93, 94], "in order");
    assert_eq!(n.ep(1).counters().tx_established, 1);

    // Another one, to a node that is set up later, closed while its QP moves.
    let mut n = Net::new(
        2,
        |i, s| {
            if i == 1 {
                s.quirks = later();
            }
        },
        |_, _| {},
    );
    let (live, created) = (n.qp_live(1), n.ep(1).counters().qp_created);
    n.inject(1, &ping4(1, 0, 64));
    assert!(run_until(&mut n, Duration::from_millis(50), moving));
    let now = n.now();
    let Cluster { f, eps, .. } = &mut n.0;
    if let Some(ep) = eps[1].as_mut() {
        ep.begin_shutdown(now, &mut f.nodes[1]);
    }
    n.run(Duration::from_millis(20));
    assert!(n.ep(1).is_stopped());
    let c = n.ep(1).counters();
    assert_eq!(c.tx_established, 0, "{c:?}");
    assert_eq!(c.qp_created, created + 1, "{c:?}");
    assert_eq!(n.qp_live(1), live);
    assert_eq!(n.soft_stats(1).retired_undrained, 0);
}

/// Moves that fail (their result says so) end the set-up: an RX connection's REQ is rejected
/// and its QP destroyed; a TX connection fails (its REP rejected) and is closed.
#[test]
fn failed_moves_reject_the_req_or_fail_the_tx_connection() {
    use crate::verbs::{Moved, VerbsError};
    let mut n = Net::new(2, |_, s| s.quirks = later(), |_, _| {});
    let failure = VerbsError::InvalidAttribute("path_mtu");
    forge_req(&mut n, 0, 1);
    let qpn = n.ep(0).rx.qpns()[0];
    let (live, rej) = (n.qp_live(0), n.ep(0).cm_stats().rej_sent);
    let now = n.now();
    let Cluster { f, eps, .. } = &mut n.0;
    if let Some(ep) = eps[0].as_mut() {
        let result = Err(failure.clone());
        ep.on_moved(now, &mut f.nodes[0], Moved { qp: qpn, result });
    }
    let c = n.ep(0).counters();
    assert_eq!((c.rx_rejected, c.rx_accepted), (1, 0), "{c:?}");
    assert_eq!(n.ep(0).rx_count(), 0);
    assert_eq!(n.qp_live(0), live - 1);
    n.run(Duration::from_millis(10));
    assert_eq!(n.ep(0).cm_stats().rej_sent, rej + 1);
    assert_eq!(n.ep(0).counters().rx_accepted, 0, "no REP after all");

    // Node 1's TX connection to node 0: its REP came, its moves fail.
    n.inject(1, &ping4(1, 0, 64));
    let moving = |n: &mut Net| {
        let ep = n.ep(1);
        ep.tx
            .qpns()
            .into_iter()
            .find(|q| ep.tx.get(q).is_some_and(|t| t.moving.is_some()))
    };
    assert!(run_until(&mut n, Duration::from_millis(50), |n| moving(n).is_some()));
    let qpn = moving(&mut n).expect("moving");
    let now = n.now();
    let Cluster { f, eps, .. } = &mut n.0;
    if let Some(ep) = eps[1].as_mut() {
        ep.on_moved(
            now,
            &mut f.nodes[1],
            Moved {
                qp: qpn,
                result: Err(failure),
            },
        );
    }
    n.run(Duration::from_millis(20));
    let c = n.ep(1).counters();
    assert_eq!((c.tx_established, c.tx_failed), (0, 1), "{c:?}");
    assert!(n.tun[0].is_empty());
}
