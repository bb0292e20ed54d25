//! Tests of the endpoint: several nodes on the simulated fabric, a virtual clock, IP packets
//! injected as if read from the TUN device.

use std::time::{Duration, Instant};

use super::*;
use crate::sim::cluster::{ping4, ping6, Cluster, BASELINE_QPS};
use crate::soft::{Quirks, SoftConfig};
use crate::verbs::{QpAttr, QpState};

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

/// The MAD of a REQ from `from` to node `to`'s `service_id` carrying `private_data` (at most
/// 92 bytes), its comm id, CA GUID, QPN and PSN made from `comm_id`: a REQ nobody will
/// complete unless the test does.
fn forged_req(
    n: &mut Net,
    to: usize,
    from: crate::verbs::Gid,
    comm_id: u32,
    response_timeout: u8,
    service_id: u64,
    private_data: &[u8],
) -> [u8; crate::wire::cm::MAD_LEN] {
    use crate::wire::cm::{CmMad, CmMessage, CmPath, Req};
    let hw = n.ep(to).hwaddr();
    let mut private = [0u8; Req::PRIVATE_DATA_LEN];
    private[..private_data.len()].copy_from_slice(private_data);
    let req = Req {
        local_comm_id: comm_id,
        service_id,
        local_ca_guid: 0xBAD0_0000_0000_0000 | u64::from(comm_id),
        local_qpn: QpNum::new(0x6000 + (comm_id & 0xFFF)),
        transport_service_type: Req::TRANSPORT_RC,
        starting_psn: crate::verbs::Psn::new(comm_id & 0xFF_FFFF),
        local_cm_response_timeout: response_timeout,
        remote_cm_response_timeout: response_timeout,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: Some(PathMtu::Mtu1024),
        max_cm_retries: 15,
        primary_path: CmPath {
            local_gid: from,
            remote_gid: hw.gid,
            local_ack_timeout: 17,
            ..CmPath::default()
        },
        private_data: private,
        ..Req::default()
    };
    CmMad::new(u64::from(comm_id), CmMessage::Req(req)).emit()
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
        |_, c| {
            c.srq = srq;
            c.max_conn_qp = default_max_conn_qp(srq);
        },
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

/// An RX QP moved to ERR behind the endpoint's back (as a provider does on a transport error)
/// raises Last WQE Reached while its connection is live; the endpoint's own move to ERR when
/// it reaps the connection raises it again on a provider that repeats it on every move to ERR
/// (rxe in Linux 6.12). Both events are counted, the QP is destroyed once, and the second
/// event drives the drain; without the repeat, the watchdog ends the teardown.
fn last_wqe_before_and_at_teardown(again: bool) -> (Counters, usize, usize) {
    let q = Quirks {
        last_wqe_again: again,
        ..Quirks::default()
    };
    let mut n = Net::new(
        2,
        |i, c| {
            if i == 0 {
                c.quirks = q;
            }
        },
        |_, c| c.srq = true,
    );
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    let qpns = n.ep(0).rx.qpns();
    assert_eq!(qpns.len(), 1);
    let live_before = n.qp_live(0);
    n.0.f.nodes[0]
        .modify_qp(qpns[0], &QpAttr::to_state(QpState::Err))
        .unwrap();
    n.run(Duration::from_millis(10));
    assert_eq!(n.ep(0).counters().last_wqe_events, 1);
    assert_eq!(
        n.ep(0).rx_count(),
        1,
        "an event for a live connection changes nothing"
    );
    n.kill(1);
    n.run(Duration::from_secs(6));
    let c = n.ep(0).counters();
    (c, n.ep(0).rx_count(), live_before - n.qp_live(0))
}

#[test]
fn last_wqe_again_at_teardown_drains_once() {
    let (c, rx, freed) = last_wqe_before_and_at_teardown(true);
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.rx_stale_reaped, 1);
    assert_eq!(c.last_wqe_events, 2);
    assert_eq!(c.drain_timeouts, 0);
}

