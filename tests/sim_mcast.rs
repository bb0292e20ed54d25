//! Multicast UD on the software provider: a send to a multicast GID is fanned out to the
//! configured underlay peers and delivered to every UD QP attached to a group there.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipoib_cm::sim::Fabric;
use ipoib_cm::soft::{SoftVerbs, MULTICAST_QPN};
use ipoib_cm::verbs::{
    AddressVector, Completion, CqId, Gid, PoolId, Psn, QKey, QpAttr, QpInit, QpNum, QpState,
    QpType, SendWr, UdDest, Verbs, WcOpcode, WcStatus, WrId,
};

const QKEY: QKey = QKey(0x0B1B);

fn mgid() -> Gid {
    let mut g = [0u8; 16];
    g[..4].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b]);
    g[12..].copy_from_slice(&[0xff; 4]);
    Gid(g)
}

struct Ud {
    qp: QpNum,
    cq: CqId,
    pool: PoolId,
}

fn ud_qp(v: &mut SoftVerbs, attach: bool) -> Ud {
    let pd = v.alloc_pd().unwrap();
    let cq = v.create_cq(64).unwrap();
    let pool = v.create_pool(pd, 2048, 32).unwrap();
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 8,
            max_recv_wr: 16,
            sq_sig_all: true,
        })
        .unwrap();
    v.modify_qp(
        qp,
        &QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(QKey(0x0B1B)),
            ..QpAttr::to_state(QpState::Init)
        },
    )
    .unwrap();
    v.modify_qp(qp, &QpAttr::to_state(QpState::Rtr)).unwrap();
    v.modify_qp(
        qp,
        &QpAttr {
            sq_psn: Some(Psn::new(0)),
            ..QpAttr::to_state(QpState::Rts)
        },
    )
    .unwrap();
    for _ in 0..16 {
        let b = v.pools_mut().alloc(pool).unwrap();
        v.post_recv(qp, WrId(1), b).unwrap();
    }
    if attach {
        v.attach_mcast(qp, mgid(), 0).unwrap();
    }
    Ud { qp, cq, pool }
}

fn recvs(v: &mut SoftVerbs, u: &Ud) -> Vec<Completion> {
    let mut out = Vec::new();
    v.poll_cq(u.cq, &mut out, 64);
    out.retain(|c| c.opcode == WcOpcode::Recv);
    out
}

#[test]
fn multicast_reaches_attached_peers_only() {
    let mut f = Fabric::with_nodes(4, Instant::now(), |_, _| {});
    let addrs: Vec<IpAddr> = f.nodes.iter().map(|n| n.config().local_ip).collect();
    for n in &mut f.nodes {
        n.set_mcast_peers(addrs.clone());
    }
    let uds: Vec<Ud> = (0..4).map(|i| ud_qp(&mut f.nodes[i], i != 3)).collect();
    let b = f.nodes[0].pools_mut().alloc(uds[0].pool).unwrap();
    f.nodes[0].pools_mut().get_mut(b).unwrap()[..5].copy_from_slice(b"hello");
    let mut wr = SendWr::send(WrId(7), b, 5);
    wr.ud = Some(UdDest {
        av: AddressVector::to_gid(mgid()),
        remote_qpn: MULTICAST_QPN,
        remote_qkey: QKEY,
    });
    f.nodes[0].post_send(uds[0].qp, &wr).unwrap();
    f.run_idle(1000, Duration::from_secs(1));

    let mut sent = Vec::new();
    f.nodes[0].poll_cq(uds[0].cq, &mut sent, 8);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert!(recvs(&mut f.nodes[0], &uds[0]).is_empty(), "no loopback");
    for i in [1, 2] {
        let got = recvs(&mut f.nodes[i], &uds[i]);
        assert_eq!(got.len(), 1, "node {i}");
        assert_eq!(got[0].src_qp, Some(uds[0].qp));
        let buf = f.nodes[i].pools().get(got[0].buf.unwrap()).unwrap();
        assert_eq!(&buf[40..45], b"hello");
    }
    assert!(recvs(&mut f.nodes[3], &uds[3]).is_empty(), "not attached");
    assert_eq!(f.nodes[3].stats().rx_unknown_qpn, 1);

    // Detached, node 1 stops receiving; destroying node 2's QP detaches it too.
    f.nodes[1].detach_mcast(uds[1].qp, mgid()).unwrap();
    assert!(f.nodes[1].detach_mcast(uds[1].qp, mgid()).is_err());
    f.nodes[2].destroy_qp(uds[2].qp).unwrap();
    let b = f.nodes[0].pools_mut().alloc(uds[0].pool).unwrap();
    let mut wr2 = wr;
    wr2.buf = Some(b);
    f.nodes[0].post_send(uds[0].qp, &wr2).unwrap();
    f.run_idle(1000, Duration::from_secs(1));
    assert!(recvs(&mut f.nodes[1], &uds[1]).is_empty());
    assert_eq!(f.nodes[1].stats().rx_unknown_qpn, 1);
}
