//! A rogue on the underlay (issue 26, points 1-3): it sends UD datagrams to node 0's UD QP
//! from its own address, as anyone on the underlay can, and must not get IP into node 0's
//! TUN device, make node 0 send datagrams to third parties (reflection, amplification), or
//! take an address from the node it is bound to with one message.
//!
//! The rogue's datagrams are handed to node 0's endpoint as its UD QP would hand them over
//! (a GRH naming the rogue's underlay address, the rogue's QPN in the completion). The rogue
//! is node 2 of a three-node fabric, killed: it sends nothing of its own, and what node 0
//! sends it is counted by its provider. Node 1 is a real peer (and the bystander).
//! Every test here fails on the code before issue 26.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::*;
use crate::sim::cluster::{node_v4, node_v6};
use crate::verbs::Gid;
use crate::wire::grh::GrhRepr;
use crate::wire::ipoib::{
    ArpOp, IpoibArp, NeighborAdvertisement, NeighborSolicitation, ETHERTYPE_ARP, ETHERTYPE_IPV4,
    ETHERTYPE_IPV6,
};

/// The rogue's node index and UD QPN.
const ROGUE: usize = 2;
const ROGUE_QPN: u32 = 0x99;

fn rogue_gid() -> Gid {
    Gid::from(Ipv4Addr::new(198, 18, 0, 3))
}

fn rogue_hw() -> HwAddr {
    HwAddr::new(0x80, QpNum::new(ROGUE_QPN), rogue_gid())
}

/// Three nodes, the rogue (node 2) killed; node 0 and node 1 resolved each other and
/// connected (IPv4 and IPv6), their TUN output cleared.
fn lab(cfg: impl FnMut(usize, &mut EndpointConfig)) -> Net {
    let mut n = Net::new(3, |_, _| {}, cfg);
    n.kill(ROGUE);
    n.inject(0, &ping4(0, 1, 64));
    n.inject(0, &ping6(0, 1, 64));
    n.inject(1, &ping4(1, 0, 64));
    n.inject(1, &ping6(1, 0, 64));
    n.run(Duration::from_millis(200));
    assert_eq!(n.tun[1].len(), 2, "node 1 got node 0's pings");
    assert_eq!(n.tun[0].len(), 2, "node 0 got node 1's pings");
    n.tun.iter_mut().for_each(Vec::clear);
    n
}

/// Node 0 takes `payload` (after an IPoIB header of `ethertype`) from the UD QP, sent by
/// `from` (its GID in the GRH, its QPN in the completion).
fn ud_in(n: &mut Net, from: HwAddr, ethertype: u16, payload: &[u8]) {
    let mut f = vec![0u8; GRH_AREA];
    GrhRepr::rocev2_ud(from.gid.to_ip(), n_gid(n, 0).to_ip(), payload.len() + 4)
        .emit(&mut f[..GRH_AREA]);
    f.extend_from_slice(&IpoibHeader::new(ethertype).to_bytes());
    f.extend_from_slice(payload);
    let r = ud::UdRecv {
        len: f.len(),
        grh: true,
        slid: None,
        src_qp: Some(from.qpn),
        src_port: Some(4791),
    };
    let now = n.now();
    let Cluster { eps, f: fabric, .. } = &mut n.0;
    if let Some(ep) = eps[0].as_mut() {
        ep.on_ud_frame(now, &mut fabric.nodes[0], &f, r);
    }
}

fn n_gid(n: &mut Net, i: usize) -> Gid {
    n.ep(i).hwaddr().gid
}

/// Datagrams node `i`'s provider received so far.
fn datagrams_at(n: &Net, i: usize) -> u64 {
    n.f.nodes[i].stats().rx_datagrams
}

fn udp4(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .udp(5353, 7777)
        .write(&mut out, b"injected")
        .expect("udp4");
    out
}

fn echo6(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ipv6(src.octets(), dst.octets(), 64)
        .icmpv6_echo_request(1, 1)
        .write(&mut out, b"injected")
        .expect("echo6");
    out
}

fn arp(op: ArpOp, sender_ip: Ipv4Addr, sender_hw: HwAddr, target_ip: Ipv4Addr) -> Vec<u8> {
    IpoibArp {
        op,
        sender_hw,
        sender_ip,
        target_hw: n_hw0(),
        target_ip,
    }
    .to_bytes()
    .to_vec()
}

