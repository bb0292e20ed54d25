//! Tests of the endpoint: several nodes on the simulated fabric, a virtual clock, IP packets
//! injected as if read from the TUN device.

use std::time::{Duration, Instant};

use super::*;
use crate::sim::cluster::{ping4, ping6, Cluster, BASELINE_QPS};
use crate::soft::{Quirks, SoftConfig};

/// The endpoint tests' cluster: [`Cluster`] with a panic on set-up errors.
struct Net(Cluster);

impl std::ops::Deref for Net {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl std::ops::DerefMut for Net {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.0
    }
}

impl Net {
    fn new(
        n: usize,
        soft: impl FnMut(usize, &mut SoftConfig),
        cfg: impl FnMut(usize, &mut EndpointConfig),
    ) -> Self {
        Self(Cluster::new(n, Instant::now(), soft, cfg).expect("cluster"))
    }

    fn ep(&mut self, i: usize) -> &mut Endpoint {
        self.0.ep(i).expect("node is up")
    }

    /// Node `i` reads `packet` from its TUN device as the daemon does: into a send buffer, and
    /// only while one is free (else the packet stays in the TUN queue). Whether it read it.
    fn read_tun(&mut self, i: usize, packet: &[u8]) -> bool {
        if self.free_send_buffers(i) == 0 {
            return false;
        }
        self.inject_via_buffer(i, packet);
        true
    }

    /// Send buffers of node `i` not in flight.
    fn free_send_buffers(&mut self, i: usize) -> usize {
        self.ep(i).tx.free_bufs()
    }
}

#[test]
fn ipv4_packets_cross_an_rc_connection() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    let p = ping4(0, 1, 100);
    n.inject(0, &p);
    n.inject(0, &p);
    n.run(Duration::from_millis(100));
    assert_eq!(
        n.tun[1],
        vec![p.clone(), p.clone()],
        "queued during ARP and CM, then sent"
    );
    let c0 = n.ep(0).counters();
    let c1 = n.ep(1).counters();
    assert_eq!(c0.tx_established, 1);
    assert_eq!(c1.rx_accepted, 1);
    assert_eq!(n.ep(0).tx_count(), 1);
    assert_eq!(n.ep(1).rx_count(), 1);
    // Established: the next packet goes straight out.
    let big = ping4(0, 1, 65000);
    n.inject(0, &big);
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1].last(), Some(&big));
    assert_eq!(n.qp_live(0), BASELINE_QPS + 1);
    assert_eq!(n.qp_live(1), BASELINE_QPS + 1);
}

/// Packets read into the endpoint's own send buffers: the first ones (no neighbour, no
/// connection yet) take the general path from a copy, later ones leave from the buffer they
/// were read into; every buffer comes back.
#[test]
fn tun_packets_read_into_send_buffers_cross() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    let free_buffers = |n: &mut Net| {
        let ep = n.ep(0);
        let taken: Vec<BufId> = std::iter::from_fn(|| ep.tun_buffer()).collect();
        let count = taken.len();
        for b in taken {
            ep.return_tun_buffer(b);
        }
        count
    };
    let depth = free_buffers(&mut n);
    assert!(depth > 0);
    let p4 = ping4(0, 1, 100);
    n.inject_via_buffer(0, &p4);
    n.run(Duration::from_millis(100));
    assert_eq!(
        n.tun[1],
        vec![p4.clone()],
        "queued during ARP and CM, then sent"
    );
    let sent = n.ep(0).counters().tx_packets;
    let big = ping4(0, 1, 65000);
    let p6 = ping6(0, 1, 3000);
    for p in [&big, &p4, &p6] {
        n.inject_via_buffer(0, p);
    }
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1][1..], [big, p4.clone(), p6.clone()][..]);
    assert!(n.ep(0).counters().tx_packets >= sent + 2);
    assert_eq!(free_buffers(&mut n), depth, "every send buffer came back");
    // A packet whose IP length exceeds what was read (cut short by the read) is dropped.
    let now = n.f.now();
    let dropped = n.ep(0).counters().tx_dropped;
    let stump = &p4[..p4.len() - 10];
    let ep = n.0.eps[0].as_mut().expect("node 0 is up");
    let b = ep.tun_buffer().expect("a free send buffer");
    let v = &mut n.0.f.nodes[0];
    v.pools_mut().get_mut(b).expect("buffer")[TUN_BUFFER_OFFSET..][..stump.len()]
        .copy_from_slice(stump);
    ep.handle_tun_buffer(now, v, b, stump.len());
    assert_eq!(n.ep(0).counters().tx_dropped, dropped + 1);
    assert_eq!(free_buffers(&mut n), depth);
}

