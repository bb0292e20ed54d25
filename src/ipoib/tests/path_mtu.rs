//! Nodes whose underlay links differ in MTU, and links whose MTU changes under a running
//! node: every connection runs at a path MTU both ends' links carry (the REQ of a larger one
//! is refused with REJ 26 naming the smaller, and asked again at it), and a changed link MTU
//! re-establishes the connections it concerns, their queued packets kept. The fabric drops
//! datagrams a link does not carry, as a bridge or a veth does.

use super::*;
use crate::verbs::PathMtu;

/// Link MTUs: 9000 bytes carries RoCEv2 at path MTU 4096, 1500 at 1024.
const JUMBO: usize = 9000;
const ETHERNET: usize = 1500;

/// Two nodes, node `i` on a link of `links[i]` bytes from the start, as the daemon starts
/// on it: the provider's port MTU and the endpoint's path MTU from the link.
fn net(links: [usize; 2]) -> Net {
    let mtu = |i: usize| PathMtu::for_link_mtu(links[i]).expect("link MTU");
    let mut n = Net::new(2, |i, s| s.port_mtu = mtu(i), |i, c| c.path_mtu = mtu(i));
    for (i, l) in links.iter().enumerate() {
        n.f.link_mtu[i] = Some(*l);
    }
    n
}

/// The path MTU of node `i`'s TX connection (the one not closing).
fn tx_path_mtu(n: &mut Net, i: usize) -> Option<PathMtu> {
    let ep = n.ep(i);
    ep.tx.qpns().into_iter().find_map(|q| {
        ep.tx
            .get(&q)
            .filter(|t| t.state != TxState::Closing)
            .map(|t| t.path_mtu)
    })
}

/// Pings of `payload` bytes from `from` to `to`, `count` of them; how many arrived.
fn pings(n: &mut Net, from: usize, to: usize, payload: usize, count: usize) -> usize {
    let before = n.tun[to].len();
    for _ in 0..count {
        n.inject(from, &ping4(from, to, payload));
        n.run(Duration::from_millis(50));
    }
    n.run(Duration::from_millis(200));
    n.tun[to].len() - before
}

/// A node on a 9000-byte link and one on a 1500-byte link: 60000-byte pings cross both ways
/// at path MTU 1024. The larger side's REQ at 4096 draws REJ 26 naming 1024, and one REQ
/// again at it from the same QP; later connections to that peer ask at 1024 at once. (Before
/// REJ 26, the larger side's connection ran at 4096 and its packets never crossed the
/// smaller link.)
#[test]
fn links_of_different_mtus_carry_60000_byte_pings_both_ways() {
    let mut n = net([JUMBO, ETHERNET]);
    assert_eq!(pings(&mut n, 0, 1, 60_000, 5), 5);
    assert_eq!(pings(&mut n, 1, 0, 60_000, 5), 5);
    assert_eq!(tx_path_mtu(&mut n, 0), Some(PathMtu::Mtu1024));
    assert_eq!(tx_path_mtu(&mut n, 1), Some(PathMtu::Mtu1024));
    let (c0, c1) = (n.ep(0).counters(), n.ep(1).counters());
    assert_eq!((c0.tx_mtu_retries, c0.tx_failed), (1, 0), "{c0:?}");
    assert_eq!((c1.rx_mtu_rejected, c1.tx_mtu_retries), (1, 0), "{c1:?}");
    assert_eq!(n.f.too_big, 0, "nothing was sent that a link drops");
}

