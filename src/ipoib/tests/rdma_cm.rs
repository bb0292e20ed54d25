//! The rdma_cm service of the endpoint, as transcripts of the MADs node 0 takes and sends:
//! REQs at `RDMA_PS_IB`'s service ID with rdma_cm's `cma_hdr` (accepted, or refused as the
//! kernel refuses them), REQs of ours to a peer with the flag `0x20`, and the one retry at the
//! rdma_cm service after a REJ 8 from a peer's standard service ID.

use std::net::Ipv4Addr;

use super::*;
use crate::verbs::Gid;
use crate::wire::cm::{
    ipoib_service_id, CmMad, CmMessage, IpoibCmData, Rej, RejReason, Req, TargetMsg,
};
use crate::wire::cma::{CmaHdr, CMA_HDR_LEN, EPHEMERAL_PORT_FIRST};

/// Node 0's underlay address (its GID's IP form).
fn node0_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1))
}

/// The underlay address of a peer that is no node of the fabric, and its GID.
fn far_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2))
}

fn far_gid() -> Gid {
    Gid::from_ip(far_ip())
}

/// `ipoib_cm_data` of the far peer: UD QPN 0x5555.
fn far_data() -> [u8; 8] {
    IpoibCmData {
        qpn: QpNum::new(0x5555),
        mtu: IPOIB_CM_BUF_SIZE,
    }
    .to_bytes()
}

/// The `cma_hdr` of a REQ from the far peer to `dst`.
fn hdr_to(dst: IpAddr) -> CmaHdr {
    CmaHdr {
        src_port: 40000,
        src: far_ip(),
        dst,
    }
}

/// Node 0 takes `mad` from the far peer and acts on it; the MADs it sends, parsed.
fn exchange(n: &mut Net, mad: &[u8; crate::wire::cm::MAD_LEN]) -> Vec<CmMessage> {
    let now = n.now();
    let c = &mut n.0;
    let (ep, v) = (c.eps[0].as_mut().expect("up"), &mut c.f.nodes[0]);
    ep.handle_mad(now, far_gid(), mad);
    ep.handle_verbs(now, v);
    sent(n)
}

/// The MADs node 0 has queued (all to the far peer), parsed.
fn sent(n: &mut Net) -> Vec<CmMessage> {
    std::iter::from_fn(|| n.ep(0).poll_mad())
        .map(|(to, mad)| {
            assert_eq!(to, far_gid());
            CmMad::parse(&mad).expect("a CM MAD").msg
        })
        .collect()
}

/// A REQ from the far peer to node 0's rdma_cm service with `private_data`.
fn rdma_cm_req(n: &mut Net, comm_id: u32, private_data: &[u8]) -> [u8; crate::wire::cm::MAD_LEN] {
    let sid = n.ep(0).config().rdma_cm_service_id();
    forged_req(n, 0, far_gid(), comm_id, 20, sid, private_data)
}

#[test]
fn a_req_at_the_rdma_cm_service_with_a_good_header_is_accepted() {
    let mut n = Net::new(1, |_, _| {}, |_, c| c.rx_timeout = Duration::from_secs(60));
    assert_eq!(n.ep(0).config().rdma_cm_service_id(), 0x013F_12B9);
    let private = hdr_to(node0_ip())
        .req_private_data(&far_data())
        .expect("one family");
    let mad = rdma_cm_req(&mut n, 0x77, &private);
    let out = exchange(&mut n, &mad);
    let [CmMessage::Rep(rep)] = &out[..] else {
        panic!("one REP, got {out:?}");
    };
    // The REP carries ipoib_cm_data at byte 0: no cma_hdr in a REP.
    let ours = n.ep(0).cm_private_data();
    assert_eq!(&rep.private_data[..ours.len()], &ours[..]);
    assert!(rep.private_data[ours.len()..].iter().all(|b| *b == 0));
    assert_eq!(rep.remote_comm_id, 0x77);
    // ipoib_cm_data was read at byte 36.
    let qpn = n.ep(0).rx.qpns()[0];
    let rx = n.ep(0).rx.get(&qpn).map(|r| (r.peer, r.remote_ud_qpn));
    assert_eq!(rx, Some((far_gid(), Some(QpNum::new(0x5555)))));
    let c = n.ep(0).counters();
    assert_eq!((c.rx_accepted, c.rx_bad_cma_hdr), (1, 0), "{c:?}");
    assert_eq!(n.qp_live(0), BASELINE_QPS + 1);
    // It is an RX connection as any other: half-open until the RTU, then reaped when the CM
    // gives up its REP.
    assert_eq!(n.ep(0).rx.half_open_count(), 1);
    n.run(Duration::from_secs(30));
    assert_eq!(n.ep(0).counters().rx_half_open_reaped, 1);
    assert_eq!(n.qp_live(0), BASELINE_QPS);
}