#[test]
fn last_wqe_only_before_teardown_ends_by_the_watchdog() {
    let (c, rx, freed) = last_wqe_before_and_at_teardown(false);
    assert_eq!((rx, freed), (0, 1));
    assert_eq!(c.rx_stale_reaped, 1);
    assert_eq!(c.last_wqe_events, 1);
    assert_eq!(c.drain_timeouts, 1);
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

/// Node 1 restarts with the same QPN order (a fixed `--qpn-seed`): its new TX connection to
/// node 0 uses the QPN that node 0's RX connection from the old incarnation still holds. The
/// new connection is taken (or refused as stale and retried) and packets flow again, both ways.
#[test]
fn a_restarted_peer_reusing_its_qpns_reconnects() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    n.inject(0, &ping4(0, 1, 64));
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    assert_eq!((n.tun[0].len(), n.tun[1].len()), (1, 1));
    n.kill(1);
    n.restart_reusing_qpns(1).unwrap();
    n.tun[0].clear();
    n.tun[1].clear();
    for _ in 0..40 {
        n.inject(1, &ping4(1, 0, 64));
        n.inject(0, &ping4(0, 1, 64));
        n.run(Duration::from_millis(250));
        if !n.tun[0].is_empty() && !n.tun[1].is_empty() {
            break;
        }
    }
    let c = n.ep(0).counters();
    assert!(!n.tun[0].is_empty() && !n.tun[1].is_empty(), "{c:?}");
    assert!(
        n.ep(0).rx_count() <= 1,
        "the old incarnation's RX is gone: {c:?}"
    );
}

/// Two nodes connected both ways; node 1 restarts. Its announcement (gratuitous ARP from its
/// own address and port, new UD QPN) makes node 0 close the old incarnation's TX and RX
/// connections at once: the next packet goes out on a new connection, nothing waits for
/// retries to run out.
#[test]
fn a_restarted_peer_is_seen_at_once() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    n.inject(0, &ping4(0, 1, 64));
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    assert_eq!((n.tun[0].len(), n.tun[1].len()), (1, 1));
    assert_eq!((n.ep(0).tx_count(), n.ep(0).rx_count()), (1, 1));
    n.kill(1);
    n.restart(1).unwrap();
    n.run(Duration::from_millis(5));
    let c = n.ep(0).counters();
    assert_eq!(c.peer_restarts, 1, "{c:?}");
    n.tun[1].clear();
    n.inject(0, &ping4(0, 1, 64));
    n.run(Duration::from_millis(20));
    assert_eq!(n.tun[1].len(), 1, "{:?}", n.ep(0).counters());
    let c = n.ep(0).counters();
    assert_eq!((c.tx_failed, c.tx_established), (0, 2), "{c:?}");
    // Only the new TX connection is left (the old one's teardown bound may still run).
    assert_eq!(
        n.ep(0)
            .tx
            .iter()
            .filter(|(_, t)| t.state == TxState::Established)
            .count(),
        1
    );
    assert_eq!(
        (n.ep(0).rx.established_count() + n.ep(0).rx.half_open_count()),
        0,
        "the old incarnation's RX connection is gone"
    );
}

/// As above, but node 0 refuses the announcement (it comes from another UDP port than the
/// mapping was learned from). The restarted node's REQ, with a new CA GUID, closes the old
/// incarnation's connections once its own connection is established.
#[test]
fn a_req_from_a_new_incarnation_closes_the_old_one_once_established() {
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    n.inject(0, &ping4(0, 1, 64));
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(100));
    let node1 = IpAddr::from(crate::sim::cluster::node_v4(1));
    n.ep(0).neigh.get_mut(&node1).unwrap().src_port = Some(1);
    n.kill(1);
    n.restart(1).unwrap();
    n.run(Duration::from_millis(5));
    let c = n.ep(0).counters();
    assert_eq!((c.peer_restarts, c.neigh_foreign_port), (0, 1), "{c:?}");
    n.tun[0].clear();
    n.inject(1, &ping4(1, 0, 64));
    n.run(Duration::from_millis(20));
    assert_eq!(n.tun[0].len(), 1);
    let c = n.ep(0).counters();
    assert_eq!(c.peer_restarts, 1, "{c:?}");
    assert_eq!(
        (n.ep(0).rx.established_count() + n.ep(0).rx.half_open_count()),
        1,
        "only the new RX connection"
    );
    assert!(
        n.ep(0)
            .tx
            .iter()
            .all(|(_, t)| t.state != TxState::Established),
        "the old TX connection is closed"
    );
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

/// A peer whose receive queue runs dry and stays dry (here: its endpoint stops running, so
/// no receive buffer comes back) answers with RNR NAKs for ever, and TX connections retry
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
    n.ep_frozen[1] = true;
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
    n.ep_frozen[1] = false;
    n.run(Duration::from_secs(2));
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

