//! Tests of the endpoint: several nodes on the simulated fabric, a virtual clock, IP packets
//! injected as if read from the TUN device.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use etherparse::PacketBuilder;

use super::*;
use crate::sim::Fabric;
use crate::soft::{Quirks, SoftConfig};

/// Nodes on the fabric, each with an endpoint, and what their TUN devices received.
struct Net {
    f: Fabric,
    eps: Vec<Option<Endpoint>>,
    tun: Vec<Vec<Vec<u8>>>,
}

fn v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 0, u8::try_from(i + 1).unwrap())
}

fn v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        0xdb8,
        0x19,
        0,
        0,
        0,
        0,
        u16::try_from(i + 1).unwrap(),
    )
}

impl Net {
    fn new(
        n: usize,
        mut soft: impl FnMut(usize, &mut SoftConfig),
        mut cfg: impl FnMut(usize, &mut EndpointConfig),
    ) -> Self {
        let t0 = Instant::now();
        let mut f = Fabric::with_nodes(n, t0, |i, c| soft(i, c));
        let peers: Vec<IpAddr> = f.nodes.iter().map(|n| n.config().local_ip).collect();
        let mut eps = Vec::new();
        for (i, node) in f.nodes.iter_mut().enumerate() {
            node.set_mcast_peers(peers.clone());
            let mut c = EndpointConfig::new(vec![(IpAddr::V4(v4(i)), 24), (IpAddr::V6(v6(i)), 64)]);
            c.seed = i as u64 + 1;
            c.rx_timeout = Duration::from_secs(2);
            c.drain_timeout = Duration::from_secs(1);
            cfg(i, &mut c);
            eps.push(Some(Endpoint::new(t0, node, c).expect("endpoint")));
        }
        Self {
            f,
            eps,
            tun: vec![Vec::new(); n],
        }
    }

    fn now(&self) -> Instant {
        self.f.now()
    }

    fn ep(&mut self, i: usize) -> &mut Endpoint {
        self.eps[i].as_mut().expect("node is up")
    }

    /// Lets every endpoint handle verbs and timers and collects TUN output.
    fn service(&mut self) {
        let now = self.f.now();
        for i in 0..self.eps.len() {
            if let Some(ep) = self.eps[i].as_mut() {
                ep.handle_verbs(now, &mut self.f.nodes[i]);
                ep.handle_timeout(now, &mut self.f.nodes[i]);
                while let Some(p) = ep.poll_tun() {
                    self.tun[i].push(p);
                }
            }
        }
    }

    /// Runs for `d` of virtual time.
    fn run(&mut self, d: Duration) {
        let end = self.f.now() + d;
        for _ in 0..2_000_000 {
            self.service();
            self.f.transmit();
            let mut next = self.f.next_event();
            for ep in self.eps.iter().flatten() {
                next = match (next, ep.poll_timeout()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            let now = self.f.now();
            let target = next.unwrap_or(end).max(now).min(end);
            if target >= end && now >= end {
                break;
            }
            // Always advance a little so a lower-bound timer cannot spin.
            let step = target
                .saturating_duration_since(now)
                .max(Duration::from_micros(1));
            self.f.advance(step);
        }
        self.service();
    }

    /// Writes `packet` into node `i`'s TUN device.
    fn inject(&mut self, i: usize, packet: &[u8]) {
        let now = self.f.now();
        let ep = self.eps[i].as_mut().expect("node is up");
        ep.handle_tun_packet(now, &mut self.f.nodes[i], packet);
    }

    fn qp_live(&self, i: usize) -> usize {
        self.f.nodes[i].qp_count()
    }

    /// Node `i` vanishes: no more traffic from it and its endpoint is gone (as after SIGKILL).
    fn kill(&mut self, i: usize) {
        self.f.partitioned[i] = true;
        self.eps[i] = None;
    }
}

fn ping4(from: usize, to: usize, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv4(v4(from).octets(), v4(to).octets(), 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut out, &vec![0xA5; payload])
        .unwrap();
    out
}

fn ping6(from: usize, to: usize, payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv6(v6(from).octets(), v6(to).octets(), 64)
        .icmpv6_echo_request(7, 1)
        .write(&mut out, &vec![0x5A; payload])
        .unwrap();
    out
}

/// Both UD QP and QP1.
const BASELINE_QPS: usize = 2;

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
        let (ep, node) = (n.eps[1].as_mut().unwrap(), &mut n.f.nodes[1]);
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
    n.f.partitioned[1] = false;
    let now = n.now();
    let mut c = EndpointConfig::new(vec![(IpAddr::V4(v4(1)), 24)]);
    c.seed = 99;
    c.rx_timeout = Duration::from_secs(2);
    c.drain_timeout = Duration::from_secs(1);
    n.f.nodes[1] = crate::soft::SoftVerbs::new(*n.f.nodes[1].config());
    let peers: Vec<IpAddr> = n.f.nodes.iter().map(|x| x.config().local_ip).collect();
    n.f.nodes[1].set_mcast_peers(peers);
    n.eps[1] = Some(Endpoint::new(now, &mut n.f.nodes[1], c).unwrap());
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
