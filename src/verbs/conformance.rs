//! A provider conformance suite: the [contract](super) checked through the [`Verbs`] trait
//! alone, so the same checks run against the software provider (over
//! [`crate::sim::Fabric`]) and, later, against a libibverbs hardware provider.
//!
//! A [`ConformancePair`] lends two providers whose ports reach each other, and a way to let
//! the fabric between them run ([`ConformancePair::settle`]). Each check opens its own PDs,
//! CQs and buffer pools, creates and connects its own QPs (RESET → INIT → RTR → RTS with the
//! other port's GID, exactly as a CM would), and destroys its QPs before it returns, so the
//! checks are independent and may run in any order on one pair. A check returns `Err` with a
//! description of the first contract violation it saw.
//!
//! Waiting is done only through [`ConformancePair::settle`], repeated at most
//! [`MAX_SETTLES`] times, so a check never loops unboundedly and never reads a clock: on the
//! simulated fabric a settle runs virtual time; on hardware it polls for a short while.
//!
//! # The checks
//!
//! | Name | What it checks |
//! |---|---|
//! | `qp_state_machine` | [`check_qp_state_machine`] |
//! | `rc_message_sizes` | [`check_rc_message_sizes`] |
//! | `completion_order` | [`check_completion_order`] |
//! | `flush_on_err` | [`check_flush_on_err`] |
//! | `drain_wr_after_err` | [`check_drain_wr_after_err`] |
//! | `srq_last_wqe_once` | [`check_srq_last_wqe_once`] |
//! | `rnr_then_success` | [`check_rnr_then_success`] |
//! | `rnr_retry_exceeded` | [`check_rnr_retry_exceeded`] |
//! | `retry_exceeded_peer_gone` | [`check_retry_exceeded_peer_gone`] |
//! | `ud_grh_qkey` | [`check_ud_grh_qkey`] |
//! | `buffer_lending` | [`check_buffer_lending`] |
//! | `comm_est` | [`check_comm_est`] |
//! | `object_rules` | [`check_object_rules`] |

use super::setup::{self, RcConnection};
use super::{
    AddressVector, AsyncEvent, BufId, Completion, CqId, Gid, PathMtu, PdId, PoolId, Psn, QKey,
    QpAttr, QpInit, QpNum, QpState, QpType, SendWr, SrqId, SrqInit, UdDest, Verbs, VerbsError,
    WcOpcode, WcStatus, WrId,
};

/// How a check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConformanceError {
    /// A verb the check needs failed (one the contract says succeeds there).
    #[error("{step}: {source}")]
    Verb {
        /// What the check was doing.
        step: String,
        /// The provider's error.
        #[source]
        source: VerbsError,
    },
    /// The provider broke the contract: what it did, against what the contract asks.
    #[error("{0}")]
    Violation(String),
    /// A pool the check allocates from had no free buffer.
    #[error("pool {0:?} exhausted")]
    PoolExhausted(PoolId),
    /// Data the check sends does not fit a buffer of its pool.
    #[error("{len} bytes do not fit a buffer of {cap}")]
    TooBig {
        /// Bytes to send.
        len: usize,
        /// The pool's buffer size.
        cap: usize,
    },
    /// [`run_one`] was asked for a check that does not exist.
    #[error("no conformance check named {0}")]
    NoSuchCheck(String),
}

/// A [`ConformanceError::Violation`] described by a format string.
macro_rules! violation {
    ($($fmt:tt)+) => {
        ConformanceError::Violation(format!($($fmt)+))
    };
}

/// Two providers that can reach each other, and a way to let the fabric between them run.
pub trait ConformancePair<V: Verbs> {
    /// The two providers, called `a` and `b` by the checks.
    fn providers(&mut self) -> (&mut V, &mut V);

    /// Lets the fabric run for a while: deliver what is in flight, fire due timers, and
    /// process what that causes, until nothing is left or some bound is reached. A check
    /// that waits for something calls this up to [`MAX_SETTLES`] times, so one settle must be
    /// long enough for a few retransmit timeouts of `timeout` 10 (4 ms) or RNR back-offs of
    /// [`RcParams::min_rnr_timer`] 14 (1.28 ms) to pass.
    fn settle(&mut self);
}

