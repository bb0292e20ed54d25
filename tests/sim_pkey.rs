//! Partitions on the simulated fabric: each node's provider carries one P_Key (its P_Key
//! table) and its endpoint the same `pkey`. Nodes of one partition resolve and connect; a node
//! of another partition neither resolves nor connects, its packets dropped and counted
//! (`rx_bad_pkey`); a limited member talks to a full member of its partition but not to
//! another limited one.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipoib_cm::sim::cluster::{node_v4, ping4, Cluster};
use ipoib_cm::verbs::{Gid, PKey, VerbsError};
use ipoib_cm::wire::ipoib::HwAddr;

/// A cluster whose node `i` is in partition `pkeys[i]` (provider and endpoint), with the
/// static neighbours `statics[i]`.
fn cluster(pkeys: &[u16], statics: &[Vec<(IpAddr, HwAddr)>]) -> Cluster {
    Cluster::new(
        pkeys.len(),
        Instant::now(),
        |i, s| s.pkey = PKey(pkeys[i]),
        |i, c| {
            c.pkey = PKey(pkeys[i]);
            if let Some(s) = statics.get(i) {
                c.static_neighbours.clone_from(s);
            }
        },
    )
    .expect("cluster")
}

/// Whether node `to`'s TUN device received the ping from `from`.
fn got_ping(cl: &Cluster, from: usize, to: usize) -> bool {
    let want = ping4(from, to, 100);
    cl.tun[to].contains(&want)
}

/// Node `from` pings `to` and the fabric runs for a while.
fn ping(cl: &mut Cluster, from: usize, to: usize) {
    cl.inject(from, &ping4(from, to, 100));
    cl.run(Duration::from_millis(500));
    // Again, once resolved (the first packet may wait for the address).
    cl.inject(from, &ping4(from, to, 100));
    cl.run(Duration::from_millis(500));
}

/// Whether node `i` has resolved node `j`'s IPv4 address.
fn resolved(cl: &mut Cluster, i: usize, j: usize) -> bool {
    let now = cl.now();
    let ep = cl.ep(i).expect("up");
    ep.snapshot(now)
        .neighbours
        .iter()
        .any(|(ip, hw, _)| *ip == IpAddr::V4(node_v4(j)) && hw.is_some())
}

fn bad_pkey(cl: &Cluster, i: usize) -> u64 {
    cl.f.nodes[i].stats().rx_bad_pkey
}

#[test]
fn a_partition_talks_within_itself_and_drops_the_other() {
    let mut cl = cluster(&[0x8001, 0x8001, 0x8002], &[]);
    ping(&mut cl, 0, 1);
    assert!(got_ping(&cl, 0, 1), "0x8001 -> 0x8001 delivered");
    assert!(resolved(&mut cl, 0, 1));
    assert!(cl.ep(0).unwrap().tx_count() >= 1, "0 connected to 1");
    // The broadcast carries the partition with the full-member bit.
    assert_eq!(
        cl.ep(0).unwrap().config().broadcast_hwaddr().to_string(),
        "00:ff:ff:ff:ff:12:40:1b:80:01:00:00:00:00:00:00:ff:ff:ff:ff"
    );

    let before = (bad_pkey(&cl, 0), bad_pkey(&cl, 1));
    ping(&mut cl, 2, 0);
    assert!(!got_ping(&cl, 2, 0), "0x8002 -> 0x8001 dropped");
    assert!(!resolved(&mut cl, 2, 0), "0x8002 resolved a 0x8001 node");
    assert_eq!(cl.ep(2).unwrap().tx_count(), 0);
    assert_eq!(cl.ep(0).unwrap().rx_count(), 0, "no RX connection from 2");
    assert!(bad_pkey(&cl, 0) > before.0, "node 0 counted 2's ARP");
    assert!(bad_pkey(&cl, 1) > before.1, "node 1 counted 2's ARP");
    // 0 and 1 heard 2's broadcast only as dropped packets: 2 is not their neighbour.
    assert!(!resolved(&mut cl, 0, 2) && !resolved(&mut cl, 1, 2));
    // And 2 never heard the broadcasts of 0 and 1.
    assert!(bad_pkey(&cl, 2) > 0, "node 2 counted 0's ARP");
}

