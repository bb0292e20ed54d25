//! Building blocks of the checks, public so provider-specific tests can reuse them.

use super::*;

/// Adds context to a verbs error.
pub(super) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, ConformanceError>;
}

impl<T> Ctx<T> for Result<T, VerbsError> {
    fn ctx(self, what: &str) -> Result<T, ConformanceError> {
        self.map_err(|source| ConformanceError::Verb {
            step: what.to_owned(),
            source,
        })
    }
}

/// The per-provider objects a check works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Protection domain.
    pub pd: PdId,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// A registered pool.
    pub pool: PoolId,
}

/// Opens a PD, two CQs of `cq_depth` entries and a pool of `count` buffers of `buf_len` bytes.
///
/// # Errors
/// The failing verb's error.
pub fn open_endpoint<V: Verbs>(
    v: &mut V,
    buf_len: usize,
    count: usize,
    cq_depth: u32,
) -> Result<Endpoint, VerbsError> {
    let pd = v.alloc_pd()?;
    let pool = v.create_pool(pd, buf_len, count)?;
    let send_cq = v.create_cq(cq_depth)?;
    let recv_cq = v.create_cq(cq_depth)?;
    Ok(Endpoint {
        pd,
        send_cq,
        recv_cq,
        pool,
    })
}

/// Destroys an endpoint's CQs (its QPs must be gone). The PD and pool stay: the trait has no
/// way to destroy a pool.
pub fn close_endpoint<V: Verbs>(v: &mut V, ep: &Endpoint) {
    let _ = v.destroy_cq(ep.send_cq);
    let _ = v.destroy_cq(ep.recv_cq);
}

/// Parameters of an RC connection made by [`connect_rc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcParams {
    /// Path MTU; `None` takes the smaller active MTU of the two ports.
    pub path_mtu: Option<PathMtu>,
    /// Local ACK timeout exponent (both sides).
    pub timeout: u8,
    /// Transport retries (both sides).
    pub retry_cnt: u8,
    /// RNR retries of side `a` (7 = infinite).
    pub rnr_retry_a: u8,
    /// RNR retries of side `b` (7 = infinite).
    pub rnr_retry_b: u8,
    /// RNR NAK timer code each side asks of its peer.
    pub min_rnr_timer: u8,
    /// First PSN `a` sends.
    pub psn_a: Psn,
    /// First PSN `b` sends.
    pub psn_b: Psn,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SRQ that `a`'s QP takes its receives from.
    pub srq_a: Option<SrqId>,
    /// SRQ that `b`'s QP takes its receives from.
    pub srq_b: Option<SrqId>,
}

impl Default for RcParams {
    fn default() -> Self {
        Self {
            path_mtu: None,
            timeout: 14,
            retry_cnt: setup::RC_RETRY_CNT,
            rnr_retry_a: setup::RNR_RETRY_FOREVER,
            rnr_retry_b: setup::RNR_RETRY_FOREVER,
            min_rnr_timer: 14,
            psn_a: Psn::new(0x00_1000),
            psn_b: Psn::new(0x7F_F000),
            max_send_wr: 256,
            max_recv_wr: 256,
            srq_a: None,
            srq_b: None,
        }
    }
}

/// Creates an RC QP in RESET on `ep`.
///
/// # Errors
/// [`Verbs::create_qp`]'s error.
pub fn create_qp<V: Verbs>(
    v: &mut V,
    ep: &Endpoint,
    qp_type: QpType,
    srq: Option<SrqId>,
    depth: (u32, u32),
) -> Result<QpNum, VerbsError> {
    v.create_qp(&QpInit {
        pd: ep.pd,
        qp_type,
        send_cq: ep.send_cq,
        recv_cq: ep.recv_cq,
        srq,
        max_send_wr: depth.0,
        max_recv_wr: depth.1,
        sq_sig_all: false,
    })
}

pub use super::setup::rc_init_attr;

/// The RC connection from one side towards `remote` (GID, QPN): `p`'s policy, `rnr_retry`,
/// receiving from `rq_psn` and sending from `sq_psn`.
fn rc_connection(
    remote: (Gid, QpNum),
    mtu: PathMtu,
    (rq_psn, sq_psn): (Psn, Psn),
    rnr_retry: u8,
    p: &RcParams,
) -> RcConnection {
    RcConnection {
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry,
        min_rnr_timer: p.min_rnr_timer,
        ..RcConnection::new(remote, mtu, rq_psn, sq_psn)
    }
}

/// The INIT → RTR attributes of an RC QP talking to `remote` (GID, QPN).
pub fn rc_rtr_attr(remote: (Gid, QpNum), mtu: PathMtu, rq_psn: Psn, min_rnr_timer: u8) -> QpAttr {
    RcConnection {
        min_rnr_timer,
        ..RcConnection::new(remote, mtu, rq_psn, Psn::new(0))
    }
    .rtr_attr()
}

/// The RTR → RTS attributes of an RC QP.
pub fn rc_rts_attr(timeout: u8, retry_cnt: u8, rnr_retry: u8, sq_psn: Psn) -> QpAttr {
    RcConnection {
        timeout,
        retry_cnt,
        rnr_retry,
        ..RcConnection::new(
            (Gid::default(), QpNum::new(1)),
            PathMtu::Mtu1024,
            Psn::new(0),
            sq_psn,
        )
    }
    .rts_attr()
}

