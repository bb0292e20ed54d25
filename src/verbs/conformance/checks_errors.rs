//! The checks of failure and recovery: flush on ERR, the drain WR, Last WQE Reached, RNR and
//! transport retries, communication established.

use super::support::*;
use super::*;

/// **Flush on ERR.** `b` posts no receive, so `a`'s sends (one of them unsignaled) stall in
/// RNR back-off; `a` also has receives posted that nothing fills. Moving `a` to ERR completes
/// every send and every receive with [`WcStatus::WrFlushErr`], the unsignaled send included,
/// each queue in posting order, and returns every buffer. Receives posted on `b` and then
/// flushed by moving `b` to ERR behave the same.
pub fn check_flush_on_err<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 8192, 16)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    for i in 0..4u64 {
        let m = pattern(i, 3000);
        let buf = alloc_with(a, ea.pool, &m)?;
        let wr = SendWr {
            signaled: i != 2,
            ..SendWr::send(WrId(i), buf, m.len())
        };
        a.post_send(qa, &wr).ctx("post_send")?;
    }
    post_recvs(a, RecvTarget::Qp(qa), ea.pool, 10, 3)?;
    pair.settle();
    let (a, b) = pair.providers();
    seen.poll(a, &ea, b, &eb);
    ensure!(
        seen.a_send.is_empty() && seen.b_recv.is_empty(),
        "sends completed with no receive posted: {:?} / {:?}",
        statuses(&seen.a_send),
        statuses(&seen.b_recv)
    );
    a.modify_qp(qa, &QpAttr::to_state(QpState::Err))
        .ctx("a to ERR")?;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.a_send.len() >= 4 && s.a_recv.len() >= 3
    });
    ensure!(
        ok,
        "after ERR: {} send and {} receive completions, expected 4 and 3",
        seen.a_send.len(),
        seen.a_recv.len()
    );
    let flush = WcStatus::WrFlushErr;
    expect_statuses(
        "a's sends",
        &seen.a_send,
        &[(0, flush), (1, flush), (2, flush), (3, flush)],
    )?;
    expect_statuses(
        "a's receives",
        &seen.a_recv,
        &[(10, flush), (11, flush), (12, flush)],
    )?;
    let (a, b) = pair.providers();
    for c in seen.a_send.iter().chain(&seen.a_recv) {
        let buf = c
            .buf
            .ok_or_else(|| violation!("a flushed WR returned no buffer"))?;
        ensure!(
            a.pools().get(buf).is_ok(),
            "buffer of flushed WR {} not returned",
            c.wr_id.0
        );
    }
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 20, 2)?;
    b.modify_qp(qb, &QpAttr::to_state(QpState::Err))
        .ctx("b to ERR")?;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| s.b_recv.len() >= 2);
    ensure!(ok, "b's receives were not flushed");
    expect_statuses("b's receives", &seen.b_recv, &[(20, flush), (21, flush)])?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **The drain WR.** With two sends stalled (no receive on `b`), `a` moves to ERR and then
