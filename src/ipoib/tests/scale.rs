//! Cluster sizes: a node with the default QP budget takes every peer of a cluster larger
//! than Linux's non-SRQ budget without evicting anyone, and one peer cannot hold more than
//! its share of the budget, however many connections it completes.

use super::*;
use crate::verbs::Gid;
use crate::wire::cm::{ipoib_service_id, CmMad, CmMessage, IpoibCmData, Rtu};
use std::net::Ipv4Addr;

/// `req` with one CA GUID whatever its comm id: REQs of one incarnation of a node (a new CA
/// GUID would announce a restart, which closes the earlier incarnation's connections).
fn one_incarnation(req: &[u8; crate::wire::cm::MAD_LEN]) -> [u8; crate::wire::cm::MAD_LEN] {
    let mut m = CmMad::parse(req).expect("a REQ");
    if let CmMessage::Req(r) = &mut m.msg {
        r.local_ca_guid = 0xBAD0_0000_0000_0001;
    }
    m.emit()
}

/// Node `to` completes a connection from `from` (a GID that is no node): the forged REQ,
/// then the RTU naming the comm id of node `to`'s REP, which the test takes from its MAD
/// queue (it never reaches the wire).
fn forge_connection(n: &mut Net, to: usize, from: Gid, comm_id: u32) {
    let hw = n.ep(to).hwaddr();
    let data = IpoibCmData {
        qpn: QpNum::new(0x5000),
        mtu: IPOIB_CM_BUF_SIZE,
    }
    .to_bytes();
    let req = one_incarnation(&forged_req(
        n,
        to,
        from,
        comm_id,
        20,
        ipoib_service_id(hw.qpn, true),
        &data,
    ));
    let now = n.now();
    let c = &mut n.0;
    let ep = c.eps[to].as_mut().expect("node is up");
    ep.handle_mad(now, from, &req);
    // The endpoint answers (builds the QP, queues the REP) when it handles the CM's events.
    ep.handle_verbs(now, &mut c.f.nodes[to]);
    let mut ours = None;
    while let Some((dst, mad)) = n.ep(to).poll_mad() {
        if let (
            true,
            Ok(CmMad {
                msg: CmMessage::Rep(rep),
                ..
            }),
        ) = (dst == from, CmMad::parse(&mad))
        {
            ours = (rep.remote_comm_id == comm_id).then_some(rep.local_comm_id);
        }
    }
    let ours = ours.expect("node answered the REQ with a REP");
    let rtu = Rtu {
        local_comm_id: comm_id,
        remote_comm_id: ours,
        private_data: [0; Rtu::PRIVATE_DATA_LEN],
    };
    let mad = CmMad::new(u64::from(comm_id), CmMessage::Rtu(rtu)).emit();
    let now = n.now();
    n.ep(to).handle_mad(now, from, &mad);
    n.run(Duration::from_millis(1));
}

/// More peers than the 128 connections Linux allows without an SRQ (and than this project's
/// old default budget, SRQ or not) all connect to node 0, which keeps every connection.
#[test]
fn the_default_budget_keeps_every_peer_of_a_cluster() {
    let peers = 160;
    let mut n = Net::new(
        peers + 1,
        |_, _| {},
        |_, c| c.rx_timeout = Duration::from_secs(60),
    );
    for batch in (1..=peers).collect::<Vec<_>>().chunks(32) {
        for &i in batch {
            n.inject(i, &ping4(i, 0, 64));
        }
        n.run(Duration::from_millis(50));
    }
    let c = n.ep(0).counters();
    assert_eq!(n.tun[0].len(), peers, "{c:?}");
    assert_eq!(
        (c.rx_evicted, c.rx_rejected, c.rx_half_open_evicted),
        (0, 0, 0),
        "{c:?}"
    );
    assert_eq!(n.ep(0).rx.established_count(), peers);
    assert_eq!(n.qp_live(0), BASELINE_QPS + peers);
    let failed: u64 = (1..=peers).map(|i| n.ep(i).counters().tx_failed).sum();
    assert_eq!(failed, 0);
}