/// A check: a name and the function that runs it.
pub type Check<P> = (&'static str, fn(&mut P) -> Result<(), ConformanceError>);

/// Most [`ConformancePair::settle`] calls a check makes while waiting for one thing.
pub const MAX_SETTLES: usize = 64;

/// Every check, in the order [`run_all`] runs them.
pub fn checks<V: Verbs, P: ConformancePair<V>>() -> Vec<Check<P>> {
    vec![
        ("qp_state_machine", check_qp_state_machine::<V, P>),
        ("rc_message_sizes", check_rc_message_sizes::<V, P>),
        ("completion_order", check_completion_order::<V, P>),
        ("flush_on_err", check_flush_on_err::<V, P>),
        ("drain_wr_after_err", check_drain_wr_after_err::<V, P>),
        ("srq_last_wqe_once", check_srq_last_wqe_once::<V, P>),
        ("rnr_then_success", check_rnr_then_success::<V, P>),
        ("rnr_retry_exceeded", check_rnr_retry_exceeded::<V, P>),
        (
            "retry_exceeded_peer_gone",
            check_retry_exceeded_peer_gone::<V, P>,
        ),
        ("ud_grh_qkey", check_ud_grh_qkey::<V, P>),
        ("buffer_lending", check_buffer_lending::<V, P>),
        ("comm_est", check_comm_est::<V, P>),
        ("object_rules", check_object_rules::<V, P>),
    ]
}

/// Runs every check on `pair`, in order; returns each check's name and outcome.
pub fn run_all<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Vec<(&'static str, Result<(), ConformanceError>)> {
    checks::<V, P>()
        .into_iter()
        .map(|(name, f)| (name, f(pair)))
        .collect()
}

/// Runs the check called `name`.
///
/// # Errors
/// The check's failure, or an error naming an unknown check.
pub fn run_one<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    name: &str,
) -> Result<(), ConformanceError> {
    let (_, f) = checks::<V, P>()
        .into_iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| ConformanceError::NoSuchCheck(name.to_owned()))?;
    f(pair)
}

// -------------------------------------------------------------------------------------------
// Building blocks, public so provider-specific tests can reuse them.
// -------------------------------------------------------------------------------------------

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
            retry_cnt: 7,
            rnr_retry_a: 7,
            rnr_retry_b: 7,
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
    let (ca, cb) = rc_connections(a, qa, b, qb, p);
    setup::init_rc_qp(a, qa)?;
    setup::init_rc_qp(b, qb)?;
    setup::connect_rc(a, qa, &ca)?;
    setup::connect_rc(b, qb, &cb)?;
    Ok((qa, qb))
}

fn create_rc_pair<V: Verbs>(
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
fn rc_connections<V: Verbs>(
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

/// Completions collected from both sides of a pair.
#[derive(Debug, Default)]
struct Seen {
    a_send: Vec<Completion>,
    a_recv: Vec<Completion>,
    b_send: Vec<Completion>,
    b_recv: Vec<Completion>,
}

impl Seen {
    fn poll<V: Verbs>(&mut self, a: &mut V, ea: &Endpoint, b: &mut V, eb: &Endpoint) {
        poll_into(a, ea.send_cq, &mut self.a_send);
        poll_into(a, ea.recv_cq, &mut self.a_recv);
        poll_into(b, eb.send_cq, &mut self.b_send);
        poll_into(b, eb.recv_cq, &mut self.b_recv);
    }

    fn free<V: Verbs>(&self, a: &mut V, b: &mut V) {
        free_bufs(a, &self.a_send);
        free_bufs(a, &self.a_recv);
        free_bufs(b, &self.b_send);
        free_bufs(b, &self.b_recv);
    }
}

/// Settles `pair` until `done` holds for the completions seen so far (polling both
/// endpoints before each test), at most [`MAX_SETTLES`] times. Returns whether it held.
fn wait<V: Verbs, P: ConformancePair<V>>(
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

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(violation!($($fmt)+));
        }
    };
}

/// Adds context to a verbs error.
trait Ctx<T> {
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

fn statuses(cs: &[Completion]) -> Vec<(u64, WcStatus)> {
    cs.iter().map(|c| (c.wr_id.0, c.status)).collect()
}

/// Buffer size of the pools the checks open (large enough for the biggest message).
const BIG: usize = 128 * 1024;

/// Opens an endpoint on each side with `count` buffers of `buf_len` bytes.
fn endpoints<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    buf_len: usize,
    count: usize,
) -> Result<(Endpoint, Endpoint), ConformanceError> {
    let (a, b) = pair.providers();
    let ea = open_endpoint(a, buf_len, count, 1024).ctx("open endpoint a")?;
    let eb = open_endpoint(b, buf_len, count, 1024).ctx("open endpoint b")?;
    Ok((ea, eb))
}