/// posts a zero-length signaled SEND (IPoIB-CM's drain WR), an unsignaled one, and a
/// receive. Each is accepted, and each send completes with [`WcStatus::WrFlushErr`]; the
/// drain WRs complete after the two sends posted before them. The receive completes with
/// [`WcStatus::WrFlushErr`] too, or, where [`Behaviours::recv_in_err`] is
/// [`RecvInErr::NeverCompleted`], not at all ([`RecvInErr::FlushedOrNever`]: either).
pub fn check_drain_wr_after_err<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 8192, 16)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    post_send_data(a, qa, ea.pool, 1, &pattern(1, 2000))?;
    post_send_data(a, qa, ea.pool, 2, &pattern(2, 20))?;
    pair.settle();
    let (a, _) = pair.providers();
    a.modify_qp(qa, &QpAttr::to_state(QpState::Err))
        .ctx("to ERR")?;
    a.post_send(qa, &SendWr::empty(WrId(3)))
        .ctx("post drain WR in ERR")?;
    let unsignaled = SendWr {
        signaled: false,
        ..SendWr::empty(WrId(4))
    };
    a.post_send(qa, &unsignaled)
        .ctx("post unsignaled WR in ERR")?;
    post_recvs(a, RecvTarget::Qp(qa), ea.pool, 10, 1)?;
    let recv = pair.expected().recv_in_err;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.a_send.len() >= 4 && (recv != RecvInErr::Flushed || !s.a_recv.is_empty())
    });
    ensure!(
        ok,
        "drain WRs did not complete: sends {:?}, receives {:?} (receive posted in ERR \
         expected {recv:?})",
        statuses(&seen.a_send),
        statuses(&seen.a_recv)
    );
    let flush = WcStatus::WrFlushErr;
    expect_statuses(
        "sends",
        &seen.a_send,
        &[(1, flush), (2, flush), (3, flush), (4, flush)],
    )?;
    if recv != RecvInErr::Flushed {
        // Give a late flush the time the other waits get.
        for _ in 0..4 {
            pair.settle();
        }
        let (a, b) = pair.providers();
        seen.poll(a, &ea, b, &eb);
    }
    let want: &[(u64, WcStatus)] = match recv {
        RecvInErr::Flushed => &[(10, flush)],
        RecvInErr::NeverCompleted => &[],
        RecvInErr::FlushedOrNever if seen.a_recv.is_empty() => &[],
        RecvInErr::FlushedOrNever => &[(10, flush)],
    };
    expect_statuses(
        &format!("receive posted in ERR (expected {recv:?})"),
        &seen.a_recv,
        want,
    )?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **Last WQE Reached, exactly once.** `b`'s QP takes its receives from an SRQ holding four
/// WQEs; one message consumes one. Moving the QP to ERR raises exactly one
/// [`AsyncEvent::QpLastWqeReached`] for it; a second move to ERR raises none (or as many as
/// [`Behaviours::last_wqe`] says: [`LastWqe::raised`]); the three WQEs
/// left on the SRQ are not flushed (no receive completion appears) and stay usable: the SRQ
/// can only be destroyed once the QP is gone, which frees them.
pub fn check_srq_last_wqe_once<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 8192, 16)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let srq = b
        .create_srq(&SrqInit {
            pd: eb.pd,
            max_wr: 16,
            limit: 0,
        })
        .ctx("create_srq")?;
    let p = RcParams {
        srq_b: Some(srq),
        ..RcParams::default()
    };
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &p).ctx("connect")?;
    post_recvs(b, RecvTarget::Srq(srq), eb.pool, 50, 4)?;
    drain_events(b);
    let msg = pattern(7, 1500);
    post_send_data(a, qa, ea.pool, 1, &msg)?;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| !s.b_recv.is_empty());
    ensure!(ok, "the SRQ receive never completed");
    {
        let (_, b) = pair.providers();
        expect_recv(b, &seen.b_recv[0], 50, &msg, 0)?;
        b.modify_qp(qb, &QpAttr::to_state(QpState::Err))
            .ctx("to ERR")?;
    }
    let mut events = Vec::new();
    for _ in 0..4 {
        pair.settle();
        let (_, b) = pair.providers();
        events.extend(drain_events(b));
    }
    let last = |evs: &[AsyncEvent]| {
        evs.iter()
            .filter(|e| **e == AsyncEvent::QpLastWqeReached(qb))
            .count()
    };
    let expected = pair.expected().last_wqe;
    let (first, second) = expected.raised();
    ensure!(
        last(&events) == first,
        "QpLastWqeReached raised {} times on the move to ERR, expected {first} ({expected:?}; \
         events {events:?})",
        last(&events)
    );
    let (_, b) = pair.providers();
    b.modify_qp(qb, &QpAttr::to_state(QpState::Err))
        .ctx("ERR->ERR")?;
    let mut again = Vec::new();
    for _ in 0..4 {
        pair.settle();
        let (_, b) = pair.providers();
        again.extend(drain_events(b));
    }
    let (a, b) = pair.providers();
    ensure!(
        last(&again) == second,
        "a second move to ERR raised QpLastWqeReached {} times, expected {second} \
         ({expected:?}; events {again:?})",
        last(&again)
    );
    seen.poll(a, &ea, b, &eb);
    ensure!(
        seen.b_recv.len() == 1,
        "WQEs still on the SRQ were completed: {:?}",
        statuses(&seen.b_recv)
    );
    match b.destroy_srq(srq) {
        Err(VerbsError::Busy(_)) => {}
        r => return Err(violation!("destroy_srq with a QP attached gave {r:?}")),
    }
    let posted = b.pools().posted_count();
    b.destroy_qp(qb).ctx("destroy QP")?;
    b.destroy_srq(srq).ctx("destroy_srq")?;
    let after = b.pools().posted_count();
    ensure!(
        posted >= 3 && after == posted - 3,
        "destroying the SRQ did not release its 3 WQEs (posted {posted} -> {after})"
    );
    teardown(pair, (&ea, &eb), (&[qa], &[]), &seen);
    Ok(())
}

