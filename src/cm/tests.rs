//! Transcript tests of the CM state machine: one per transition, timeout and duplicate/stale
//! rule, on a virtual clock (`t0 + Duration`). Each parses the exact MADs `poll_transmit`
//! returns and checks the events.

use super::types::cm_ack_timeout;
use super::*;
use crate::verbs::{Lid, Path, PathMtu, Psn, QpNum, Rate, Sl};
use crate::wire::cm::cm_timeout_ms;
use crate::wire::cm::{CmMad, CmMessage, Drep, Dreq, Mra, Rej, Rep, Req, Rtu, TargetMsg};
use core::net::Ipv4Addr;
use proptest::prelude::*;
use std::time::Duration;

const GUID_A: u64 = 0xA0A0_0000_0000_0001;
const GUID_B: u64 = 0xB0B0_0000_0000_0002;
const SID: u64 = 0x1000_0000_0000_0048;
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const PSN_A: u32 = 0x00AB_CDEF;
const PSN_B: u32 = 0x0012_3456;
const TW: Duration = Duration::from_millis(100);

fn gid(n: u8) -> Gid {
    Gid::from(Ipv4Addr::new(10, 0, 0, n))
}

fn a() -> Gid {
    gid(1)
}

fn b() -> Gid {
    gid(2)
}

fn x() -> Gid {
    gid(66)
}

