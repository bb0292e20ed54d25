//! The software provider's InfiniBand link layer on the simulated fabric: ports whose LIDs and
//! P_Keys are set as an SM would set them, packets addressed by LID with an LRH, routes
//! learnt from beacons, multicast by MLID, and what an HCA drops (a DLID not its own, a P_Key
//! its table does not admit, anything while the port is down), each counted.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipoib_cm::sim::Fabric;
use ipoib_cm::soft::ib::BEACON_INTERVAL;
use ipoib_cm::soft::{IbPortAttr, SoftLink, SoftVerbs, MULTICAST_QPN};
use ipoib_cm::verbs::setup::{connect_rc, init_rc_qp, open_ud_qp, RcConnection};
use ipoib_cm::verbs::{
    AddressVector, BufId, Completion, CqId, Gid, Grh, Lid, PathMtu, Psn, QKey, QpInit, QpNum,
    QpType, SendWr, Sl, UdDest, Verbs, WcOpcode, WcStatus, WrId,
};

const QKEY: QKey = QKey(0x0B1B);

/// LIDs of the three ports, as an SM might have given them.
const LIDS: [u16; 3] = [4, 9, 12];

fn port_gid(i: usize) -> Gid {
    let mut g = [0u8; 16];
    g[..2].copy_from_slice(&[0xfe, 0x80]);
    g[8..].copy_from_slice(&(0x0010_0000u64 + i as u64).to_be_bytes());
    Gid(g)
}

fn port(i: usize) -> IbPortAttr {
    IbPortAttr {
        active: true,
        lid: Lid(LIDS[i]),
        lmc: 0,
        sm_lid: Lid(1),
        sm_sl: Sl::ZERO,
        gid: port_gid(i),
        pkeys: vec![0xFFFF],
        mtu: PathMtu::Mtu2048,
    }
}

fn mgid() -> Gid {
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b]);
    g[12..].copy_from_slice(&[0xff; 4]);
    Gid(g)
}

/// Three IB ports on one underlay segment, beacons heard both ways (by IP multicast, or by
/// unicast to the peers), every port knowing the other two.
fn fabric(multicast: bool) -> Fabric {
    let mut f = Fabric::with_nodes(3, Instant::now(), |_, c| {
        c.link = SoftLink::Infiniband;
        c.port_mtu = PathMtu::Mtu4096;
        c.multicast = multicast;
    });
    let addrs: Vec<IpAddr> = f.nodes.iter().map(|n| n.config().local_ip).collect();
    let now = f.now();
    for (i, n) in f.nodes.iter_mut().enumerate() {
        if !multicast {
            n.set_mcast_peers(addrs.clone());
        }
        n.set_ib_port(now, port(i));
    }
    assert!(
        f.run_until(10_000, Duration::from_secs(2), |f| f
            .nodes
            .iter()
            .all(|n| n.ib_routes() == 2)),
        "routes: {:?}",
        f.nodes.iter().map(SoftVerbs::ib_routes).collect::<Vec<_>>()
    );
    f
}

struct Ud {
    qp: QpNum,
    cq: CqId,
    /// Send buffers, one per send (each test sends fewer).
    send_bufs: Vec<BufId>,
}

fn ud_qp(v: &mut SoftVerbs) -> Ud {
    let pd = v.alloc_pd().unwrap();
    let cq = v.create_cq(64).unwrap();
    let pool = v.create_pool(pd, 2048, 32).unwrap();
    let s = open_ud_qp(v, pd, QpType::Ud, cq, pool, QKEY, 0, 16, 8, WrId(1)).unwrap();
    Ud {
        qp: s.qp,
        cq,
        send_bufs: s.send_bufs,
    }
}

fn send_ud(v: &mut SoftVerbs, from: &mut Ud, av: AddressVector, to: QpNum, what: &[u8]) {
    let b = from.send_bufs.pop().expect("a send buffer");
    v.pools_mut().get_mut(b).unwrap()[..what.len()].copy_from_slice(what);
    let mut wr = SendWr::send(WrId(7), b, what.len());
    wr.ud = Some(UdDest {
        av,
        remote_qpn: to,
        remote_qkey: QKEY,
    });
    v.post_send(from.qp, &wr).unwrap();
}

