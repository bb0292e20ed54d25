//! What `rdma_init_qp_attr` hands back (a C `ibv_qp_attr` and its mask), as the
//! [`QpAttr`] of [`crate::verbs`], so that the move of our QP goes through the provider's own
//! `modify_qp` and its state checks.

use super::error::RdmaCmError;
use super::ffi;
use crate::verbs::{
    AccessFlags, AddressVector, Gid, Grh, Lid, PathMtu, Psn, QpAttr, QpNum, QpState, Rate, Sl,
};

/// The attributes the kernel's CM gives for a move of our QP: the [`QpAttr`] and, for a
/// move to RTR, the source GID index the CM's route uses (the provider must send from the
/// same GID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmQpAttr {
    /// The attributes, one `Some` per bit of the CM's mask that [`QpAttr`] carries.
    pub attr: QpAttr,
    /// `ah_attr.grh.sgid_index` when the mask has the address vector.
    pub sgid_index: Option<u8>,
}

fn state_from(s: ffi::ibv_qp_state) -> Option<QpState> {
    Some(match s {
        ffi::IBV_QPS_RESET => QpState::Reset,
        ffi::IBV_QPS_INIT => QpState::Init,
        ffi::IBV_QPS_RTR => QpState::Rtr,
        ffi::IBV_QPS_RTS => QpState::Rts,
        ffi::IBV_QPS_SQD => QpState::Sqd,
        ffi::IBV_QPS_SQE => QpState::Sqe,
        ffi::IBV_QPS_ERR => QpState::Err,
        _ => return None,
    })
}

/// The C state of `s` (the `qp_state` asked of `rdma_init_qp_attr`).
pub(super) fn state_to(s: QpState) -> ffi::ibv_qp_state {
    match s {
        QpState::Reset => ffi::IBV_QPS_RESET,
        QpState::Init => ffi::IBV_QPS_INIT,
        QpState::Rtr => ffi::IBV_QPS_RTR,
        QpState::Rts => ffi::IBV_QPS_RTS,
        QpState::Sqd => ffi::IBV_QPS_SQD,
        QpState::Sqe => ffi::IBV_QPS_SQE,
        QpState::Err => ffi::IBV_QPS_ERR,
    }
}

/// Mask bits this conversion understands; any other bit the CM sets (alternate path, path
/// migration) is refused rather than silently dropped.
const KNOWN: u32 = ffi::IBV_QP_STATE
    | ffi::IBV_QP_ACCESS_FLAGS
    | ffi::IBV_QP_PKEY_INDEX
    | ffi::IBV_QP_PORT
    | ffi::IBV_QP_AV
    | ffi::IBV_QP_PATH_MTU
    | ffi::IBV_QP_TIMEOUT
    | ffi::IBV_QP_RETRY_CNT
    | ffi::IBV_QP_RNR_RETRY
    | ffi::IBV_QP_RQ_PSN
    | ffi::IBV_QP_MAX_QP_RD_ATOMIC
    | ffi::IBV_QP_MIN_RNR_TIMER
    | ffi::IBV_QP_SQ_PSN
    | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
    | ffi::IBV_QP_DEST_QPN;