fn msec(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn cm_a() -> Cm {
    let mut c = CmConfig::new(a(), GUID_A);
    c.timewait = TW;
    Cm::new(c)
}

/// A's CM with `f` applied to its configuration.
fn cm_a_with(f: impl FnOnce(&mut CmConfig)) -> Cm {
    let mut c = CmConfig::new(a(), GUID_A);
    c.timewait = TW;
    f(&mut c);
    Cm::new(c)
}

fn cm_b() -> Cm {
    let mut c = CmConfig::new(b(), GUID_B);
    c.timewait = TW;
    let mut cm = Cm::new(c);
    cm.listen(SID, u64::MAX);
    cm
}

fn connect_params() -> ConnectParams {
    ConnectParams {
        peer: b(),
        service_id: SID,
        local_qpn: QpNum::new(QPN_A),
        starting_psn: Psn::new(PSN_A),
        path_mtu: PathMtu::Mtu1024,
        retry_count: 7,
        rnr_retry_count: 6,
        srq: true,
        local_ack_timeout: 17,
        private_data: vec![1, 2, 3],
        path: None,
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        local_qpn: QpNum::new(QPN_B),
        starting_psn: Psn::new(PSN_B),
        srq: false,
        rnr_retry_count: 5,
        private_data: vec![9, 8],
    }
}

/// Exactly one MAD, to `to`; returns its bytes.
fn sent_one(cm: &mut Cm, to: Gid) -> [u8; 256] {
    let (g, m) = cm.poll_transmit().expect("a MAD");
    assert_eq!(g, to);
    assert!(cm.poll_transmit().is_none(), "more than one MAD");
    m
}

fn events(cm: &mut Cm) -> Vec<CmEvent> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

fn parse(m: &[u8; 256]) -> CmMad {
    CmMad::parse(m).unwrap()
}

fn mad(tid: u64, msg: CmMessage) -> [u8; 256] {
    CmMad::new(tid, msg).emit()
}

fn as_req(m: &CmMad) -> Req {
    match m.msg {
        CmMessage::Req(r) => r,
        ref o => panic!("not a REQ: {o:?}"),
    }
}

fn as_rep(m: &CmMad) -> Rep {
    match m.msg {
        CmMessage::Rep(r) => r,
        ref o => panic!("not a REP: {o:?}"),
    }
}

fn as_rej(m: &CmMad) -> Rej {
    match m.msg {
        CmMessage::Rej(r) => r,
        ref o => panic!("not a REJ: {o:?}"),
    }
}

fn as_dreq(m: &CmMad) -> Dreq {
    match m.msg {
        CmMessage::Dreq(r) => r,
        ref o => panic!("not a DREQ: {o:?}"),
    }
}

fn as_drep(m: &CmMad) -> Drep {
    match m.msg {
        CmMessage::Drep(r) => r,
        ref o => panic!("not a DREP: {o:?}"),
    }
}

fn as_rtu(m: &CmMad) -> Rtu {
    match m.msg {
        CmMessage::Rtu(r) => r,
        ref o => panic!("not an RTU: {o:?}"),
    }
}

/// A connects; B gets the REQ. Returns the active id, the passive id, the REQ bytes.
fn req_delivered(t0: Instant, ca: &mut Cm, cb: &mut Cm) -> (CommId, CommId, [u8; 256]) {
    let ida = ca.connect(t0, connect_params()).unwrap();
    let req = sent_one(ca, b());
    cb.handle_mad(t0, a(), &req);
    let idb = match events(cb).as_slice() {
        [CmEvent::ReqReceived { id, .. }] => *id,
        e => panic!("{e:?}"),
    };
    (ida, idb, req)
}

/// Up to B's REP delivered to A (A in RepRcvd, B in RepSent). Returns ids and the REP.
fn rep_delivered(t0: Instant, ca: &mut Cm, cb: &mut Cm) -> (CommId, CommId, [u8; 256]) {
    let (ida, idb, _) = req_delivered(t0, ca, cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let rep = sent_one(cb, a());
    ca.handle_mad(t0, b(), &rep);
    assert!(matches!(
        events(ca).as_slice(),
        [CmEvent::RepReceived { .. }]
    ));
    (ida, idb, rep)
}

/// Both Established. Returns ids.
fn established(t0: Instant, ca: &mut Cm, cb: &mut Cm) -> (CommId, CommId) {
    let (ida, idb, _) = rep_delivered(t0, ca, cb);
    ca.rtu(t0, ida).unwrap();
    let rtu = sent_one(ca, b());
    cb.handle_mad(t0, a(), &rtu);
    assert_eq!(events(ca), vec![CmEvent::Established { id: ida }]);
    assert_eq!(events(cb), vec![CmEvent::Established { id: idb }]);
    (ida, idb)
}

// ------------------------------------------------------------------------------------------
// Active side

#[test]
fn connect_sends_req_as_linux_fills_it() {
    let t0 = Instant::now();
    let mut ca = cm_a();
    let id = ca.connect(t0, connect_params()).unwrap();
    assert_eq!(ca.state(id), Some(CmState::ReqSent));
    let m = parse(&sent_one(&mut ca, b()));
    assert_eq!(m.header.transaction_id, 1 << 32 | u64::from(id.0));
    let r = as_req(&m);
    assert_eq!(r.local_comm_id, id.0);
    assert_eq!(r.service_id, SID);
    assert_eq!(r.local_ca_guid, GUID_A);
    assert_eq!(r.local_qpn, QpNum::new(QPN_A));
    assert_eq!(r.starting_psn, Psn::new(PSN_A));
    assert_eq!(r.transport_service_type, Req::TRANSPORT_RC);
    assert_eq!(r.remote_cm_response_timeout, 20);
    assert_eq!(r.local_cm_response_timeout, 20);
    assert_eq!(r.max_cm_retries, 15);
    assert_eq!((r.retry_count, r.rnr_retry_count), (7, 6));
    assert_eq!(r.path_mtu, Some(PathMtu::Mtu1024));
    assert!(r.srq);
    assert_eq!(r.pkey, 0xFFFF);
    let p = r.primary_path;
    assert_eq!((p.local_lid, p.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!((p.local_gid, p.remote_gid), (a(), b()));
    assert_eq!(p.hop_limit, 64);
    assert!(!p.subnet_local);
    assert_eq!(p.local_ack_timeout, 17);
    assert!(!r.alternate_path.is_present());
    assert_eq!(r.private_data[..4], [1, 2, 3, 0]);
    // 2 · conv(16) + conv(20) = 2 · 256 + 4096 ms.
    assert_eq!(ca.next_deadline(), Some(t0 + msec(4608)));
    assert_eq!(ca.len(), 1);
}

#[test]
fn req_is_resent_identically_then_times_out() {
    let t0 = Instant::now();
    let mut cfg = CmConfig::new(a(), GUID_A);
    cfg.max_cm_retries = 2;
    let mut ca = Cm::new(cfg);
    let id = ca.connect(t0, connect_params()).unwrap();
    let req = sent_one(&mut ca, b());
    ca.handle_timeout(t0 + msec(4607));
    assert!(ca.poll_transmit().is_none());
    for k in 1..=2u32 {
        let at = t0 + msec(4608) * k;
        assert_eq!(ca.next_deadline(), Some(at));
        ca.handle_timeout(at);
        ca.handle_timeout(at); // idempotent
        assert_eq!(sent_one(&mut ca, b()), req);
    }
    ca.handle_timeout(t0 + msec(4608 * 3));
    assert!(
        ca.poll_transmit().is_none(),
        "Linux sends nothing on REQ timeout"
    );
    assert_eq!(
        events(&mut ca),
        vec![CmEvent::TimedOut {
            id,
            state: CmState::ReqSent
        }]
    );
    assert_eq!(ca.state(id), None);
    assert_eq!(ca.next_deadline(), None);
    assert_eq!(ca.stats().retransmits, 2);
    assert_eq!(ca.stats().timeouts, 1);
}

#[test]
fn rep_moves_active_to_rep_rcvd_and_rtu_to_established() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let rep = sent_one(&mut cb, a());
    ca.handle_mad(t0 + msec(5), b(), &rep);
    assert_eq!(ca.state(ida), Some(CmState::RepRcvd));
    assert_eq!(ca.next_deadline(), None, "REQ no longer resent");
    let mut pd = [0u8; 196];
    pd[..2].copy_from_slice(&[9, 8]);
    assert_eq!(
        events(&mut ca),
        vec![CmEvent::RepReceived {
            id: ida,
            remote_ca_guid: GUID_B,
            remote_qpn: QpNum::new(QPN_B),
            remote_psn: Psn::new(PSN_B),
            rnr_retry_count: 5,
            private_data: pd,
        }]
    );
    ca.rtu(t0 + msec(6), ida).unwrap();
    let m = parse(&sent_one(&mut ca, b()));
    assert_eq!(m.header.transaction_id, 1 << 32 | u64::from(ida.0));
    let r = as_rtu(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (ida.0, idb.0));
    assert_eq!(ca.state(ida), Some(CmState::Established));
    assert_eq!(events(&mut ca), vec![CmEvent::Established { id: ida }]);
    assert_eq!(
        ca.rtu(t0, ida),
        Err(CmUseError::WrongState(CmState::Established))
    );
}

// ------------------------------------------------------------------------------------------
// Passive side

#[test]
fn req_creates_req_rcvd_and_accept_sends_rep() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let ida = ca.connect(t0, connect_params()).unwrap();
    let req = sent_one(&mut ca, b());
    cb.handle_mad(t0, a(), &req);
    let ev = events(&mut cb);
    let [CmEvent::ReqReceived {
        id: idb,
        peer,
        remote_ca_guid,
        service_id,
        remote_qpn,
        remote_psn,
        path_mtu,
        path,
        retry_count,
        rnr_retry_count,
        private_data,
    }] = ev.as_slice()
    else {
        panic!("{ev:?}")
    };
    let idb = *idb;
    assert_eq!(*peer, a());
    assert_eq!(*remote_ca_guid, GUID_A);
    assert_eq!(*service_id, SID);
    assert_eq!(*remote_qpn, QpNum::new(QPN_A));
    assert_eq!(*remote_psn, Psn::new(PSN_A));
    // RoCE: the passive path is today's address vector back to the peer.
    assert_eq!(path.av(), Path::roce(b(), a(), PathMtu::Mtu1024).av());
    assert_eq!(*path_mtu, PathMtu::Mtu1024);
    assert_eq!((*retry_count, *rnr_retry_count), (7, 6));
    assert_eq!(private_data[..3], [1, 2, 3]);
    assert_eq!(cb.state(idb), Some(CmState::ReqRcvd));
    assert_eq!(cb.next_deadline(), None);

    cb.accept(t0 + msec(1), idb, accept_params()).unwrap();
    assert_eq!(cb.state(idb), Some(CmState::RepSent));
    let m = parse(&sent_one(&mut cb, a()));
    assert_eq!(
        m.header.transaction_id,
        1 << 32 | u64::from(ida.0),
        "echoes REQ TID"
    );
    let r = as_rep(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (idb.0, ida.0));
    assert_eq!(r.local_qpn, QpNum::new(QPN_B));
    assert_eq!(r.starting_psn, Psn::new(PSN_B));
    assert_eq!(r.local_ca_guid, GUID_B);
    assert_eq!(r.rnr_retry_count, 5);
    assert!(!r.srq);
    assert_eq!(r.private_data[..3], [9, 8, 0]);
    // conv(REQ.local_cm_response_timeout = 20).
    assert_eq!(cb.next_deadline(), Some(t0 + msec(1 + 4096)));
}

#[test]
fn rtu_moves_passive_to_established() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    assert_eq!(ca.state(ida), Some(CmState::Established));
    assert_eq!(cb.state(idb), Some(CmState::Established));
    assert_eq!(cb.next_deadline(), None, "REP no longer resent");
    assert_eq!(ca.next_deadline(), None);
}

#[test]
fn rep_is_resent_then_times_out_with_rej_and_timewait() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (_ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let rep = sent_one(&mut cb, a());
    // The REQ asked for 15 retries; the REP is resent at most MAX_PASSIVE_CM_RETRIES times.
    let retries = u32::from(MAX_PASSIVE_CM_RETRIES);
    for k in 1..=retries {
        cb.handle_timeout(t0 + msec(4096) * k);
        assert_eq!(sent_one(&mut cb, a()), rep);
    }
    let end = t0 + msec(4096) * (retries + 1);
    cb.handle_timeout(end);
    let rej = as_rej(&parse(&sent_one(&mut cb, a())));
    assert_eq!(rej.reason, RejReason::Timeout);
    assert_eq!(rej.ari[..8], GUID_B.to_be_bytes());
    assert_eq!(rej.reject_info_len, 8);
    assert_eq!(
        events(&mut cb),
        vec![CmEvent::TimedOut {
            id: idb,
            state: CmState::RepSent
        }]
    );
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    cb.handle_timeout(end + TW);
    assert_eq!(events(&mut cb), vec![CmEvent::TimeWaitExit { id: idb }]);
    assert_eq!(cb.len(), 0);
}

#[test]
fn notify_comm_est_establishes_passive_when_rtu_is_lost() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = rep_delivered(t0, &mut ca, &mut cb);
    ca.rtu(t0, ida).unwrap();
    let _lost = sent_one(&mut ca, b());
    cb.notify_comm_est(t0 + msec(3), idb);
    assert_eq!(cb.state(idb), Some(CmState::Established));
    assert_eq!(events(&mut cb), vec![CmEvent::Established { id: idb }]);
    assert_eq!(cb.next_deadline(), None);
    cb.notify_comm_est(t0 + msec(4), idb); // no-op now
    assert!(events(&mut cb).is_empty());
}