/// An overloaded receiver (its endpoint run only now and then, so its shared receive queue
/// keeps running dry) answers two senders with RNR NAKs, yet delivers everything in the
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
        // The receiver runs one turn in five.
        n.ep_frozen[1] = round % 5 != 0;
        for from in [0, 2] {
            for _ in 0..8 {
                if n.read_tun(from, &ping4(from, 1, 1000)) {
                    sent += 1;
                }
            }
        }
        n.run(Duration::from_millis(2));
    }
    n.ep_frozen[1] = false;
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
    // The SRQ fell below its limit while the endpoint was off; the event refilled it.
    let c1 = n.ep(1).counters();
    assert!(
        c1.srq_limit_events > 0 && c1.srq_refills > 0 && c1.rx_buffer_drops == 0,
        "{c1:?}"
    );
}

/// A sender configured as Linux's (`rnr_retry` 0, `retry_count` 0: the first RNR NAK fails
/// its QP and `ipoib_cm_handle_tx_wc` tears the connection down) into a receiver whose TUN
/// device is read one turn in five: the receiver posts a spare buffer before a packet goes
/// to the TUN queue and drops the packet when it has none, so its SRQ never runs dry, the
/// sender sees no RNR NAK and its connection lives; the overload is counted as drops.
#[test]
fn a_linux_sender_into_a_slow_tun_loses_packets_not_its_connection() {
    linux_sender_into_a_slow_tun(true);
}

/// [`a_linux_sender_into_a_slow_tun_loses_packets_not_its_connection`] in non-SRQ mode: a
/// spare takes the packet's buffer's place on the connection's own ring.
#[test]
fn a_linux_sender_into_a_slow_tun_without_srq_loses_packets_not_its_connection() {
    linux_sender_into_a_slow_tun(false);
}