/// **RNR, then success.** With `rnr_retry` 7 (infinite), a send to a QP with no receive
/// posted does not complete while the responder is not ready; once `b` posts a receive the
/// send completes successfully and the receive holds the message.
pub fn check_rnr_then_success<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 8192, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    let msg = pattern(3, 5000);
    post_send_data(a, qa, ea.pool, 1, &msg)?;
    for _ in 0..3 {
        pair.settle();
    }
    let (a, b) = pair.providers();
    seen.poll(a, &ea, b, &eb);
    ensure!(
        seen.a_send.is_empty(),
        "the send completed with no receive posted: {:?}",
        statuses(&seen.a_send)
    );
    ensure!(
        a.query_qp_state(qa).ctx("query")? == QpState::Rts,
        "RNR with rnr_retry 7 moved the QP out of RTS"
    );
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 9, 1)?;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        !s.a_send.is_empty() && !s.b_recv.is_empty()
    });
    ensure!(ok, "the send never completed after a receive was posted");
    expect_statuses("send", &seen.a_send, &[(1, WcStatus::Success)])?;
    let (_, b) = pair.providers();
    expect_recv(b, &seen.b_recv[0], 9, &msg, 0)?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **RNR retries exhausted.** For `rnr_retry` 0, 1 and 3, a send to a QP that never posts a
/// receive completes with [`WcStatus::RnrRetryExcErr`], the send posted behind it with
/// [`WcStatus::WrFlushErr`], and the QP is in ERR.
pub fn check_rnr_retry_exceeded<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    for rnr_retry in [0u8, 1, 3] {
        let (ea, eb) = endpoints(pair, 8192, 8)?;
        let mut seen = Seen::default();
        let (a, b) = pair.providers();
        let p = RcParams {
            rnr_retry_a: rnr_retry,
            ..RcParams::default()
        };
        let (qa, qb) = connect_rc(a, &ea, b, &eb, &p).ctx("connect")?;
        post_send_data(a, qa, ea.pool, 1, &pattern(1, 100))?;
        post_send_data(a, qa, ea.pool, 2, &pattern(2, 100))?;
        let ok = wait(pair, &ea, &eb, &mut seen, |s| s.a_send.len() >= 2);
        ensure!(
            ok,
            "rnr_retry {rnr_retry}: sends did not fail ({:?})",
            statuses(&seen.a_send)
        );
        expect_statuses(
            &format!("rnr_retry {rnr_retry}"),
            &seen.a_send,
            &[(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)],
        )?;
        let (a, _) = pair.providers();
        let s = a.query_qp_state(qa).ctx("query")?;
        ensure!(
            s == QpState::Err,
            "rnr_retry {rnr_retry}: QP in {s:?}, not ERR"
        );
        teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    }
    Ok(())
}

