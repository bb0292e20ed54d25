//! Set-up sequences every consumer of the trait would otherwise repeat.

use super::{
    BufId, CqId, PdId, PoolId, Psn, QKey, QpAttr, QpInit, QpNum, QpState, QpType, Verbs,
    VerbsError, WrId,
};

/// A UD or GSI QP in RTS, with its receives posted.
#[derive(Debug)]
pub struct UdQpSetup {
    /// The QP.
    pub qp: QpNum,
    /// Send buffers taken from the pool, held by the caller.
    pub send_bufs: Vec<BufId>,
}

/// Creates a UD or GSI QP on `cq`, moves it RESET → INIT (P_Key index 0, port 1 for UD, the
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
            pkey_index: Some(0),
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