fn resolved(n: &mut Net, ip: IpAddr) -> Option<HwAddr> {
    n.ep(0).neigh.get(&ip).and_then(|e| e.resolved())
}

/// Point 1: an IP packet over UD reaches the TUN device only from the sender its source is
/// bound to; the rogue's, with the real peer's source, with an unbound one or with none,
/// are dropped and counted by reason. Before: all four delivered, no counter moved.
#[test]
fn ip_over_ud_needs_a_source_bound_to_its_sender() {
    let mut n = lab(|_, _| {});
    let peer = n.ep(1).hwaddr();
    let us = node_v4(0);
    // The real peer's source from the rogue.
    ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV4, &udp4(node_v4(1), us));
    // An unbound on-link source from the rogue.
    ud_in(
        &mut n,
        rogue_hw(),
        ETHERTYPE_IPV4,
        &udp4(Ipv4Addr::new(198, 19, 0, 77), us),
    );
    // The unspecified source to the broadcast address, from the rogue.
    ud_in(
        &mut n,
        rogue_hw(),
        ETHERTYPE_IPV4,
        &udp4(Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST),
    );
    // The peer's source from the peer's GID but another QP of its host.
    let other_qp = HwAddr::new(0, QpNum::new(peer.qpn.get() + 1), peer.gid);
    ud_in(&mut n, other_qp, ETHERTYPE_IPV4, &udp4(node_v4(1), us));
    n.run(Duration::from_millis(10));
    assert!(n.tun[0].is_empty(), "delivered: {}", n.tun[0].len());
    let c = n.ep(0).counters();
    assert_eq!(
        (
            c.rx_ud_spoofed_drops,
            c.rx_ud_unbound_drops,
            c.rx_ud_unknown_sender_drops
        ),
        (2, 1, 1),
        "{c:?}"
    );
    // The peer itself: its source, to us and to the broadcast address.
    let p = udp4(node_v4(1), us);
    ud_in(&mut n, peer, ETHERTYPE_IPV4, &p);
    let b = udp4(node_v4(1), Ipv4Addr::BROADCAST);
    ud_in(&mut n, peer, ETHERTYPE_IPV4, &b);
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[0], vec![p, b]);
}

/// Point 1, loose mode (routers): an off-link source is taken from a sender the node knows
/// (a bound neighbour, a `--peer`), not from the rogue; on-link sources stay strict.
#[test]
fn loose_mode_takes_off_link_sources_from_known_senders_only() {
    let mut n = lab(|_, c| c.ud_source_check = SourceCheck::Loose);
    let peer = n.ep(1).hwaddr();
    let us = node_v4(0);
    let routed = udp4(Ipv4Addr::new(198, 18, 200, 5), us);
    ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV4, &routed);
    ud_in(
        &mut n,
        rogue_hw(),
        ETHERTYPE_IPV4,
        &udp4(Ipv4Addr::new(198, 19, 0, 77), us),
    );
    ud_in(
        &mut n,
        peer,
        ETHERTYPE_IPV4,
        &udp4(Ipv4Addr::new(198, 19, 0, 77), us),
    );
    ud_in(&mut n, peer, ETHERTYPE_IPV4, &routed);
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[0], vec![routed.clone()]);
    let c = n.ep(0).counters();
    assert_eq!(
        (c.rx_ud_unknown_sender_drops, c.rx_ud_unbound_drops),
        (1, 2),
        "{c:?}"
    );
    // A --peer is known before any binding.
    n.ep(0).set_peers(&[rogue_gid()]);
    ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV4, &routed);
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[0].len(), 2);
}

/// Point 1: 3,000 echo requests from random sources of the /64, injected by the rogue, to a
/// host that answers whatever it is handed: nothing reaches it, so it answers nothing, and
/// node 0 resolves nothing and sends nothing. Before: all 3,000 delivered, the answers filled
/// the table with incomplete entries past the per-source cap and sent solicitations to every
/// peer.
#[test]
fn injected_echoes_make_the_node_resolve_nothing() {
    let mut n = lab(|_, c| c.neigh_max = 1024);
    let entries = n.ep(0).neigh.len();
    let (to_peer, to_rogue) = (datagrams_at(&n, 1), datagrams_at(&n, ROGUE));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..3000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let [a, b, c, d] = [
            seed as u16,
            (seed >> 16) as u16,
            (seed >> 32) as u16,
            (seed >> 48) as u16,
        ];
        let src = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, a, b, c, d | 0x100);
        ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV6, &echo6(src, node_v6(0)));
        // The host answers each echo it got.
        let got: Vec<Vec<u8>> = std::mem::take(&mut n.tun[0]);
        for p in got {
            let reply = echo6(
                node_v6(0),
                Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).unwrap()),
            );
            n.inject(0, &reply);
        }
        n.run(Duration::from_micros(200));
    }
    n.run(Duration::from_millis(500));
    let c = n.ep(0).counters();
    assert_eq!(c.rx_ud_unbound_drops, 3000, "{c:?}");
    assert_eq!(
        n.ep(0).neigh.len(),
        entries,
        "entries made for injected sources"
    );
    assert_eq!(
        (
            datagrams_at(&n, 1) - to_peer,
            datagrams_at(&n, ROGUE) - to_rogue
        ),
        (0, 0),
        "datagrams sent because of the injection"
    );
}