#[test]
fn req_for_unlistened_service_gets_rej_invalid_service_id() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let mut p = connect_params();
    p.service_id = SID + 1;
    let ida = ca.connect(t0, p).unwrap();
    cb.handle_mad(t0, a(), &sent_one(&mut ca, b()));
    assert!(events(&mut cb).is_empty());
    assert_eq!(cb.len(), 0);
    let m = parse(&sent_one(&mut cb, a()));
    assert_eq!(m.header.transaction_id, 1 << 32 | u64::from(ida.0));
    let r = as_rej(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, ida.0));
    assert_eq!(r.msg_rejected, TargetMsg::Req);
    assert_eq!(r.reason, RejReason::InvalidServiceId);
    // A gives up at once.
    ca.handle_mad(t0, b(), &CmMad::new(m.header.transaction_id, m.msg).emit());
    assert_eq!(
        events(&mut ca),
        vec![CmEvent::Rejected {
            id: ida,
            reason: RejReason::InvalidServiceId,
            acceptable_mtu: None
        }]
    );
    assert_eq!(ca.state(ida), None);
}

#[test]
fn listen_mask_matches_prefix() {
    let t0 = Instant::now();
    let mut ca = cm_a();
    let mut cb = Cm::new(CmConfig::new(b(), GUID_B));
    cb.listen(0x1000_0000_0000_0000, 0xFFFF_FFFF_FF00_0000);
    ca.connect(t0, connect_params()).unwrap();
    cb.handle_mad(t0, a(), &sent_one(&mut ca, b()));
    assert!(matches!(
        events(&mut cb).as_slice(),
        [CmEvent::ReqReceived { .. }]
    ));
}

#[test]
fn bad_reqs_are_rejected_with_their_reason() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    let base = Req {
        local_comm_id: 77,
        service_id: SID,
        local_ca_guid: GUID_A,
        local_qpn: QpNum::new(QPN_A),
        path_mtu: Some(PathMtu::Mtu1024),
        primary_path: crate::wire::cm::CmPath {
            local_gid: a(),
            remote_gid: b(),
            ..Default::default()
        },
        ..Req::default()
    };
    let cases = [
        (
            Req {
                transport_service_type: Req::TRANSPORT_UC,
                ..base
            },
            RejReason::InvalidTransportType,
        ),
        (
            Req {
                path_mtu: None,
                ..base
            },
            RejReason::InvalidMtu,
        ),
        (
            Req {
                primary_path: crate::wire::cm::CmPath {
                    remote_gid: x(),
                    ..base.primary_path
                },
                ..base
            },
            RejReason::InvalidGid,
        ),
    ];
    for (req, reason) in cases {
        cb.handle_mad(t0, a(), &mad(5, CmMessage::Req(req)));
        let m = parse(&sent_one(&mut cb, a()));
        assert_eq!(m.header.transaction_id, 5);
        assert_eq!(as_rej(&m).reason, reason);
    }
    assert_eq!(cb.len(), 0);
    assert_eq!(cb.stats().rej_sent, 3);
}

// ------------------------------------------------------------------------------------------
// Duplicates and stale connections

#[test]
fn duplicate_req_in_rep_sent_resends_rep() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (_, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let rep = sent_one(&mut cb, a());
    cb.handle_mad(t0 + msec(10), a(), &req);
    assert_eq!(sent_one(&mut cb, a()), rep);
    assert!(events(&mut cb).is_empty());
    assert_eq!(cb.len(), 1);
    assert_eq!(cb.stats().duplicates, 1);
}

#[test]
fn duplicate_req_when_established_is_ignored_and_no_mad_is_kept() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let rep = sent_one(&mut cb, a());
    ca.handle_mad(t0, b(), &rep);
    let _ = events(&mut ca);
    ca.rtu(t0, ida).unwrap();
    let rtu = sent_one(&mut ca, b());
    cb.handle_mad(t0, a(), &rtu);
    assert_eq!(events(&mut cb), vec![CmEvent::Established { id: idb }]);
    // An idle passive id keeps neither its REP nor a retransmission copy.
    let c = cb.conns.get(&idb.0).unwrap();
    assert!(c.reply.is_none() && c.retx.is_none());
    cb.handle_mad(t0 + msec(10), a(), &req);
    assert!(cb.poll_transmit().is_none());
    assert_eq!(cb.state(idb), Some(CmState::Established));
    assert_eq!(cb.stats().duplicates, 1);
}

