//! The checks of the QP state machine and of the object rules.

use super::support::*;
use super::*;
use crate::verbs::setup::{rc_init_attr, RC_RETRY_CNT, RNR_RETRY_FOREVER};

/// **QP state machine through `modify_qp`.** A fresh RC QP is in RESET and refuses
/// `post_recv` and `post_send` there; illegal transitions (RESET→RTR, INIT→RTS, RTS→RTR,
/// ERR→RTS, ERR→INIT) fail with [`VerbsError::IllegalTransition`], a transition lacking a
/// required attribute with [`VerbsError::MissingAttributes`], one with a forbidden attribute
/// with [`VerbsError::UnexpectedAttributes`], a wrong `cur_state` with
/// [`VerbsError::InvalidAttribute`], and none of them changes the state. Legal transitions
/// walk RESET→INIT→RTR→RTS→RTS→SQD→RTS→ERR→RESET→INIT; `post_recv` works from INIT on and
/// `post_send` from RTS on; the RTR carries a full address vector (static rate, flow label,
/// traffic class and GRH). A UD QP needs a Q_Key, not an address vector.
pub fn check_qp_state_machine<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let qp = create_qp(a, &ea, QpType::Rc, None, (16, 16)).ctx("create_qp")?;
    let peer = create_qp(b, &eb, QpType::Rc, None, (16, 16)).ctx("create peer QP")?;
    let ud = create_qp(a, &ea, QpType::Ud, None, (16, 16)).ctx("create UD QP")?;
    let result = (|| {
        let expect_state = |v: &V, want: QpState| -> Result<(), ConformanceError> {
            let s = v.query_qp_state(qp).ctx("query_qp_state")?;
            ensure!(s == want, "QP in {s:?}, expected {want:?}");
            Ok(())
        };
        expect_state(a, QpState::Reset)?;
        let buf = a
            .pools_mut()
            .alloc(ea.pool)
            .ok_or(ConformanceError::PoolExhausted(ea.pool))?;
        match a.post_recv(qp, WrId(1), buf) {
            Err(VerbsError::InvalidState { .. }) => {}
            r => {
                return Err(violation!(
                    "post_recv in RESET gave {r:?}, expected InvalidState"
                ))
            }
        }
        match a.post_send(qp, &SendWr::send(WrId(2), buf, 8)) {
            Err(VerbsError::InvalidState { .. }) => {}
            r => {
                return Err(violation!(
                    "post_send in RESET gave {r:?}, expected InvalidState"
                ))
            }
        }
        ensure!(
            a.pools().get(buf).is_ok(),
            "a refused post kept the buffer from its owner"
        );
        let illegal = |v: &mut V, from: QpState, to: QpState| -> Result<(), ConformanceError> {
            match v.modify_qp(qp, &QpAttr::to_state(to)) {
                Err(VerbsError::IllegalTransition { .. }) => {}
                r => {
                    return Err(violation!(
                        "{from:?}->{to:?} gave {r:?}, expected IllegalTransition"
                    ))
                }
            }
            let s = v.query_qp_state(qp).ctx("query_qp_state")?;
            ensure!(
                s == from,
                "a rejected {from:?}->{to:?} left the QP in {s:?}"
            );
            Ok(())
        };
        illegal(a, QpState::Reset, QpState::Rtr)?;
        illegal(a, QpState::Reset, QpState::Rts)?;
        let partial = QpAttr {
            pkey_index: Some(0),
            ..QpAttr::to_state(QpState::Init)
        };
        match a.modify_qp(qp, &partial) {
            Err(VerbsError::MissingAttributes { .. }) => {}
            r => return Err(violation!("RESET->INIT without PORT gave {r:?}")),
        }
        let extra = QpAttr {
            sq_psn: Some(Psn::new(1)),
            ..rc_init_attr()
        };
        match a.modify_qp(qp, &extra) {
            Err(VerbsError::UnexpectedAttributes { .. }) => {}
            r => return Err(violation!("RESET->INIT with SQ_PSN gave {r:?}")),
        }
        expect_state(a, QpState::Reset)?;
        a.modify_qp(qp, &rc_init_attr()).ctx("RESET->INIT")?;
        expect_state(a, QpState::Init)?;
        match a.post_send(qp, &SendWr::send(WrId(2), buf, 8)) {
            Err(VerbsError::InvalidState { .. }) => {}
            r => {
                return Err(violation!(
                    "post_send in INIT gave {r:?}, expected InvalidState"
                ))
            }
        }
        a.post_recv(qp, WrId(1), buf).ctx("post_recv in INIT")?;
        illegal(a, QpState::Init, QpState::Rts)?;
        let mtu = a.port_attr().active_mtu.min(b.port_attr().active_mtu);
        // A full address vector: static rate, flow label and traffic class besides the GID.
        let full_av = AddressVector {
            static_rate: Rate::GBPS_10,
            ..AddressVector::global(Grh {
                flow_label: 0x1_2345,
                traffic_class: 0,
                ..Grh::to_gid(b.port_attr().gid)
            })
        };
        let rtr = QpAttr {
            av: Some(full_av),
            ..rc_rtr_attr((b.port_attr().gid, peer), mtu, Psn::new(5), 14)
        };
        a.modify_qp(qp, &rtr).ctx("INIT->RTR")?;
        expect_state(a, QpState::Rtr)?;
        let buf2 = a
            .pools_mut()
            .alloc(ea.pool)
            .ok_or(ConformanceError::PoolExhausted(ea.pool))?;
        match a.post_send(qp, &SendWr::send(WrId(3), buf2, 8)) {
            Err(VerbsError::InvalidState { .. }) => {}
            r => {
                return Err(violation!(
                    "post_send in RTR gave {r:?}, expected InvalidState"
                ))
            }
        }
        a.pools_mut().free(buf2).ctx("free")?;
        illegal(a, QpState::Rtr, QpState::Init)?;
        let mut rts = rc_rts_attr(14, RC_RETRY_CNT, RNR_RETRY_FOREVER, Psn::new(9));
        rts.retry_cnt = None;
        match a.modify_qp(qp, &rts) {
            Err(VerbsError::MissingAttributes { .. }) => {}
            r => return Err(violation!("RTR->RTS without RETRY_CNT gave {r:?}")),
        }
        let wrong_cur = QpAttr {
            cur_state: Some(QpState::Init),
            ..rc_rts_attr(14, RC_RETRY_CNT, RNR_RETRY_FOREVER, Psn::new(9))
        };
        match a.modify_qp(qp, &wrong_cur) {
            Err(VerbsError::InvalidAttribute(_)) => {}
            r => return Err(violation!("RTR->RTS with cur_state INIT gave {r:?}")),
        }
        expect_state(a, QpState::Rtr)?;
        a.modify_qp(
            qp,
            &rc_rts_attr(14, RC_RETRY_CNT, RNR_RETRY_FOREVER, Psn::new(9)),
        )
        .ctx("RTR->RTS")?;
        expect_state(a, QpState::Rts)?;
        let rts_rts = QpAttr {
            min_rnr_timer: Some(12),
            ..QpAttr::to_state(QpState::Rts)
        };
        a.modify_qp(qp, &rts_rts).ctx("RTS->RTS")?;
        illegal(a, QpState::Rts, QpState::Rtr)?;
        a.modify_qp(qp, &QpAttr::to_state(QpState::Sqd))
            .ctx("RTS->SQD")?;
        expect_state(a, QpState::Sqd)?;
        a.modify_qp(qp, &QpAttr::to_state(QpState::Rts))
            .ctx("SQD->RTS")?;
        a.modify_qp(qp, &QpAttr::to_state(QpState::Err))
            .ctx("RTS->ERR")?;
        expect_state(a, QpState::Err)?;
        illegal(a, QpState::Err, QpState::Rts)?;
        illegal(a, QpState::Err, QpState::Init)?;
        Ok(())
    })();
    result?;
    // The receive posted in INIT is flushed by the move to ERR.
    let ok = wait(pair, &ea, &eb, &mut seen, |s| !s.a_recv.is_empty());
    ensure!(ok, "the receive posted before ERR was never flushed");
    expect_statuses(
        "receive posted in INIT",
        &seen.a_recv,
        &[(1, WcStatus::WrFlushErr)],
    )?;
    let (a, _) = pair.providers();
    a.modify_qp(qp, &QpAttr::to_state(QpState::Reset))
        .ctx("ERR->RESET")?;
    ensure!(
        a.query_qp_state(qp).ctx("query")? == QpState::Reset,
        "ERR->RESET did not reach RESET"
    );
    a.modify_qp(qp, &rc_init_attr())
        .ctx("RESET->INIT after a reset")?;
    // UD: RESET->INIT takes a Q_Key, and refuses RC-only access flags.
    let ud_with_access = QpAttr {
        qkey: Some(QKey(0x1111)),
        ..rc_init_attr()
    };
    match a.modify_qp(ud, &ud_with_access) {
        Err(VerbsError::UnexpectedAttributes { .. }) => {}
        r => return Err(violation!("UD RESET->INIT with ACCESS_FLAGS gave {r:?}")),
    }
    match a.modify_qp(ud, &rc_init_attr()) {
        Err(VerbsError::MissingAttributes { .. } | VerbsError::UnexpectedAttributes { .. }) => {}
        r => return Err(violation!("UD RESET->INIT without QKEY gave {r:?}")),
    }
    teardown(pair, (&ea, &eb), (&[qp, ud], &[peer]), &seen);
    Ok(())
}

