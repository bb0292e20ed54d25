//! Every TX connection this side closes says so once, naming the peer and why: its neighbour
//! aged out, the peer restarted, the interface shut down, its static neighbour was removed.

use super::*;
use crate::sim::cluster::node_v4;

/// The `tx closed` events node `i` queued, as `(peer IP, reason)`.
fn closed(n: &mut Net, i: usize) -> Vec<(Option<IpAddr>, TxCloseReason)> {
    let mut out = Vec::new();
    while let Some(e) = n.ep(i).poll_event() {
        if let Event::TxClosed { peer, reason } = e {
            out.push((peer.ip, reason));
        }
    }
    out
}

/// Two nodes, node 0 connected to node 1 by one ping; its events so far taken.
fn connected(cfg: impl FnMut(usize, &mut EndpointConfig)) -> Net {
    let mut n = Net::new(2, |_, _| {}, cfg);
    n.inject(0, &ping4(0, 1, 64));
    n.run(Duration::from_millis(100));
    assert_eq!(n.ep(0).counters().tx_established, 1);
    assert_eq!(closed(&mut n, 0), []);
    n
}

fn node1() -> Option<IpAddr> {
    Some(IpAddr::V4(node_v4(1)))
}

#[test]
fn an_aged_out_neighbour_closes_its_connection_with_a_line() {
    let mut n = connected(|_, c| c.neigh_timeout = Duration::from_secs(1));
    n.run(Duration::from_secs(5));
    assert_eq!(n.ep(0).tx_count(), 0, "{:?}", n.ep(0).counters());
    assert_eq!(closed(&mut n, 0), [(node1(), TxCloseReason::AgedOut)]);
}

#[test]
fn a_restarted_peer_closes_the_old_connection_with_a_line() {
    let mut n = connected(|_, _| {});
    n.kill(1);
    n.restart(1).unwrap();
    n.run(Duration::from_millis(5));
    assert_eq!(n.ep(0).counters().peer_restarts, 1);
    assert_eq!(closed(&mut n, 0), [(node1(), TxCloseReason::PeerRestarted)]);
}

#[test]
fn shutdown_closes_every_connection_with_a_line() {
    let mut n = connected(|_, _| {});
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.begin_shutdown(now, v);
    assert_eq!(closed(&mut n, 0), [(node1(), TxCloseReason::Shutdown)]);
    // Closing already: a second shutdown says nothing more.
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.begin_shutdown(now, v);
    assert_eq!(closed(&mut n, 0), []);
}

#[test]
fn a_removed_static_neighbour_closes_its_connection_with_a_line() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    let hw1 = n.ep(1).hwaddr();
    let ip1 = IpAddr::V4(node_v4(1));
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.add_static_neighbour(now, v, ip1, hw1);
    n.inject(0, &ping4(0, 1, 64));
    n.run(Duration::from_millis(100));
    assert_eq!(n.ep(0).counters().tx_established, 1);
    assert_eq!(closed(&mut n, 0), []);
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    assert!(ep.remove_static_neighbour(now, v, ip1));
    assert_eq!(
        closed(&mut n, 0),
        [(Some(ip1), TxCloseReason::NeighbourChanged)]
    );
}

#[test]
fn a_failed_connection_says_failed_not_closed() {
    let mut n = connected(|_, _| {});
    n.kill(1);
    for _ in 0..40 {
        n.inject(0, &ping4(0, 1, 64));
        n.run(Duration::from_millis(250));
        if n.ep(0).counters().tx_failed > 0 {
            break;
        }
    }
    assert_eq!(n.ep(0).counters().tx_failed, 1, "{:?}", n.ep(0).counters());
    assert_eq!(closed(&mut n, 0), []);
}

#[test]
fn a_peers_dreq_closes_the_connection_normally() {
    // Node 1 shuts down: it sends a DREQ for its RX side of node 0's TX connection, the first
    // DREQ node 0 sees. That is an orderly close, not a failure.
    let mut n = connected(|_, _| {});
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[1].as_mut().unwrap(), &mut c.f.nodes[1]);
    ep.begin_shutdown(now, v);
    n.run(Duration::from_millis(100));
    let c = n.ep(0).counters();
    assert_eq!((c.tx_failed, n.ep(0).tx_count()), (0, 0), "{c:?}");
    assert_eq!(
        closed(&mut n, 0),
        [(node1(), TxCloseReason::PeerDisconnected)]
    );
}
