//! Groups held through an SA client ([`Endpoint::use_sa_groups`]): nothing over UD before the
//! broadcast join, the broadcast record's Q_Key and MTU applied, attachment with the MLID,
//! send-only joins before the first send to a group, port events, leaves; and without an SA
//! nothing of it (today's RoCE and soft behaviour).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use etherparse::PacketBuilder;

use super::*;
use crate::sa::GroupParams;
use crate::soft::{SoftConfig, SoftVerbs};
use crate::verbs::{Gid, PathMtu, QKey};
use crate::wire::ipoib::{broadcast_mgid, mgid_for_ipv6};
use crate::wire::sa::PathRecord;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn setup(sa: bool) -> (SoftVerbs, Endpoint) {
    let mut v = SoftVerbs::new(SoftConfig::new(ip("198.18.0.1")));
    let mut cfg = EndpointConfig::new(vec![(ip("198.19.0.1"), 24), (ip("2001:db8:19::1"), 64)]);
    cfg.path_mtu = PathMtu::Mtu4096;
    let mut ep = Endpoint::new(Instant::now(), &mut v, cfg, None).unwrap();
    if sa {
        ep.use_sa_groups(&mut v);
    }
    (v, ep)
}

fn udp4_to(dst: Ipv4Addr) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv4([198, 19, 0, 1], dst.octets(), 1)
        .udp(9, 9)
        .write(&mut out, &[1, 2, 3, 4])
        .unwrap();
    out
}

fn udp6_to(dst: Ipv6Addr) -> Vec<u8> {
    let mut out = Vec::new();
    let src: Ipv6Addr = "2001:db8:19::1".parse().unwrap();
    PacketBuilder::ipv6(src.octets(), dst.octets(), 1)
        .udp(9, 9)
        .write(&mut out, &[1, 2, 3, 4])
        .unwrap();
    out
}

fn params(mlid: u16, qkey: u32, mtu: PathMtu) -> GroupParams {
    GroupParams {
        mlid,
        qkey,
        mtu: Some(mtu),
        sl: 3,
        rate: 6,
        tclass: 0,
        flow_label: 0,
        hop_limit: 0,
    }
}

/// An SA-held endpoint whose broadcast join was answered (MLID 0xC000, MTU 2048), its
/// requests taken.
fn joined() -> (SoftVerbs, Endpoint) {
    let (mut v, mut ep) = setup(true);
    requests(&mut ep);
    ep.set_group_joined(&mut v, bcast(), params(0xC000, 0x0B1B, PathMtu::Mtu2048));
    (v, ep)
}

fn requests(ep: &mut Endpoint) -> Vec<SaRequest> {
    std::iter::from_fn(|| ep.poll_sa_request()).collect()
}

fn bcast() -> Gid {
    broadcast_mgid(0xffff)
}

#[test]
fn without_an_sa_multicast_goes_out_at_once_as_today() {
    let (mut v, mut ep) = setup(false);
    let now = Instant::now();
    ep.handle_tun_packet(now, &mut v, &udp4_to(Ipv4Addr::new(224, 0, 0, 1)));
    assert_eq!(ep.counters().tx_packets, 1);
    assert_eq!(ep.counters().tx_dropped, 0);
    assert!(requests(&mut ep).is_empty());
    assert_eq!(ep.broadcast_group(), None);
    assert_eq!(ep.ud_mtu(), 4092);
    assert_eq!(ep.config().qkey, QKey(0x0B1B));
}