/// **Object and work-request rules.** A CQ, SRQ or PD still in use cannot be destroyed
/// ([`VerbsError::Busy`]); an unknown QP is [`VerbsError::NoSuchQp`]; a receive posted
/// directly to an SRQ-attached QP is [`VerbsError::UsesSrq`]; a send longer than its buffer
/// is [`VerbsError::TooLong`]; a send queue holding `max_send_wr` WRs refuses another with
/// [`VerbsError::QueueFull`]. A refused post leaves the buffer with the caller. Once the QP is
/// destroyed, the CQ and SRQ can be.
pub fn check_object_rules<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 4096, 16)?;
    let (a, b) = pair.providers();
    let srq = a
        .create_srq(&SrqInit {
            pd: ea.pd,
            max_wr: 4,
            limit: 0,
        })
        .ctx("create_srq")?;
    let p = RcParams {
        max_send_wr: 2,
        srq_a: Some(srq),
        ..RcParams::default()
    };
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &p).ctx("connect")?;
    for (what, r) in [
        ("destroy_cq of a CQ in use", a.destroy_cq(ea.send_cq)),
        ("destroy_srq of an SRQ in use", a.destroy_srq(srq)),
        ("dealloc_pd of a PD in use", a.dealloc_pd(ea.pd)),
    ] {
        match r {
            Err(VerbsError::Busy(_)) => {}
            r => return Err(violation!("{what} gave {r:?}, expected Busy")),
        }
    }
    let gone = QpNum::new(0xFF_FFF0);
    match a.destroy_qp(gone) {
        Err(VerbsError::NoSuchQp(_)) => {}
        r => return Err(violation!("destroy_qp of an unknown QP gave {r:?}")),
    }
    let buf = a
        .pools_mut()
        .alloc(ea.pool)
        .ok_or(ConformanceError::PoolExhausted(ea.pool))?;
    match a.post_recv(qa, WrId(1), buf) {
        Err(VerbsError::UsesSrq(_)) => {}
        r => return Err(violation!("post_recv on an SRQ-attached QP gave {r:?}")),
    }
    match a.post_send(qa, &SendWr::send(WrId(2), buf, 4097)) {
        Err(VerbsError::TooLong { .. }) => {}
        r => {
            return Err(violation!(
                "a 4097-byte send from a 4096-byte buffer gave {r:?}"
            ))
        }
    }
    ensure!(
        a.pools().get(buf).is_ok(),
        "a refused post kept the buffer from its owner"
    );
    a.pools_mut().free(buf).ctx("free")?;
    // b posts no receive: the two sends stay queued (RNR), a third does not fit.
    post_send_data(a, qa, ea.pool, 3, &[1; 8])?;
    post_send_data(a, qa, ea.pool, 4, &[2; 8])?;
    let buf = alloc_with(a, ea.pool, &[3; 8])?;
    match a.post_send(qa, &SendWr::send(WrId(5), buf, 8)) {
        Err(VerbsError::QueueFull) => {}
        r => return Err(violation!("a third send on a 2-deep send queue gave {r:?}")),
    }
    a.pools_mut().free(buf).ctx("free")?;
    a.destroy_qp(qa).ctx("destroy_qp")?;
    a.destroy_srq(srq).ctx("destroy_srq after its QP")?;
    b.destroy_qp(qb).ctx("destroy peer")?;
    teardown(pair, (&ea, &eb), (&[], &[]), &Seen::default());
    Ok(())
}

