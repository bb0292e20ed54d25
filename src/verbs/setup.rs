//! Set-up sequences every consumer of the trait would otherwise repeat.

use super::{
    AccessFlags, AddressVector, BufId, CqId, Gid, PathMtu, PdId, PoolId, Psn, QKey, QpAttr, QpInit,
    QpNum, QpState, QpType, Verbs, VerbsError, WrId,
};

/// Transport retries (`retry_cnt`) after a local ACK timeout or a PSN-sequence NAK: 7, the
/// most the 3-bit field holds. Unlike [`RNR_RETRY_FOREVER`] this is a count: the eighth
/// timeout in a row fails the send with `RetryExcErr`.
pub const RC_RETRY_CNT: u8 = 7;

/// RNR retries (`rnr_retry`) that never give up. In the 3-bit field 0..=6 count retries but
/// 7 means "retry for ever" (IBTA 9.7.5.2.8, `ibv_modify_qp(3)`): an RNR NAK says the peer is
/// alive and its receive queue is momentarily empty, so the sender waits the RNR timer and
/// resends instead of failing the connection. Whatever must bound a peer that stays dry does
/// so above the QP (a stall watchdog).
pub const RNR_RETRY_FOREVER: u8 = 7;

/// The RNR NAK timer code a receiver asks of its peer by default: 12 = 0.64 ms (IBTA table
/// 45), the value of rdma-core's examples and Linux's IPoIB-CM.
pub const DEFAULT_MIN_RNR_TIMER: u8 = 12;

/// The local ACK timeout exponent by default: 14 = 4.096 µs · 2^14 ≈ 67 ms, rdma-core's.
pub const DEFAULT_LOCAL_ACK_TIMEOUT: u8 = 14;

/// A seed for what must not be guessable from outside: starting PSNs, CM ids, CA GUIDs and
/// the software provider's QPN order. From the operating system's random source; should that
/// fail, the wall clock and the process id (then it still differs between runs, but is no
/// longer secret).
pub fn os_seed() -> u64 {
    use rand::RngCore;
    let mut b = [0u8; 8];
    match rand::rngs::OsRng.try_fill_bytes(&mut b) {
        Ok(()) => u64::from_ne_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ (u64::from(std::process::id()) << 32)
        }
    }
}

/// The RESET → INIT attributes of an RC QP: P_Key index 0, port 1, no remote access (SEND
/// only).
pub fn rc_init_attr() -> QpAttr {
    rc_init_attr_at(0)
}

/// [`rc_init_attr`] with P_Key index `pkey_index` ([`Verbs::pkey_index`]).
pub fn rc_init_attr_at(pkey_index: u16) -> QpAttr {
    QpAttr {
        pkey_index: Some(pkey_index),
        port: Some(1),
        access: Some(AccessFlags::default()),
        ..QpAttr::to_state(QpState::Init)
    }
}

/// Moves an RC QP RESET → INIT ([`rc_init_attr_at`] `pkey_index`). Receives may be posted from here on, before
/// [`connect_rc`].
///
/// # Errors
/// The provider's error.
pub fn init_rc_qp<V: Verbs>(v: &mut V, qp: QpNum, pkey_index: u16) -> Result<(), VerbsError> {
    v.modify_qp(qp, &rc_init_attr_at(pkey_index))
}

/// What RTR and RTS need to connect one RC QP to its peer: the peer's address and QPN, the
/// path MTU, both PSNs, and the retry and timer policy. [`RcConnection::new`] fills the policy
/// with the defaults; change a field with struct update syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnection {
    /// Where the peer is (its GID in the primary path).
    pub av: AddressVector,
    /// The peer's QPN (`dest_qpn`).
    pub remote_qpn: QpNum,
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// The first PSN this QP expects to receive (`rq_psn`).
    pub rq_psn: Psn,
    /// The first PSN this QP sends (`sq_psn`).
    pub sq_psn: Psn,
    /// Local ACK timeout exponent: 4.096 µs · 2^n, 0 = infinite.
    pub timeout: u8,
    /// Transport retries, 0..=7 ([`RC_RETRY_CNT`]).
    pub retry_cnt: u8,
    /// RNR retries, 0..=6, or [`RNR_RETRY_FOREVER`].
    pub rnr_retry: u8,
    /// RNR NAK timer code asked of the peer, 0..=31.
    pub min_rnr_timer: u8,
    /// RDMA READ/atomic depth, both directions (`max_rd_atomic` and `max_dest_rd_atomic`);
    /// 0 for a SEND-only connection.
    pub rd_atomic: u8,
}