#[test]
fn duplicate_req_in_req_rcvd_is_ignored() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (_, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    cb.handle_mad(t0 + msec(10), a(), &req);
    assert!(cb.poll_transmit().is_none());
    assert!(events(&mut cb).is_empty());
    assert_eq!(cb.state(idb), Some(CmState::ReqRcvd));
    assert_eq!(cb.stats().duplicates, 1);
}

#[test]
fn duplicate_req_in_timewait_gets_rej_stale_conn() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let _ = sent_one(&mut cb, a());
    // A rejects the REP; B (RepSent) enters TimeWait.
    cb.handle_mad(
        t0,
        a(),
        &mad(
            1 << 32 | u64::from(ida.0),
            CmMessage::Rej(Rej {
                local_comm_id: ida.0,
                remote_comm_id: idb.0,
                msg_rejected: TargetMsg::Rep,
                reason: RejReason::ConsumerDefined,
                ..Rej::default()
            }),
        ),
    );
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    let _ = events(&mut cb);
    cb.handle_mad(t0 + msec(1), a(), &req);
    let m = parse(&sent_one(&mut cb, a()));
    let r = as_rej(&m);
    assert_eq!(r.reason, RejReason::StaleConn);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, ida.0));
    assert_eq!(m.header.transaction_id, 1 << 32 | u64::from(ida.0));
    assert_eq!(cb.stats().stale_rejected, 1);
}

#[test]
fn req_from_qpn_in_timewait_gets_rej_stale_conn() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    ca.disconnect(t0, ida).unwrap();
    cb.handle_mad(t0, a(), &sent_one(&mut ca, b()));
    ca.handle_mad(t0, b(), &sent_one(&mut cb, a()));
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    // A (new comm id, same CA, same QPN) connects again before B's TimeWait is over.
    let ida2 = ca.connect(t0 + msec(1), connect_params()).unwrap();
    assert_ne!(ida2, ida);
    cb.handle_mad(t0 + msec(1), a(), &sent_one(&mut ca, b()));
    let r = as_rej(&parse(&sent_one(&mut cb, a())));
    assert_eq!(r.reason, RejReason::StaleConn);
    assert_eq!(r.remote_comm_id, ida2.0);
    assert!(!events(&mut cb)
        .iter()
        .any(|e| matches!(e, CmEvent::ReqReceived { .. })));
    // After TimeWait the same REQ is accepted.
    cb.handle_timeout(t0 + TW);
    ca.connect(t0 + TW, connect_params()).unwrap();
    cb.handle_mad(t0 + TW, a(), &sent_one(&mut ca, b()));
    assert!(events(&mut cb)
        .iter()
        .any(|e| matches!(e, CmEvent::ReqReceived { .. })));
}

#[test]
fn duplicate_rep_when_established_resends_rtu() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, _, rep) = rep_delivered(t0, &mut ca, &mut cb);
    ca.handle_mad(t0, b(), &rep); // RepRcvd: ignored
    assert!(ca.poll_transmit().is_none());
    assert_eq!(ca.stats().duplicates, 1);
    ca.rtu(t0, ida).unwrap();
    let rtu = sent_one(&mut ca, b());
    let _ = events(&mut ca);
    ca.handle_mad(t0 + msec(4096), b(), &rep);
    assert_eq!(sent_one(&mut ca, b()), rtu);
    assert!(events(&mut ca).is_empty());
    assert_eq!(ca.stats().duplicates, 2);
}

#[test]
fn rtu_in_wrong_state_is_counted_and_ignored() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    let rtu = mad(
        1 << 32 | u64::from(ida.0),
        CmMessage::Rtu(Rtu {
            local_comm_id: ida.0,
            remote_comm_id: idb.0,
            ..Rtu::default()
        }),
    );
    cb.handle_mad(t0, a(), &rtu);
    assert!(cb.poll_transmit().is_none());
    assert!(events(&mut cb).is_empty());
    assert_eq!(cb.state(idb), Some(CmState::Established));
    assert_eq!(cb.stats().duplicates, 1);
}

// ------------------------------------------------------------------------------------------
// Disconnect

#[test]
fn disconnect_dreq_drep_timewait_exit() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    ca.disconnect(t0 + msec(10), ida).unwrap();
    assert_eq!(ca.state(ida), Some(CmState::DreqSent));
    let dreq_bytes = sent_one(&mut ca, b());
    let m = parse(&dreq_bytes);
    assert_eq!(m.header.transaction_id, 1 << 32 | u64::from(ida.0));
    let d = as_dreq(&m);
    assert_eq!((d.local_comm_id, d.remote_comm_id), (ida.0, idb.0));
    assert_eq!(d.remote_qpn, QpNum::new(QPN_B));
    assert_eq!(ca.next_deadline(), Some(t0 + msec(10 + 4608)));

    cb.handle_mad(t0 + msec(11), a(), &dreq_bytes);
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    assert_eq!(
        events(&mut cb),
        vec![CmEvent::DisconnectReceived { id: idb }]
    );
    let drep_bytes = sent_one(&mut cb, a());
    let m = parse(&drep_bytes);
    assert_eq!(
        m.header.transaction_id,
        1 << 32 | u64::from(ida.0),
        "echoes DREQ TID"
    );
    let r = as_drep(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (idb.0, ida.0));

    ca.handle_mad(t0 + msec(12), b(), &drep_bytes);
    assert_eq!(ca.state(ida), Some(CmState::TimeWait));
    assert_eq!(events(&mut ca), vec![CmEvent::Disconnected { id: ida }]);
    assert_eq!(ca.next_deadline(), Some(t0 + msec(12) + TW));
    ca.handle_mad(t0 + msec(13), b(), &drep_bytes); // duplicate DREP
    assert_eq!(ca.stats().duplicates, 1);
    ca.handle_timeout(t0 + msec(12) + TW);
    assert_eq!(events(&mut ca), vec![CmEvent::TimeWaitExit { id: ida }]);
    assert_eq!(ca.state(ida), None);
    cb.handle_timeout(t0 + msec(11) + TW);
    assert_eq!(events(&mut cb), vec![CmEvent::TimeWaitExit { id: idb }]);
    assert_eq!((ca.len(), cb.len()), (0, 0));
}