#[test]
fn with_an_sa_nothing_goes_out_over_ud_before_the_broadcast_join() {
    let (mut v, mut ep) = setup(true);
    let now = Instant::now();
    // Full-member joins of the groups set-up would have attached, broadcast first.
    let all_nodes = mgid_for_ipv6("ff02::1".parse().unwrap(), 0xffff);
    let solicited = mgid_for_ipv6("ff02::1:ff00:1".parse().unwrap(), 0xffff);
    assert_eq!(
        requests(&mut ep),
        [bcast(), all_nodes, solicited].map(|mgid| SaRequest::Join {
            mgid,
            send_only: false
        })
    );
    assert_eq!(ep.attached_mlid(bcast()), None);
    // IP multicast, and the ARP request a unicast packet needs, are held back.
    ep.handle_tun_packet(now, &mut v, &udp4_to(Ipv4Addr::new(224, 0, 0, 1)));
    ep.handle_tun_packet(now, &mut v, &udp4_to(Ipv4Addr::new(198, 19, 0, 2)));
    assert_eq!(ep.counters().tx_packets, 0);
    assert_eq!(ep.counters().tx_dropped, 2, "{:?}", ep.counters());
    // The broadcast group's record: Q_Key and MTU taken, attached with its MLID.
    ep.set_group_joined(
        &mut v,
        bcast(),
        params(0xC000, 0x1234_5678, PathMtu::Mtu2048),
    );
    assert_eq!(ep.attached_mlid(bcast()), Some(0xC000));
    assert_eq!(ep.config().qkey, QKey(0x1234_5678));
    assert_eq!(ep.ud_mtu(), 2044);
    assert_eq!(ep.broadcast_group().map(|b| b.sl), Some(3));
    // Sends to the group are addressed by its MLID, with a GRH to the MGID.
    let av = ep.av_to(bcast());
    assert_eq!(av.dlid, crate::verbs::Lid(0xC000));
    assert_eq!(av.sl.get(), 3);
    assert_eq!(av.dgid(), Some(bcast()));
    ep.handle_tun_packet(now, &mut v, &udp4_to(Ipv4Addr::new(224, 0, 0, 1)));
    assert_eq!(ep.counters().tx_packets, 1);
    // A packet over the broadcast group's MTU is dropped, not sent.
    let mut big = Vec::new();
    PacketBuilder::ipv4([198, 19, 0, 1], [224, 0, 0, 1], 1)
        .udp(9, 9)
        .write(&mut big, &[0u8; 3000])
        .unwrap();
    ep.handle_tun_packet(now, &mut v, &big);
    assert_eq!(ep.counters().tx_packets, 1);
}

#[test]
fn datagram_mode_takes_the_interface_mtu_from_the_broadcast_group() {
    let mut v = SoftVerbs::new(SoftConfig::new(ip("198.18.0.1")));
    let mut cfg = EndpointConfig::new(vec![(ip("198.19.0.1"), 24)]);
    cfg.path_mtu = PathMtu::Mtu4096;
    cfg.mode = Mode::Datagram;
    let mut ep = Endpoint::new(Instant::now(), &mut v, cfg, None).unwrap();
    ep.use_sa_groups(&mut v);
    assert_eq!(ep.interface_mtu(), 4092);
    ep.set_group_joined(&mut v, bcast(), params(0xC000, 0x0B1B, PathMtu::Mtu2048));
    assert_eq!(ep.interface_mtu(), 2044);
}

#[test]
fn a_group_only_sent_to_gets_a_send_only_join_before_its_first_send() {
    let (mut v, mut ep) = joined();
    let now = Instant::now();
    let group: Ipv6Addr = "ff0e::1:2".parse().unwrap();
    let mgid = mgid_for_ipv6(group, 0xffff);
    ep.handle_tun_packet(now, &mut v, &udp6_to(group));
    ep.handle_tun_packet(now, &mut v, &udp6_to(group));
    // One join, send-only; both packets held back until it is answered.
    assert_eq!(
        requests(&mut ep),
        [SaRequest::Join {
            mgid,
            send_only: true
        }]
    );
    assert_eq!(ep.counters().tx_packets, 0);
    ep.set_group_joined(&mut v, mgid, params(0xC005, 0x0B1B, PathMtu::Mtu2048));
    // Sent to, never attached (a send-only member receives nothing).
    assert_eq!(ep.attached_mlid(mgid), None);
    ep.handle_tun_packet(now, &mut v, &udp6_to(group));
    assert_eq!(ep.counters().tx_packets, 1);
    // A record for a group never asked for is ignored.
    let other = mgid_for_ipv6("ff0e::9".parse().unwrap(), 0xffff);
    ep.set_group_joined(&mut v, other, params(0xC006, 0x0B1B, PathMtu::Mtu2048));
    assert_eq!(ep.group(other), None);
}

