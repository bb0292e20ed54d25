//! What a REQ may cost: the per-source rate limit, the clamped REP retries and timeout, the
//! id cap, and a property test of those bounds over arbitrary REQ streams.

use std::collections::BTreeMap;

use super::*;
use crate::cm::admission::{MAX_MRA_TIMEOUT_EXP, MAX_REQ_SOURCES};
use crate::wire::cm::CmPath;

/// A REQ for B's service from `from` (its GID also the REQ's Primary Local Port GID).
fn req_from(from: Gid, comm_id: u32, response_timeout: u8, retries: u8) -> [u8; 256] {
    let req = Req {
        local_comm_id: comm_id,
        service_id: SID,
        local_ca_guid: 0xF00D_0000_0000_0000 | u64::from(comm_id),
        local_qpn: QpNum::new(0x100 + (comm_id & 0xFFFF)),
        transport_service_type: Req::TRANSPORT_RC,
        starting_psn: Psn::new(7),
        local_cm_response_timeout: response_timeout,
        remote_cm_response_timeout: response_timeout,
        path_mtu: Some(PathMtu::Mtu1024),
        max_cm_retries: retries,
        primary_path: CmPath {
            local_gid: from,
            remote_gid: b(),
            local_ack_timeout: 17,
            ..CmPath::default()
        },
        ..Req::default()
    };
    mad(u64::from(comm_id), CmMessage::Req(req))
}

/// Every MAD queued, with its destination.
fn drain(cm: &mut Cm) -> Vec<(Gid, [u8; 256])> {
    std::iter::from_fn(|| cm.poll_transmit()).collect()
}

/// Accepts every delivered REQ, as the endpoint does.
fn accept_all(now: Instant, cm: &mut Cm) -> usize {
    let mut n = 0;
    for e in events(cm) {
        if let CmEvent::ReqReceived { id, .. } = e {
            cm.accept(now, id, accept_params()).unwrap();
            n += 1;
        }
    }
    n
}

#[test]
fn a_req_asking_for_15_fast_retries_draws_at_most_max_mads_per_req() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    // 4.096 us * 2^3 and 15 retries: 17 MADs within 16 ms before the clamp.
    cb.handle_mad(t0, x(), &req_from(x(), 9, 3, 15));
    assert_eq!(accept_all(t0, &mut cb), 1);
    assert_eq!(cb.stats().req_retx_clamped, 1);
    let mut sent = drain(&mut cb);
    assert_eq!(sent.len(), 1, "the REP");
    // The interval is at least conv(14) = 64 ms.
    cb.handle_timeout(t0 + msec(63));
    assert!(drain(&mut cb).is_empty(), "resent before 64 ms");
    let mut now = t0;
    for _ in 0..100 {
        let Some(at) = cb.next_deadline() else { break };
        now = at;
        cb.handle_timeout(now);
        sent.extend(drain(&mut cb));
        if cb.is_empty() {
            break;
        }
    }
    assert!(cb.is_empty(), "the id is freed after TimeWait");
    assert!(sent.iter().all(|(g, _)| *g == x()));
    assert_eq!(sent.len() as u64, MAX_MADS_PER_REQ);
    let reps = sent
        .iter()
        .filter(|(_, m)| matches!(parse(m).msg, CmMessage::Rep(_)))
        .count();
    assert_eq!(reps, 1 + usize::from(MAX_PASSIVE_CM_RETRIES));
    let last = sent.last().map(|(_, m)| as_rej(&parse(m)).reason);
    assert_eq!(last, Some(RejReason::Timeout));
    // REP, 3 resends 64 ms apart, the REJ 64 ms later, TimeWait.
    assert_eq!(
        now,
        t0 + msec(64) * (u32::from(MAX_PASSIVE_CM_RETRIES) + 1) + TW
    );
}