#[test]
fn duplicate_dreq_in_timewait_resends_drep() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    ca.disconnect(t0, ida).unwrap();
    let dreq = sent_one(&mut ca, b());
    cb.handle_mad(t0, a(), &dreq);
    let drep = sent_one(&mut cb, a());
    cb.handle_mad(t0 + msec(4608), a(), &dreq);
    assert_eq!(sent_one(&mut cb, a()), drep);
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    assert_eq!(cb.stats().duplicates, 1);
}

#[test]
fn dreq_for_unknown_id_gets_drep_anyway() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    let dreq = Dreq {
        local_comm_id: 0x1234,
        remote_comm_id: 0x5678,
        remote_qpn: QpNum::new(9),
        ..Dreq::default()
    };
    cb.handle_mad(t0, x(), &mad(0xDEAD, CmMessage::Dreq(dreq)));
    let m = parse(&sent_one(&mut cb, x()));
    assert_eq!(m.header.transaction_id, 0xDEAD);
    let r = as_drep(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0x5678, 0x1234));
    assert_eq!(cb.stats().unknown_dreq_answered, 1);
    assert_eq!(cb.len(), 0);
}

#[test]
fn dreq_retries_exhausted_enters_timewait() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, _) = established(t0, &mut ca, &mut cb);
    ca.disconnect(t0, ida).unwrap();
    let dreq = sent_one(&mut ca, b());
    for k in 1..=15u32 {
        ca.handle_timeout(t0 + msec(4608) * k);
        assert_eq!(sent_one(&mut ca, b()), dreq);
    }
    let end = t0 + msec(4608) * 16;
    ca.handle_timeout(end);
    assert!(ca.poll_transmit().is_none());
    assert_eq!(events(&mut ca), vec![CmEvent::Disconnected { id: ida }]);
    assert_eq!(ca.state(ida), Some(CmState::TimeWait));
    ca.handle_timeout(end + TW);
    assert_eq!(events(&mut ca), vec![CmEvent::TimeWaitExit { id: ida }]);
}

#[test]
fn crossing_dreqs_converge_to_timewait() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    ca.disconnect(t0, ida).unwrap();
    cb.disconnect(t0, idb).unwrap();
    let dreq_a = sent_one(&mut ca, b());
    let dreq_b = sent_one(&mut cb, a());
    ca.handle_mad(t0 + msec(1), b(), &dreq_b);
    cb.handle_mad(t0 + msec(1), a(), &dreq_a);
    assert_eq!(ca.state(ida), Some(CmState::TimeWait));
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    assert_eq!(events(&mut ca), vec![CmEvent::Disconnected { id: ida }]);
    assert_eq!(events(&mut cb), vec![CmEvent::Disconnected { id: idb }]);
    // The DREPs cross too and are duplicates now.
    let drep_a = sent_one(&mut ca, b());
    let drep_b = sent_one(&mut cb, a());
    ca.handle_mad(t0 + msec(2), b(), &drep_b);
    cb.handle_mad(t0 + msec(2), a(), &drep_a);
    assert!(ca.poll_transmit().is_none() && cb.poll_transmit().is_none());
    assert_eq!(ca.next_deadline(), Some(t0 + msec(1) + TW));
}

#[test]
fn disconnect_before_rep_sends_rej_timeout_and_frees() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    ca.disconnect(t0, ida).unwrap();
    assert_eq!(ca.state(ida), None);
    let rej_bytes = sent_one(&mut ca, b());
    let r = as_rej(&parse(&rej_bytes));
    assert_eq!(r.reason, RejReason::Timeout);
    assert_eq!(r.msg_rejected, TargetMsg::Other);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (ida.0, 0));
    assert_eq!(r.ari[..8], GUID_A.to_be_bytes());
    // B finds its id by (CA GUID in the ARI, A's comm id).
    cb.handle_mad(t0, a(), &rej_bytes);
    assert_eq!(
        events(&mut cb),
        vec![CmEvent::Rejected {
            id: idb,
            reason: RejReason::Timeout,
            acceptable_mtu: None
        }]
    );
    assert_eq!(cb.state(idb), None);
}

// ------------------------------------------------------------------------------------------
// REJ and MRA

#[test]
fn owner_reject_in_req_rcvd_sends_rej_and_frees() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    cb.reject(t0, idb, RejReason::NoQp).unwrap();
    assert_eq!(cb.state(idb), None);
    let m = parse(&sent_one(&mut cb, a()));
    assert_eq!(m.header.transaction_id, 1 << 32 | u64::from(ida.0));
    let r = as_rej(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, ida.0));
    assert_eq!(r.msg_rejected, TargetMsg::Req);
    ca.handle_mad(t0, b(), &m.emit());
    assert_eq!(
        events(&mut ca),
        vec![CmEvent::Rejected {
            id: ida,
            reason: RejReason::NoQp,
            acceptable_mtu: None
        }]
    );
    assert_eq!(ca.state(ida), None);
    assert_eq!(ca.next_deadline(), None);
}

/// A REQ whose path MTU is too large is refused with REJ 26 (invalid path MTU) naming, in a
/// one-byte ARI, the largest MTU the rejecter accepts; the requester's event carries it.
#[test]
fn reject_mtu_names_the_acceptable_mtu_in_the_ari() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    cb.reject_mtu(t0, idb, PathMtu::Mtu1024).unwrap();
    assert_eq!(cb.state(idb), None);
    let m = parse(&sent_one(&mut cb, a()));
    let r = as_rej(&m);
    assert_eq!(r.reason, RejReason::InvalidMtu);
    assert_eq!(r.reason.code(), 26);
    assert_eq!((r.reject_info_len, r.ari[0]), (1, 3));
    assert_eq!(r.acceptable_mtu(), Some(PathMtu::Mtu1024));
    ca.handle_mad(t0, b(), &m.emit());
    assert_eq!(
        events(&mut ca),
        vec![CmEvent::Rejected {
            id: ida,
            reason: RejReason::InvalidMtu,
            acceptable_mtu: Some(PathMtu::Mtu1024)
        }]
    );
    assert_eq!(ca.state(ida), None);
}