fn completions(v: &mut SoftVerbs, cq: CqId, op: WcOpcode) -> Vec<Completion> {
    let mut out = Vec::new();
    v.poll_cq(cq, &mut out, 64);
    out.retain(|c| c.opcode == op);
    out
}

fn settle(f: &mut Fabric) {
    let until = f.now() + Duration::from_millis(50);
    f.run_until(10_000, Duration::from_secs(1), |f| f.now() >= until);
}

#[test]
fn unicast_goes_by_lid_without_a_grh_and_says_who_sent_it() {
    for multicast in [false, true] {
        let mut f = fabric(multicast);
        let mut a = ud_qp(&mut f.nodes[0]);
        let b = ud_qp(&mut f.nodes[1]);
        let av = AddressVector::to_lid(Lid(LIDS[1]), Sl::new(3).unwrap());
        send_ud(&mut f.nodes[0], &mut a, av, b.qp, b"hello");
        settle(&mut f);
        let sent = completions(&mut f.nodes[0], a.cq, WcOpcode::Send);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].status, WcStatus::Success);
        let got = completions(&mut f.nodes[1], b.cq, WcOpcode::Recv);
        assert_eq!(got.len(), 1, "multicast {multicast}");
        let c = &got[0];
        assert!(!c.grh, "no GRH inside a subnet");
        assert_eq!(c.slid, Some(Lid(LIDS[0])));
        assert_eq!(c.sl.get(), 3);
        assert_eq!(c.src_qp, Some(a.qp));
        let buf = f.nodes[1].pools().get(c.buf.unwrap()).unwrap();
        assert_eq!(&buf[40..45], b"hello");
    }
}

#[test]
fn a_port_takes_only_its_own_lids_and_partitions() {
    let mut f = fabric(false);
    let mut a = ud_qp(&mut f.nodes[0]);
    let c = ud_qp(&mut f.nodes[2]);

    // No port beacons LID 30: the sender's fabric has no route for it.
    send_ud(
        &mut f.nodes[0],
        &mut a,
        AddressVector::to_lid(Lid(30), Sl::ZERO),
        c.qp,
        b"x",
    );
    settle(&mut f);
    assert_eq!(f.nodes[0].stats().tx_no_route, 1);
    let sent = completions(&mut f.nodes[0], a.cq, WcOpcode::Send);
    assert_eq!(
        sent[0].status,
        WcStatus::Success,
        "the fabric drops it, not the HCA"
    );

    // Node 2 leaves the default partition: node 0's packets are P_Key violations there.
    let now = f.now();
    f.nodes[2].set_ib_port(
        now,
        IbPortAttr {
            pkeys: vec![0x8002],
            ..port(2)
        },
    );
    settle(&mut f);
    send_ud(
        &mut f.nodes[0],
        &mut a,
        AddressVector::to_lid(Lid(LIDS[2]), Sl::ZERO),
        c.qp,
        b"x",
    );
    settle(&mut f);
    assert_eq!(f.nodes[2].stats().rx_pkey_violations, 1);
    assert!(completions(&mut f.nodes[2], c.cq, WcOpcode::Recv).is_empty());

    // Node 2's LID moves to 13: what node 0 still sends to 12 is not for it (the route
    // follows the new beacon, so none reaches it on the underlay either).
    f.nodes[2].set_ib_port(
        now,
        IbPortAttr {
            lid: Lid(13),
            ..port(2)
        },
    );
    settle(&mut f);
    let before = f.nodes[0].stats().tx_no_route;
    send_ud(
        &mut f.nodes[0],
        &mut a,
        AddressVector::to_lid(Lid(12), Sl::ZERO),
        c.qp,
        b"old",
    );
    send_ud(
        &mut f.nodes[0],
        &mut a,
        AddressVector::to_lid(Lid(13), Sl::ZERO),
        c.qp,
        b"new",
    );
    settle(&mut f);
    assert_eq!(f.nodes[0].stats().tx_no_route, before + 1);
    let got = completions(&mut f.nodes[2], c.cq, WcOpcode::Recv);
    assert_eq!(got.len(), 1);
    let buf = f.nodes[2].pools().get(got[0].buf.unwrap()).unwrap();
    assert_eq!(&buf[40..43], b"new");
}

