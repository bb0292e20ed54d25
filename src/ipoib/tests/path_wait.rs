//! First contact on InfiniBand: where an SA holds the paths, a new neighbour's packets (IP
//! over UD and RC, ARP replies) wait for its PathRecord, bounded as kernel ipoib bounds them
//! (`IPOIB_MAX_PATH_REC_QUEUE`), and the REQ of its TX connection leaves only with the path.
//! Transcripts with a slow SA (answers after a delay: nothing before, everything held after,
//! in order) and a failing one (drops counted, asked again by the next packet). Node 0 is
//! SA-held (its SA requests answered by the test), node 1 is not (RoCE, nothing waits).

use super::*;
use crate::sa::GroupParams;
use crate::sim::cluster::node_v4;
use crate::verbs::Gid;
use crate::wire::ipoib::broadcast_mgid;
use crate::wire::sa::{PathRecord, Selected, Selector};

/// Two nodes; node 0 holds its groups and paths through an (absent) SA whose broadcast join
/// the test answered; its SA requests so far taken.
fn sa_net(cfg: impl FnMut(usize, &mut EndpointConfig)) -> Net {
    let mut n = Net::new(2, |_, _| {}, cfg);
    // The start-up announcements land first (an Incomplete entry would learn from them).
    n.run(Duration::from_millis(10));
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.use_sa_groups(v);
    ep.set_group_joined(v, broadcast_mgid(0xffff), broadcast(0xC000));
    sa_requests(&mut n);
    n
}

/// The broadcast group's record, with MLID `mlid` and MTU 2048.
fn broadcast(mlid: u16) -> GroupParams {
    GroupParams {
        mlid,
        qkey: 0x0B1B,
        mtu: Some(PathMtu::Mtu2048),
        sl: 0,
        rate: 0,
        tclass: 0,
        flow_label: 0,
        hop_limit: 0,
    }
}

fn sa_requests(n: &mut Net) -> Vec<SaRequest> {
    std::iter::from_fn(|| n.ep(0).poll_sa_request()).collect()
}

fn path_query(n: &mut Net, to: usize) -> SaRequest {
    SaRequest::Path {
        dgid: n.ep(to).hwaddr().gid,
    }
}

/// The SA's PathRecord from node 0 to node `to`: LIDs, SL 3, MTU 2048, and a hop limit that
/// keeps a GRH in its address vector (the software fabric routes by it).
fn record(n: &mut Net, to: usize) -> PathRecord {
    PathRecord {
        dgid: n.ep(to).hwaddr().gid,
        sgid: n.ep(0).hwaddr().gid,
        dlid: 0x21,
        slid: 0x11,
        hop_limit: 64,
        sl: 3,
        mtu: Selected::new(Selector::Exactly, PathMtu::Mtu2048.to_enum()),
        ..PathRecord::default()
    }
}

/// The SA answers node 0's query for node `to`.
fn answer(n: &mut Net, to: usize) {
    let rec = record(n, to);
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.set_sa_path(now, v, rec.dgid, &rec);
}

fn fail(n: &mut Net, to: usize) {
    let gid: Gid = n.ep(to).hwaddr().gid;
    n.ep(0).path_failed(gid);
}

#[test]
fn a_slow_sa_holds_a_new_neighbours_packets_and_its_req_then_sends_them_in_order() {
    let mut n = sa_net(|_, _| {});
    // Three packets wait for ARP (tx_queue_len), then for the path.
    let pings: Vec<Vec<u8>> = (0..3).map(|i| ping4(0, 1, 100 + i)).collect();
    for p in &pings {
        n.inject(0, p);
    }
    n.run(Duration::from_millis(100));
    let resolved = n
        .ep(0)
        .neigh
        .get(&IpAddr::V4(node_v4(1)))
        .unwrap()
        .resolved();
    assert_eq!(resolved, Some(n.ep(1).hwaddr()), "ARP crossed");
    let query = path_query(&mut n, 1);
    assert_eq!(sa_requests(&mut n), [query]);
    // Two more: the path's queue holds three IP packets; these are dropped and counted.
    n.inject(0, &ping4(0, 1, 200));
    n.inject(0, &ping4(0, 1, 201));
    // The SA takes its time: nothing goes out, no REQ (no connection on either side).
    n.run(Duration::from_secs(2));
    assert_eq!(n.ep(0).tx_count(), 0, "no TX QP, no REQ before the path");
    assert_eq!(n.ep(1).counters().rx_accepted, 0);
    assert!(n.tun[1].is_empty());
    let c0 = n.ep(0).counters();
    assert_eq!((c0.tx_packets, c0.tx_established), (0, 0));
    assert_eq!(
        (c0.path_wait_held, c0.path_wait_drops, c0.path_failed_drops),
        (3, 2, 0)
    );
    assert_eq!(c0.tx_queue_drops, 2);
    assert_eq!(n.ep(0).path_waiting(), 3);
    // The path: the connection is set up with it, and what waited arrives in order.
    answer(&mut n, 1);
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1], pings);
    let c0 = n.ep(0).counters();
    assert_eq!((c0.tx_established, c0.tx_packets), (1, 3));
    assert_eq!(n.ep(0).path_waiting(), 0);
    let gid1 = n.ep(1).hwaddr().gid;
    assert_eq!(n.ep(0).path(gid1).map(|p| p.dlid.0), Some(0x21));
    // Known now: the next packet goes straight out, nothing more is asked.
    let later = ping4(0, 1, 300);
    n.inject(0, &later);
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[1].last(), Some(&later));
    assert_eq!(sa_requests(&mut n), []);
    // The node without an SA held nothing.
    assert_eq!(n.ep(1).counters().path_wait_held, 0);
}