#[test]
fn owner_reject_of_rep_frees_active_and_sends_passive_to_timewait() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = rep_delivered(t0, &mut ca, &mut cb);
    ca.reject(t0, ida, RejReason::ConsumerDefined).unwrap();
    assert_eq!(ca.state(ida), None);
    let m = parse(&sent_one(&mut ca, b()));
    let r = as_rej(&m);
    assert_eq!((r.local_comm_id, r.remote_comm_id), (ida.0, idb.0));
    assert_eq!(r.msg_rejected, TargetMsg::Rep);
    cb.handle_mad(t0, a(), &m.emit());
    assert_eq!(cb.state(idb), Some(CmState::TimeWait));
    assert_eq!(
        events(&mut cb),
        vec![CmEvent::Rejected {
            id: idb,
            reason: RejReason::ConsumerDefined,
            acceptable_mtu: None
        }]
    );
    assert_eq!(cb.next_deadline(), Some(t0 + TW));
}

#[test]
fn rej_when_established_enters_timewait() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    let rej = Rej {
        local_comm_id: idb.0,
        remote_comm_id: ida.0,
        msg_rejected: TargetMsg::Other,
        reason: RejReason::Timeout,
        ..Rej::default()
    };
    ca.handle_mad(t0, b(), &mad(7, CmMessage::Rej(rej)));
    assert_eq!(ca.state(ida), Some(CmState::TimeWait));
    assert_eq!(
        events(&mut ca),
        vec![CmEvent::Rejected {
            id: ida,
            reason: RejReason::Timeout,
            acceptable_mtu: None
        }]
    );
}

#[test]
fn owner_api_errors() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let mut p = connect_params();
    p.private_data = vec![0; 93];
    assert_eq!(ca.connect(t0, p), Err(CmUseError::PrivateDataTooLong));
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    let mut ap = accept_params();
    ap.private_data = vec![0; 197];
    assert_eq!(cb.accept(t0, idb, ap), Err(CmUseError::PrivateDataTooLong));
    assert_eq!(cb.state(idb), Some(CmState::ReqRcvd));
    assert_eq!(
        cb.accept(t0, CommId(999), accept_params()),
        Err(CmUseError::NoSuchId)
    );
    assert_eq!(
        ca.accept(t0, ida, accept_params()),
        Err(CmUseError::WrongState(CmState::ReqSent))
    );
    assert_eq!(
        ca.rtu(t0, ida),
        Err(CmUseError::WrongState(CmState::ReqSent))
    );
    assert_eq!(ca.disconnect(t0, CommId(999)), Err(CmUseError::NoSuchId));
    cb.accept(t0, idb, accept_params()).unwrap();
    ca.handle_mad(t0, b(), &sent_one(&mut cb, a()));
    ca.rtu(t0, ida).unwrap();
    assert_eq!(
        ca.reject(t0, ida, RejReason::NoQp),
        Err(CmUseError::WrongState(CmState::Established))
    );
}

/// A gets B's MRA of A's REQ with `service_timeout`.
fn mra_of_req(ca: &mut Cm, at: Instant, ida: CommId, idb: CommId, service_timeout: u8) {
    let mra = Mra {
        local_comm_id: idb.0,
        remote_comm_id: ida.0,
        msg_mraed: TargetMsg::Req,
        service_timeout,
        ..Mra::default()
    };
    ca.handle_mad(
        at,
        b(),
        &mad(1 << 32 | u64::from(ida.0), CmMessage::Mra(mra)),
    );
}

#[test]
fn mra_extends_the_req_timeout() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    mra_of_req(&mut ca, t0 + msec(100), ida, idb, 24);
    assert_eq!(ca.state(ida), Some(CmState::MraReqRcvd));
    assert_eq!(ca.stats().mra_received, 1);
    // conv(24) + conv(av.timeout = 16 + 1) = 65536 + 512 ms.
    let at = t0 + msec(100 + 65536 + 512);
    assert_eq!(ca.next_deadline(), Some(at));
    ca.handle_timeout(t0 + msec(4608));
    assert!(ca.poll_transmit().is_none());
    ca.handle_timeout(at);
    assert_eq!(sent_one(&mut ca, b()), req);
    assert_eq!(ca.next_deadline(), Some(at + msec(65536 + 512)));
    // A REP still completes the exchange.
    cb.accept(at, idb, accept_params()).unwrap();
    ca.handle_mad(at, b(), &sent_one(&mut cb, a()));
    assert_eq!(ca.state(ida), Some(CmState::RepRcvd));
}

/// The kernel's rdma_cm arms a delayed MRA (`CMA_CM_MRA_SETTING`: service timeout 24) when
/// its user has not accepted a REQ by the time its handler returns, and sends it only on a
/// duplicate REQ (`cm_dup_req_handler`, state MRA_REQ_SENT). A passive user that accepts 3 s
/// later: our REQ times out (conv(17) + conv(17)), is resent, draws the MRA; no REQ goes out
/// while the MRA holds; the late REP then completes the connection.
#[test]
fn the_kernels_delayed_mra_holds_our_req_until_a_late_rep() {
    let t0 = Instant::now();
    let mut ca = cm_a_with(|c| c.cm_response_timeout = 17);
    let mut cb = cm_b();
    let (ida, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    let first = ca.next_deadline().expect("the REQ's timer");
    assert!(first - t0 < msec(1100), "{:?}", first - t0);
    ca.handle_timeout(first);
    assert_eq!(sent_one(&mut ca, b()), req, "the REQ is resent");
    assert_eq!(ca.stats().retransmits, 1);
    // The kernel answers the duplicate with its MRA (service timeout 24).
    let t1 = first + msec(5);
    mra_of_req(&mut ca, t1, ida, idb, 24);
    assert_eq!(ca.state(ida), Some(CmState::MraReqRcvd));
    assert_eq!(ca.stats().mra_received, 1);
    // Nothing is resent and nothing times out while the user makes us wait (the MRA holds
    // for conv(24) + conv(17), about 69 s).
    assert!(ca.next_deadline().unwrap() - t1 > msec(65_000));
    for n in 1..=20 {
        ca.handle_timeout(t1 + msec(n * 100));
        assert!(ca.poll_transmit().is_none(), "a MAD {n}00 ms after the MRA");
        assert!(
            events(&mut ca).is_empty(),
            "an event {n}00 ms after the MRA"
        );
    }
    // The REP comes 3 s after the first REQ: A takes it and the RTU completes.
    let t2 = t0 + msec(3000);
    cb.accept(t2, idb, accept_params()).unwrap();
    ca.handle_mad(t2, b(), &sent_one(&mut cb, a()));
    assert!(matches!(
        events(&mut ca).as_slice(),
        [CmEvent::RepReceived { .. }]
    ));
    ca.rtu(t2, ida).unwrap();
    cb.handle_mad(t2, a(), &sent_one(&mut ca, b()));
    assert_eq!(ca.state(ida), Some(CmState::Established));
    assert_eq!(cb.state(idb), Some(CmState::Established));
}

#[test]
fn mra_extends_the_rep_timeout() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let _ = sent_one(&mut cb, a());
    let mra = Mra {
        local_comm_id: ida.0,
        remote_comm_id: idb.0,
        msg_mraed: TargetMsg::Rep,
        service_timeout: 20,
        ..Mra::default()
    };
    cb.handle_mad(t0, a(), &mad(1, CmMessage::Mra(mra)));
    assert_eq!(cb.state(idb), Some(CmState::MraRepRcvd));
    // conv(20) + conv(REQ local ACK timeout 17).
    assert_eq!(cb.next_deadline(), Some(t0 + msec(4096 + 512)));
    // An MRA of the wrong message is unexpected.
    let wrong = Mra {
        msg_mraed: TargetMsg::Req,
        ..mra
    };
    cb.handle_mad(t0, a(), &mad(1, CmMessage::Mra(wrong)));
    assert_eq!(cb.stats().dropped_unexpected, 1);
}