/// Destroys the QPs and the endpoints' CQs, freeing whatever completions returned.
fn teardown<V: Verbs, P: ConformancePair<V>>(
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
fn expect_statuses(
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
fn expect_recv<V: Verbs>(
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

// -------------------------------------------------------------------------------------------
// The checks
// -------------------------------------------------------------------------------------------

/// **QP state machine through `modify_qp`.** A fresh RC QP is in RESET and refuses
/// `post_recv` and `post_send` there; illegal transitions (RESET→RTR, INIT→RTS, RTS→RTR,
/// ERR→RTS, ERR→INIT) fail with [`VerbsError::IllegalTransition`], a transition lacking a
/// required attribute with [`VerbsError::MissingAttributes`], one with a forbidden attribute
/// with [`VerbsError::UnexpectedAttributes`], a wrong `cur_state` with
/// [`VerbsError::InvalidAttribute`], and none of them changes the state. Legal transitions
/// walk RESET→INIT→RTR→RTS→RTS→SQD→RTS→ERR→RESET→INIT; `post_recv` works from INIT on and
/// `post_send` from RTS on. A UD QP needs a Q_Key, not an address vector.
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
        let rtr = rc_rtr_attr((b.port_attr().gid, peer), mtu, Psn::new(5), 14);
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
        let mut rts = rc_rts_attr(14, 7, 7, Psn::new(9));
        rts.retry_cnt = None;
        match a.modify_qp(qp, &rts) {
            Err(VerbsError::MissingAttributes { .. }) => {}
            r => return Err(violation!("RTR->RTS without RETRY_CNT gave {r:?}")),
        }
        let wrong_cur = QpAttr {
            cur_state: Some(QpState::Init),
            ..rc_rts_attr(14, 7, 7, Psn::new(9))
        };
        match a.modify_qp(qp, &wrong_cur) {
            Err(VerbsError::InvalidAttribute(_)) => {}
            r => return Err(violation!("RTR->RTS with cur_state INIT gave {r:?}")),
        }
        expect_state(a, QpState::Rtr)?;
        a.modify_qp(qp, &rc_rts_attr(14, 7, 7, Psn::new(9)))
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

/// **RC round trip of 1 B, 4 KiB, 64 KiB and larger messages.** Side `a` sends messages of
/// 1, 4096, 65 524 (the IPoIB-CM maximum), 65 536 and 100 000 bytes of distinct pseudo-random
/// content; `b` receives each and sends the received buffer straight back; `a` receives the
/// echoes. Every receive completes successfully with the right `byte_len` and exactly the
/// bytes sent, in order; every send completes successfully.
pub fn check_rc_message_sizes<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const SIZES: [usize; 5] = [1, 4096, 65_524, 65_536, 100_000];
    let (ea, eb) = endpoints(pair, BIG, 16)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    let msgs: Vec<Vec<u8>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, n)| pattern(0x5EED + i as u64, *n))
        .collect();
    post_recvs(a, RecvTarget::Qp(qa), ea.pool, 100, SIZES.len())?;
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 200, SIZES.len())?;
    for (i, m) in msgs.iter().enumerate() {
        post_send_data(a, qa, ea.pool, i as u64, m)?;
    }
    let n = SIZES.len();
    let ok = wait(pair, &ea, &eb, &mut seen, |s| s.b_recv.len() >= n);
    ensure!(ok, "b received {} of {n} messages", seen.b_recv.len());
    let (_, b) = pair.providers();
    for (i, (c, m)) in seen.b_recv.iter().zip(&msgs).enumerate() {
        expect_recv(b, c, 200 + i as u64, m, 0)?;
        let buf = c.buf.ok_or_else(|| violation!("no buffer"))?;
        b.post_send(qb, &SendWr::send(WrId(300 + i as u64), buf, m.len()))
            .ctx("echo")?;
    }
    // The echoed buffers now belong to b's send WRs, whose completions return them.
    seen.b_recv.clear();
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.a_recv.len() >= n && s.a_send.len() >= n && s.b_send.len() >= n
    });
    ensure!(
        ok,
        "round trip incomplete: a sent {}, b echoed {}, a got {} back",
        seen.a_send.len(),
        seen.b_send.len(),
        seen.a_recv.len()
    );
    let (a, _) = pair.providers();
    for (i, (c, m)) in seen.a_recv.iter().zip(&msgs).enumerate() {
        expect_recv(a, c, 100 + i as u64, m, 0)?;
    }
    let want: Vec<_> = (0..n as u64).map(|i| (i, WcStatus::Success)).collect();
    expect_statuses("a's sends", &seen.a_send, &want)?;
    let want: Vec<_> = (0..n as u64)
        .map(|i| (300 + i, WcStatus::Success))
        .collect();
    expect_statuses("b's echoes", &seen.b_send, &want)?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **Completion order.** 48 sends of sizes 0 to a few path MTUs, every third unsignaled and