#[test]
fn send_only_joins_are_capped() {
    let (mut v, mut ep) = joined();
    let now = Instant::now();
    for i in 0..(MAX_SEND_ONLY as u16 + 10) {
        let g = Ipv6Addr::new(0xff0e, 0, 0, 0, 0, 0, 1, i);
        ep.handle_tun_packet(now, &mut v, &udp6_to(g));
    }
    assert_eq!(requests(&mut ep).len(), MAX_SEND_ONLY);
}

#[test]
fn a_port_event_detaches_everything_and_the_rejoin_reattaches_with_the_new_mlid() {
    let (mut v, mut ep) = joined();
    let now = Instant::now();
    v.raise_port_event(crate::verbs::AsyncEvent::ClientReregister);
    ep.handle_verbs(now, &mut v);
    assert_eq!(
        requests(&mut ep),
        [SaRequest::Port(PortChange::ClientReregister)]
    );
    assert_eq!(ep.attached_mlid(bcast()), None);
    assert_eq!(ep.broadcast_group(), None);
    // Held back again until the rejoin is answered.
    ep.handle_tun_packet(now, &mut v, &udp4_to(Ipv4Addr::new(224, 0, 0, 1)));
    assert_eq!(ep.counters().tx_packets, 0);
    ep.set_group_joined(&mut v, bcast(), params(0xC010, 0x0B1B, PathMtu::Mtu2048));
    assert_eq!(ep.attached_mlid(bcast()), Some(0xC010));
    // Without an SA the same event changes nothing.
    let (mut v, mut plain) = setup(false);
    v.raise_port_event(crate::verbs::AsyncEvent::ClientReregister);
    plain.handle_verbs(now, &mut v);
    assert!(requests(&mut plain).is_empty());
}

#[test]
fn paths_are_asked_for_once_and_kept_for_the_endpoint() {
    let (mut v, mut ep) = setup(true);
    let now = Instant::now();
    requests(&mut ep);
    let peer = Gid::from_ip(ip("fe80::10:7"));
    ep.want_path(peer);
    ep.want_path(peer);
    assert_eq!(requests(&mut ep), [SaRequest::Path { dgid: peer }]);
    let path = PathRecord {
        dlid: 5,
        slid: 4,
        ..PathRecord::default()
    };
    ep.set_sa_path(now, &mut v, peer, &path);
    assert_eq!(ep.path(peer).map(|p| p.dlid), Some(crate::verbs::Lid(5)));
    // An answer nobody asked for is not kept.
    let stranger = Gid::from_ip(ip("fe80::10:9"));
    ep.set_sa_path(now, &mut v, stranger, &path);
    assert_eq!(ep.path(stranger), None);
}

#[test]
fn leaving_asks_for_every_group_joined_or_asked_for() {
    let (mut v, mut ep) = joined();
    let now = Instant::now();
    let group: Ipv6Addr = "ff0e::1:2".parse().unwrap();
    ep.handle_tun_packet(now, &mut v, &udp6_to(group));
    requests(&mut ep);
    ep.leave_groups(&mut v);
    let leaves = requests(&mut ep);
    assert_eq!(leaves.len(), 4, "{leaves:?}");
    assert!(leaves.contains(&SaRequest::Leave { mgid: bcast() }));
    assert!(leaves.contains(&SaRequest::Leave {
        mgid: mgid_for_ipv6(group, 0xffff)
    }));
    assert_eq!(ep.attached_mlid(bcast()), None);
}