/// Sends one message of `len` bytes (a pattern of `round`) from `a`'s QP to `b` and waits for
/// both completions: the send succeeds and the receive holds the message whole. What was
/// seen, for the caller to give the buffers back.
fn one_message<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    (ea, qa): (&Endpoint, QpNum),
    eb: &Endpoint,
    round: usize,
    len: usize,
) -> Result<Seen, ConformanceError> {
    let msg = pattern(round as u64, len);
    let (a, _) = pair.providers();
    post_send_data(a, qa, ea.pool, round as u64, &msg)?;
    let mut seen = Seen::default();
    let done = wait(pair, ea, eb, &mut seen, |s| {
        !s.a_send.is_empty() && !s.b_recv.is_empty()
    });
    let (_, b) = pair.providers();
    ensure!(
        done && seen
            .a_send
            .first()
            .is_some_and(|c| c.status == WcStatus::Success),
        "round {round}: send {:?}, receive {:?}",
        statuses(&seen.a_send),
        statuses(&seen.b_recv)
    );
    let c = seen.b_recv[0];
    expect_recv(b, &c, c.wr_id.0, &msg, 0)?;
    Ok(seen)
}

/// Connections set up and retired in [`check_retire_drained`].
pub const RETIRE_ROUNDS: usize = 100;