#[test]
fn a_req_asking_for_a_huge_response_timeout_is_resent_within_4096_ms() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    cb.handle_mad(t0, x(), &req_from(x(), 9, 31, 2));
    accept_all(t0, &mut cb);
    assert_eq!(cb.next_deadline(), Some(t0 + msec(4096)));
    assert_eq!(cb.stats().req_retx_clamped, 1);
    // Within the bounds nothing is clamped.
    cb.handle_mad(t0, x(), &req_from(x(), 10, 17, 3));
    accept_all(t0, &mut cb);
    assert_eq!(cb.stats().req_retx_clamped, 1);
}

#[test]
fn an_mra_extends_a_wait_by_at_most_twice_conv_24() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    cb.handle_mad(t0, x(), &req_from(x(), 9, 20, 3));
    accept_all(t0, &mut cb);
    let rep = as_rep(&parse(&drain(&mut cb)[0].1));
    let mra = Mra {
        local_comm_id: 9,
        remote_comm_id: rep.local_comm_id,
        msg_mraed: TargetMsg::Rep,
        service_timeout: 31,
        ..Mra::default()
    };
    cb.handle_mad(t0, x(), &mad(9, CmMessage::Mra(mra)));
    assert_eq!(
        cb.state(CommId(rep.local_comm_id)),
        Some(CmState::MraRepRcvd)
    );
    let conv = cm_timeout_ms(MAX_MRA_TIMEOUT_EXP);
    // conv(24) + conv(REQ local ACK timeout 17).
    assert_eq!(cb.next_deadline(), Some(t0 + msec(conv + 512)));
}

#[test]
fn reqs_beyond_a_sources_bucket_are_dropped_unanswered_and_counted() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    let limit = ReqRateLimit::default();
    for k in 0..limit.burst + 10 {
        cb.handle_mad(t0, x(), &req_from(x(), 100 + k, 17, 3));
    }
    assert_eq!(events(&mut cb).len(), limit.burst as usize);
    assert_eq!(cb.stats().req_rate_limited, 10);
    assert!(drain(&mut cb).is_empty(), "a dropped REQ draws nothing");
    // Another source has its own bucket.
    cb.handle_mad(t0, a(), &req_from(a(), 1, 17, 3));
    assert_eq!(events(&mut cb).len(), 1, "{:?}", cb.stats());
    // The bucket refills at per_second.
    let later = t0 + Duration::from_secs(1) / limit.per_second;
    cb.handle_mad(later, x(), &req_from(x(), 500, 17, 3));
    cb.handle_mad(later, x(), &req_from(x(), 501, 17, 3));
    assert_eq!(events(&mut cb).len(), 1);
    assert_eq!(cb.stats().req_rate_limited, 11);
    // Duplicates spend tokens too: a REQ resent in a loop draws at most the bucket's REPs.
    let t1 = t0 + Duration::from_secs(10);
    let dup = req_from(a(), 2, 17, 3);
    cb.handle_mad(t1, a(), &dup);
    accept_all(t1, &mut cb);
    drain(&mut cb);
    for _ in 0..1000 {
        cb.handle_mad(t1, a(), &dup);
    }
    assert_eq!(drain(&mut cb).len(), limit.burst as usize - 1);
}

#[test]
fn the_rate_limiter_tracks_at_most_max_req_sources() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    let n = MAX_REQ_SOURCES + 500;
    for k in 0..n {
        let g = Gid::from(Ipv4Addr::from(0x0A00_0000 + k as u32));
        // Rejected (wrong remote GID), so no id is kept: only the limiter's table grows.
        let mut m = req_from(g, k as u32 + 1, 17, 3);
        m[24 + 52 + 20] ^= 0xFF;
        cb.handle_mad(t0, g, &m);
    }
    assert_eq!(cb.limiter.len(), MAX_REQ_SOURCES);
    assert_eq!(cb.stats().req_sources_evicted, 500);
    assert!(cb.is_empty());
}