/// `mad` (a forged REQ) asking for path MTU `mtu` instead.
fn at_mtu(mad: &[u8; crate::wire::cm::MAD_LEN], mtu: PathMtu) -> [u8; crate::wire::cm::MAD_LEN] {
    let m = CmMad::parse(mad).expect("a CM MAD");
    let CmMessage::Req(mut req) = m.msg else {
        panic!("a REQ");
    };
    req.path_mtu = Some(mtu);
    CmMad::new(m.header.transaction_id, CmMessage::Req(req)).emit()
}

/// A REQ above node 0's path MTU (1024) at its standard service ID (our CM's peers, kernel
/// `ipoib_cm`) is refused with REJ 26 naming 1024; at the rdma_cm service (a sender on the
/// kernel's CM, which cannot act on the REJ's ARI) it is taken, the QP at 1024.
#[test]
fn a_req_above_our_path_mtu_is_refused_with_rej_26_except_from_rdma_cm() {
    let mut n = Net::new(1, |_, _| {}, |_, _| {});
    assert_eq!(n.ep(0).config().path_mtu, PathMtu::Mtu1024);
    let sid = ipoib_service_id(n.ep(0).hwaddr().qpn, true);
    let mad = forged_req(&mut n, 0, far_gid(), 0x91, 20, sid, &far_data());
    let out = exchange(&mut n, &at_mtu(&mad, PathMtu::Mtu2048));
    let [CmMessage::Rej(rej)] = &out[..] else {
        panic!("one REJ, got {out:?}");
    };
    assert_eq!(rej.reason, RejReason::InvalidMtu);
    assert_eq!(rej.acceptable_mtu(), Some(PathMtu::Mtu1024));
    assert_eq!(n.ep(0).counters().rx_mtu_rejected, 1);
    assert_eq!(n.qp_live(0), BASELINE_QPS, "no QP for it");
    // At our MTU it is taken.
    let mad = forged_req(&mut n, 0, far_gid(), 0x92, 20, sid, &far_data());
    let out = exchange(&mut n, &mad);
    assert!(matches!(&out[..], [CmMessage::Rep(_)]), "{out:?}");
    let private = hdr_to(node0_ip())
        .req_private_data(&far_data())
        .expect("one family");
    let mad = rdma_cm_req(&mut n, 0x93, &private);
    let out = exchange(&mut n, &at_mtu(&mad, PathMtu::Mtu4096));
    assert!(matches!(&out[..], [CmMessage::Rep(_)]), "{out:?}");
    let mtus: Vec<PathMtu> = n
        .ep(0)
        .rx
        .qpns()
        .iter()
        .filter_map(|q| {
            n.0.eps[0]
                .as_ref()
                .and_then(|ep| ep.rx.get(q))
                .map(|r| r.path_mtu)
        })
        .collect();
    assert_eq!(mtus, [PathMtu::Mtu1024, PathMtu::Mtu1024]);
    assert_eq!(n.ep(0).counters().rx_mtu_rejected, 1);
}

#[test]
fn a_req_at_the_rdma_cm_service_with_a_bad_header_gets_the_kernels_rej_and_nothing() {
    let mut n = Net::new(1, |_, _| {}, |_, _| {});
    let good = hdr_to(node0_ip())
        .req_private_data(&far_data())
        .expect("one family");
    let mut version_1 = good.clone();
    version_1[0] = 1;
    let mut ip_version_5 = good.clone();
    ip_version_5[1] = 0x50;
    let six: IpAddr = "2001:db8::1".parse().expect("IPv6");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("no header (ipoib_cm_data at 0)", far_data().to_vec()),
        ("empty", Vec::new()),
        ("version 1", version_1),
        ("IP version 5", ip_version_5),
        (
            "another destination",
            hdr_to(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9)))
                .req_private_data(&far_data())
                .expect("one family"),
        ),
        (
            "IPv6 to an IPv4 node",
            CmaHdr {
                src_port: 1,
                src: six,
                dst: six,
            }
            .req_private_data(&far_data())
            .expect("one family"),
        ),
    ];
    for (k, (what, private)) in cases.iter().enumerate() {
        let comm_id = 0x100 + k as u32;
        let mad = rdma_cm_req(&mut n, comm_id, private);
        let out = exchange(&mut n, &mad);
        let [CmMessage::Rej(rej)] = &out[..] else {
            panic!("{what}: one REJ, got {out:?}");
        };
        // What the kernel's rdma_cm sends: ConsumerDefined, no ARI, no private data.
        assert_eq!(rej.reason, RejReason::ConsumerDefined, "{what}");
        assert_eq!(rej.reason.code(), 28, "{what}");
        assert_eq!(rej.reject_info_len, 0, "{what}");
        assert_eq!(rej.ari, [0; Rej::ARI_LEN], "{what}");
        assert_eq!(rej.private_data, [0; Rej::PRIVATE_DATA_LEN], "{what}");
        assert_eq!(rej.msg_rejected, TargetMsg::Req, "{what}");
        assert_eq!(rej.remote_comm_id, comm_id, "{what}");
        // Nothing allocated: no QP, no RX connection, no CM id.
        assert_eq!(n.qp_live(0), BASELINE_QPS, "{what}");
        assert_eq!(n.ep(0).rx_count(), 0, "{what}");
        assert_eq!(n.ep(0).cm.len(), 0, "{what}");
        assert_eq!(n.ep(0).counters().rx_bad_cma_hdr, k as u64 + 1, "{what}");
    }
    let c = n.ep(0).counters();
    assert_eq!((c.rx_accepted, c.qp_created), (0, BASELINE_QPS as u64));
    // The same ipoib_cm_data at the standard service ID is taken as ever.
    let sid = ipoib_service_id(n.ep(0).hwaddr().qpn, true);
    let mad = forged_req(&mut n, 0, far_gid(), 0x200, 20, sid, &far_data());
    let out = exchange(&mut n, &mad);
    assert!(matches!(&out[..], [CmMessage::Rep(_)]), "{out:?}");
}