#[test]
fn a_port_that_goes_down_carries_nothing_until_it_is_active_again() {
    let mut f = fabric(false);
    let mut a = ud_qp(&mut f.nodes[0]);
    let mut b = ud_qp(&mut f.nodes[1]);
    let now = f.now();
    f.nodes[1].set_ib_port(
        now,
        IbPortAttr {
            active: false,
            ..port(1)
        },
    );
    settle(&mut f);
    assert_eq!(f.nodes[0].ib_routes(), 1, "its beacon took its route away");
    let av = AddressVector::to_lid(Lid(LIDS[1]), Sl::ZERO);
    send_ud(&mut f.nodes[0], &mut a, av, b.qp, b"x");
    send_ud(
        &mut f.nodes[1],
        &mut b,
        AddressVector::to_lid(Lid(LIDS[0]), Sl::ZERO),
        a.qp,
        b"y",
    );
    settle(&mut f);
    assert_eq!(f.nodes[0].stats().tx_no_route, 1);
    assert_eq!(f.nodes[1].stats().tx_port_down, 1);
    assert!(completions(&mut f.nodes[1], b.cq, WcOpcode::Recv).is_empty());
    assert!(completions(&mut f.nodes[0], a.cq, WcOpcode::Recv).is_empty());

    let now = f.now();
    f.nodes[1].set_ib_port(now, port(1));
    settle(&mut f);
    send_ud(&mut f.nodes[0], &mut a, av, b.qp, b"z");
    settle(&mut f);
    assert_eq!(completions(&mut f.nodes[1], b.cq, WcOpcode::Recv).len(), 1);
}

#[test]
fn multicast_goes_to_the_mlid_with_a_grh_naming_the_sender() {
    let mut f = fabric(true);
    let mut uds: Vec<Ud> = (0..3).map(|i| ud_qp(&mut f.nodes[i])).collect();
    for (i, u) in uds.iter().enumerate().skip(1) {
        f.nodes[i].attach_mcast(u.qp, mgid(), 0xC000).unwrap();
    }
    f.nodes[0].attach_mcast(uds[0].qp, mgid(), 0xC000).unwrap();
    let ip = IpAddr::from([239, 254, 0xC0, 0]);
    assert!(f.nodes[1].ip_multicast_groups().contains(&ip));
    let av = AddressVector {
        dlid: Lid(0xC000),
        ..AddressVector::global(Grh::to_gid(mgid()))
    };
    send_ud(&mut f.nodes[0], &mut uds[0], av, MULTICAST_QPN, b"arp?");
    settle(&mut f);
    for i in [1, 2] {
        let got = completions(&mut f.nodes[i], uds[i].cq, WcOpcode::Recv);
        assert_eq!(got.len(), 1, "node {i}");
        assert!(got[0].grh);
        let buf = f.nodes[i].pools().get(got[0].buf.unwrap()).unwrap();
        assert_eq!(
            ipoib_cm::soft::grh_source_gid(buf),
            Some(port_gid(0)),
            "the real GID"
        );
        assert_eq!(&buf[40..44], b"arp?");
    }

    // Node 2 detaches: the MLID is not its any more, so the packet is dropped there.
    f.nodes[2].detach_mcast(uds[2].qp, mgid()).unwrap();
    send_ud(&mut f.nodes[0], &mut uds[0], av, MULTICAST_QPN, b"again");
    settle(&mut f);
    assert_eq!(
        completions(&mut f.nodes[1], uds[1].cq, WcOpcode::Recv).len(),
        1
    );
    assert!(completions(&mut f.nodes[2], uds[2].cq, WcOpcode::Recv).is_empty());
    assert_eq!(f.nodes[2].stats().rx_wrong_dlid, 1);
}