// ------------------------------------------------------------------------------------------
// Malformed, unknown and spoofed MADs

#[test]
fn malformed_and_unknown_mads_are_counted() {
    let t0 = Instant::now();
    let mut ca = cm_a();
    ca.handle_mad(t0, b(), &[1, 2, 3]);
    ca.handle_mad(t0, b(), &[0u8; 256]);
    let rep = Rep {
        local_comm_id: 1,
        remote_comm_id: 424_242,
        ..Rep::default()
    };
    ca.handle_mad(t0, b(), &mad(1, CmMessage::Rep(rep)));
    let s = ca.stats();
    assert_eq!(
        (s.mads_received, s.dropped_malformed, s.dropped_unknown),
        (3, 2, 1)
    );
    assert!(ca.poll_transmit().is_none());
}

#[test]
fn spoofed_mads_change_nothing() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb, _) = req_delivered(t0, &mut ca, &mut cb);
    // A REP for A's id from a third GID.
    let rep = Rep {
        local_comm_id: 5,
        remote_comm_id: ida.0,
        local_qpn: QpNum::new(3),
        ..Rep::default()
    };
    ca.handle_mad(
        t0,
        x(),
        &mad(1 << 32 | u64::from(ida.0), CmMessage::Rep(rep)),
    );
    assert_eq!(ca.state(ida), Some(CmState::ReqSent));
    cb.accept(t0, idb, accept_params()).unwrap();
    ca.handle_mad(t0, b(), &sent_one(&mut cb, a()));
    ca.rtu(t0, ida).unwrap();
    cb.handle_mad(t0, a(), &sent_one(&mut ca, b()));
    let _ = (events(&mut ca), events(&mut cb));

    let good = Dreq {
        local_comm_id: idb.0,
        remote_comm_id: ida.0,
        remote_qpn: QpNum::new(QPN_A),
        ..Dreq::default()
    };
    let forged = [
        (x(), good),
        (
            b(),
            Dreq {
                remote_qpn: QpNum::new(QPN_A + 1),
                ..good
            },
        ),
        (
            b(),
            Dreq {
                local_comm_id: idb.0 + 1,
                ..good
            },
        ),
    ];
    for (from, d) in forged {
        ca.handle_mad(t0, from, &mad(9, CmMessage::Dreq(d)));
    }
    let rej = Rej {
        local_comm_id: idb.0,
        remote_comm_id: ida.0,
        msg_rejected: TargetMsg::Other,
        reason: RejReason::ConsumerDefined,
        ..Rej::default()
    };
    ca.handle_mad(t0, x(), &mad(9, CmMessage::Rej(rej)));
    let drep = Drep {
        local_comm_id: idb.0,
        remote_comm_id: ida.0,
        ..Drep::default()
    };
    ca.handle_mad(t0, x(), &mad(9, CmMessage::Drep(drep)));
    assert_eq!(ca.state(ida), Some(CmState::Established));
    assert!(ca.poll_transmit().is_none());
    assert!(events(&mut ca).is_empty());
    assert_eq!(ca.stats().dropped_spoofed, 6);
    // The genuine DREQ still works.
    ca.handle_mad(t0, b(), &mad(9, CmMessage::Dreq(good)));
    assert_eq!(ca.state(ida), Some(CmState::TimeWait));
}

#[test]
fn duplicate_req_from_another_gid_is_spoofed() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (_, idb, req) = req_delivered(t0, &mut ca, &mut cb);
    cb.accept(t0, idb, accept_params()).unwrap();
    let _ = sent_one(&mut cb, a());
    cb.handle_mad(t0, x(), &req);
    assert!(cb.poll_transmit().is_none());
    assert_eq!(cb.stats().dropped_spoofed, 1);
}

#[test]
fn drained_queues_give_back_a_burst() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let burst = 4 * QUEUE_KEEP;
    // One source's burst of REQs, all admitted.
    cb.cfg.req_rate_limit.burst = burst as u32;
    for k in 0..burst as u32 {
        // One QP per connection (a second REQ naming a QP in use would be stale).
        let mut p = connect_params();
        p.local_qpn = QpNum::new(QPN_A + k);
        ca.connect(t0, p).unwrap();
    }
    let mut reqs = Vec::new();
    while let Some((_, m)) = ca.poll_transmit() {
        reqs.push(m);
    }
    assert_eq!(reqs.len(), burst);
    assert!(ca.tx.capacity() < burst, "{}", ca.tx.capacity());
    for m in &reqs {
        cb.handle_mad(t0, a(), m);
    }
    assert_eq!(events(&mut cb).len(), burst);
    assert!(cb.events.capacity() < burst, "{}", cb.events.capacity());
}

#[test]
fn comm_id_seed_changes_ids_and_ids_skip_zero() {
    let t0 = Instant::now();
    let mut cfg = CmConfig::new(a(), GUID_A);
    cfg.comm_id_seed = 1;
    let mut ca = Cm::new(cfg);
    let id = ca.connect(t0, connect_params()).unwrap();
    assert_ne!(id.0, 0);
    assert_eq!(id, CommId(2 ^ 1));
}