/// With the address given (a static neighbour), a node of another partition still cannot
/// connect: its CM REQs on QP1 and its datagrams are dropped and counted.
#[test]
fn another_partition_cannot_connect_even_knowing_the_address() {
    // The hardware address node 0 will have: the cluster is deterministic.
    let probe = cluster(&[0x8001], &[]);
    let hw0 = probe.eps[0].as_ref().unwrap().hwaddr();
    assert_eq!(hw0.gid, Gid::from_ip(IpAddr::from([198, 18, 0, 1])));
    let statics = vec![Vec::new(), vec![(IpAddr::V4(node_v4(0)), hw0)]];
    let mut cl = cluster(&[0x8001, 0x8002], &statics);
    assert_eq!(cl.ep(0).unwrap().hwaddr(), hw0);
    let before = bad_pkey(&cl, 0);
    ping(&mut cl, 1, 0);
    assert!(!got_ping(&cl, 1, 0), "0x8002 -> 0x8001 delivered");
    assert_eq!(
        cl.ep(0).unwrap().rx_count(),
        0,
        "node 0 accepted a connection"
    );
    assert_eq!(
        cl.ep(0).unwrap().cm_stats().mads_received,
        0,
        "node 0 saw a MAD"
    );
    assert!(bad_pkey(&cl, 0) > before, "the REQs were not counted");
}

#[test]
fn a_limited_member_talks_to_full_members_only() {
    // 0: full member of 0x0001; 1 and 2: limited members.
    let mut cl = cluster(&[0x8001, 0x0001, 0x0001], &[]);
    ping(&mut cl, 1, 0);
    assert!(got_ping(&cl, 1, 0), "limited -> full delivered");
    ping(&mut cl, 0, 1);
    assert!(got_ping(&cl, 0, 1), "full -> limited delivered");
    assert!(resolved(&mut cl, 1, 0) && resolved(&mut cl, 0, 1));
    assert!(cl.ep(1).unwrap().tx_count() >= 1, "1 connected to 0");
    assert_eq!(bad_pkey(&cl, 0), 0, "full member dropped a limited one");
    // Both limited members joined the same groups as the full member.
    assert_eq!(
        cl.ep(1).unwrap().config().broadcast_hwaddr(),
        cl.ep(0).unwrap().config().broadcast_hwaddr()
    );

    let before = bad_pkey(&cl, 2);
    ping(&mut cl, 1, 2);
    assert!(!got_ping(&cl, 1, 2), "limited -> limited delivered");
    assert!(!resolved(&mut cl, 1, 2));
    assert!(bad_pkey(&cl, 2) > before, "node 2 did not count 1's ARP");
}

#[test]
fn an_endpoint_needs_its_partition_in_the_ports_table() {
    let e = Cluster::new(
        1,
        Instant::now(),
        |_, s| s.pkey = PKey(0x8001),
        |_, c| c.pkey = PKey(0x8002),
    )
    .unwrap_err();
    assert_eq!(e, VerbsError::NoSuchPKey(0x8002));
    assert!(e.to_string().contains("0x8002"), "{e}");
    // A limited member of a partition the port carries as full member (and the reverse).
    for (port, ep) in [(0x8001, 0x0001), (0x0001, 0x8001)] {
        Cluster::new(
            1,
            Instant::now(),
            |_, s| s.pkey = PKey(port),
            |_, c| c.pkey = PKey(ep),
        )
        .expect("same partition");
    }
}

/// The software port's P_Key table is its one configured entry, at index 0.
#[test]
fn the_soft_port_has_a_one_entry_pkey_table() {
    use ipoib_cm::soft::{SoftConfig, SoftVerbs};
    use ipoib_cm::verbs::{QKey, QpAttr, QpInit, QpState, QpType, Verbs};
    let mut c = SoftConfig::new(IpAddr::from([198, 18, 0, 1]));
    c.pkey = PKey(0x0001);
    let mut v = SoftVerbs::new(c);
    assert_eq!(v.pkey_index(PKey(0x8001)), Ok(0));
    assert_eq!(v.pkey_index(PKey(0x0001)), Ok(0));
    assert_eq!(
        v.pkey_index(PKey::DEFAULT),
        Err(VerbsError::NoSuchPKey(0xFFFF))
    );
    let pd = v.alloc_pd().unwrap();
    let cq = v.create_cq(8).unwrap();
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 4,
            max_recv_wr: 4,
            sq_sig_all: true,
        })
        .unwrap();
    let init = |pkey_index| QpAttr {
        pkey_index: Some(pkey_index),
        port: Some(1),
        qkey: Some(QKey(0x0B1B)),
        ..QpAttr::to_state(QpState::Init)
    };
    assert_eq!(
        v.modify_qp(qp, &init(1)),
        Err(VerbsError::InvalidAttribute("pkey_index"))
    );
    v.modify_qp(qp, &init(0)).unwrap();
}