/// **Transport retries exhausted.** With `timeout` 10 (4 ms) and `retry_cnt` 2, `b`'s QP is
/// destroyed (the peer vanishes: its packets go to an unknown QPN and are dropped without a
/// response). `a`'s send completes with [`WcStatus::RetryExcErr`], the one behind it with
/// [`WcStatus::WrFlushErr`], and `a`'s QP is in ERR.
pub fn check_retry_exceeded_peer_gone<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 8192, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let p = RcParams {
        timeout: 10,
        retry_cnt: 2,
        ..RcParams::default()
    };
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &p).ctx("connect")?;
    b.destroy_qp(qb).ctx("destroy the peer")?;
    post_send_data(a, qa, ea.pool, 1, &pattern(1, 3000))?;
    post_send_data(a, qa, ea.pool, 2, &pattern(2, 10))?;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| s.a_send.len() >= 2);
    ensure!(
        ok,
        "sends to a vanished peer did not fail ({:?})",
        statuses(&seen.a_send)
    );
    expect_statuses(
        "sends",
        &seen.a_send,
        &[(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
    )?;
    let (a, _) = pair.providers();
    let s = a.query_qp_state(qa).ctx("query")?;
    ensure!(s == QpState::Err, "QP in {s:?}, not ERR");
    teardown(pair, (&ea, &eb), (&[qa], &[]), &seen);
    Ok(())
}

/// **Communication established.** `b`'s QP is left in RTR (never moved to RTS); the first
/// request arriving on it is processed (the receive completes) and raises
/// [`AsyncEvent::CommEst`] for it, once (or never, where [`Behaviours::comm_est`] says
/// [`CommEst::Never`]).
pub fn check_comm_est<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let p = RcParams::default();
    let (a, b) = pair.providers();
    let (qa, qb) = create_rc_pair(a, &ea, b, &eb, &p).ctx("create")?;
    let (ca, cb) = rc_connections(a, qa, b, qb, &p);
    setup::init_rc_qp(a, qa, 0).ctx("a to INIT")?;
    setup::init_rc_qp(b, qb, 0).ctx("b to INIT")?;
    setup::connect_rc(a, qa, &ca).ctx("a to RTS")?;
    b.modify_qp(qb, &cb.rtr_attr()).ctx("b to RTR")?;
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 1, 2)?;
    drain_events(b);
    post_send_data(a, qa, ea.pool, 1, &pattern(1, 10))?;
    post_send_data(a, qa, ea.pool, 2, &pattern(2, 10))?;
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.b_recv.len() >= 2 && s.a_send.len() >= 2
    });
    ensure!(ok, "sends to a QP in RTR did not complete");
    let expected = pair.expected().comm_est;
    let want = match expected {
        CommEst::Raised => 1,
        CommEst::Never => 0,
    };
    let (_, b) = pair.providers();
    let evs = drain_events(b);
    let n = evs
        .iter()
        .filter(|e| **e == AsyncEvent::CommEst(qb))
        .count();
    ensure!(
        n == want,
        "CommEst raised {n} times, expected {want} ({expected:?}; events {evs:?})"
    );
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// Watchdog destroys in [`check_destroy_keeps_srq`].
pub const WATCHDOG_DESTROYS: usize = 1000;