/// Point 2: a Neighbor Solicitation for node 0 whose source link-layer option names node 1
/// but that came from the rogue is neither answered nor learned (before: node 1 got an
/// advertisement per solicitation).
#[test]
fn nd_answers_go_only_to_their_sender() {
    let mut n = lab(|_, _| {});
    let peer = n.ep(1).hwaddr();
    let before = datagrams_at(&n, 1);
    for i in 0..20u16 {
        let mut ns = NeighborSolicitation::new(
            Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 9, i),
            peer,
            node_v6(0),
        );
        ns.dst = node_v6(0);
        ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV6, &ns.to_packet());
    }
    n.run(Duration::from_millis(10));
    assert_eq!(
        datagrams_at(&n, 1),
        before,
        "advertisements reflected to node 1"
    );
    assert_eq!(n.ep(0).counters().neigh_unvouched_drops, 20);
    assert!(resolved(
        &mut n,
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 9, 0))
    )
    .is_none());
}

/// Point 2: a duplicate address detection probe (from `::`, no source link-layer option)
/// draws one unicast advertisement to its sender, not a multicast one that the underlay
/// copies to every peer (before: one to each of them).
#[test]
fn a_dad_solicitation_draws_one_unicast_answer_to_its_sender() {
    let mut n = lab(|_, _| {});
    let (to_peer, to_rogue) = (datagrams_at(&n, 1), datagrams_at(&n, ROGUE));
    let dad = NeighborSolicitation::new(Ipv6Addr::UNSPECIFIED, rogue_hw(), node_v6(0));
    assert!(dad.source_hw.is_none());
    for _ in 0..10 {
        ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV6, &dad.to_packet());
    }
    n.run(Duration::from_millis(10));
    assert_eq!(
        (
            datagrams_at(&n, 1) - to_peer,
            datagrams_at(&n, ROGUE) - to_rogue
        ),
        (0, 10)
    );
}

/// Point 2: each sender's answers are budgeted: 100 ARP requests from the rogue draw
/// [`ANSWER_BURST`] replies at once, then [`ANSWER_RATE`] a second (before: 100).
#[test]
fn answers_stay_within_each_sender_s_budget() {
    let mut n = lab(|_, _| {});
    let to_rogue = datagrams_at(&n, ROGUE);
    let req = arp(
        ArpOp::Request,
        Ipv4Addr::new(198, 19, 0, 3),
        rogue_hw(),
        node_v4(0),
    );
    for _ in 0..100 {
        ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &req);
    }
    n.run(Duration::from_millis(10));
    assert_eq!(datagrams_at(&n, ROGUE) - to_rogue, u64::from(ANSWER_BURST));
    assert_eq!(
        n.ep(0).counters().neigh_answer_budget_drops,
        100 - u64::from(ANSWER_BURST)
    );
    n.run(Duration::from_secs(1));
    for _ in 0..100 {
        ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &req);
    }
    n.run(Duration::from_millis(10));
    let answered = datagrams_at(&n, ROGUE) - to_rogue - u64::from(ANSWER_BURST);
    assert!(
        (u64::from(ANSWER_RATE)..=u64::from(ANSWER_RATE) + 1).contains(&answered),
        "{answered}"
    );
}