/// Converts the CM's attributes and mask.
///
/// # Errors
/// [`RdmaCmError::QpAttr`] for a mask bit [`QpAttr`] cannot carry, a state or MTU out of
/// range.
pub(super) fn from_c(a: &ffi::ibv_qp_attr, mask: i32) -> Result<CmQpAttr, RdmaCmError> {
    let mask = mask as u32;
    let has = |bit: u32| mask & bit != 0;
    if mask & !KNOWN != 0 {
        return Err(RdmaCmError::QpAttr(format!(
            "mask bits {:#x} not supported",
            mask & !KNOWN
        )));
    }
    let bad = |what: &str, v: u32| RdmaCmError::QpAttr(format!("{what} {v} out of range"));
    let mut out = QpAttr::default();
    let mut sgid_index = None;
    if has(ffi::IBV_QP_STATE) {
        out.state = Some(state_from(a.qp_state).ok_or_else(|| bad("state", a.qp_state))?);
    }
    if has(ffi::IBV_QP_ACCESS_FLAGS) {
        let f = a.qp_access_flags;
        out.access = Some(AccessFlags {
            remote_write: f & ffi::IBV_ACCESS_REMOTE_WRITE != 0,
            remote_read: f & ffi::IBV_ACCESS_REMOTE_READ != 0,
            remote_atomic: f & ffi::IBV_ACCESS_REMOTE_ATOMIC != 0,
        });
    }
    if has(ffi::IBV_QP_PKEY_INDEX) {
        out.pkey_index = Some(a.pkey_index);
    }
    if has(ffi::IBV_QP_PORT) {
        out.port = Some(a.port_num);
    }
    if has(ffi::IBV_QP_AV) {
        let h = &a.ah_attr;
        let grh = (h.is_global != 0).then(|| {
            // SAFETY: `ibv_gid` is a union of a 16-byte array and two u64s: every bit
            // pattern is a valid `[u8; 16]`.
            let dgid = unsafe { h.grh.dgid.raw };
            sgid_index = Some(h.grh.sgid_index);
            // The QP's SGID index travels beside the attributes (`sgid_index`).
            Grh {
                dgid: Gid(dgid),
                sgid_index: None,
                flow_label: h.grh.flow_label & 0x000F_FFFF,
                hop_limit: h.grh.hop_limit,
                traffic_class: h.grh.traffic_class,
            }
        });
        out.av = Some(AddressVector {
            dlid: Lid(h.dlid),
            sl: Sl::from_bits(h.sl),
            src_path_bits: h.src_path_bits,
            static_rate: Rate(h.static_rate),
            grh,
        });
    }
    if has(ffi::IBV_QP_PATH_MTU) {
        let m = u8::try_from(a.path_mtu)
            .ok()
            .and_then(PathMtu::from_enum)
            .ok_or_else(|| bad("path MTU", a.path_mtu))?;
        out.path_mtu = Some(m);
    }
    if has(ffi::IBV_QP_TIMEOUT) {
        out.timeout = Some(a.timeout);
    }
    if has(ffi::IBV_QP_RETRY_CNT) {
        out.retry_cnt = Some(a.retry_cnt);
    }
    if has(ffi::IBV_QP_RNR_RETRY) {
        out.rnr_retry = Some(a.rnr_retry);
    }
    if has(ffi::IBV_QP_RQ_PSN) {
        out.rq_psn = Some(Psn::new(a.rq_psn));
    }
    if has(ffi::IBV_QP_MAX_QP_RD_ATOMIC) {
        out.max_rd_atomic = Some(a.max_rd_atomic);
    }
    if has(ffi::IBV_QP_MIN_RNR_TIMER) {
        out.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if has(ffi::IBV_QP_SQ_PSN) {
        out.sq_psn = Some(Psn::new(a.sq_psn));
    }
    if has(ffi::IBV_QP_MAX_DEST_RD_ATOMIC) {
        out.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(ffi::IBV_QP_DEST_QPN) {
        out.dest_qpn = Some(QpNum::new(a.dest_qp_num));
    }
    Ok(CmQpAttr {
        attr: out,
        sgid_index,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTR as `ib_cm`'s `cm_init_qp_rtr_attr` fills it for RC on RoCE.
    fn rtr() -> (ffi::ibv_qp_attr, i32) {
        let mut a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_RTR,
            path_mtu: ffi::IBV_MTU_1024,
            dest_qp_num: 0x11,
            rq_psn: 0x12_3456,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.grh.dgid.raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
        a.ah_attr.grh.sgid_index = 1;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.flow_label = 0xabcde;
        a.ah_attr.is_global = 1;
        let mask = ffi::IBV_QP_STATE
            | ffi::IBV_QP_AV
            | ffi::IBV_QP_PATH_MTU
            | ffi::IBV_QP_DEST_QPN
            | ffi::IBV_QP_RQ_PSN
            | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::IBV_QP_MIN_RNR_TIMER;
        (a, mask as i32)
    }

    #[test]
    fn an_rtr_becomes_the_same_qp_attr() {
        let (a, mask) = rtr();
        let got = from_c(&a, mask).unwrap();
        assert_eq!(got.sgid_index, Some(1));
        let want = QpAttr {
            av: Some(AddressVector::global(Grh {
                flow_label: 0xabcde,
                ..Grh::to_gid(Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]))
            })),
            path_mtu: Some(PathMtu::Mtu1024),
            dest_qpn: Some(QpNum::new(0x11)),
            rq_psn: Some(Psn::new(0x12_3456)),
            max_dest_rd_atomic: Some(0),
            min_rnr_timer: Some(12),
            ..QpAttr::to_state(QpState::Rtr)
        };
        assert_eq!(got.attr, want);
    }

    /// A field outside the mask stays `None` even when the C struct holds a value.
    #[test]
    fn only_masked_fields_are_taken() {
        let (mut a, _) = rtr();
        a.sq_psn = 77;
        a.timeout = 14;
        let got = from_c(&a, ffi::IBV_QP_STATE as i32).unwrap();
        assert_eq!(got.attr, QpAttr::to_state(QpState::Rtr));
        assert_eq!(got.sgid_index, None);
    }

    #[test]
    fn an_rts_carries_psn_and_retries() {
        let a = ffi::ibv_qp_attr {
            qp_state: ffi::IBV_QPS_RTS,
            sq_psn: 0xff_ffff,
            timeout: 18,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 0,
            ..Default::default()
        };
        let mask = ffi::IBV_QP_STATE
            | ffi::IBV_QP_SQ_PSN
            | ffi::IBV_QP_TIMEOUT
            | ffi::IBV_QP_RETRY_CNT
            | ffi::IBV_QP_RNR_RETRY
            | ffi::IBV_QP_MAX_QP_RD_ATOMIC;
        let got = from_c(&a, mask as i32).unwrap().attr;
        assert_eq!(
            got,
            QpAttr {
                sq_psn: Some(Psn::new(0xff_ffff)),
                timeout: Some(18),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(0),
                ..QpAttr::to_state(QpState::Rts)
            }
        );
    }

    /// Alternate-path bits (a LAP) are refused, not dropped.
    #[test]
    fn unknown_mask_bits_are_refused() {
        let (a, mask) = rtr();
        let e = from_c(&a, mask | ffi::IBV_QP_ALT_PATH as i32).unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
    }

    #[test]
    fn a_bad_mtu_is_refused() {
        let (mut a, mask) = rtr();
        a.path_mtu = 9;
        assert!(from_c(&a, mask).is_err());
    }

    #[test]
    fn states_round_trip() {
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            assert_eq!(state_from(state_to(s)), Some(s));
        }
    }
}