/// **Drained QPs retire; new QPs come fresh.** [`RETIRE_ROUNDS`] times, as the daemon runs a
/// connection: `a` creates a QP and `b` one on an SRQ (of the same kinds every round), both
/// in RESET when created; they connect and one message goes from `a` to `b`; once both
/// completions were polled, both QPs go to ERR and are retired ([`Verbs::retire_qp`]). Every
/// message arrives whole, and after every round the QP counts, the SRQ's posted count and
/// the buffers lent are where they started: a provider that creates QPs ahead or destroys
/// them later (the hardware provider does, on a thread of its own) hands out QPs as fresh as
/// `create_qp` makes them and loses nothing of a retired one.
pub fn check_retire_drained<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const DEPTH: usize = 4;
    let (ea, eb) = endpoints(pair, 2048, 32)?;
    let (a, b) = pair.providers();
    let srq = full_srq(b, &eb, DEPTH)?;
    // (QPs of a, of b, the SRQ's posted count, buffers lent by a, by b)
    let counts = |a: &V, b: &V| -> Result<_, ConformanceError> {
        Ok((
            a.qp_count(),
            b.qp_count(),
            b.srq_posted(srq).ctx("srq_posted")?,
            a.pools().posted_count(),
            b.pools().posted_count(),
        ))
    };
    let start = counts(a, b)?;
    let p = RcParams {
        srq_b: Some(srq),
        ..RcParams::default()
    };
    let mut next_id = DEPTH as u64;
    for round in 0..RETIRE_ROUNDS {
        let (a, b) = pair.providers();
        let (qa, qb) = create_rc_pair(a, &ea, b, &eb, &p).ctx("create")?;
        let states = (a.query_qp_state(qa), b.query_qp_state(qb));
        ensure!(
            states == (Ok(QpState::Reset), Ok(QpState::Reset)),
            "round {round}: new QPs in {states:?}, not RESET"
        );
        connect_rc_pair(a, qa, b, qb, &p).ctx("connect")?;
        let seen = one_message(pair, (&ea, qa), &eb, round, 1000)?;
        let (a, b) = pair.providers();
        for buf in seen.b_recv.iter().filter_map(|c| c.buf) {
            b.post_srq_recv(srq, WrId(next_id), buf)
                .ctx("repost the receive buffer")?;
            next_id += 1;
        }
        free_bufs(a, &seen.a_send);
        a.modify_qp(qa, &QpAttr::to_state(QpState::Err))
            .ctx("a to ERR")?;
        b.modify_qp(qb, &QpAttr::to_state(QpState::Err))
            .ctx("b to ERR")?;
        a.retire_qp(qa).ctx("retire a's QP")?;
        b.retire_qp(qb).ctx("retire b's QP")?;
        drain_events(a);
        drain_events(b);
        let now = counts(a, b)?;
        ensure!(
            now == start,
            "after round {round}: (QPs of a, of b, SRQ posted, buffers lent by a, by b) {now:?}, \
             started at {start:?}"
        );
    }
    let (a, b) = pair.providers();
    let mut late = Vec::new();
    poll_into(a, ea.send_cq, &mut late);
    poll_into(b, eb.recv_cq, &mut late);
    ensure!(
        late.is_empty(),
        "completions of retired QPs: {:?}",
        statuses(&late)
    );
    b.destroy_srq(srq).ctx("destroy_srq")?;
    close_endpoint(a, &ea);
    close_endpoint(b, &eb);
    Ok(())
}