#[test]
fn ipv6_resolves_with_nd_and_crosses() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    let p = ping6(1, 0, 3000);
    n.inject(1, &p);
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[0], vec![p]);
    assert_eq!(n.ep(1).counters().tx_established, 1);
}

#[test]
fn datagram_mode_uses_ud_and_sends_too_big() {
    let mut n = Net::new(2, |_, _| {}, |_, c| c.mode = Mode::Datagram);
    let small = ping4(0, 1, 500);
    n.inject(0, &small);
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1], vec![small]);
    assert_eq!(n.ep(0).tx_count(), 0, "no RC in datagram mode");
    let big = ping4(0, 1, 2000);
    n.inject(0, &big);
    n.run(Duration::from_millis(10));
    assert_eq!(n.ep(0).counters().icmp_too_big_sent, 1);
    let icmp = n.tun[0].last().expect("ICMP written back");
    let parsed = etherparse::SlicedPacket::from_ip(icmp).unwrap();
    match parsed.transport {
        Some(etherparse::TransportSlice::Icmpv4(i)) => match i.icmp_type() {
            etherparse::Icmpv4Type::DestinationUnreachable(
                etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu },
            ) => assert_eq!(next_hop_mtu, 1020),
            t => panic!("{t:?}"),
        },
        t => panic!("{t:?}"),
    }
}

#[test]
fn unknown_neighbour_gives_up_and_queue_is_bounded() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    let p = ping4(0, 9, 10);
    for _ in 0..5 {
        n.inject(0, &p);
    }
    n.run(Duration::from_secs(5));
    let c = n.ep(0).counters();
    assert_eq!(c.tx_queue_drops, 2, "3 queued, 2 dropped");
    assert_eq!(c.neigh_failed, 1);
    assert!(n.tun[1].is_empty());
}

/// One sender (node 1) to node 0, then node 1 vanishes: node 0 must reap its RX QP.
fn stale_reap(srq: bool, quirks: Quirks) -> (Counters, usize, usize) {
    let mut n = Net::new(
        2,
        |i, c| {
            if i == 0 {
                c.quirks = quirks;
            }
        },
        |_, c| c.srq = srq,
    );
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    assert_eq!(n.ep(0).rx_count(), 1);
    let live_before = n.qp_live(0);
    n.kill(1);
    n.run(Duration::from_secs(6));
    let c = n.ep(0).counters();
    (c, n.ep(0).rx_count(), live_before - n.qp_live(0))
}

#[test]
fn stale_rx_qp_is_reaped_in_srq_mode() {
    let (c, rx, freed) = stale_reap(true, Quirks::default());
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.rx_stale_reaped, 1);
    assert_eq!(c.last_wqe_events, 1);
    assert_eq!(c.drain_timeouts, 0);
}

#[test]
fn stale_rx_qp_is_reaped_without_srq() {
    let (c, rx, freed) = stale_reap(false, Quirks::default());
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.rx_stale_reaped, 1);
    assert_eq!(c.last_wqe_events, 0);
    assert_eq!(c.drain_timeouts, 0);
}

#[test]
fn drain_never_is_caught_by_the_watchdog() {
    let q = Quirks {
        drain_never: true,
        ..Quirks::default()
    };
    let (c, rx, freed) = stale_reap(true, q);
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.drain_timeouts, 1);
}

#[test]
fn missing_last_wqe_is_caught_by_the_watchdog() {
    let q = Quirks {
        no_last_wqe: true,
        ..Quirks::default()
    };
    let (c, rx, freed) = stale_reap(true, q);
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.drain_timeouts, 1);
    assert_eq!(c.last_wqe_events, 0);
}