/// Creates an RC QP on each side and connects them with [`setup::connect_rc`] (both end in
/// RTS). Returns `(a's QP, b's QP)`.
///
/// # Errors
/// The first failing verb's error.
pub fn connect_rc<V: Verbs>(
    a: &mut V,
    ea: &Endpoint,
    b: &mut V,
    eb: &Endpoint,
    p: &RcParams,
) -> Result<(QpNum, QpNum), VerbsError> {
    let (qa, qb) = create_rc_pair(a, ea, b, eb, p)?;
    connect_rc_pair(a, qa, b, qb, p)?;
    Ok((qa, qb))
}

/// Moves two fresh RC QPs, `qa` of `a` and `qb` of `b`, to RTS towards each other.
pub(super) fn connect_rc_pair<V: Verbs>(
    a: &mut V,
    qa: QpNum,
    b: &mut V,
    qb: QpNum,
    p: &RcParams,
) -> Result<(), VerbsError> {
    let (ca, cb) = rc_connections(a, qa, b, qb, p);
    setup::init_rc_qp(a, qa, 0)?;
    setup::init_rc_qp(b, qb, 0)?;
    setup::connect_rc(a, qa, &ca)?;
    setup::connect_rc(b, qb, &cb)
}

pub(super) fn create_rc_pair<V: Verbs>(
    a: &mut V,
    ea: &Endpoint,
    b: &mut V,
    eb: &Endpoint,
    p: &RcParams,
) -> Result<(QpNum, QpNum), VerbsError> {
    let depth = (p.max_send_wr, p.max_recv_wr);
    let qa = create_qp(a, ea, QpType::Rc, p.srq_a, depth)?;
    let qb = create_qp(b, eb, QpType::Rc, p.srq_b, depth)?;
    Ok((qa, qb))
}

/// The connections of `qa` (towards `qb`) and `qb` (towards `qa`): each receives from the
/// PSN the other sends from.
pub(super) fn rc_connections<V: Verbs>(
    a: &V,
    qa: QpNum,
    b: &V,
    qb: QpNum,
    p: &RcParams,
) -> (RcConnection, RcConnection) {
    let mtu = p
        .path_mtu
        .unwrap_or_else(|| a.port_attr().active_mtu.min(b.port_attr().active_mtu));
    let (ga, gb) = (a.port_attr().gid, b.port_attr().gid);
    (
        rc_connection((gb, qb), mtu, (p.psn_b, p.psn_a), p.rnr_retry_a, p),
        rc_connection((ga, qa), mtu, (p.psn_a, p.psn_b), p.rnr_retry_b, p),
    )
}

/// `len` deterministic pseudo-random bytes (xorshift64*), different for every `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// Allocates a buffer from `pool` and copies `data` to its start.
///
/// # Errors
/// A message when the pool is exhausted or the buffer too small.
pub fn alloc_with<V: Verbs>(
    v: &mut V,
    pool: PoolId,
    data: &[u8],
) -> Result<BufId, ConformanceError> {
    let b = v
        .pools_mut()
        .alloc(pool)
        .ok_or(ConformanceError::PoolExhausted(pool))?;
    let dst = v.pools_mut().get_mut(b).ctx("the fresh buffer")?;
    let cap = dst.len();
    dst.get_mut(..data.len())
        .ok_or(ConformanceError::TooBig {
            len: data.len(),
            cap,
        })?
        .copy_from_slice(data);
    Ok(b)
}

/// Copies `data` into a fresh buffer of `pool` and posts it as a signaled SEND on `qp`.
///
/// # Errors
/// A message naming the failing step.
pub fn post_send_data<V: Verbs>(
    v: &mut V,
    qp: QpNum,
    pool: PoolId,
    wr_id: u64,
    data: &[u8],
) -> Result<BufId, ConformanceError> {
    let b = alloc_with(v, pool, data)?;
    v.post_send(qp, &SendWr::send(WrId(wr_id), b, data.len()))
        .ctx(&format!("post_send {wr_id}"))?;
    Ok(b)
}

/// Posts `n` receive WRs with ids `first_id..` on `qp` (or on `srq` when given), each with a
/// fresh buffer of `pool`.
///
/// # Errors
/// A message naming the failing step.
pub fn post_recvs<V: Verbs>(
    v: &mut V,
    target: RecvTarget,
    pool: PoolId,
    first_id: u64,
    n: usize,
) -> Result<Vec<BufId>, ConformanceError> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let b = v
            .pools_mut()
            .alloc(pool)
            .ok_or(ConformanceError::PoolExhausted(pool))?;
        let id = WrId(first_id + i);
        match target {
            RecvTarget::Qp(q) => v.post_recv(q, id, b),
            RecvTarget::Srq(s) => v.post_srq_recv(s, id, b),
        }
        .ctx(&format!("post receive {}", first_id + i))?;
        out.push(b);
    }
    Ok(out)
}

/// Where [`post_recvs`] posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvTarget {
    /// A QP's own receive queue.
    Qp(QpNum),
    /// A shared receive queue.
    Srq(SrqId),
}

/// Moves every completion of `cq` onto `out` (bounded: at most 2^20 completions).
pub fn poll_into<V: Verbs>(v: &mut V, cq: CqId, out: &mut Vec<Completion>) {
    for _ in 0..1024 {
        if v.poll_cq(cq, out, 1024) == 0 {
            break;
        }
    }
}

/// Every queued asynchronous event (bounded: at most 4096).
pub fn drain_events<V: Verbs>(v: &mut V) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| v.poll_async_event())
        .take(4096)
        .collect()
}

/// Frees the buffers the completions returned.
pub fn free_bufs<V: Verbs>(v: &mut V, cs: &[Completion]) {
    for b in cs.iter().filter_map(|c| c.buf) {
        let _ = v.pools_mut().free(b);
    }
}