/// Point 2, the bound: whatever the rogue sends (forged solicitations, DAD probes, ARP
/// requests naming others, injected IP, unsolicited advertisements, claims of node 1's
/// addresses), node 0 sends at most one datagram per datagram in towards any address but
/// the rogue's; measured: towards node 1, the probes of its contested bindings, one a second.
#[test]
fn no_datagram_in_draws_more_than_one_out_towards_others() {
    let mut n = lab(|_, _| {});
    let peer = n.ep(1).hwaddr();
    let (to_peer, to_rogue) = (datagrams_at(&n, 1), datagrams_at(&n, ROGUE));
    let mut sent = 0u64;
    let dad = NeighborSolicitation::new(Ipv6Addr::UNSPECIFIED, rogue_hw(), node_v6(0)).to_packet();
    let mut reflect = NeighborSolicitation::new(node_v6(5), peer, node_v6(0));
    reflect.dst = node_v6(0);
    let reflect = reflect.to_packet();
    let claim4 = arp(ArpOp::Request, node_v4(1), rogue_hw(), node_v4(0));
    let claim6 = NeighborSolicitation::new(node_v6(1), rogue_hw(), node_v6(0)).to_packet();
    let unsolicited = NeighborAdvertisement {
        src: node_v6(7),
        dst: node_v6(0),
        target: node_v6(7),
        router: false,
        solicited: true,
        override_flag: true,
        target_hw: Some(rogue_hw()),
    }
    .to_packet();
    let foreign_arp = arp(ArpOp::Request, node_v4(6), peer, node_v4(0));
    let inject = udp4(node_v4(1), node_v4(0));
    for round in 0..200 {
        for (ethertype, p) in [
            (ETHERTYPE_IPV6, &dad),
            (ETHERTYPE_IPV6, &reflect),
            (ETHERTYPE_ARP, &claim4),
            (ETHERTYPE_IPV6, &claim6),
            (ETHERTYPE_IPV6, &unsolicited),
            (ETHERTYPE_ARP, &foreign_arp),
            (ETHERTYPE_IPV4, &inject),
        ] {
            ud_in(&mut n, rogue_hw(), ethertype, p);
            sent += 1;
        }
        if round % 10 == 0 {
            n.run(Duration::from_millis(100));
        }
    }
    n.run(Duration::from_secs(1));
    let others = datagrams_at(&n, 1) - to_peer;
    let rogue = datagrams_at(&n, ROGUE) - to_rogue;
    println!("{sent} datagrams in: {others} out to node 1, {rogue} to the rogue");
    assert!(others <= sent / 20, "{others} towards node 1 for {sent} in");
    assert!(
        others + rogue <= sent,
        "{others} + {rogue} out for {sent} in"
    );
    assert!(n.tun[0].is_empty());
    // Node 1's bindings held: it answered every probe.
    assert_eq!(resolved(&mut n, IpAddr::V4(node_v4(1))), Some(peer));
    assert_eq!(resolved(&mut n, IpAddr::V6(node_v6(1))), Some(peer));
}

/// Point 3: unsolicited answers (a Neighbor Advertisement with S=1, or without, an ARP reply)
/// for addresses node 0 is not resolving bind nothing (RFC 4861 §7.2.5); before: the NA
/// with S=1 and the ARP reply created the entries.
#[test]
fn unsolicited_answers_bind_nothing() {
    let mut n = lab(|_, _| {});
    for solicited in [true, false] {
        let na = NeighborAdvertisement {
            src: node_v6(2),
            dst: node_v6(0),
            target: node_v6(2),
            router: false,
            solicited,
            override_flag: true,
            target_hw: Some(rogue_hw()),
        };
        ud_in(&mut n, rogue_hw(), ETHERTYPE_IPV6, &na.to_packet());
    }
    ud_in(
        &mut n,
        rogue_hw(),
        ETHERTYPE_ARP,
        &arp(ArpOp::Reply, node_v4(2), rogue_hw(), node_v4(0)),
    );
    n.run(Duration::from_millis(10));
    assert_eq!(resolved(&mut n, IpAddr::V6(node_v6(2))), None);
    assert_eq!(resolved(&mut n, IpAddr::V4(node_v4(2))), None);
    assert_eq!(n.ep(0).counters().neigh_unsolicited_drops, 3);
}

/// Point 3: claims of a bound address by another node probe the binding (unicast, at most
/// one a second); while its node answers it stays, whatever the rate of claims.
#[test]
fn a_contested_binding_stays_while_its_node_answers_probes() {
    let mut n = lab(|_, _| {});
    let peer = n.ep(1).hwaddr();
    let claim = arp(ArpOp::Request, node_v4(1), rogue_hw(), node_v4(0));
    for _ in 0..1000 {
        ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &claim);
        n.run(Duration::from_millis(10));
    }
    let c = n.ep(0).counters();
    assert_eq!(resolved(&mut n, IpAddr::V4(node_v4(1))), Some(peer));
    assert!((9..=11).contains(&c.neigh_probes), "{c:?}");
    assert_eq!(c.neigh_bindings_failed, 0, "{c:?}");
    n.inject(0, &ping4(0, 1, 64));
    n.run(Duration::from_millis(10));
    assert_eq!(n.tun[1].len(), 1);
}

