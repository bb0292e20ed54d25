//! The RC QP of a tool run, built and connected as rdma-core's pingpong examples do it.

use rand::{Rng, SeedableRng};

use super::exchange::Dest;
use super::{PingpongError, RcLink, RECV_WRID};
use crate::verbs::setup::{self, RcConnection};
use crate::verbs::{BufId, CqId, PdId, Psn, QpInit, QpNum, QpType, Verbs};

/// The RC QP of a run, as rdma-core's examples build it.
pub(crate) struct RcQpSetup {
    pub(crate) pd: PdId,
    pub(crate) cq: CqId,
    pub(crate) qp: QpNum,
    /// The first send buffer (held).
    pub(crate) send_buf: BufId,
    /// The other `tx_depth - 1` send buffers (held).
    pub(crate) spare_send_bufs: Vec<BufId>,
    /// This side's QP info: the QPN, a random PSN and the port's GID.
    pub(crate) my: Dest,
}

/// PD, a pool of `rx_depth + tx_depth` buffers of `size` bytes, one CQ for both queues, an RC
/// QP with room for `tx_depth` sends moved to INIT with `rx_depth` receives posted
/// ([`RECV_WRID`]), `tx_depth` send buffers held, and a random 24-bit PSN drawn from `seed`
/// (in the returned [`Dest`]).
/// rdma-core's pingpong examples use a `tx_depth` of 1.
///
/// # Errors
/// The provider's error, or an exhausted pool.
pub(crate) fn open_rc_qp<V: Verbs>(
    v: &mut V,
    size: usize,
    (rx_depth, tx_depth): (u32, u32),
    seed: u64,
) -> Result<RcQpSetup, PingpongError> {
    let tx_depth = tx_depth.max(1);
    let pd = v.alloc_pd().map_err(PingpongError::verbs("alloc_pd"))?;
    let pool = v
        .create_pool(pd, size.max(1), rx_depth as usize + tx_depth as usize)
        .map_err(PingpongError::verbs("create_pool"))?;
    let cq = v
        .create_cq(rx_depth.saturating_add(tx_depth))
        .map_err(PingpongError::verbs("create_cq"))?;
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: tx_depth,
            max_recv_wr: rx_depth,
            sq_sig_all: false,
        })
        .map_err(PingpongError::verbs("create_qp"))?;
    setup::init_rc_qp(v, qp, 0).map_err(PingpongError::verbs("RESET->INIT"))?;
    let send_buf = v
        .pools_mut()
        .alloc(pool)
        .ok_or(PingpongError::PoolExhausted)?;
    let spare_send_bufs = (1..tx_depth)
        .map(|_| {
            v.pools_mut()
                .alloc(pool)
                .ok_or(PingpongError::PoolExhausted)
        })
        .collect::<Result<Vec<_>, _>>()?;
    for _ in 0..rx_depth {
        let b = v
            .pools_mut()
            .alloc(pool)
            .ok_or(PingpongError::PoolExhausted)?;
        v.post_recv(qp, RECV_WRID, b)
            .map_err(PingpongError::verbs("Couldn't post receive"))?;
    }
    let my = Dest {
        lid: 0,
        qpn: qp,
        psn: random_psn(seed),
        gid: v.port_attr().gid,
    };
    Ok(RcQpSetup {
        pd,
        cq,
        qp,
        send_buf,
        spare_send_bufs,
        my,
    })
}

/// A 24-bit PSN drawn from `seed`.
pub(crate) fn random_psn(seed: u64) -> Psn {
    Psn::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed).gen::<u32>())
}

/// The connection towards `rem` with rdma-core's pingpong attributes (7 retries, RNR retries
/// for ever, one read/atomic) on `link`'s MTU and timeout, receiving from `rq_psn` and
/// sending from `sq_psn`.
pub(crate) fn rdma_core_connection(
    rem: &Dest,
    link: &RcLink,
    rq_psn: Psn,
    sq_psn: Psn,
) -> RcConnection {
    RcConnection {
        timeout: link.qp_timeout,
        rd_atomic: 1,
        ..RcConnection::new((rem.gid, rem.qpn), link.mtu, rq_psn, sq_psn)
    }
}

/// RTR then RTS towards `rem` ([`rdma_core_connection`]).
///
/// # Errors
/// The provider's error.
pub(crate) fn connect_rc_qp<V: Verbs>(
    v: &mut V,
    qp: QpNum,
    rem: &Dest,
    link: &RcLink,
    (rq_psn, sq_psn): (Psn, Psn),
) -> Result<(), PingpongError> {
    let c = rdma_core_connection(rem, link, rq_psn, sq_psn);
    setup::connect_rc(v, qp, &c).map_err(PingpongError::verbs("INIT->RTR->RTS"))
}