#[test]
fn a_failing_sa_drops_what_waited_and_the_next_packet_asks_again() {
    let mut n = sa_net(|_, _| {});
    n.inject(0, &ping4(0, 1, 100));
    n.inject(0, &ping4(0, 1, 101));
    n.run(Duration::from_millis(100));
    let query = path_query(&mut n, 1);
    assert_eq!(sa_requests(&mut n), [query]);
    assert_eq!(n.ep(0).path_waiting(), 2);
    let dropped_before = n.ep(0).counters().tx_dropped;
    fail(&mut n, 1);
    n.run(Duration::from_millis(100));
    let c0 = n.ep(0).counters();
    assert_eq!(c0.path_failed_drops, 2);
    assert_eq!(c0.tx_dropped, dropped_before + 2);
    assert_eq!(n.ep(0).path_waiting(), 0);
    assert!(n.tun[1].is_empty());
    assert_eq!(n.ep(0).tx_count(), 0);
    // The neighbour stays resolved; its next packet waits again and asks again.
    let again = ping4(0, 1, 102);
    n.inject(0, &again);
    assert_eq!(sa_requests(&mut n), [query]);
    assert_eq!(n.ep(0).path_waiting(), 1);
    answer(&mut n, 1);
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1], [again]);
    assert_eq!(n.ep(0).counters().path_failed_drops, 2);
}

#[test]
fn an_arp_reply_to_a_new_neighbour_waits_for_its_path() {
    let mut n = sa_net(|_, _| {});
    // Node 1 (no SA) pings node 0: its ARP request reaches node 0, whose reply waits.
    let p = ping4(1, 0, 64);
    n.inject(1, &p);
    n.run(Duration::from_millis(500));
    let query = path_query(&mut n, 1);
    assert_eq!(sa_requests(&mut n), [query]);
    assert_eq!(n.ep(0).counters().path_wait_held, 1);
    assert!(n.tun[0].is_empty(), "node 1 has no answer yet");
    let ip0 = IpAddr::V4(node_v4(0));
    assert_eq!(n.ep(1).neigh.get(&ip0).and_then(|e| e.resolved()), None);
    // Node 1 asks again each second: the second reply is held too (one path, three replies).
    n.run(Duration::from_millis(1000));
    assert_eq!(n.ep(0).path_waiting(), 2);
    answer(&mut n, 1);
    n.run(Duration::from_millis(100));
    assert_eq!(
        n.ep(1).neigh.get(&ip0).and_then(|e| e.resolved()),
        Some(n.ep(0).hwaddr())
    );
    assert_eq!(n.tun[0], [p]);
}

#[test]
fn datagram_mode_packets_wait_for_the_path_and_a_port_event_drops_them() {
    let mut n = sa_net(|_, c| c.mode = Mode::Datagram);
    let first = ping4(0, 1, 100);
    n.inject(0, &first);
    n.run(Duration::from_millis(100));
    assert_eq!(n.ep(0).path_waiting(), 1);
    assert!(n.tun[1].is_empty());
    answer(&mut n, 1);
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[1], std::slice::from_ref(&first));
    // A port event voids every path: packets wait again; the event drops them, counted.
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.port_changed(v, PortChange::SmChange);
    let params = ep.broadcast_group();
    assert_eq!(params, None);
    // Rejoined (the SA answered the broadcast join again): the next packet waits for its
    // path, and the next port event drops it.
    ep.set_group_joined(v, broadcast_mgid(0xffff), broadcast(0xC001));
    ep.handle_tun_packet(now, v, &ping4(0, 1, 101));
    assert_eq!(ep.path_waiting(), 1);
    ep.port_changed(v, PortChange::ClientReregister);
    assert_eq!(ep.path_waiting(), 0);
    assert_eq!(ep.counters().path_failed_drops, 1);
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[1], [first]);
}