/// Point 3: a binding whose node stopped answering is replaced by the next claim only
/// after [`PROBES`](super::neigh::PROBES) unanswered probes, a second apart (Linux's NUD
/// and `locktime`): an address that moved to another node is learned again, in about 3 s.
/// Before: never, while the old binding was in use.
#[test]
fn a_binding_that_fails_its_probes_is_taken_by_the_next_claim() {
    let mut n = lab(|_, _| {});
    n.kill(1);
    let claim = arp(ArpOp::Request, node_v4(1), rogue_hw(), node_v4(0));
    let start = n.now();
    let mut taken = None;
    for _ in 0..100 {
        ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &claim);
        n.run(Duration::from_millis(100));
        if resolved(&mut n, IpAddr::V4(node_v4(1))) == Some(rogue_hw()) {
            taken = Some(n.now() - start);
            break;
        }
    }
    let taken = taken.expect("never rebound");
    println!("rebound after {taken:?}");
    assert!(
        taken >= Duration::from_secs(3) && taken <= Duration::from_secs(5),
        "{taken:?}"
    );
    let c = n.ep(0).counters();
    assert_eq!((c.neigh_probes, c.neigh_bindings_failed), (3, 1), "{c:?}");
}

/// Point 3: with `pin_peer_neighbours`, an address bound to a `--peer` is never taken by a
/// node that is not one, even after the peer stopped answering.
#[test]
fn a_binding_to_a_pinned_peer_is_not_taken_by_others() {
    let mut n = lab(|_, c| c.pin_peer_neighbours = true);
    let peer = n.ep(1).hwaddr();
    n.ep(0).set_peers(&[peer.gid]);
    n.kill(1);
    let claim = arp(ArpOp::Request, node_v4(1), rogue_hw(), node_v4(0));
    for _ in 0..100 {
        ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &claim);
        n.run(Duration::from_millis(100));
    }
    assert_eq!(resolved(&mut n, IpAddr::V4(node_v4(1))), Some(peer));
    let c = n.ep(0).counters();
    assert_eq!((c.neigh_probes, c.neigh_conflicts), (0, 100), "{c:?}");
}

/// Point 3, the window a rogue gets: it claims node 1's IPv4 address before node 0 knows
/// it, and claims it again every 5 ms. Node 0's pings go to the rogue until that connection
/// fails; then the address is resolved again without the rogue, node 1 answers, and the
/// rogue's later claims only probe node 1. Before: every ping lost (the rogue took the
/// address back within 5 ms of each failure).
#[test]
fn a_rogue_that_claimed_an_address_first_loses_it_at_its_first_failure() {
    let mut n = Net::new(3, |_, _| {}, |_, _| {});
    n.kill(ROGUE);
    let claim = arp(ArpOp::Request, node_v4(1), rogue_hw(), node_v4(0));
    ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &claim);
    n.run(Duration::from_millis(5));
    assert_eq!(resolved(&mut n, IpAddr::V4(node_v4(1))), Some(rogue_hw()));
    let start = n.now();
    let mut first = None;
    let pings = 200;
    for i in 0..pings * 20 {
        if i % 20 == 0 {
            n.inject(0, &ping4(0, 1, 64));
        }
        ud_in(&mut n, rogue_hw(), ETHERTYPE_ARP, &claim);
        n.run(Duration::from_millis(5));
        if first.is_none() && !n.tun[1].is_empty() {
            first = Some(n.now() - start);
        }
    }
    let got = n.tun[1].len();
    let c = n.ep(0).counters();
    println!(
        "pings {got}/{pings}; first through after {first:?}; bindings failed {}, conflicts {}, probes {}",
        c.neigh_bindings_failed, c.neigh_conflicts, c.neigh_probes
    );
    let first = first.expect("no ping got through");
    assert!(first < Duration::from_secs(10), "{first:?}");
    assert!(got * 10 >= pings * 7, "{got}/{pings}");
    assert_eq!(
        resolved(&mut n, IpAddr::V4(node_v4(1))),
        Some(n.ep(1).hwaddr())
    );
}
