//! REQ admission at the endpoint: forged REQs (handed to node 0's CM as its MAD transport
//! would, from GIDs that are no node) hold no QP budget, evict no established connection, and
//! their half-open receive QPs are capped and reaped at the REP timeout.

use super::*;
use crate::verbs::Gid;
use crate::wire::cm::{ipoib_service_id, IpoibCmData};
use proptest::prelude::*;
use std::net::Ipv4Addr;

/// A GID that is no node of the fabric.
fn rogue(k: u32) -> Gid {
    Gid::from(Ipv4Addr::from(0xC612_8000 + k))
}

/// Hands node `to` a REQ for its IPoIB-CM service from `from`, never to be completed.
fn forge_req(n: &mut Net, to: usize, from: Gid, comm_id: u32, response_timeout: u8) {
    let hw = n.ep(to).hwaddr();
    let data = IpoibCmData {
        qpn: QpNum::new(0x5000 + (comm_id & 0xFFF)),
        mtu: IPOIB_CM_BUF_SIZE,
    }
    .to_bytes();
    let sid = ipoib_service_id(hw.qpn, true);
    let mad = forged_req(n, to, from, comm_id, response_timeout, sid, &data);
    let now = n.now();
    n.ep(to).handle_mad(now, from, &mad);
}

/// Half-open RX connections of node `i`.
fn half_open(n: &mut Net, i: usize) -> usize {
    n.ep(i).rx.half_open_count()
}

#[test]
fn forged_reqs_hold_no_qp_budget_under_the_reject_policy() {
    let mut n = Net::new(
        3,
        |_, _| {},
        |_, c| {
            c.max_conn_qp = 2;
            c.max_pending_rx = 4;
            c.budget_policy = QpBudgetPolicy::Reject;
        },
    );
    for k in 0..50 {
        forge_req(&mut n, 0, rogue(k), 0x100 + k, 20);
        n.run(Duration::from_millis(1));
    }
    assert_eq!(half_open(&mut n, 0), 4);
    assert_eq!(n.qp_live(0), BASELINE_QPS + 4);
    // Both real peers connect and deliver.
    for i in 1..3 {
        n.inject(i, &ping4(i, 0, 64));
        n.run(Duration::from_millis(100));
    }
    assert_eq!(n.tun[0].len(), 2, "{:?}", n.ep(0).counters());
    let c = n.ep(0).counters();
    assert_eq!(c.rx_rejected, 0, "{c:?}");
    // 46 by forged REQs, up to one per real REQ.
    assert!((46..=48).contains(&c.rx_half_open_evicted), "{c:?}");
    assert_eq!(n.ep(0).rx.established_count(), 2);
    // The budget is spent by established connections only: a forged REQ now is rejected.
    forge_req(&mut n, 0, rogue(999), 0x999, 20);
    n.run(Duration::from_millis(1));
    assert_eq!(n.ep(0).counters().rx_rejected, 1);
}

#[test]
fn forged_reqs_evict_no_established_connection() {
    let mut n = Net::new(2, |_, _| {}, |_, c| c.max_conn_qp = 1);
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[0].len(), 1);
    let rx_before: Vec<QpNum> = n.ep(0).rx.qpns();
    for k in 0..200 {
        forge_req(&mut n, 0, rogue(k), 0x100 + k, 20);
        if k % 20 == 0 {
            n.inject(1, &ping4(1, 0, 64));
        }
        n.run(Duration::from_millis(1));
    }
    n.run(Duration::from_millis(100));
    let c = n.ep(0).counters();
    assert_eq!(c.rx_evicted, 0, "{c:?}");
    assert_eq!(n.tun[0].len(), 11, "{c:?}");
    assert!(n.ep(0).rx.qpns().contains(&rx_before[0]));
    assert_eq!(
        n.ep(1).counters().tx_established,
        1,
        "node 1 never reconnected"
    );
    assert!(half_open(&mut n, 0) <= EndpointConfig::new(Vec::new()).max_pending_rx);
}

#[test]
fn a_half_open_rx_qp_is_reaped_at_the_rep_timeout() {
    let mut n = Net::new(1, |_, _| {}, |_, c| c.rx_timeout = Duration::from_secs(60));
    // Response timeout conv(14) = 64 ms: REP and 3 resends, then the REJ at 256 ms.
    forge_req(&mut n, 0, rogue(1), 0x42, 14);
    n.run(Duration::from_millis(10));
    assert_eq!(n.qp_live(0), BASELINE_QPS + 1);
    n.run(Duration::from_millis(400));
    let c = n.ep(0).counters();
    assert_eq!(c.rx_half_open_reaped, 1, "{c:?}");
    assert_eq!(c.rx_stale_reaped, 0, "{c:?}");
    assert_eq!(n.qp_live(0), BASELINE_QPS);
    assert_eq!(n.ep(0).rx_count(), 0);
    assert_eq!(n.ep(0).cm_stats().timeouts, 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Arbitrary forged REQ streams from arbitrary GIDs while node 1 keeps pinging node 0:
    /// node 0's QPs stay within UD + QP1 + the budget + the half-open cap (+ node 0's own TX
    /// connection), its CM ids within what arrived, and every ping of node 1 gets through.
    #[test]
    fn forged_req_streams_keep_node_0_within_its_qp_bounds(
        reqs in prop::collection::vec((0u32..64, 0u8..32, 0u16..40), 1..120)) {
        let mut n = Net::new(2, |_, _| {}, |_, c| {
            c.max_conn_qp = 2;
            c.max_pending_rx = 4;
        });
        let bound = BASELINE_QPS + 2 + 4 + 1;
        let mut pings = 0;
        for (k, (src, timeout, wait)) in reqs.into_iter().enumerate() {
            forge_req(&mut n, 0, rogue(src), k as u32 + 1, timeout);
            if k % 10 == 0 {
                n.inject(1, &ping4(1, 0, 64));
                pings += 1;
            }
            n.run(Duration::from_millis(u64::from(wait) + 1));
            prop_assert!(n.qp_live(0) <= bound, "{} QPs", n.qp_live(0));
            prop_assert!(half_open(&mut n, 0) <= 4);
            prop_assert!(n.ep(0).cm.len() <= k + 2);
        }
        n.run(Duration::from_millis(200));
        prop_assert_eq!(n.tun[0].len(), pings, "{:?}", n.ep(0).counters());
        // Every forged REQ ends: the half-open QPs are gone within the clamped REP lifetime.
        n.run(Duration::from_secs(20));
        prop_assert_eq!(half_open(&mut n, 0), 0);
    }
}