#[test]
fn duplicate_reqs_find_their_id_and_make_no_state() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    for k in 0..20 {
        cb.handle_mad(t0, a(), &req_from(a(), 1000 + k, 17, 3));
    }
    accept_all(t0, &mut cb);
    drain(&mut cb);
    let before = cb.len();
    for k in 0..20 {
        cb.handle_mad(t0 + msec(1), x(), &req_from(x(), 1000 + k, 17, 3));
    }
    // Same (CA GUID, comm id) from another GID: spoofed, dropped; from the peer: the REP.
    assert_eq!(cb.stats().dropped_spoofed, 20);
    cb.handle_mad(t0 + msec(2), a(), &req_from(a(), 1005, 17, 3));
    assert_eq!(drain(&mut cb).len(), 1);
    assert_eq!(cb.len(), before);
    assert_eq!(cb.index.len(), (before, before));
}

#[test]
fn the_id_table_cap_is_counted() {
    let t0 = Instant::now();
    let mut cb = cm_b();
    cb.cfg.req_rate_limit.burst = u32::MAX;
    for k in 0..MAX_LIVE_IDS as u32 + 3 {
        cb.handle_mad(t0, a(), &req_from(a(), k + 1, 17, 3));
        let _ = events(&mut cb);
    }
    assert_eq!(cb.len(), MAX_LIVE_IDS);
    assert_eq!(cb.stats().ids_exhausted, 3);
    let rejs: Vec<_> = drain(&mut cb)
        .iter()
        .map(|(_, m)| as_rej(&parse(m)).reason)
        .collect();
    assert_eq!(rejs, vec![RejReason::NoResources; 3]);
    let mut p = connect_params();
    p.peer = a();
    assert_eq!(cb.connect(t0, p), Err(CmUseError::NoResources));
    assert_eq!(cb.stats().ids_exhausted, 4);
}

/// One input of the admission property test.
#[derive(Debug, Clone)]
enum Input {
    /// A REQ from source `src` with comm id `id`, response timeout and retries.
    Req {
        src: u8,
        id: u8,
        timeout: u8,
        retries: u8,
    },
    /// Time passes (ms).
    Wait(u16),
}