#[test]
fn duplicate_last_wqe_changes_nothing() {
    let q = Quirks {
        dup_last_wqe: true,
        ..Quirks::default()
    };
    let (c, rx, freed) = stale_reap(true, q);
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.last_wqe_events, 2);
    assert_eq!(c.drain_timeouts, 0);
}

#[test]
fn traffic_keeps_an_rx_connection_alive() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    for _ in 0..10 {
        n.inject(1, &ping4(1, 0, 64));
        n.run(Duration::from_millis(500));
    }
    assert_eq!(n.ep(0).rx_count(), 1);
    assert_eq!(n.ep(0).counters().rx_stale_reaped, 0);
    assert_eq!(n.tun[0].len(), 10);
}

#[test]
fn dreq_from_a_closing_peer_reaps_the_rx_qp() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    let now = n.now();
    {
        let c = &mut n.0;
        let (ep, node) = (c.eps[1].as_mut().unwrap(), &mut c.f.nodes[1]);
        ep.begin_shutdown(now, node);
    }
    n.run(Duration::from_millis(200));
    assert!(n.ep(1).is_stopped());
    assert_eq!(n.ep(0).rx_count(), 0);
    assert_eq!(n.ep(0).counters().rx_dreq_reaped, 1);
    assert_eq!(n.qp_live(0), BASELINE_QPS);
    assert_eq!(n.qp_live(1), BASELINE_QPS);
}

#[test]
fn qp_budget_evicts_so_every_node_stays_reachable() {
    let mut n = Net::new(4, |_, _| {}, |_, c| c.max_conn_qp = 2);
    for round in 0..3 {
        for i in 1..4 {
            n.inject(i, &ping4(i, 0, 64));
            n.run(Duration::from_millis(100));
        }
        assert_eq!(n.tun[0].len(), 3 * (round + 1), "round {round}");
    }
    let c = n.ep(0).counters();
    assert!(c.rx_evicted >= 1, "{c:?}");
    assert!(n.ep(0).rx_count() <= 2);
}

#[test]
fn qp_budget_reject_policy_rejects() {
    let mut n = Net::new(
        3,
        |_, _| {},
        |_, c| {
            c.max_conn_qp = 1;
            c.budget_policy = QpBudgetPolicy::Reject;
        },
    );
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    n.inject(2, &ping4(2, 0, 64));
    n.run(Duration::from_millis(100));
    assert_eq!(n.ep(0).counters().rx_rejected, 1);
    assert_eq!(n.ep(2).counters().tx_failed, 1);
    assert_eq!(n.tun[0].len(), 1);
}

#[test]
fn restarted_peer_reconnects() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    n.inject(0, &ping4(0, 1, 64));
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1].len(), 1);
    // Node 1 vanishes and comes back with a new endpoint (new UD QPN).
    n.kill(1);
    n.run(Duration::from_secs(3));
    n.restart(1).unwrap();
    n.tun[1].clear();
    // The old connection fails (retries run out against the new node), the neighbour is
    // forgotten, and a later packet resolves and connects again.
    for _ in 0..40 {
        n.inject(0, &ping4(0, 1, 64));
        n.run(Duration::from_millis(250));
        if !n.tun[1].is_empty() {
            break;
        }
    }
    assert!(!n.tun[1].is_empty(), "{:?}", n.ep(0).counters());
}

#[test]
fn all_pairs_steady_state_delivers_everything() {
    let mut n = Net::new(4, |_, _| {}, |_, c| c.max_conn_qp = 8);
    let mut sent = 0;
    for round in 0..50 {
        for a in 0..4 {
            for b in 0..4 {
                if a != b {
                    let p = if (a + b + round) % 2 == 0 {
                        ping4(a, b, 200)
                    } else {
                        ping6(a, b, 200)
                    };
                    n.inject(a, &p);
                    sent += 1;
                }
            }
        }
        n.run(Duration::from_millis(300));
    }
    let delivered: usize = n.tun.iter().map(Vec::len).sum();
    assert_eq!(delivered, sent);
}