/// Node 0 as Linux's sender, node 1 with 16 receives (on the SRQ, or on each connection's
/// ring without one) and 16 spares, its TUN device read one turn in five (ten).
fn linux_sender_into_a_slow_tun(srq: bool) {
    let mut n = Net::new(
        2,
        |_, _| {},
        |i, c| {
            if i == 0 {
                c.tx_rnr_retry = 0;
                c.tx_retry_count = 0;
            } else {
                c.srq = srq;
                c.srq_depth = 16;
                c.nonsrq_ring = 16;
                c.rx_spare = 16;
                // Rings for a few connections: the non-SRQ pool is pinned at start.
                c.max_conn_qp = 1;
                c.max_pending_rx = 1;
            }
        },
    );
    n.inject(0, &ping4(0, 1, 100));
    n.run(Duration::from_millis(200));
    assert_eq!(n.tun[1].len(), 1);
    // Without an SRQ the rings of the connections not made (two of the pool's three) serve
    // as spares too: a TUN device read one turn in ten empties them.
    let every = if srq { 5 } else { 10 };
    let mut sent = 1;
    for round in 0..100 {
        n.tun_stalled[1] = round % every != 0;
        for _ in 0..8 {
            if n.read_tun(0, &ping4(0, 1, 1000)) {
                sent += 1;
            }
        }
        n.run(Duration::from_millis(2));
    }
    n.tun_stalled[1] = false;
    n.run(Duration::from_millis(500));
    let c0 = n.ep(0).counters();
    let c1 = n.ep(1).counters();
    let naks = n.f.nodes[1].stats().tx_rnr_naks;
    println!(
        "srq {srq}: sent {sent}, delivered {}, rx_buffer_drops {}, RNR NAKs {naks}, sender: \
         tx_failed {} tx_established {} tx_dropped {}",
        n.tun[1].len(),
        c1.rx_buffer_drops,
        c0.tx_failed,
        c0.tx_established,
        c0.tx_dropped
    );
    assert_eq!(naks, 0, "the receiver RNR-NAKed the sender");
    assert_eq!((c0.tx_failed, c0.tx_established), (0, 1), "{c0:?}");
    assert!(c1.rx_buffer_drops > 0, "{c1:?}");
    assert_eq!(
        n.tun[1].len() as u64 + c1.rx_buffer_drops,
        sent as u64,
        "every packet delivered or counted"
    );
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

/// Node 0 takes the ARP request `sender_ip is at (gid, qpn), who has node 0?` straight off the
/// wire, as its UD QP would hand it over.
fn forged_arp(n: &mut Net, sender_ip: std::net::Ipv4Addr, gid: crate::verbs::Gid, qpn: u32) {
    use crate::wire::ipoib::{ArpOp, IpoibArp};
    let arp = IpoibArp {
        op: ArpOp::Request,
        sender_hw: HwAddr::new(0x80, QpNum::new(qpn), gid),
        sender_ip,
        target_hw: HwAddr::new(
            0,
            QpNum::new(0),
            crate::verbs::Gid::from(std::net::Ipv4Addr::UNSPECIFIED),
        ),
        target_ip: crate::sim::cluster::node_v4(0),
    };
    let now = n.now();
    let Cluster { eps, f, .. } = &mut n.0;
    if let Some(ep) = eps[0].as_mut() {
        ep.on_arp(
            now,
            &mut f.nodes[0],
            ud::UdSource::by_gid(gid, None),
            &arp.to_bytes(),
        );
    }
    // Its ARP reply's send buffer comes back.
    n.run(Duration::from_micros(100));
}

#[test]
fn arp_senders_outside_the_prefixes_are_not_learned_and_the_caps_hold() {
    let mut n = Net::new(
        2,
        |_, _| {},
        |_, c| {
            c.neigh_max = 8;
            c.neigh_max_per_source = 3;
        },
    );
    let peer = n.ep(1).hwaddr().gid;
    for i in 0..50u8 {
        forged_arp(
            &mut n,
            std::net::Ipv4Addr::new(10, 0, 0, i),
            peer,
            0x100 + u32::from(i),
        );
    }
    let c = n.ep(0).counters();
    assert_eq!(c.neigh_out_of_prefix, 50);
    assert_eq!(
        {
            let now = n.now();
            n.ep(0).snapshot(now)
        }
        .neigh_counts,
        NeighCounts::default()
    );
    // In the prefix: one source gets three entries, many sources at most neigh_max.
    for i in 0..10u8 {
        forged_arp(
            &mut n,
            std::net::Ipv4Addr::new(198, 19, 0, 100 + i),
            peer,
            0x200 + u32::from(i),
        );
    }
    let snap = {
        let now = n.now();
        n.ep(0).snapshot(now)
    };
    assert_eq!(snap.neigh_counts.reachable, 3);
    assert_eq!(n.ep(0).counters().neigh_source_full, 7);
    for i in 0..40u8 {
        let gid = crate::verbs::Gid::from(std::net::Ipv4Addr::new(198, 18, 1, i));
        forged_arp(
            &mut n,
            std::net::Ipv4Addr::new(198, 19, 0, 150 + i),
            gid,
            0x300,
        );
    }
    let snap = {
        let now = n.now();
        n.ep(0).snapshot(now)
    };
    assert_eq!(snap.neigh_counts.reachable, 8);
    let c = n.ep(0).counters();
    assert!(
        c.neigh_table_full >= 32 && c.neigh_evicted >= 32 + 7,
        "{c:?}"
    );
    // A real exchange still resolves and flows.
    let p = ping4(0, 1, 100);
    n.inject(0, &p);
    n.run(Duration::from_millis(100));
    assert_eq!(n.tun[1], vec![p]);
}

#[test]
fn the_snapshot_lists_a_bounded_number_of_neighbours_and_counts_them_all() {
    let statics: Vec<_> = (0..300u16)
        .map(|i| {
            let [a, b] = i.to_be_bytes();
            let ip = IpAddr::V4(std::net::Ipv4Addr::new(198, 19, 10 + a, b));
            let hw = HwAddr::new(
                0x80,
                QpNum::new(0x40),
                crate::verbs::Gid::from(std::net::Ipv4Addr::new(198, 18, 9, 9)),
            );
            (ip, hw)
        })
        .collect();
    let mut n = Net::new(1, |_, _| {}, |_, c| c.static_neighbours = statics.clone());
    let snap = {
        let now = n.now();
        n.ep(0).snapshot(now)
    };
    assert_eq!(snap.neighbours.len(), SNAPSHOT_NEIGHBOURS);
    assert_eq!(snap.neigh_counts.permanent, 300);
    assert!(snap.neighbours.windows(2).all(|w| w[0].0 < w[1].0));
}

mod admission;
mod device_events;
mod follower;
mod groups;
mod kernel_cm;
mod moves;
mod path_mtu;
mod path_wait;
mod rdma_cm;
mod sa_groups;
mod scale;
mod tx_closed;
mod underlay;

/// IB unicast UD: a completion without `IBV_WC_GRH` whose 40-byte area holds garbage (here
/// a GRH naming a third port) is attributed by its SLID and `src_qp` through the path set for
/// the sender's GID, not by those bytes: the ARP is learned. The same message from a LID
/// whose path names another GID, or from another QPN, is refused.
#[test]
fn a_grh_less_ud_message_is_attributed_by_slid_and_src_qp() {
    use crate::verbs::{Lid, Path, PathMtu};
    use crate::wire::grh::GrhRepr;
    use crate::wire::ipoib::{ArpOp, IpoibArp, IpoibHeader, ETHERTYPE_ARP};
    let mut n = Net::new(2, |_, _| {}, |_, _| {});
    let peer = n.ep(1).hwaddr();
    let liar = crate::verbs::Gid::from(std::net::Ipv4Addr::new(192, 0, 2, 99));
    let us = n.ep(0).hwaddr().gid;
    n.ep(0).set_path(
        peer.gid,
        Path {
            dlid: Lid(0x0021),
            slid: Lid(0x0001),
            hop_limit: 0,
            ..Path::roce(us, peer.gid, PathMtu::Mtu2048)
        },
    );
    let sender_ip = crate::sim::cluster::node_v4(1);
    let frame = |sender_hw: HwAddr| {
        let arp = IpoibArp {
            op: ArpOp::Request,
            sender_hw,
            sender_ip,
            target_hw: n_hw0(),
            target_ip: crate::sim::cluster::node_v4(0),
        };
        let mut f = vec![0u8; GRH_AREA];
        // Garbage in the GRH area: a well-formed GRH from `liar`.
        GrhRepr::rocev2_ud(liar.to_ip(), us.to_ip(), 60).emit(&mut f[..GRH_AREA]);
        let mut hdr = [0u8; IpoibHeader::LEN];
        IpoibHeader::new(ETHERTYPE_ARP).emit(&mut hdr);
        f.extend_from_slice(&hdr);
        f.extend_from_slice(&arp.to_bytes());
        f
    };
    let recv = |len: usize, slid: u16, qpn: QpNum| ud::UdRecv {
        len,
        grh: false,
        slid: Some(Lid(slid)),
        src_qp: Some(qpn),
        src_port: None,
    };
    let deliver = |n: &mut Net, f: &[u8], r: ud::UdRecv| {
        let now = n.now();
        let Cluster { eps, f: fabric, .. } = &mut n.0;
        if let Some(ep) = eps[0].as_mut() {
            ep.on_ud_frame(now, &mut fabric.nodes[0], f, r);
        }
        n.run(Duration::from_micros(100));
    };
    let ip = IpAddr::V4(sender_ip);
    let before = n.ep(0).counters().neigh_unvouched_drops;
    // From another QPN than the ARP's sender: refused.
    let f = frame(peer);
    deliver(
        &mut n,
        &f,
        recv(f.len(), 0x0021, QpNum::new(peer.qpn.get() + 1)),
    );
    // From the peer's LID claiming the liar's GID: refused.
    let forged = frame(HwAddr::new(0x80, peer.qpn, liar));
    deliver(&mut n, &forged, recv(forged.len(), 0x0021, peer.qpn));
    assert!(n.ep(0).neigh.get(&ip).and_then(|e| e.resolved()).is_none());
    assert_eq!(n.ep(0).counters().neigh_unvouched_drops, before + 2);
    // From the peer's LID and UD QPN: learned, whatever the GRH area says.
    deliver(&mut n, &f, recv(f.len(), 0x0021, peer.qpn));
    assert_eq!(
        n.ep(0).neigh.get(&ip).and_then(|e| e.resolved()),
        Some(peer)
    );
    assert_eq!(n.ep(0).counters().neigh_unvouched_drops, before + 2);
    // The path is what UD sends and connections to the peer use: DLID, no GRH.
    let av = n.ep(0).av_to(peer.gid);
    assert_eq!((av.dlid, av.grh), (Lid(0x0021), None));
}

const GRH_AREA: usize = crate::wire::grh::GRH_LEN;

fn n_hw0() -> HwAddr {
    HwAddr::new(
        0,
        QpNum::new(0),
        crate::verbs::Gid::from(std::net::Ipv4Addr::UNSPECIFIED),
    )
}