impl RcConnection {
    /// A connection to `remote` (GID, QPN) with the default policy: timeout
    /// [`DEFAULT_LOCAL_ACK_TIMEOUT`], [`RC_RETRY_CNT`] transport retries, RNR retries for ever,
    /// [`DEFAULT_MIN_RNR_TIMER`], no RDMA READ/atomics.
    pub fn new(remote: (Gid, QpNum), path_mtu: PathMtu, rq_psn: Psn, sq_psn: Psn) -> Self {
        Self {
            av: AddressVector::to_gid(remote.0),
            remote_qpn: remote.1,
            path_mtu,
            rq_psn,
            sq_psn,
            timeout: DEFAULT_LOCAL_ACK_TIMEOUT,
            retry_cnt: RC_RETRY_CNT,
            rnr_retry: RNR_RETRY_FOREVER,
            min_rnr_timer: DEFAULT_MIN_RNR_TIMER,
            rd_atomic: 0,
        }
    }

    /// The INIT → RTR attributes.
    pub fn rtr_attr(&self) -> QpAttr {
        QpAttr {
            av: Some(self.av),
            path_mtu: Some(self.path_mtu),
            dest_qpn: Some(self.remote_qpn),
            rq_psn: Some(self.rq_psn),
            max_dest_rd_atomic: Some(self.rd_atomic),
            min_rnr_timer: Some(self.min_rnr_timer),
            ..QpAttr::to_state(QpState::Rtr)
        }
    }

    /// The RTR → RTS attributes.
    pub fn rts_attr(&self) -> QpAttr {
        QpAttr {
            timeout: Some(self.timeout),
            retry_cnt: Some(self.retry_cnt),
            rnr_retry: Some(self.rnr_retry),
            sq_psn: Some(self.sq_psn),
            max_rd_atomic: Some(self.rd_atomic),
            ..QpAttr::to_state(QpState::Rts)
        }
    }
}

/// Connects an RC QP in INIT (see [`init_rc_qp`]): INIT → RTR → RTS with `c`'s attributes.
/// The active side calls it when the REP arrives, the passive side when it accepts a REQ.
///
/// # Errors
/// The provider's error for the first transition that fails (the QP stays in INIT, or in
/// RTR when RTS fails).
pub fn connect_rc<V: Verbs>(v: &mut V, qp: QpNum, c: &RcConnection) -> Result<(), VerbsError> {
    v.modify_qp(qp, &c.rtr_attr())?;
    v.modify_qp(qp, &c.rts_attr())
}

/// A UD or GSI QP in RTS, with its receives posted.
#[derive(Debug)]
pub struct UdQpSetup {
    /// The QP.
    pub qp: QpNum,
    /// Send buffers taken from the pool, held by the caller.
    pub send_bufs: Vec<BufId>,
}

/// Creates a UD or GSI QP on `cq`, moves it RESET → INIT (`pkey_index`, port 1 for UD, the
/// Q_Key) → RTR → RTS (SQ PSN 0), posts `recv_depth` receives with `recv_wr` from `pool`, and
/// takes `send_depth` more buffers from `pool` for sending. Every send is signaled, so each
/// send buffer comes back in a completion.
///
/// # Errors
/// Any verbs error of the sequence, or [`VerbsError::OutOfResources`] if the pool is too
/// small.
#[allow(clippy::too_many_arguments)]
pub fn open_ud_qp<V: Verbs>(
    v: &mut V,
    pd: PdId,
    qp_type: QpType,
    cq: CqId,
    pool: PoolId,
    qkey: QKey,
    pkey_index: u16,
    recv_depth: u32,
    send_depth: u32,
    recv_wr: WrId,
) -> Result<UdQpSetup, VerbsError> {
    let qp = v.create_qp(&QpInit {
        pd,
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        max_send_wr: send_depth,
        max_recv_wr: recv_depth,
        sq_sig_all: true,
    })?;
    v.modify_qp(
        qp,
        &QpAttr {
            pkey_index: Some(pkey_index),
            port: (qp_type != QpType::Gsi).then_some(1),
            qkey: Some(qkey),
            ..QpAttr::to_state(QpState::Init)
        },
    )?;
    v.modify_qp(qp, &QpAttr::to_state(QpState::Rtr))?;
    v.modify_qp(
        qp,
        &QpAttr {
            sq_psn: Some(Psn::new(0)),
            ..QpAttr::to_state(QpState::Rts)
        },
    )?;
    let take = |v: &mut V| {
        v.pools_mut()
            .alloc(pool)
            .ok_or(VerbsError::OutOfResources("UD buffers"))
    };
    for _ in 0..recv_depth {
        let b = take(v)?;
        v.post_recv(qp, recv_wr, b)?;
    }
    let mut send_bufs = Vec::with_capacity(send_depth as usize);
    for _ in 0..send_depth {
        send_bufs.push(take(v)?);
    }
    Ok(UdQpSetup { qp, send_bufs })
}