#[test]
fn rc_connections_run_over_lid_address_vectors() {
    let mut f = fabric(false);
    let mut qps = Vec::new();
    let mut cqs = Vec::new();
    let mut pools = Vec::new();
    for i in 0..2 {
        let v = &mut f.nodes[i];
        let pd = v.alloc_pd().unwrap();
        let cq = v.create_cq(64).unwrap();
        let pool = v.create_pool(pd, 8192, 16).unwrap();
        let qp = v
            .create_qp(&QpInit {
                pd,
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                max_send_wr: 8,
                max_recv_wr: 8,
                sq_sig_all: true,
            })
            .unwrap();
        init_rc_qp(v, qp, 0).unwrap();
        for _ in 0..8 {
            let b = v.pools_mut().alloc(pool).unwrap();
            v.post_recv(qp, WrId(2), b).unwrap();
        }
        qps.push(qp);
        cqs.push(cq);
        pools.push(pool);
    }
    for (me, peer) in [(0, 1), (1, 0)] {
        let c = RcConnection {
            av: AddressVector::to_lid(Lid(LIDS[peer]), Sl::ZERO),
            ..RcConnection::new(
                (port_gid(peer), qps[peer]),
                PathMtu::Mtu2048,
                Psn::new(100),
                Psn::new(100),
            )
        };
        connect_rc(&mut f.nodes[me], qps[me], &c).unwrap();
    }
    // A message of three packets at MTU 2048, and one back.
    let big: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let b = f.nodes[0].pools_mut().alloc(pools[0]).unwrap();
    f.nodes[0].pools_mut().get_mut(b).unwrap()[..big.len()].copy_from_slice(&big);
    f.nodes[0]
        .post_send(qps[0], &SendWr::send(WrId(9), b, big.len()))
        .unwrap();
    let b = f.nodes[1].pools_mut().alloc(pools[1]).unwrap();
    f.nodes[1].pools_mut().get_mut(b).unwrap()[..4].copy_from_slice(b"back");
    f.nodes[1]
        .post_send(qps[1], &SendWr::send(WrId(9), b, 4))
        .unwrap();
    settle(&mut f);
    let mut done: Vec<Vec<Completion>> = Vec::new();
    for (i, cq) in cqs.iter().enumerate() {
        let mut all = Vec::new();
        f.nodes[i].poll_cq(*cq, &mut all, 64);
        assert!(all.iter().all(|c| c.status == WcStatus::Success), "{all:?}");
        assert_eq!(all.iter().filter(|c| c.opcode == WcOpcode::Send).count(), 1);
        assert_eq!(f.nodes[i].stats().rx_bad_src, 0);
        done.push(all);
    }
    let got: Vec<&Completion> = done[1]
        .iter()
        .filter(|c| c.opcode == WcOpcode::Recv)
        .collect();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].byte_len as usize, big.len());
    let buf = f.nodes[1].pools().get(got[0].buf.unwrap()).unwrap();
    assert_eq!(&buf[..big.len()], &big[..]);
    assert_eq!(
        done[0]
            .iter()
            .filter(|c| c.opcode == WcOpcode::Recv)
            .count(),
        1
    );
    // Nothing went to the third port.
    assert_eq!(f.nodes[2].stats().rx_wrong_dlid, 0);
}