/// every fifth with immediate data, are posted back to back. The receiver's completions come
/// in posting order with the right lengths, contents and immediates; the sender gets exactly
/// one successful completion per signaled WR, in posting order, and none for unsignaled
/// ones; afterwards no buffer is left posted.
pub fn check_completion_order<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const N: u64 = 48;
    let (ea, eb) = endpoints(pair, 16 * 1024, 64)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let base_a = a.pools().posted_count();
    let base_b = b.pools().posted_count();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 1000, N as usize)?;
    let mut msgs = Vec::new();
    for i in 0..N {
        let len = ((i * 997) % (3 * 1024 + 7)) as usize * usize::from(i % 7 != 0);
        let m = pattern(i, len);
        let buf = alloc_with(a, ea.pool, &m)?;
        let wr = SendWr {
            signaled: i % 3 != 2,
            imm: (i % 5 == 0).then_some(0xC0DE_0000 | i as u32),
            ..SendWr::send(WrId(i), buf, len)
        };
        a.post_send(qa, &wr).ctx("post_send")?;
        msgs.push((m, wr));
    }
    let signaled = msgs.iter().filter(|(_, w)| w.signaled).count();
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.b_recv.len() >= N as usize && s.a_send.len() >= signaled
    });
    ensure!(
        ok,
        "got {} receives and {} send completions, expected {N} and {signaled}",
        seen.b_recv.len(),
        seen.a_send.len()
    );
    let (a, b) = pair.providers();
    for (i, (c, (m, wr))) in seen.b_recv.iter().zip(&msgs).enumerate() {
        expect_recv(b, c, 1000 + i as u64, m, 0)?;
        ensure!(
            c.imm == wr.imm,
            "receive {i}: immediate {:?}, expected {:?}",
            c.imm,
            wr.imm
        );
    }
    let want: Vec<_> = msgs
        .iter()
        .filter(|(_, w)| w.signaled)
        .map(|(_, w)| (w.wr_id.0, WcStatus::Success))
        .collect();
    expect_statuses("sends", &seen.a_send, &want)?;
    seen.free(a, b);
    let (pa, pb) = (a.pools().posted_count(), b.pools().posted_count());
    ensure!(
        pa == base_a && pb == base_b,
        "buffers still posted after every WR completed: a {pa} (was {base_a}), b {pb} (was {base_b})"
    );
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &Seen::default());
    Ok(())
}

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
/// receive. Each is accepted, and each completes with [`WcStatus::WrFlushErr`]; the drain
/// WRs complete after the two sends posted before them.
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
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.a_send.len() >= 4 && !s.a_recv.is_empty()
    });
    ensure!(
        ok,
        "drain WRs did not complete: sends {:?}, receives {:?}",
        statuses(&seen.a_send),
        statuses(&seen.a_recv)
    );
    let flush = WcStatus::WrFlushErr;
    expect_statuses(
        "sends",
        &seen.a_send,
        &[(1, flush), (2, flush), (3, flush), (4, flush)],
    )?;
    expect_statuses("receive posted in ERR", &seen.a_recv, &[(10, flush)])?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **Last WQE Reached, exactly once.** `b`'s QP takes its receives from an SRQ holding four