#[test]
fn default_config_matches_rdma_cm() {
    let c = CmConfig::new(a(), GUID_A);
    assert_eq!(
        (c.cm_response_timeout, c.max_cm_retries, c.packet_life_time),
        (20, 15, 16)
    );
    assert_eq!(c.timewait, msec(512));
    assert_eq!(c.req_timeout(), msec(4608));
    assert_eq!(cm_ack_timeout(15, 16), 17);
    assert_eq!(cm_ack_timeout(15, 0), 15);
}

// ------------------------------------------------------------------------------------------
// Properties

fn arb_msg() -> impl Strategy<Value = CmMessage> {
    // Small id and QPN ranges so that random MADs do hit live ids.
    let id = 0u32..6;
    let qpn = (0u32..4).prop_map(QpNum::new);
    prop_oneof![
        (id.clone(), 0u64..3, qpn.clone(), 0u8..3, any::<bool>()).prop_map(
            |(i, g, q, sid, gid_ok)| {
                CmMessage::Req(Req {
                    local_comm_id: i,
                    local_ca_guid: g,
                    local_qpn: q,
                    service_id: SID + u64::from(sid),
                    path_mtu: Some(PathMtu::Mtu1024),
                    max_cm_retries: 2,
                    primary_path: crate::wire::cm::CmPath {
                        remote_gid: if gid_ok { b() } else { a() },
                        ..Default::default()
                    },
                    ..Req::default()
                })
            }
        ),
        (id.clone(), id.clone(), 0u8..3, 0u8..31).prop_map(|(l, r, t, s)| {
            CmMessage::Mra(Mra {
                local_comm_id: l,
                remote_comm_id: r,
                msg_mraed: TargetMsg::from_bits(t),
                service_timeout: s,
                ..Mra::default()
            })
        }),
        (id.clone(), id.clone(), 0u8..3, 0u16..40).prop_map(|(l, r, t, c)| {
            CmMessage::Rej(Rej {
                local_comm_id: l,
                remote_comm_id: r,
                msg_rejected: TargetMsg::from_bits(t),
                reason: RejReason::from_code(c),
                ..Rej::default()
            })
        }),
        (id.clone(), id.clone(), qpn.clone()).prop_map(|(l, r, q)| {
            CmMessage::Rep(Rep {
                local_comm_id: l,
                remote_comm_id: r,
                local_qpn: q,
                ..Rep::default()
            })
        }),
        (id.clone(), id.clone()).prop_map(|(l, r)| CmMessage::Rtu(Rtu {
            local_comm_id: l,
            remote_comm_id: r,
            ..Rtu::default()
        })),
        (id.clone(), id.clone(), qpn).prop_map(|(l, r, q)| CmMessage::Dreq(Dreq {
            local_comm_id: l,
            remote_comm_id: r,
            remote_qpn: q,
            ..Dreq::default()
        })),
        (id.clone(), id).prop_map(|(l, r)| CmMessage::Drep(Drep {
            local_comm_id: l,
            remote_comm_id: r,
            ..Drep::default()
        })),
    ]
}

/// An input to a CM under test.
#[derive(Debug, Clone)]
enum Step {
    Mad(u8, Box<CmMessage>),
    Bytes(Vec<u8>),
    Wait(u64),
    Owner(u8, u32),
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => ((1u8..4), arb_msg()).prop_map(|(g, m)| Step::Mad(g, Box::new(m))),
        1 => prop::collection::vec(any::<u8>(), 0..300).prop_map(Step::Bytes),
        2 => (0u64..70_000).prop_map(Step::Wait),
        3 => ((0u8..7), (0u32..6)).prop_map(|(op, id)| Step::Owner(op, id)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bufs in prop::collection::vec(
        prop::collection::vec(any::<u8>(), 0..300), 1..20)) {
        let t0 = Instant::now();
        let mut cb = cm_b();
        for (i, buf) in bufs.iter().enumerate() {
            // Keep the CM header valid half the time, so the message parsers get exercised.
            let mut buf = buf.clone();
            if i % 2 == 0 && buf.len() >= 24 {
                buf[..4].copy_from_slice(&[1, 7, 2, 3]);
                buf[16] = 0;
                buf[17] = 0x10 + (buf[17] % 7);
            }
            cb.handle_mad(t0, a(), &buf);
        }
        prop_assert!(cb.len() <= bufs.len());
        prop_assert_eq!(cb.stats().mads_received, bufs.len() as u64);
    }

    #[test]
    fn random_mad_scripts_never_panic_and_stay_bounded(
        steps in prop::collection::vec(arb_step(), 1..60)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut cb = cm_b();
        let mut reqs = 0usize;
        let mut connects = 0usize;
        for s in steps {
            match s {
                Step::Mad(g, m) => {
                    reqs += usize::from(matches!(*m, CmMessage::Req(_)));
                    cb.handle_mad(now, gid(g), &mad(7, *m));
                }
                Step::Bytes(b) => cb.handle_mad(now, a(), &b),
                Step::Wait(ms) => {
                    now += Duration::from_millis(ms);
                    cb.handle_timeout(now);
                }
                Step::Owner(op, id) => {
                    let id = CommId(id);
                    let _ = match op {
                        0 => cb.accept(now, id, accept_params()),
                        1 => cb.reject(now, id, RejReason::NoQp),
                        2 => cb.rtu(now, id),
                        3 => cb.disconnect(now, id),
                        4 => { cb.notify_comm_est(now, id); Ok(()) }
                        5 => { connects += 1; let mut p = connect_params(); p.peer = a(); cb.connect(now, p).map(|_| ()) }
                        _ => { cb.handle_timeout(now); Ok(()) }
                    };
                }
            }
            while cb.poll_transmit().is_some() {}
            while cb.poll_event().is_some() {}
            prop_assert!(cb.len() <= reqs + connects);
            // After handle_timeout, nothing is due any more.
            cb.handle_timeout(now);
            prop_assert!(cb.next_deadline().is_none_or(|t| t > now));
        }
        // Everything ends: after long enough, every id is gone.
        for _ in 0..100_000 {
            match cb.next_deadline() {
                Some(at) => cb.handle_timeout(at),
                None => break,
            }
            while cb.poll_transmit().is_some() {}
        }
        // Ids in ReqRcvd or Established wait for the owner/peer and have no timer.
        prop_assert!(cb.next_deadline().is_none());
    }
}

mod admission;
mod paths;
mod route;