#[test]
fn a_path_query_pushed_out_of_a_full_request_queue_fails_what_waited() {
    let mut n = sa_net(|_, _| {});
    n.inject(0, &ping4(0, 1, 100));
    n.run(Duration::from_millis(100));
    assert_eq!(n.ep(0).path_waiting(), 1);
    // Queries for other ports fill the request queue behind node 1's; one more pushes the
    // oldest, node 1's, out: what waited for it is dropped, not held for ever.
    let other = |i: usize| {
        let mut g = [0u8; 16];
        g[..2].copy_from_slice(&[0xfe, 0x80]);
        g[14..].copy_from_slice(&u16::try_from(i).unwrap().to_be_bytes());
        Gid(g)
    };
    for i in 1..MAX_SA_REQUESTS {
        assert!(n.ep(0).want_path(other(i)));
    }
    assert_eq!(n.ep(0).path_waiting(), 1);
    assert!(n.ep(0).want_path(other(MAX_SA_REQUESTS)));
    assert_eq!(n.ep(0).path_waiting(), 0);
    assert_eq!(n.ep(0).counters().path_failed_drops, 1);
    let query = path_query(&mut n, 1);
    let reqs = sa_requests(&mut n);
    assert_eq!(reqs.len(), MAX_SA_REQUESTS);
    assert!(!reqs.contains(&query));
    // The next packet asks again.
    n.inject(0, &ping4(0, 1, 101));
    assert_eq!(sa_requests(&mut n), [query]);
}

/// Node 0's TX connections to node 1: (QPN, state).
fn tx_to_1(n: &mut Net) -> Vec<(QpNum, TxState)> {
    let now = n.now();
    n.ep(0)
        .snapshot(now)
        .tx
        .iter()
        .map(|t| (t.qpn, t.state))
        .collect()
}

/// The events node 0 raised since the last call, for their TX close reasons.
fn tx_closed(n: &mut Net) -> Vec<TxCloseReason> {
    std::iter::from_fn(|| n.ep(0).poll_event())
        .filter_map(|e| match e {
            Event::TxClosed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

/// The connection to node 1 on the path the test's SA gave (LID 0x21), established.
fn connected(n: &mut Net) -> QpNum {
    n.inject(0, &ping4(0, 1, 100));
    n.run(Duration::from_millis(100));
    answer(n, 1);
    n.run(Duration::from_millis(100));
    let tx = tx_to_1(n);
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].1, TxState::Established);
    let _ = tx_closed(n);
    tx[0].0
}

#[test]
fn a_port_event_asks_again_for_the_paths_in_use_and_a_moved_peer_is_reconnected() {
    let mut n = sa_net(|_, _| {});
    let qpn = connected(&mut n);
    let gid1 = n.ep(1).hwaddr().gid;
    let _ = sa_requests(&mut n);

    // The SM re-registered the port: the path to node 1, in use, is asked for again after
    // the event; the same answer leaves the connection as it is.
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.port_changed(v, PortChange::ClientReregister);
    let query = path_query(&mut n, 1);
    assert_eq!(
        sa_requests(&mut n),
        [SaRequest::Port(PortChange::ClientReregister), query]
    );
    answer(&mut n, 1);
    n.run(Duration::from_millis(10));
    assert_eq!(tx_to_1(&mut n), [(qpn, TxState::Established)]);
    assert_eq!(tx_closed(&mut n), []);

    // The SM moved node 1 to LID 0x22: the connection on 0x21 is closed; the next packet
    // opens one on the new path.
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.port_changed(v, PortChange::SmChange);
    let _ = sa_requests(&mut n);
    let rec = PathRecord {
        dlid: 0x22,
        ..record(&mut n, 1)
    };
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.set_sa_path(now, v, gid1, &rec);
    assert_eq!(tx_closed(&mut n), [TxCloseReason::PathMoved]);
    n.inject(0, &ping4(0, 1, 101));
    n.run(Duration::from_millis(200));
    let tx = tx_to_1(&mut n);
    assert!(
        tx.iter()
            .any(|(q, s)| *q != qpn && *s == TxState::Established),
        "no new connection: {tx:?}"
    );
    assert_eq!(n.ep(0).path(gid1).map(|p| p.dlid.0), Some(0x22));
}

#[test]
fn our_lid_changed_closes_every_connection() {
    let mut n = sa_net(|_, _| {});
    let qpn = connected(&mut n);
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.port_changed(v, PortChange::LidChange);
    assert_eq!(tx_closed(&mut n), [TxCloseReason::LidChanged]);
    n.run(Duration::from_millis(100));
    assert!(tx_to_1(&mut n).iter().all(|(q, _)| *q != qpn));
}

/// A port event asks again for every path held, not only those of the node's own
/// connections: the followers' connections (another worker's) run on paths the node holds
/// for them, and would otherwise stay on a LID the SM moved until they fail.
#[test]
fn a_port_event_asks_again_for_every_path_held() {
    let mut n = sa_net(|_, _| {});
    let gid = n.ep(1).hwaddr().gid;
    assert!(n.ep(0).want_path(gid));
    assert_eq!(sa_requests(&mut n), [path_query(&mut n, 1)]);
    answer(&mut n, 1);
    assert_eq!(n.ep(0).tx_count(), 0, "no connection of its own");
    assert!(n.ep(0).path(gid).is_some());
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.port_changed(v, PortChange::ClientReregister);
    assert_eq!(n.ep(0).path(gid), None, "flushed");
    let asked = sa_requests(&mut n);
    assert!(asked.contains(&SaRequest::Path { dgid: gid }), "{asked:?}");
}