/// Both links at 9000 with connections both ways; node 1's link drops to 1500. Node 1's TX
/// connection is closed (its sends in flight are lost, as on a link that no longer carries
/// them) and the next packet opens one at 1024; its RX connection from node 0 is torn down
/// (DREQ), node 0 connects again and is told 1024 by REJ 26: 60000-byte pings cross both
/// ways. A connection still connecting when the MTU changes is set up again with the packets
/// it queued. Back at 9000, both connections return to 4096.
#[test]
fn a_link_mtu_lowered_then_raised_is_followed_with_the_queue_kept() {
    let mut n = net([JUMBO, JUMBO]);
    assert_eq!(pings(&mut n, 0, 1, 60_000, 1), 1);
    assert_eq!(pings(&mut n, 1, 0, 60_000, 1), 1);
    assert_eq!(tx_path_mtu(&mut n, 0), Some(PathMtu::Mtu4096));
    let change = n.set_link_mtu(1, ETHERNET).expect("the path MTU changed");
    assert_eq!(
        (change.from, change.to),
        (PathMtu::Mtu4096, PathMtu::Mtu1024)
    );
    assert_eq!((change.tx_reconnects, change.rx_reconnects), (1, 1));
    // What node 0 sends before the DREQ reaches it still goes at 4096, and is lost.
    n.run(Duration::from_millis(1));
    assert_eq!(pings(&mut n, 0, 1, 60_000, 5), 5);
    assert_eq!(pings(&mut n, 1, 0, 60_000, 5), 5);
    assert_eq!(tx_path_mtu(&mut n, 0), Some(PathMtu::Mtu1024));
    assert_eq!(tx_path_mtu(&mut n, 1), Some(PathMtu::Mtu1024));
    let c1 = n.ep(1).counters();
    assert_eq!((c1.path_mtu_changes, c1.mtu_reconnects), (1, 2), "{c1:?}");
    // 2048, then 1024 while the new connection is still connecting: it starts again at
    // 1024 with the packet it held.
    assert!(n.set_link_mtu(1, 2200).is_some());
    let before = n.tun[0].len();
    n.inject(1, &ping4(1, 0, 60_000));
    let held = n.ep(1).tx.qpns().into_iter().any(|q| {
        n.0.ep(1)
            .and_then(|ep| ep.tx.get(&q))
            .is_some_and(|t| t.state == TxState::Connecting && t.queue.len() == 1)
    });
    assert!(held, "the packet waits on a connecting connection");
    let change = n.set_link_mtu(1, ETHERNET).expect("the path MTU changed");
    assert_eq!(change.tx_reconnects, 1);
    n.run(Duration::from_millis(200));
    assert_eq!(n.tun[0].len(), before + 1, "the queued packet crossed");
    assert_eq!(tx_path_mtu(&mut n, 1), Some(PathMtu::Mtu1024));
    assert_eq!(pings(&mut n, 0, 1, 60_000, 1), 1);
    assert_eq!(tx_path_mtu(&mut n, 0), Some(PathMtu::Mtu1024));
    // Back to 9000: node 1's RX connection at the old MTU goes (node 0's cap was ours), and
    // node 0, told by the DREQ, asks at 4096 again.
    let change = n.set_link_mtu(1, JUMBO).expect("the path MTU changed");
    assert_eq!((change.tx_reconnects, change.rx_reconnects), (1, 1));
    // What node 0 sends before the DREQ reaches it still goes at 4096, and is lost.
    n.run(Duration::from_millis(1));
    assert_eq!(pings(&mut n, 0, 1, 60_000, 5), 5);
    assert_eq!(pings(&mut n, 1, 0, 60_000, 5), 5);
    assert_eq!(tx_path_mtu(&mut n, 0), Some(PathMtu::Mtu4096));
    assert_eq!(tx_path_mtu(&mut n, 1), Some(PathMtu::Mtu4096));
    for i in 0..2 {
        let c = n.ep(i).counters();
        assert_eq!((c.drain_timeouts, c.tx_stalled), (0, 0), "{c:?}");
    }
    assert_eq!(n.set_link_mtu(1, JUMBO), None, "no change, nothing done");
}

/// A REJ 26 naming an MTU not below the one the REQ asked at fails the connection instead
/// of asking again: each retry asks lower, so no peer can keep a connection asking.
#[test]
fn a_rej_26_naming_no_smaller_mtu_draws_no_retry() {
    let mut n = net([JUMBO, JUMBO]);
    n.inject(0, &ping4(0, 1, 100));
    let mut id = None;
    for _ in 0..100 {
        let ep = n.ep(0);
        id = ep.tx.qpns().into_iter().find_map(|q| {
            ep.tx
                .get(&q)
                .filter(|t| t.state == TxState::Connecting)
                .map(|t| t.id)
        });
        if id.is_some() {
            break;
        }
        n.run(Duration::from_micros(1));
    }
    let id = id.expect("a TX connection");
    assert!(!n.ep(0).may_retry_at_mtu(id, PathMtu::Mtu4096));
    assert!(n.ep(0).may_retry_at_mtu(id, PathMtu::Mtu2048));
}

/// In datagram mode the interface MTU is the path MTU - 4, and follows it.
#[test]
fn in_datagram_mode_the_interface_mtu_follows_the_path_mtu() {
    let mut n = Net::new(
        2,
        |_, s| s.port_mtu = PathMtu::Mtu4096,
        |_, c| {
            c.mode = Mode::Datagram;
            c.path_mtu = PathMtu::Mtu4096;
        },
    );
    assert_eq!(n.ep(1).interface_mtu(), 4092);
    n.set_link_mtu(1, ETHERNET);
    assert_eq!(n.ep(1).interface_mtu(), 1020);
    assert_eq!(n.ep(1).ud_mtu(), 1020);
    n.set_link_mtu(1, JUMBO);
    assert_eq!(n.ep(1).interface_mtu(), 4092);
}