/// WQEs; one message consumes one. Moving the QP to ERR raises exactly one
/// [`AsyncEvent::QpLastWqeReached`] for it; a second move to ERR raises none; the three WQEs
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
    ensure!(
        last(&events) == 1,
        "QpLastWqeReached raised {} times on the move to ERR (events {events:?})",
        last(&events)
    );
    let (_, b) = pair.providers();
    b.modify_qp(qb, &QpAttr::to_state(QpState::Err))
        .ctx("ERR->ERR")?;
    pair.settle();
    let (a, b) = pair.providers();
    let again = drain_events(b);
    ensure!(
        last(&again) == 0,
        "a second move to ERR raised QpLastWqeReached again ({again:?})"
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

/// **UD send and receive.** Two UD QPs with Q_Key 0x11223344. A 200-byte send with immediate
/// data arrives in a receive buffer after a 40-byte GRH area: `byte_len` is 240, `grh` is
/// set, `src_qp` is the sender, the payload follows the GRH, and the GRH names the sender's
/// GID (for an IPv4-mapped GID, the IPv4 source at bytes 32..36; otherwise the IPv6 source
/// at 8..24). A send with the wrong Q_Key completes at the sender but is dropped by the
/// receiver: the next receive gets the following good message instead.
pub fn check_ud_grh_qkey<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const QK: QKey = QKey(0x1122_3344);
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let qa = create_qp(a, &ea, QpType::Ud, None, (16, 16)).ctx("create UD a")?;
    let qb = create_qp(b, &eb, QpType::Ud, None, (16, 16)).ctx("create UD b")?;
    for (v, q) in [(&mut *a, qa), (&mut *b, qb)] {
        let init = QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(QK),
            ..QpAttr::to_state(QpState::Init)
        };
        v.modify_qp(q, &init).ctx("UD RESET->INIT")?;
        v.modify_qp(q, &QpAttr::to_state(QpState::Rtr))
            .ctx("UD INIT->RTR")?;
        let rts = QpAttr {
            sq_psn: Some(Psn::new(0)),
            ..QpAttr::to_state(QpState::Rts)
        };
        v.modify_qp(q, &rts).ctx("UD RTR->RTS")?;
    }
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 10, 2)?;
    let gb = b.port_attr().gid;
    let ga = a.port_attr().gid;
    let dest = |qkey| UdDest {
        av: AddressVector::to_gid(gb),
        remote_qpn: qb,
        remote_qkey: qkey,
    };
    let msgs = [pattern(1, 200), pattern(2, 64), pattern(3, 77)];
    let keys = [QK, QKey(QK.0 ^ 1), QK];
    for (i, (m, k)) in msgs.iter().zip(keys).enumerate() {
        let buf = alloc_with(a, ea.pool, m)?;
        let wr = SendWr {
            ud: Some(dest(k)),
            imm: (i == 0).then_some(0xFEED),
            ..SendWr::send(WrId(i as u64), buf, m.len())
        };
        a.post_send(qa, &wr).ctx("UD post_send")?;
    }
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.b_recv.len() >= 2 && s.a_send.len() >= 3
    });
    ensure!(
        ok,
        "UD: {} receives and {} send completions, expected 2 and 3",
        seen.b_recv.len(),
        seen.a_send.len()
    );
    let want = [
        (0, WcStatus::Success),
        (1, WcStatus::Success),
        (2, WcStatus::Success),
    ];
    expect_statuses("UD sends", &seen.a_send, &want)?;
    let (_, b) = pair.providers();
    let c0 = &seen.b_recv[0];
    expect_recv(b, c0, 10, &msgs[0], 40)?;
    ensure!(
        c0.grh && c0.src_qp == Some(qa) && c0.imm == Some(0xFEED),
        "UD receive: grh {}, src_qp {:?}, imm {:?}",
        c0.grh,
        c0.src_qp,
        c0.imm
    );
    let grh = b
        .pools()
        .get(c0.buf.ok_or_else(|| violation!("no buffer"))?)
        .ctx("UD buffer")?;
    let src_ok = match ga.to_ip() {
        std::net::IpAddr::V4(v4) => grh.get(32..36) == Some(&v4.octets()[..]),
        std::net::IpAddr::V6(_) => grh.get(8..24) == Some(&ga.0[..]),
    };
    ensure!(src_ok, "the GRH area does not name the sender {ga}");
    // The wrong-key message (1) was dropped: receive 11 holds message 2.
    expect_recv(b, &seen.b_recv[1], 11, &msgs[2], 40)?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **Buffer lending.** A posted buffer cannot be read, written, freed or posted again by the