/// **Destroys keep the SRQ whole.** [`WATCHDOG_DESTROYS`] times, `a` sends one message to a
/// fresh QP of `b` that takes its receives from an SRQ; once `a`'s send completed (the
/// receive is queued on `b`'s CQ), `b` moves the QP to ERR and destroys it without polling,
/// as IPoIB-CM's drain watchdog does, then polls its CQ and reposts every buffer that came
/// back. The SRQ's posted count ([`Verbs::srq_posted`]) is where it started after each
/// round: a provider either delivers a destroyed QP's queued completions, or (as mlx5 does)
/// cleans them from the CQ and gives their WQEs back to the SRQ, but never loses one.
pub fn check_destroy_keeps_srq<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const DEPTH: usize = 16;
    let (ea, eb) = endpoints(pair, 2048, 64)?;
    let (_, b) = pair.providers();
    let srq = full_srq(b, &eb, DEPTH)?;
    let start = b.srq_posted(srq).ctx("srq_posted")?;
    ensure!(start == DEPTH, "srq_posted {start} after posting {DEPTH}");
    let posted_bufs = b.pools().posted_count();
    let p = RcParams {
        srq_b: Some(srq),
        ..RcParams::default()
    };
    let msg = pattern(23, 256);
    let mut next_id = DEPTH as u64;
    for round in 0..WATCHDOG_DESTROYS {
        let (a, b) = pair.providers();
        let (qa, qb) = connect_rc(a, &ea, b, &eb, &p).ctx("connect")?;
        post_send_data(a, qa, ea.pool, round as u64, &msg)?;
        let mut sent = Vec::new();
        for _ in 0..MAX_SETTLES {
            pair.settle();
            let (a, _) = pair.providers();
            poll_into(a, ea.send_cq, &mut sent);
            if !sent.is_empty() {
                break;
            }
        }
        let (a, b) = pair.providers();
        free_bufs(a, &sent);
        ensure!(
            sent.first().is_some_and(|c| c.status == WcStatus::Success),
            "round {round}: the send completed {:?} (SRQ posted {:?} of {start})",
            statuses(&sent),
            b.srq_posted(srq)
        );
        b.modify_qp(qb, &QpAttr::to_state(QpState::Err))
            .ctx("to ERR")?;
        b.destroy_qp(qb).ctx("destroy with a completion queued")?;
        a.destroy_qp(qa).ctx("destroy the sender")?;
        drain_events(b);
        let mut back = Vec::new();
        poll_into(b, eb.recv_cq, &mut back);
        poll_into(b, eb.send_cq, &mut back);
        for buf in back.iter().filter_map(|c| c.buf) {
            b.post_srq_recv(srq, WrId(next_id), buf)
                .ctx("repost a returned buffer")?;
            next_id += 1;
        }
        let now = b.srq_posted(srq).ctx("srq_posted")?;
        let bufs = b.pools().posted_count();
        ensure!(
            now == start && bufs == posted_bufs,
            "after destroy {}: SRQ posted {now} (buffers posted {bufs}), started at {start} \
             ({posted_bufs})",
            round + 1
        );
    }
    let (a, b) = pair.providers();
    drain_events(a);
    b.destroy_srq(srq).ctx("destroy_srq")?;
    close_endpoint(a, &ea);
    close_endpoint(b, &eb);
    Ok(())
}

/// **Receive chains.** [`Verbs::post_srq_recvs`] posts a chain in order up to the SRQ's room:
/// 12 receives on an SRQ of 8 post the first 8 (the count returned), the other 4 buffers stay
/// the caller's; 8 messages then land in the chained receives in their order.
pub fn check_srq_recv_chain<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 2048, 32)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let srq = b
        .create_srq(&SrqInit {
            pd: eb.pd,
            max_wr: 8,
            limit: 0,
        })
        .ctx("create_srq")?;
    let mut chain = Vec::new();
    for i in 0..12u64 {
        let buf = b
            .pools_mut()
            .alloc(eb.pool)
            .ok_or(ConformanceError::PoolExhausted(eb.pool))?;
        chain.push((WrId(100 + i), buf));
    }
    let posted = b.post_srq_recvs(srq, &chain).ctx("post_srq_recvs")?;
    ensure!(posted == 8, "a chain of 12 on an SRQ of 8 posted {posted}");
    ensure!(
        b.srq_posted(srq).ctx("srq_posted")? == 8,
        "srq_posted {:?} after the chain",
        b.srq_posted(srq)
    );
    for &(_, buf) in &chain[8..] {
        b.pools().get(buf).ctx("a refused buffer is still held")?;
        let _ = b.pools_mut().free(buf);
    }
    let p = RcParams {
        srq_b: Some(srq),
        ..RcParams::default()
    };
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &p).ctx("connect")?;
    let msgs: Vec<Vec<u8>> = (0..8u64)
        .map(|i| pattern(40 + i, 500 + i as usize))
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        post_send_data(a, qa, ea.pool, i as u64, m)?;
    }
    let ok = wait(pair, &ea, &eb, &mut seen, |s| s.b_recv.len() >= 8);
    ensure!(ok, "{} of 8 chained receives completed", seen.b_recv.len());
    let (_, b) = pair.providers();
    for (i, m) in msgs.iter().enumerate() {
        expect_recv(b, &seen.b_recv[i], 100 + i as u64, m, 0)?;
    }
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    let (_, b) = pair.providers();
    b.destroy_srq(srq).ctx("destroy_srq")?;
    Ok(())
}
