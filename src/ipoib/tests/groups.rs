//! The UD QP's multicast groups: which it attaches for the interface's addresses, the IP
//! multicast groups they cross an IPv4 and an IPv6 underlay as, and their release at the end.

use super::*;
use crate::verbs::PKey;
use crate::wire::ipoib::{broadcast_mgid, mgid_for_ipv6, HwAddr};
use std::net::{IpAddr, Ipv6Addr};

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn broadcast_then_all_nodes_then_each_solicited_node_group_once() {
    let mut cfg = EndpointConfig::new(vec![
        (ip("198.19.0.1"), 24),
        (ip("2001:db8:19::1"), 64),
        (ip("fe80::2:c903:a:bcde"), 64),
        // The same low 24 bits as the first: the same solicited-node group.
        (ip("2001:db8:77::1"), 64),
    ]);
    cfg.pkey = PKey(0x8001);
    let groups: Vec<String> = ud::ud_groups(&cfg)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        groups,
        [
            "ff12:401b:8001::ffff:ffff",
            "ff12:601b:8001::1",
            "ff12:601b:8001::1:ff00:1",
            "ff12:601b:8001::1:ff0a:bcde",
        ]
    );
    // A limited member joins the same groups: the MGIDs carry the full-member bit.
    cfg.pkey = PKey(0x0001);
    let limited: Vec<String> = ud::ud_groups(&cfg)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(limited, groups);
    let v4_only = EndpointConfig::new(vec![(ip("198.19.0.1"), 24)]);
    assert_eq!(ud::ud_groups(&v4_only), [broadcast_mgid(0xffff)]);
}

#[test]
fn the_broadcast_address_carries_the_partition_with_the_full_member_bit() {
    let mut cfg = EndpointConfig::new(vec![(ip("198.19.0.1"), 24)]);
    assert_eq!(cfg.broadcast_hwaddr(), HwAddr::BROADCAST);
    for pkey in [0x8001, 0x0001] {
        cfg.pkey = PKey(pkey);
        assert_eq!(
            cfg.broadcast_hwaddr().to_string(),
            "00:ff:ff:ff:ff:12:40:1b:80:01:00:00:00:00:00:00:ff:ff:ff:ff"
        );
        assert_eq!(cfg.mgid_pkey(), 0x8001);
    }
    cfg.pkey = PKey(0x7FFF);
    assert_eq!(cfg.broadcast_hwaddr(), HwAddr::BROADCAST);
}

/// A node whose provider has an IPv6 underlay and IP multicast on.
fn ipv6_underlay(n: usize) -> Net {
    Net::new(
        n,
        |i, c| {
            c.local_ip = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, i as u16 + 1));
            c.multicast = true;
        },
        |_, _| {},
    )
}

#[test]
fn on_an_ipv6_underlay_each_group_is_its_own_ip_group_and_leaving_closes_them() {
    let mut n = ipv6_underlay(1);
    let want: Vec<IpAddr> = [
        broadcast_mgid(0xffff),
        mgid_for_ipv6(v6("ff02::1"), 0xffff),
        mgid_for_ipv6(v6("ff02::1:ff00:1"), 0xffff),
    ]
    .iter()
    .map(|g| IpAddr::V6(Ipv6Addr::from(g.0)))
    .collect();
    let mut sorted = want.clone();
    sorted.sort_unstable();
    assert_eq!(n.f.nodes[0].ip_multicast_groups(), sorted);
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    let generation = v.multicast_generation();
    ep.leave_groups(v);
    assert!(v.ip_multicast_groups().is_empty());
    assert_ne!(v.multicast_generation(), generation);
    let generation = v.multicast_generation();
    ep.leave_groups(v);
    assert_eq!(v.multicast_generation(), generation, "left once only");
}

#[test]
fn on_an_ipv4_underlay_every_group_shares_the_partition_s_ip_group() {
    let mut n = Net::new(1, |_, c| c.multicast = true, |_, _| {});
    assert_eq!(n.f.nodes[0].ip_multicast_groups(), [ip("239.255.255.255")]);
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().unwrap(), &mut c.f.nodes[0]);
    ep.leave_groups(v);
    assert!(v.ip_multicast_groups().is_empty());
}

#[test]
fn full_and_limited_members_of_a_partition_share_its_ip_group() {
    // 239.255.<P_Key with the full-member bit>: a limited member 0x0001 joins 239.255.128.1
    // as the full members of 0x8001 do, not 239.255.0.1.
    for pkey in [0x8001, 0x0001] {
        let n = Net::new(
            1,
            |_, c| {
                c.multicast = true;
                c.pkey = PKey(pkey);
            },
            |_, c| c.pkey = PKey(pkey),
        );
        assert_eq!(
            n.f.nodes[0].ip_multicast_groups(),
            [ip("239.255.128.1")],
            "{pkey:#06x}"
        );
    }
}