/// One node with a static neighbour 198.19.0.2 at the far peer (UD QPN 0x99) whose hardware
/// address has `flags`.
fn with_far_neighbour(flags: u8) -> Net {
    let hw = HwAddr::new(flags, QpNum::new(0x99), far_gid());
    Net::new(
        1,
        |_, _| {},
        |_, c| {
            c.static_neighbours = vec![(IpAddr::V4(Ipv4Addr::new(198, 19, 0, 2)), hw)];
        },
    )
}

/// Node 0 sends a ping to the far neighbour; the MADs that go out.
fn ping_far(n: &mut Net) -> Vec<CmMessage> {
    n.inject(0, &ping4(0, 1, 64));
    sent(n)
}

/// The one REQ of `out`.
fn one_req(out: &[CmMessage]) -> Req {
    match out {
        [CmMessage::Req(r)] => *r,
        _ => panic!("one REQ, got {out:?}"),
    }
}

/// Checks that `req` goes to the rdma_cm service from node 0 to the far peer, with a
/// `cma_hdr` and node 0's `ipoib_cm_data` at byte 36.
fn assert_framed(n: &mut Net, req: &Req) {
    assert_eq!(req.service_id, n.ep(0).config().rdma_cm_service_id());
    let (hdr, user) = CmaHdr::parse(&req.private_data).expect("a cma_hdr");
    assert_eq!((hdr.src, hdr.dst), (node0_ip(), far_ip()));
    assert!(hdr.src_port >= EPHEMERAL_PORT_FIRST, "{}", hdr.src_port);
    let ours = n.ep(0).cm_private_data();
    assert_eq!(&user[..ours.len()], &ours[..]);
    assert_eq!(&req.private_data[CMA_HDR_LEN..][..ours.len()], &ours[..]);
}

/// A REJ from the far peer of `req` with `reason`, as `ib_cm` sends it for a REQ it holds no
/// id for (local comm id 0).
fn rej_of(req: &Req, reason: RejReason) -> [u8; crate::wire::cm::MAD_LEN] {
    let rej = Rej {
        remote_comm_id: req.local_comm_id,
        msg_rejected: TargetMsg::Req,
        reason,
        ..Rej::default()
    };
    CmMad::new(1, CmMessage::Rej(rej)).emit()
}

#[test]
fn a_peer_with_flag_0x20_gets_the_req_at_its_rdma_cm_service() {
    let mut n = with_far_neighbour(HwAddr::FLAG_CONNECTED | HwAddr::FLAG_RDMA_CM);
    let req = one_req(&ping_far(&mut n));
    assert_framed(&mut n, &req);
    assert_eq!(n.ep(0).counters().tx_rdma_cm_retries, 0);
    // Without the flag: the standard service ID and ipoib_cm_data at 0, as ever.
    let mut n = with_far_neighbour(HwAddr::FLAG_CONNECTED);
    let req = one_req(&ping_far(&mut n));
    assert_eq!(req.service_id, ipoib_service_id(QpNum::new(0x99), true));
    let ours = n.ep(0).cm_private_data();
    assert_eq!(&req.private_data[..ours.len()], &ours[..]);
    // Flag 0x20 alone (a kernel-CM daemon on InfiniBand clears 0x80): still connected to.
    let mut n = with_far_neighbour(HwAddr::FLAG_RDMA_CM);
    let req = one_req(&ping_far(&mut n));
    assert_framed(&mut n, &req);
}