/// A follower's port (another worker of node 0's interface, here on a port of its own on the
/// underlay) copies node 0's: its attributes and routes, with no beacon of its own; it sends
/// by LID through the copied routes, as node 0's LID. The port events a device would raise
/// come with each change, and node 0's view changes only when its port or routes do, not
/// with every beacon.
#[test]
fn a_followers_port_is_a_copy_of_controls() {
    use ipoib_cm::verbs::AsyncEvent;
    let mut f = Fabric::with_nodes(4, Instant::now(), |_, c| {
        c.link = SoftLink::Infiniband;
        c.port_mtu = PathMtu::Mtu4096;
        c.multicast = true;
    });
    let now = f.now();
    for i in 0..3 {
        f.nodes[i].set_ib_port(now, port(i));
    }
    assert!(f.run_until(10_000, Duration::from_secs(2), |f| f.nodes[..3]
        .iter()
        .all(|n| n.ib_routes() == 2)));
    let generation = f.nodes[0].ib_port_view_generation();
    settle(&mut f);
    let until = f.now() + Duration::from_secs(1);
    f.run_until(100_000, Duration::from_secs(3), |f| f.now() >= until);
    assert_eq!(
        f.nodes[0].ib_port_view_generation(),
        generation,
        "beacons renewed the routes; the view did not change"
    );
    let view = f.nodes[0].ib_port_view().expect("an IB link");
    assert_eq!(view.routes(), 2);
    let events =
        |v: &mut SoftVerbs| std::iter::from_fn(|| v.poll_async_event()).collect::<Vec<_>>();
    events(&mut f.nodes[3]);
    f.nodes[3].follow_ib_port(&view);
    assert_eq!(events(&mut f.nodes[3]), [AsyncEvent::PortActive]);
    assert_eq!(f.nodes[3].ib_port(), Some(view.port()));
    assert_eq!(f.nodes[3].ib_routes(), 2);
    let beacons = f.nodes[3].stats().tx_beacons;
    // It sends by LID to node 1, as node 0's LID.
    let mut a = ud_qp(&mut f.nodes[3]);
    let b = ud_qp(&mut f.nodes[1]);
    let av = AddressVector::to_lid(Lid(LIDS[1]), Sl::ZERO);
    send_ud(&mut f.nodes[3], &mut a, av, b.qp, b"from a worker");
    settle(&mut f);
    let got = completions(&mut f.nodes[1], b.cq, WcOpcode::Recv);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].slid, Some(Lid(LIDS[0])));
    assert_eq!(
        f.nodes[3].stats().tx_beacons,
        beacons,
        "no beacon of its own"
    );

    // The SM moves node 0's LID, then changes its P_Keys, then takes the port down.
    let now = f.now();
    let mut p = port(0);
    p.lid = Lid(20);
    f.nodes[0].set_ib_port(now, p.clone());
    assert_ne!(f.nodes[0].ib_port_view_generation(), generation);
    let view = f.nodes[0].ib_port_view().unwrap();
    f.nodes[3].follow_ib_port(&view);
    assert_eq!(events(&mut f.nodes[3]), [AsyncEvent::LidChange]);
    p.pkeys.push(0x8001);
    f.nodes[0].set_ib_port(now, p.clone());
    let view = f.nodes[0].ib_port_view().unwrap();
    f.nodes[3].follow_ib_port(&view);
    assert_eq!(events(&mut f.nodes[3]), [AsyncEvent::PkeyChange]);
    p.active = false;
    f.nodes[0].set_ib_port(now, p);
    let view = f.nodes[0].ib_port_view().unwrap();
    f.nodes[3].follow_ib_port(&view);
    assert_eq!(events(&mut f.nodes[3]), [AsyncEvent::PortErr]);
}

/// A port that comes up is answered at once: every port that hears a port new to it beacons
/// then, not at its next period, so a newly started daemon learns every route within a round
/// trip (its first REQ finds its peer's LID). Only on that change: the exchange ends.
#[test]
fn a_port_that_comes_up_is_answered_at_once() {
    let mut f = Fabric::with_nodes(3, Instant::now(), |_, c| {
        c.link = SoftLink::Infiniband;
        c.port_mtu = PathMtu::Mtu4096;
        c.multicast = true;
    });
    let now = f.now();
    for i in 0..2 {
        f.nodes[i].set_ib_port(now, port(i));
    }
    assert!(f.run_until(10_000, Duration::from_secs(2), |f| f.nodes[..2]
        .iter()
        .all(|n| n.ib_routes() == 1)));
    // Just past the others' periodic beacons: their next is almost a period away.
    f.advance(Duration::from_millis(20));
    let sent = |f: &Fabric| [0, 1].map(|i| f.nodes[i].stats().tx_beacons);
    let before = sent(&f);
    let up = f.now();
    f.nodes[2].set_ib_port(up, port(2));
    f.advance(BEACON_INTERVAL / 10);
    assert_eq!(
        sent(&f),
        before.map(|n| n + 1),
        "each answered the newcomer once, before its period"
    );
    assert_eq!(f.nodes[2].ib_routes(), 2);
}