#[test]
fn no_connection_is_opened_after_shutdown_began() {
    // Found by the endpoint_script fuzz target: a packet queued on an unresolved neighbour
    // must not open a TX connection when the ARP reply arrives after begin_shutdown.
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    n.inject(1, &ping4(1, 0, 64));
    let now = n.now();
    {
        let c = &mut n.0;
        let (ep, node) = (c.eps[1].as_mut().unwrap(), &mut c.f.nodes[1]);
        ep.begin_shutdown(now, node);
    }
    n.run(Duration::from_millis(200));
    assert!(n.ep(1).is_stopped());
    assert_eq!(n.ep(1).tx_count(), 0);
    assert_eq!(n.qp_live(1), BASELINE_QPS);
    assert!(n.tun[0].is_empty());
}

/// A peer whose receive queue runs dry and stays dry (here: it never reads its TUN device,
/// so no receive buffer comes back) answers with RNR NAKs for ever, and TX connections retry
/// RNR for ever. Nothing completes, so the stall watchdog fails the connection after
/// `tx_stall_timeout`, its send buffers come back, and traffic to every other node goes on;
/// without the watchdog the buffers stayed with that connection and the node reached nobody.
#[test]
fn a_peer_stuck_in_rnr_does_not_lock_the_node_out() {
    let mut n = Net::new(
        3,
        |_, _| {},
        |i, c| {
            if i == 1 {
                // Small, and never reaped by its own stale scan: the stuck state lasts.
                c.srq_depth = 16;
                c.rx_timeout = Duration::from_secs(3600);
            }
        },
    );
    let tx_depth = n.ep(0).cfg.tx_depth as usize;
    // Connections and neighbours first.
    for to in [1, 2] {
        n.inject(0, &ping4(0, to, 100));
    }
    n.run(Duration::from_millis(200));
    assert_eq!(n.tun[1].len(), 1);
    assert_eq!(n.tun[2].len(), 1);
    n.tun_stalled[1] = true;
    // Far more than node 1 has receives for, and than node 0 has send buffers, read as the
    // daemon reads its TUN device: only while a send buffer is free.
    let mut sent = 0;
    for _ in 0..400 {
        if n.read_tun(0, &ping4(0, 1, 1000)) {
            sent += 1;
        }
        n.run(Duration::from_micros(200));
    }
    assert!(sent >= tx_depth, "{sent}");
    n.run(Duration::from_secs(2));
    let c0 = n.ep(0).counters();
    assert!(
        c0.tx_stalled >= 1,
        "the connection to the stuck peer failed: {c0:?}"
    );
    assert_eq!(c0.tx_dropped, 0, "{c0:?}");
    assert_eq!(
        n.free_send_buffers(0),
        tx_depth,
        "every send buffer came back"
    );
    // The failed connection was closed with a DREQ: no RX QP piles up on the stuck peer.
    let c1 = n.ep(1).counters();
    assert!(c1.rx_accepted <= c1.rx_dreq_reaped + 1, "{c1:?}");
    assert!(n.qp_live(1) <= BASELINE_QPS + 1);
    // Node 0 still reaches node 2.
    let before = n.tun[2].len();
    n.inject_via_buffer(0, &ping4(0, 2, 200));
    n.run(Duration::from_millis(200));
    assert_eq!(n.tun[2].len(), before + 1, "node 0 can still reach node 2");
}

/// An overloaded receiver (its TUN device read only now and then, so its shared receive
/// queue keeps running dry) answers two senders with RNR NAKs, yet delivers everything in the
/// end: their connections ride it out instead of failing and reconnecting, which would flush
/// what was in flight. With 6 RNR retries instead of for ever, connections failed here.
#[test]
fn an_overloaded_receiver_costs_rnr_naks_not_connections() {
    let mut n = Net::new(
        3,
        |_, _| {},
        |i, c| {
            if i == 1 {
                c.srq_depth = 16;
            }
        },
    );
    for from in [0, 2] {
        n.inject(from, &ping4(from, 1, 100));
    }
    n.run(Duration::from_millis(200));
    assert_eq!(n.tun[1].len(), 2);
    let mut sent = 2;
    for round in 0..200 {
        // The receiver reads its TUN one turn in five.
        n.tun_stalled[1] = round % 5 != 0;
        for from in [0, 2] {
            for _ in 0..8 {
                if n.read_tun(from, &ping4(from, 1, 1000)) {
                    sent += 1;
                }
            }
        }
        n.run(Duration::from_millis(2));
    }
    n.tun_stalled[1] = false;
    n.run(Duration::from_millis(500));
    assert!(
        n.f.nodes[1].stats().tx_rnr_naks > 0,
        "the receive queue ran dry"
    );
    for from in [0, 2] {
        let c = n.ep(from).counters();
        assert_eq!((c.tx_failed, c.tx_dropped), (0, 0), "node {from}: {c:?}");
    }
    assert_eq!(n.tun[1].len(), sent, "everything arrived");
}