/// Connections set up through [`Verbs::begin_moves`] in [`check_begin_moves`].
pub const MOVES_ROUNDS: usize = 20;

/// Takes every result [`Verbs::poll_moved`] has from both providers, settling between polls
/// until `done` holds of what was taken (at most [`MAX_SETTLES`] settles); `(side, result)`,
/// side 0 for `a`, 1 for `b`.
fn take_moved<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    out: &mut Vec<(usize, Moved)>,
    mut done: impl FnMut(&[(usize, Moved)]) -> bool,
) -> bool {
    for round in 0..=MAX_SETTLES {
        let (a, b) = pair.providers();
        for (side, v) in [(0, a), (1, b)] {
            for _ in 0..64 {
                let Some(m) = v.poll_moved() else { break };
                out.push((side, m));
            }
        }
        if done(out) {
            return true;
        }
        if round < MAX_SETTLES {
            pair.settle();
        }
    }
    false
}

/// **Moves begun end as though done, once.** [`MOVES_ROUNDS`] times: each side creates a
/// QP and moves it RESET → INIT → RTR → RTS with one [`Verbs::begin_moves`]; `b` posts a
/// receive at once (legal from INIT on: a later verb sees the moves done, wherever the
/// provider makes them); each QP's result is `Ok` and comes once ([`Moves::Done`] has none);
/// a message from `a` arrives whole; then both QPs are moved to ERR the same way and
/// retired at once, and no result of theirs comes. A QP whose moves were begun and that is
/// destroyed at once has none either, and a move the state machine refuses (RTR from RESET)
/// fails, at once or in its result. QP counts and buffers lent end where they started.
pub fn check_begin_moves<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 2048, 32)?;
    let (a, b) = pair.providers();
    let start = (
        a.qp_count(),
        b.qp_count(),
        a.pools().posted_count(),
        b.pools().posted_count(),
    );
    let p = RcParams::default();
    let init = rc_init_attr();
    for round in 0..MOVES_ROUNDS {
        let (a, b) = pair.providers();
        let (qa, qb) = create_rc_pair(a, &ea, b, &eb, &p).ctx("create")?;
        let (ca, cb) = rc_connections(a, qa, b, qb, &p);
        let mut waiting = Vec::new();
        for (side, v, qp, c) in [(0, &mut *a, qa, ca), (1, &mut *b, qb, cb)] {
            let moves = v
                .begin_moves(qp, &[init, c.rtr_attr(), c.rts_attr()])
                .ctx("begin_moves to RTS")?;
            if moves == Moves::Started {
                waiting.push((side, qp));
            }
        }
        let rbuf = b
            .pools_mut()
            .alloc(eb.pool)
            .ok_or(ConformanceError::PoolExhausted(eb.pool))?;
        b.post_recv(qb, WrId(round as u64), rbuf)
            .ctx("post_recv right after begin_moves")?;
        let mut got = Vec::new();
        let all = take_moved(pair, &mut got, |g| g.len() >= waiting.len());
        let mut results: Vec<(usize, QpNum)> = got.iter().map(|(s, m)| (*s, m.qp)).collect();
        results.sort_unstable();
        waiting.sort_unstable();
        ensure!(
            all && results == waiting && got.iter().all(|(_, m)| m.result.is_ok()),
            "round {round}: results {got:?}, for moves started on {waiting:?}"
        );
        let (a, b) = pair.providers();
        let states = (a.query_qp_state(qa), b.query_qp_state(qb));
        ensure!(
            states == (Ok(QpState::Rts), Ok(QpState::Rts)),
            "round {round}: QPs in {states:?} after their moves"
        );
        let seen = one_message(pair, (&ea, qa), &eb, round, 700)?;
        let (a, b) = pair.providers();
        free_bufs(a, &seen.a_send);
        free_bufs(b, &seen.b_recv);
        let err = QpAttr::to_state(QpState::Err);
        let _ = a.begin_moves(qa, &[err]).ctx("a to ERR")?;
        let _ = b.begin_moves(qb, &[err]).ctx("b to ERR")?;
        a.retire_qp(qa).ctx("retire a's QP")?;
        b.retire_qp(qb).ctx("retire b's QP")?;
        drain_events(a);
        drain_events(b);
    }
    let mut late = Vec::new();
    take_moved(pair, &mut late, |_| false);
    ensure!(late.is_empty(), "results of retired QPs' moves: {late:?}");
    // Destroyed with its moves begun: no result.
    let (a, b) = pair.providers();
    let (qa, qb) = create_rc_pair(a, &ea, b, &eb, &p).ctx("create")?;
    let (ca, _) = rc_connections(a, qa, b, qb, &p);
    let _ = a
        .begin_moves(qa, &[init, ca.rtr_attr(), ca.rts_attr()])
        .ctx("begin_moves")?;
    a.destroy_qp(qa).ctx("destroy with moves begun")?;
    // Refused by the state machine: RTR from RESET.
    let refused = match b.begin_moves(qb, &[ca.rtr_attr()]) {
        Err(_) => true,
        Ok(Moves::Done) => false,
        Ok(Moves::Started) => {
            let mut got = Vec::new();
            take_moved(pair, &mut got, |g| !g.is_empty());
            got.iter()
                .any(|(s, m)| *s == 1 && m.qp == qb && m.result.is_err())
        }
    };
    ensure!(refused, "RTR from RESET was not refused");
    let mut late = Vec::new();
    take_moved(pair, &mut late, |_| false);
    ensure!(
        late.is_empty(),
        "results after a destroy or a refusal: {late:?}"
    );
    let (a, b) = pair.providers();
    b.destroy_qp(qb).ctx("destroy")?;
    let now = (
        a.qp_count(),
        b.qp_count(),
        a.pools().posted_count(),
        b.pools().posted_count(),
    );
    ensure!(
        now == start,
        "(QPs of a, of b, buffers lent by a, by b) {now:?}, started at {start:?}"
    );
    close_endpoint(a, &ea);
    close_endpoint(b, &eb);
    Ok(())
}
