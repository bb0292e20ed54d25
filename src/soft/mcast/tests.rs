use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::{group_addr, Multicast, DUPLICATE_MEMORY, DUPLICATE_WINDOW};
use crate::verbs::{Gid, QpNum};
use crate::wire::ipoib::{broadcast_mgid, mgid_for_ipv4, mgid_for_ipv6};

const V4: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
const V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn gid(s: &str) -> Gid {
    Gid(s.parse::<Ipv6Addr>().unwrap().octets())
}

#[test]
fn ipv4_mapped_mgid_is_its_ipv4_group() {
    // rdma_gid2ip: ::ffff:a.b.c.d is a.b.c.d (rdma_cm's RoCEv2 IPv4 groups).
    let g = gid("::ffff:239.1.2.3");
    assert_eq!(group_addr(g, V4), Some(ip("239.1.2.3")));
    assert_eq!(group_addr(g, V6), None, "an IPv4 group has no IPv6 form");
    // A mapped unicast address is no group.
    assert_eq!(group_addr(gid("::ffff:198.18.0.9"), V4), None);
    assert_eq!(
        group_addr(Gid::from_ip(ip("224.0.0.251")), V4),
        Some(ip("224.0.0.251"))
    );
}

#[test]
fn ipoib_broadcast_mgid() {
    let b = broadcast_mgid(0xffff);
    assert_eq!(b, gid("ff12:401b:ffff::ffff:ffff"));
    // IPv6 underlay: the MGID itself, as rxe sends it.
    assert_eq!(group_addr(b, V6), Some(ip("ff12:401b:ffff::ffff:ffff")));
    // IPv4 underlay: 239.255.<P_Key>.
    assert_eq!(group_addr(b, V4), Some(ip("239.255.255.255")));
    assert_eq!(
        group_addr(broadcast_mgid(0x8001), V4),
        Some(ip("239.255.128.1"))
    );
    assert_eq!(
        group_addr(broadcast_mgid(0x8001), V6),
        Some(ip("ff12:401b:8001::ffff:ffff"))
    );
}

#[test]
fn ipv6_all_nodes_and_solicited_node_mgids() {
    let all = mgid_for_ipv6("ff02::1".parse().unwrap(), 0xffff);
    assert_eq!(all, gid("ff12:601b:ffff::1"));
    assert_eq!(group_addr(all, V6), Some(ip("ff12:601b:ffff::1")));
    assert_eq!(group_addr(all, V4), Some(ip("239.255.255.255")));
    let sn = mgid_for_ipv6("ff02::1:ff00:2".parse().unwrap(), 0xffff);
    assert_eq!(group_addr(sn, V6), Some(ip("ff12:601b:ffff::1:ff00:2")));
    // One IPv4 group per partition: the solicited-node group shares the broadcast one.
    assert_eq!(group_addr(sn, V4), group_addr(broadcast_mgid(0xffff), V4));
    // IPoIB's IPv4 multicast MGIDs are not IPv4-mapped either.
    let mdns = mgid_for_ipv4(Ipv4Addr::new(224, 0, 0, 251), 0xffff);
    assert_eq!(group_addr(mdns, V4), Some(ip("239.255.255.255")));
}

#[test]
fn non_multicast_gid_has_no_group() {
    assert_eq!(group_addr(Gid::from_ip(V6), V6), None);
    assert_eq!(group_addr(gid("fe80::1"), V4), None);
}

#[test]
fn members_by_group_address() {
    let mut m = Multicast::default();
    let (a, b) = (QpNum::new(0x11), QpNum::new(0x12));
    let bcast = broadcast_mgid(0xffff);
    let other = broadcast_mgid(0x8001);
    let g0 = m.generation();
    m.attach(a, bcast, 0);
    m.attach(b, other, 0);
    m.attach(b, bcast, 0);
    assert_ne!(m.generation(), g0);
    assert_eq!(
        m.ip_groups(V4),
        vec![ip("239.255.128.1"), ip("239.255.255.255")]
    );
    assert_eq!(m.members_for(ip("239.255.255.255"), V4), vec![a, b]);
    assert_eq!(m.members_for(ip("239.255.128.1"), V4), vec![b]);
    assert_eq!(m.members_for(ip("239.1.1.1"), V4), vec![]);
    // A unicast fan-out copy does not say its group: every member.
    assert_eq!(m.members_for(V4, V4), vec![a, b]);
    assert_eq!(m.members_for(ip("ff12:401b:8001::ffff:ffff"), V6), vec![b]);
    let g1 = m.generation();
    m.forget(b);
    assert_ne!(m.generation(), g1, "group `other` is gone");
    assert_eq!(m.ip_groups(V4), vec![ip("239.255.255.255")]);
    let g2 = m.generation();
    m.attach(b, bcast, 0);
    assert_eq!(m.generation(), g2, "no new group");
}

#[test]
fn second_copy_is_dropped_within_the_window() {
    let mut m = Multicast::default();
    let t = Instant::now();
    let src = ip("198.18.0.2");
    assert!(m.first_copy(t, src, 0x11, 7));
    assert!(!m.first_copy(t + Duration::from_millis(5), src, 0x11, 7));
    assert!(m.first_copy(t, src, 0x11, 8), "next PSN");
    assert!(m.first_copy(t, src, 0x12, 7), "other QP");
    assert!(m.first_copy(t, ip("198.18.0.3"), 0x11, 7), "other sender");
    // After the window the same key is new again (a restarted sender).
    let later = t + DUPLICATE_WINDOW + Duration::from_millis(1);
    assert!(m.first_copy(later, src, 0x11, 7));
    // The memory is bounded: the oldest key is forgotten.
    for psn in 100..100 + DUPLICATE_MEMORY as u32 {
        assert!(m.first_copy(later, src, 0x11, psn));
    }
    assert!(m.recent.len() <= DUPLICATE_MEMORY);
    assert!(
        m.first_copy(later, src, 0x11, 7),
        "pushed out by newer ones"
    );
}
