//! What the checks share: completions seen on both sides, bounded waiting, context on
//! errors, set-up and teardown, expected completions and data.

pub(super) use super::blocks::Ctx;
use super::*;

/// Completions collected from both sides of a pair.
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub(super) a_send: Vec<Completion>,
    pub(super) a_recv: Vec<Completion>,
    pub(super) b_send: Vec<Completion>,
    pub(super) b_recv: Vec<Completion>,
}

impl Seen {
    pub(super) fn poll<V: Verbs>(&mut self, a: &mut V, ea: &Endpoint, b: &mut V, eb: &Endpoint) {
        poll_into(a, ea.send_cq, &mut self.a_send);
        poll_into(a, ea.recv_cq, &mut self.a_recv);
        poll_into(b, eb.send_cq, &mut self.b_send);
        poll_into(b, eb.recv_cq, &mut self.b_recv);
    }

    pub(super) fn free<V: Verbs>(&self, a: &mut V, b: &mut V) {
        free_bufs(a, &self.a_send);
        free_bufs(a, &self.a_recv);
        free_bufs(b, &self.b_send);
        free_bufs(b, &self.b_recv);
    }
}

/// Settles `pair` until `done` holds for the completions seen so far (polling both
/// endpoints before each test), at most [`MAX_SETTLES`] times. Returns whether it held.
pub(super) fn wait<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    ea: &Endpoint,
    eb: &Endpoint,
    seen: &mut Seen,
    mut done: impl FnMut(&Seen) -> bool,
) -> bool {
    for round in 0..=MAX_SETTLES {
        {
            let (a, b) = pair.providers();
            seen.poll(a, ea, b, eb);
        }
        if done(seen) {
            return true;
        }
        if round < MAX_SETTLES {
            pair.settle();
        }
    }
    false
}

pub(super) fn statuses(cs: &[Completion]) -> Vec<(u64, WcStatus)> {
    cs.iter().map(|c| (c.wr_id.0, c.status)).collect()
}

/// Buffer size of the pools the checks open (large enough for the biggest message).
pub(super) const BIG: usize = 128 * 1024;

/// Opens an endpoint on each side with `count` buffers of `buf_len` bytes.
pub(super) fn endpoints<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    buf_len: usize,
    count: usize,
) -> Result<(Endpoint, Endpoint), ConformanceError> {
    let (a, b) = pair.providers();
    let ea = open_endpoint(a, buf_len, count, 1024).ctx("open endpoint a")?;
    let eb = open_endpoint(b, buf_len, count, 1024).ctx("open endpoint b")?;
    Ok((ea, eb))
}

/// An SRQ of `depth` on `ep`'s PD with a receive posted in each slot (ids `0..depth`).
pub(super) fn full_srq<V: Verbs>(
    v: &mut V,
    ep: &Endpoint,
    depth: usize,
) -> Result<SrqId, ConformanceError> {
    let srq = v
        .create_srq(&SrqInit {
            pd: ep.pd,
            max_wr: depth as u32,
            limit: 0,
        })
        .ctx("create_srq")?;
    post_recvs(v, RecvTarget::Srq(srq), ep.pool, 0, depth)?;
    Ok(srq)
}

/// Destroys the QPs and the endpoints' CQs, freeing whatever completions returned.
pub(super) fn teardown<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    (ea, eb): (&Endpoint, &Endpoint),
    qps: (&[QpNum], &[QpNum]),
    seen: &Seen,
) {
    let (a, b) = pair.providers();
    seen.free(a, b);
    for q in qps.0 {
        let _ = a.destroy_qp(*q);
    }
    for q in qps.1 {
        let _ = b.destroy_qp(*q);
    }
    close_endpoint(a, ea);
    close_endpoint(b, eb);
}

/// Checks a completion list against expected `(wr_id, status)` pairs, in order.
pub(super) fn expect_statuses(
    what: &str,
    got: &[Completion],
    want: &[(u64, WcStatus)],
) -> Result<(), ConformanceError> {
    ensure!(
        statuses(got) == want,
        "{what}: completions {:?}, expected {want:?}",
        statuses(got)
    );
    Ok(())
}

/// Checks the data of a receive completion on `v`.
pub(super) fn expect_recv<V: Verbs>(
    v: &V,
    c: &Completion,
    wr_id: u64,
    data: &[u8],
    grh_off: usize,
) -> Result<(), ConformanceError> {
    ensure!(
        c.wr_id.0 == wr_id && c.status == WcStatus::Success && c.opcode == WcOpcode::Recv,
        "receive completion {c:?}, expected wr_id {wr_id} success"
    );
    ensure!(
        c.byte_len as usize == data.len() + grh_off,
        "receive {wr_id}: byte_len {}, expected {}",
        c.byte_len,
        data.len() + grh_off
    );
    let b = c
        .buf
        .ok_or_else(|| violation!("receive {wr_id}: no buffer"))?;
    let got = v.pools().get(b).ctx("returned receive buffer")?;
    let got = got
        .get(grh_off..grh_off + data.len())
        .ok_or_else(|| violation!("receive {wr_id}: buffer too short"))?;
    if got != data {
        let at = got.iter().zip(data).position(|(x, y)| x != y).unwrap_or(0);
        return Err(violation!(
            "receive {wr_id}: {} bytes differ from what was sent, first at offset {at}",
            got.iter().zip(data).filter(|(x, y)| x != y).count()
        ));
    }
    Ok(())
}