/// A peer (one GID) that completes more connections than its share: its own least recently
/// active ones give way, a real peer's connection stays, and the node's QPs stay bounded.
#[test]
fn one_peer_holds_at_most_its_share_of_the_budget() {
    let mut n = Net::new(2, |_, _| {}, |_, c| c.rx_timeout = Duration::from_secs(60));
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(50));
    let real = n.ep(0).rx.qpns();
    assert_eq!(real.len(), 1);
    let rogue = Gid::from(Ipv4Addr::new(198, 18, 0, 200));
    let extra = 5;
    for k in 0..(MAX_CONN_QP_PER_SOURCE + extra) as u32 {
        forge_connection(&mut n, 0, rogue, 0x100 + k);
    }
    n.run(Duration::from_millis(100));
    let c = n.ep(0).counters();
    assert_eq!(
        n.ep(0).rx.established_from(rogue),
        MAX_CONN_QP_PER_SOURCE,
        "{c:?}"
    );
    assert_eq!(
        (c.rx_source_full, c.rx_evicted),
        (extra as u64, extra as u64),
        "{c:?}"
    );
    assert!(
        n.ep(0).rx.qpns().contains(&real[0]),
        "the real peer's connection stays"
    );
    assert_eq!(n.qp_live(0), BASELINE_QPS + 1 + MAX_CONN_QP_PER_SOURCE);
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(50));
    assert_eq!(n.tun[0].len(), 2);
}

/// Under the reject policy the same peer's REQs beyond its share are refused before a QP is
/// built for them.
#[test]
fn under_the_reject_policy_a_peer_beyond_its_share_is_refused() {
    let mut n = Net::new(
        1,
        |_, _| {},
        |_, c| {
            c.budget_policy = QpBudgetPolicy::Reject;
            c.rx_timeout = Duration::from_secs(60);
        },
    );
    let rogue = Gid::from(Ipv4Addr::new(198, 18, 0, 201));
    for k in 0..MAX_CONN_QP_PER_SOURCE as u32 {
        forge_connection(&mut n, 0, rogue, 0x200 + k);
    }
    let hw = n.ep(0).hwaddr();
    let data = IpoibCmData {
        qpn: QpNum::new(0x5000),
        mtu: IPOIB_CM_BUF_SIZE,
    }
    .to_bytes();
    let req = one_incarnation(&forged_req(
        &mut n,
        0,
        rogue,
        0x300,
        20,
        ipoib_service_id(hw.qpn, true),
        &data,
    ));
    let now = n.now();
    n.ep(0).handle_mad(now, rogue, &req);
    n.run(Duration::from_millis(1));
    let c = n.ep(0).counters();
    assert_eq!((c.rx_rejected, c.rx_source_full), (1, 1), "{c:?}");
    assert_eq!(n.qp_live(0), BASELINE_QPS + MAX_CONN_QP_PER_SOURCE);
}

/// A burst of REQs read in one turn: each pump of the CM's events sets up at most
/// [`SETUPS_PER_PUMP`] QPs (each set-up two or three firmware commands on a ConnectX), asks to
/// be called again at once, and answers the rest on the next turns, in the order they came.
#[test]
fn a_burst_of_reqs_is_set_up_a_bounded_number_per_pump() {
    use crate::ipoib::endpoint::SETUPS_PER_PUMP;
    let burst = 3 * SETUPS_PER_PUMP + 2;
    let mut n = Net::new(1, |_, _| {}, |_, c| c.rx_timeout = Duration::from_secs(60));
    let hw = n.ep(0).hwaddr();
    let data = IpoibCmData {
        qpn: QpNum::new(0x5000),
        mtu: IPOIB_CM_BUF_SIZE,
    }
    .to_bytes();
    let now = n.now();
    let mut sent = Vec::new();
    for k in 0..burst as u32 {
        let from = Gid::from(Ipv4Addr::new(198, 18, 1, 1 + k as u8));
        let req = forged_req(
            &mut n,
            0,
            from,
            100 + k,
            20,
            ipoib_service_id(hw.qpn, true),
            &data,
        );
        n.ep(0).handle_mad(now, from, &req);
        sent.push(100 + k);
    }
    let mut per_pump = Vec::new();
    let mut answered = Vec::new();
    for _ in 0..10 {
        let c = &mut n.0;
        let ep = c.eps[0].as_mut().expect("node is up");
        ep.handle_verbs(now, &mut c.f.nodes[0]);
        let mut reps = 0;
        while let Some((_, mad)) = ep.poll_mad() {
            if let Ok(CmMad {
                msg: CmMessage::Rep(rep),
                ..
            }) = CmMad::parse(&mad)
            {
                reps += 1;
                answered.push(rep.remote_comm_id);
            }
        }
        per_pump.push(reps);
        if answered.len() == burst {
            break;
        }
        assert!(
            ep.poll_timeout().is_some_and(|t| t <= now),
            "set-ups left for the next turn, and the endpoint does not ask for it at once"
        );
    }
    assert_eq!(
        per_pump,
        [SETUPS_PER_PUMP, SETUPS_PER_PUMP, SETUPS_PER_PUMP, 2],
        "REPs per pump"
    );
    assert_eq!(answered, sent, "every REQ answered once, in order");
    assert_eq!(n.ep(0).counters().rx_accepted, burst as u64);
}