/// A peer that vanishes without a DREQ while every send buffer is in flight to it holds them
/// only for `tx_stall_timeout`, not for the provider's retry budget (the software provider
/// backs off over ~47 local ACK timeouts, 3.2 s at exponent 14, before the send fails; the
/// node reached no other peer meanwhile): the connection fails, every buffer comes back, the
/// node reaches the other peers again, and the failed connection's QP is destroyed.
#[test]
fn a_vanished_peer_holds_the_send_buffers_only_for_the_stall_timeout() {
    // Idle RX connections are not reaped meanwhile: node 2 keeps the one from node 0. With
    // qp_timeout 14 the provider's retries outlast the stall timeout, which then acts first.
    let mut n = Net::new(
        3,
        |_, _| {},
        |_, c| {
            c.rx_timeout = Duration::from_secs(60);
            c.qp_timeout = 14;
        },
    );
    for to in [1, 2] {
        n.inject(0, &ping4(0, to, 100));
    }
    n.run(Duration::from_millis(200));
    assert_eq!((n.tun[1].len(), n.tun[2].len()), (1, 1));
    let tx_depth = n.ep(0).cfg.tx_depth as usize;
    let stall_timeout = n.ep(0).cfg.tx_stall_timeout;
    n.kill(1);
    // As the daemon does: read packets (all for the vanished peer) while a send buffer is free.
    let mut sent = 0;
    while sent < 10 * tx_depth && n.read_tun(0, &ping4(0, 1, 1000)) {
        sent += 1;
    }
    assert_eq!(
        sent, tx_depth,
        "every send buffer is in flight to the vanished peer"
    );
    // Status shows which connection holds them.
    let now = n.now();
    let held: Vec<u32> = n
        .ep(0)
        .snapshot(now)
        .tx
        .iter()
        .map(|t| t.in_flight)
        .collect();
    assert_eq!(held, [tx_depth as u32, 0]);
    // The node cannot send until the connection fails; then it can.
    let stuck_at = n.now();
    for _ in 0..500 {
        if n.free_send_buffers(0) > 0 {
            break;
        }
        n.run(Duration::from_millis(10));
    }
    let stuck = n.now() - stuck_at;
    let c0 = n.ep(0).counters();
    assert!(
        stuck <= stall_timeout + Duration::from_millis(20),
        "send buffers held for {stuck:?}: {c0:?}"
    );
    assert_eq!((c0.tx_stalled, c0.tx_failed), (1, 1), "{stuck:?} {c0:?}");
    assert_eq!(
        n.free_send_buffers(0),
        tx_depth,
        "every send buffer came back"
    );
    n.inject_via_buffer(0, &ping4(0, 2, 200));
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[2].len(), 2, "node 0 reaches node 2 again");
    // The failed connection's QP goes (the TX watchdog bounds its flush); the one to node 2
    // is all that is left.
    n.run(Duration::from_secs(10));
    assert_eq!(n.ep(0).tx.len(), 1);
    assert_eq!(n.qp_live(0), BASELINE_QPS + 1);
}

/// Sends that keep completing never trip the stall check, however long the connection stays
/// busy: a stream of pings over 5 s (five stall timeouts) to a live peer, every one delivered.
#[test]
fn a_busy_connection_that_makes_progress_never_stalls() {
    let mut n = Net::new(2, |_, _| {}, |_, c| c.rx_timeout = Duration::from_secs(60));
    for _ in 0..500 {
        n.inject_via_buffer(0, &ping4(0, 1, 1000));
        n.run(Duration::from_millis(10));
    }
    let c0 = n.ep(0).counters();
    assert_eq!(
        (c0.tx_stalled, c0.tx_failed, c0.tx_established),
        (0, 0, 1),
        "{c0:?}"
    );
    assert_eq!(n.tun[1].len(), 500);
}

mod admission;
