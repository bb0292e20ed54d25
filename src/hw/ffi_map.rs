//! Conversions between libibverbs' C enums and masks and the [`crate::verbs`] types.

use crate::verbs::{PathMtu, QpState, WcStatus};
use ibverbs_sys as ffi;

pub(super) fn mtu_from(m: ffi::ibv_mtu) -> PathMtu {
    PathMtu::from_enum(u8::try_from(m).unwrap_or(1)).unwrap_or(PathMtu::Mtu256)
}

pub(super) fn state_to(s: QpState) -> ffi::ibv_qp_state::Type {
    use ffi::ibv_qp_state as S;
    match s {
        QpState::Reset => S::IBV_QPS_RESET,
        QpState::Init => S::IBV_QPS_INIT,
        QpState::Rtr => S::IBV_QPS_RTR,
        QpState::Rts => S::IBV_QPS_RTS,
        QpState::Sqd => S::IBV_QPS_SQD,
        QpState::Sqe => S::IBV_QPS_SQE,
        QpState::Err => S::IBV_QPS_ERR,
    }
}

pub(super) fn state_from(s: ffi::ibv_qp_state::Type) -> QpState {
    use ffi::ibv_qp_state as S;
    match s {
        S::IBV_QPS_RESET => QpState::Reset,
        S::IBV_QPS_INIT => QpState::Init,
        S::IBV_QPS_RTR => QpState::Rtr,
        S::IBV_QPS_RTS => QpState::Rts,
        S::IBV_QPS_SQD => QpState::Sqd,
        S::IBV_QPS_SQE => QpState::Sqe,
        _ => QpState::Err,
    }
}

pub(super) fn status_from(s: ffi::ibv_wc_status::Type) -> WcStatus {
    use ffi::ibv_wc_status as S;
    match s {
        S::IBV_WC_SUCCESS => WcStatus::Success,
        S::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        S::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        S::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        S::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        S::IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
        S::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocAccessErr,
        S::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        S::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        S::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        S::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        S::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

/// The attribute mask bit of `ibv_qp_attr_mask`.
pub(super) fn bit(m: ffi::ibv_qp_attr_mask) -> i32 {
    m.0 as i32
}