#[test]
fn a_rej_8_from_the_standard_service_draws_one_framed_retry_and_is_remembered() {
    let mut n = with_far_neighbour(HwAddr::FLAG_CONNECTED);
    let first = one_req(&ping_far(&mut n));
    assert_eq!(first.service_id, ipoib_service_id(QpNum::new(0x99), true));
    let qps = n.qp_live(0);
    // No listener there (a daemon on the kernel's CM): REJ 8, and at once the REQ again, at
    // the rdma_cm service, from the same QP with the same PSN.
    let retry = one_req(&exchange(
        &mut n,
        &rej_of(&first, RejReason::InvalidServiceId),
    ));
    assert_framed(&mut n, &retry);
    assert_eq!(
        (retry.local_qpn, retry.starting_psn),
        (first.local_qpn, first.starting_psn)
    );
    assert_ne!(retry.local_comm_id, first.local_comm_id);
    assert_eq!(n.qp_live(0), qps, "the same QP");
    let c = n.ep(0).counters();
    assert_eq!((c.tx_rdma_cm_retries, c.tx_failed), (1, 0), "{c:?}");
    assert_eq!(n.ep(0).tx_count(), 1);
    // A second REJ 8 fails the connection as any REJ: no third REQ.
    let out = exchange(&mut n, &rej_of(&retry, RejReason::InvalidServiceId));
    assert!(
        out.iter().all(|m| !matches!(m, CmMessage::Req(_))),
        "{out:?}"
    );
    let c = n.ep(0).counters();
    assert_eq!((c.tx_rdma_cm_retries, c.tx_failed), (1, 1), "{c:?}");
    assert_eq!(n.ep(0).tx_count(), 0);
    assert_eq!(n.qp_live(0), BASELINE_QPS);
    // The neighbour entry remembers the peer's kind: the next connection goes straight to
    // the rdma_cm service.
    let next = one_req(&ping_far(&mut n));
    assert_framed(&mut n, &next);
    assert_eq!(n.ep(0).counters().tx_rdma_cm_retries, 1);
}

#[test]
fn a_rej_8_at_the_rdma_cm_service_or_another_reason_draws_no_retry() {
    // The flag sent the REQ to the rdma_cm service already: REJ 8 ends it.
    let mut n = with_far_neighbour(HwAddr::FLAG_CONNECTED | HwAddr::FLAG_RDMA_CM);
    let req = one_req(&ping_far(&mut n));
    let out = exchange(&mut n, &rej_of(&req, RejReason::InvalidServiceId));
    assert!(out.iter().all(|m| !matches!(m, CmMessage::Req(_))));
    let c = n.ep(0).counters();
    assert_eq!((c.tx_rdma_cm_retries, c.tx_failed), (0, 1), "{c:?}");
    // Another reason from the standard service ID: no retry, and nothing remembered.
    let mut n = with_far_neighbour(HwAddr::FLAG_CONNECTED);
    let req = one_req(&ping_far(&mut n));
    let out = exchange(&mut n, &rej_of(&req, RejReason::NoQp));
    assert!(out.iter().all(|m| !matches!(m, CmMessage::Req(_))));
    let c = n.ep(0).counters();
    assert_eq!((c.tx_rdma_cm_retries, c.tx_failed), (0, 1), "{c:?}");
    let next = one_req(&ping_far(&mut n));
    assert_eq!(next.service_id, ipoib_service_id(QpNum::new(0x99), true));
}

#[test]
fn a_node_without_the_standard_listen_rejects_it_with_8_and_takes_rdma_cm() {
    let mut n = Net::new(
        1,
        |_, _| {},
        |_, c| {
            c.listen_ipoib_service = false;
            c.advertise_rdma_cm = true;
        },
    );
    assert!(n.ep(0).hwaddr().rdma_cm() && n.ep(0).hwaddr().connected_mode());
    let sid = ipoib_service_id(n.ep(0).hwaddr().qpn, true);
    let mad = forged_req(&mut n, 0, far_gid(), 0x300, 20, sid, &far_data());
    let out = exchange(&mut n, &mad);
    let [CmMessage::Rej(rej)] = &out[..] else {
        panic!("one REJ, got {out:?}");
    };
    assert_eq!(rej.reason, RejReason::InvalidServiceId);
    let private = hdr_to(node0_ip())
        .req_private_data(&far_data())
        .expect("one family");
    let mad = rdma_cm_req(&mut n, 0x301, &private);
    let out = exchange(&mut n, &mad);
    assert!(matches!(&out[..], [CmMessage::Rep(_)]), "{out:?}");
}