fn arb_input() -> impl Strategy<Value = Input> {
    prop_oneof![
        8 => (any::<u8>(), 0u8..16, 0u8..32, 0u8..16).prop_map(|(src, id, timeout, retries)| {
            Input::Req { src, id, timeout, retries }
        }),
        2 => (0u16..3000).prop_map(Input::Wait),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Arbitrary REQ streams from arbitrary GIDs, every REQ accepted as the endpoint does and
    /// none completed: each source draws at most MAX_MADS_PER_REQ MADs per REQ its bucket
    /// admitted (and admits at most burst + rate · t), the ids stay within what was admitted,
    /// and every id ends.
    #[test]
    fn forged_req_streams_stay_within_the_admission_bounds(
        inputs in prop::collection::vec(arb_input(), 1..200)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut cb = cm_b();
        let limit = cb.cfg.req_rate_limit;
        let mut sent: BTreeMap<Gid, u64> = BTreeMap::new();
        let mut reqs: BTreeMap<Gid, u64> = BTreeMap::new();
        fn step(cb: &mut Cm, now: Instant, sent: &mut BTreeMap<Gid, u64>) {
            accept_all(now, cb);
            for (g, _) in drain(cb) {
                *sent.entry(g).or_default() += 1;
            }
        }
        for input in inputs {
            match input {
                Input::Req { src, id, timeout, retries } => {
                    let g = gid(src);
                    *reqs.entry(g).or_default() += 1;
                    cb.handle_mad(now, g, &req_from(g, u32::from(src) << 8 | u32::from(id), timeout, retries));
                }
                Input::Wait(ms) => {
                    now += Duration::from_millis(u64::from(ms));
                    cb.handle_timeout(now);
                }
            }
            step(&mut cb, now, &mut sent);
            let elapsed = now.duration_since(t0).as_secs() + 1;
            let admitted_bound = u64::from(limit.burst) + u64::from(limit.per_second) * elapsed;
            let admitted = reqs.values().sum::<u64>() - cb.stats().req_rate_limited;
            prop_assert!(cb.len() as u64 <= admitted);
            let (passive, by_qpn) = cb.index.len();
            prop_assert!(passive <= cb.len() && by_qpn <= cb.len());
            for (g, n) in &sent {
                let from_g = reqs.get(g).copied().unwrap_or(0);
                prop_assert!(*n <= MAX_MADS_PER_REQ * from_g.min(admitted_bound),
                    "{n} MADs to {g:?} for {from_g} REQs");
            }
        }
        // Every id ends: REP retries run out, TimeWait ends.
        for _ in 0..1000 {
            let Some(at) = cb.next_deadline() else { break };
            now = at;
            cb.handle_timeout(now);
            step(&mut cb, now, &mut sent);
        }
        prop_assert!(cb.is_empty(), "{} ids left", cb.len());
        prop_assert_eq!(cb.index.len(), (0, 0));
        for (g, n) in &sent {
            prop_assert!(*n <= MAX_MADS_PER_REQ * reqs.get(g).copied().unwrap_or(0));
        }
    }
}

#[test]
fn a_req_naming_the_qpn_of_a_live_connection_gets_rej_stale_conn_and_the_old_one_a_dreq() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let (ida, idb) = established(t0, &mut ca, &mut cb);
    // A (same CA GUID, same QPN, new comm id) connects again while B still uses the QPN.
    let ida2 = ca.connect(t0 + msec(1), connect_params()).unwrap();
    cb.handle_mad(t0 + msec(1), a(), &sent_one(&mut ca, b()));
    let sent = drain(&mut cb);
    assert_eq!(sent.len(), 2, "the REJ and the old connection's DREQ");
    let rej = as_rej(&parse(&sent[0].1));
    assert_eq!(rej.reason, RejReason::StaleConn);
    assert_eq!(rej.remote_comm_id, ida2.0);
    let dreq = as_dreq(&parse(&sent[1].1));
    assert_eq!((dreq.local_comm_id, dreq.remote_comm_id), (idb.0, ida.0));
    assert_eq!(cb.state(idb), Some(CmState::DreqSent));
    assert!(events(&mut cb).is_empty(), "no new passive id");
    assert_eq!(cb.stats().stale_rejected, 1);
    // A ends both: the REJ frees its new id, the DREQ closes the old one.
    ca.handle_mad(t0 + msec(2), b(), &sent[0].1);
    ca.handle_mad(t0 + msec(2), b(), &sent[1].1);
    assert_eq!(ca.state(ida2), None);
    assert_eq!(ca.state(ida), Some(CmState::TimeWait));
    cb.handle_mad(t0 + msec(3), a(), &sent_one(&mut ca, b()));
    assert_eq!(events(&mut cb), vec![CmEvent::Disconnected { id: idb }]);
}

#[test]
fn a_peer_that_answered_us_keeps_the_retries_its_req_asks_for() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    // A's RTU named B's id: A receives what B sends. (Its first REQ was clamped.)
    established(t0, &mut ca, &mut cb);
    assert_eq!(cb.stats().req_retx_clamped, 1);
    let mut p = connect_params();
    p.local_qpn = QpNum::new(QPN_A + 1);
    let ida2 = ca.connect(t0, p).unwrap();
    cb.handle_mad(t0, a(), &sent_one(&mut ca, b()));
    accept_all(t0, &mut cb);
    let rep = sent_one(&mut cb, a());
    for k in 1..=15u32 {
        cb.handle_timeout(t0 + msec(4096) * k);
        assert_eq!(sent_one(&mut cb, a()), rep, "resend {k}");
    }
    cb.handle_timeout(t0 + msec(4096) * 16);
    let rej = as_rej(&parse(&sent_one(&mut cb, a())));
    assert_eq!(
        (rej.reason, rej.remote_comm_id),
        (RejReason::Timeout, ida2.0)
    );
    assert_eq!(cb.stats().req_retx_clamped, 1);
    // The same REQ from a GID that never answered is resent 3 times.
    cb.handle_mad(t0, x(), &req_from(x(), 77, 20, 15));
    accept_all(t0, &mut cb);
    assert_eq!(cb.stats().req_retx_clamped, 2);
}