/// caller (all fail with [`VerbsError::BufferNotHeld`]); `posted_count` counts it. The
/// completion returns it with its contents (the sent bytes unchanged, the received bytes
/// written). Destroying a QP with a receive still posted frees that buffer without a
/// completion, and `posted_count` returns to where it started.
pub fn check_buffer_lending<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (base_a, base_b) = (a.pools().posted_count(), b.pools().posted_count());
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    let rb = post_recvs(b, RecvTarget::Qp(qb), eb.pool, 5, 2)?;
    let msg = pattern(11, 3333);
    let sb = post_send_data(a, qa, ea.pool, 1, &msg)?;
    for (v, buf, who) in [(&mut *a, sb, "send"), (&mut *b, rb[0], "receive")] {
        ensure!(
            v.pools().get(buf) == Err(VerbsError::BufferNotHeld(buf)),
            "a posted {who} buffer is readable"
        );
        ensure!(
            v.pools_mut().get_mut(buf).is_err(),
            "a posted {who} buffer is writable"
        );
        ensure!(
            v.pools_mut().free(buf).is_err(),
            "a posted {who} buffer could be freed"
        );
    }
    match a.post_send(qa, &SendWr::send(WrId(2), sb, 10)) {
        Err(VerbsError::BufferNotHeld(_)) => {}
        r => return Err(violation!("posting a posted buffer again gave {r:?}")),
    }
    match b.post_recv(qb, WrId(7), rb[0]) {
        Err(VerbsError::BufferNotHeld(_)) => {}
        r => {
            return Err(violation!(
                "posting a posted receive buffer again gave {r:?}"
            ))
        }
    }
    ensure!(
        a.pools().posted_count() == base_a + 1 && b.pools().posted_count() == base_b + 2,
        "posted_count: a {} (expected {}), b {} (expected {})",
        a.pools().posted_count(),
        base_a + 1,
        b.pools().posted_count(),
        base_b + 2
    );
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        !s.a_send.is_empty() && !s.b_recv.is_empty()
    });
    ensure!(ok, "the send did not complete");
    let (a, b) = pair.providers();
    ensure!(
        seen.a_send[0].buf == Some(sb) && seen.b_recv[0].buf == Some(rb[0]),
        "completions returned other buffers: {:?} / {:?}",
        seen.a_send[0].buf,
        seen.b_recv[0].buf
    );
    ensure!(
        a.pools()
            .get(sb)
            .ctx("returned send buffer")?
            .get(..msg.len())
            == Some(&msg[..]),
        "the send buffer changed while lent"
    );
    expect_recv(b, &seen.b_recv[0], 5, &msg, 0)?;
    ensure!(
        b.pools().posted_count() == base_b + 1,
        "b posted_count {} after one of two receives completed, expected {}",
        b.pools().posted_count(),
        base_b + 1
    );
    let free_before = b.pools().free_count(eb.pool);
    b.destroy_qp(qb).ctx("destroy b")?;
    ensure!(
        b.pools().posted_count() == base_b,
        "destroying a QP left its receive buffer posted"
    );
    ensure!(
        b.pools().free_count(eb.pool) == free_before + 1,
        "destroying a QP did not free its receive buffer"
    );
    ensure!(
        b.pools().get(rb[1]).is_err(),
        "the freed buffer is still readable as held"
    );
    seen.free(a, b);
    ensure!(
        a.pools().posted_count() == base_a,
        "a still has buffers posted"
    );
    teardown(pair, (&ea, &eb), (&[qa], &[]), &Seen::default());
    Ok(())
}

/// **Communication established.** `b`'s QP is left in RTR (never moved to RTS); the first
/// request arriving on it is processed (the receive completes) and raises
/// [`AsyncEvent::CommEst`] for it, once.
pub fn check_comm_est<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let p = RcParams::default();
    let (a, b) = pair.providers();
    let (qa, qb) = create_rc_pair(a, &ea, b, &eb, &p).ctx("create")?;
    let (ca, cb) = rc_connections(a, qa, b, qb, &p);
    setup::init_rc_qp(a, qa).ctx("a to INIT")?;
    setup::init_rc_qp(b, qb).ctx("b to INIT")?;
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
    let (_, b) = pair.providers();
    let evs = drain_events(b);
    let n = evs
        .iter()
        .filter(|e| **e == AsyncEvent::CommEst(qb))
        .count();
    ensure!(n == 1, "CommEst raised {n} times ({evs:?})");
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
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
