//! `modify_qp` attributes and the IBTA QP state machine.
//!
//! [`QpAttr`] is libibverbs' `ibv_qp_attr` + mask in one: a field that is `Some` is in the mask.
//! [`check_modify`] is the kernel's `ib_modify_qp_is_ok` over `qp_state_table`
//! (`drivers/infiniband/core/verbs.c`): which transitions exist, which attributes each one
//! requires, and which it allows. Every provider calls it before touching a QP, so an illegal
//! transition or a missing attribute is rejected the same way on every fabric.

use super::av::AddressVector;
use super::error::VerbsError;
use super::types::{PathMtu, Psn, QKey, QpNum, QpState, QpType};

/// Remote access rights of an RC QP (`IBV_ACCESS_*`). IPoIB-CM uses SEND only, so all are
/// usually false.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessFlags {
    /// Allow incoming RDMA WRITE.
    pub remote_write: bool,
    /// Allow incoming RDMA READ.
    pub remote_read: bool,
    /// Allow incoming atomics.
    pub remote_atomic: bool,
}

/// Attributes for `modify_qp`. A field that is `Some` is in the attribute mask.
///
/// Build with [`QpAttr::to_state`] and the `with_*` style struct update syntax, e.g.
/// `QpAttr { dest_qpn: Some(q), ..QpAttr::to_state(QpState::Rtr) }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Target state (`IBV_QP_STATE`). `None` is not a legal modify.
    pub state: Option<QpState>,
    /// Expected current state (`IBV_QP_CUR_STATE`).
    pub cur_state: Option<QpState>,
    /// P_Key table index (`IBV_QP_PKEY_INDEX`).
    pub pkey_index: Option<u16>,
    /// Physical port (`IBV_QP_PORT`).
    pub port: Option<u8>,
    /// Q_Key of a UD QP (`IBV_QP_QKEY`).
    pub qkey: Option<QKey>,
    /// Remote access rights (`IBV_QP_ACCESS_FLAGS`).
    pub access: Option<AccessFlags>,
    /// Primary path (`IBV_QP_AV`).
    pub av: Option<AddressVector>,
    /// Path MTU (`IBV_QP_PATH_MTU`).
    pub path_mtu: Option<PathMtu>,
    /// Remote QPN (`IBV_QP_DEST_QPN`).
    pub dest_qpn: Option<QpNum>,
    /// First PSN expected from the peer (`IBV_QP_RQ_PSN`).
    pub rq_psn: Option<Psn>,
    /// Incoming RDMA READ/atomic depth (`IBV_QP_MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer code asked of the peer, 0..=31 (`IBV_QP_MIN_RNR_TIMER`).
    pub min_rnr_timer: Option<u8>,
    /// Local ACK timeout exponent: 4.096 µs · 2^timeout, 0 = infinite (`IBV_QP_TIMEOUT`).
    pub timeout: Option<u8>,
    /// Transport retries after a timeout or PSN-sequence NAK, 0..=7 (`IBV_QP_RETRY_CNT`).
    pub retry_cnt: Option<u8>,
    /// RNR retries, 0..=7 where 7 means infinite (`IBV_QP_RNR_RETRY`).
    pub rnr_retry: Option<u8>,
    /// First PSN this QP sends (`IBV_QP_SQ_PSN`).
    pub sq_psn: Option<Psn>,
    /// Outgoing RDMA READ/atomic depth (`IBV_QP_MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: Option<u8>,
    /// Raise `SqDrained` when SQD is reached (`IBV_QP_EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: Option<bool>,
}

impl QpAttr {
    /// Attributes with only the target state set.
    pub fn to_state(state: QpState) -> Self {
        Self {
            state: Some(state),
            ..Self::default()
        }
    }

    fn mask(&self) -> AttrMask {
        let mut m = AttrMask::empty();
        let bits = [
            (self.cur_state.is_some(), AttrMask::CUR_STATE),
            (self.pkey_index.is_some(), AttrMask::PKEY_INDEX),
            (self.port.is_some(), AttrMask::PORT),
            (self.qkey.is_some(), AttrMask::QKEY),
            (self.access.is_some(), AttrMask::ACCESS_FLAGS),
            (self.av.is_some(), AttrMask::AV),
            (self.path_mtu.is_some(), AttrMask::PATH_MTU),
            (self.dest_qpn.is_some(), AttrMask::DEST_QPN),
            (self.rq_psn.is_some(), AttrMask::RQ_PSN),
            (
                self.max_dest_rd_atomic.is_some(),
                AttrMask::MAX_DEST_RD_ATOMIC,
            ),
            (self.min_rnr_timer.is_some(), AttrMask::MIN_RNR_TIMER),
            (self.timeout.is_some(), AttrMask::TIMEOUT),
            (self.retry_cnt.is_some(), AttrMask::RETRY_CNT),
            (self.rnr_retry.is_some(), AttrMask::RNR_RETRY),
            (self.sq_psn.is_some(), AttrMask::SQ_PSN),
            (self.max_rd_atomic.is_some(), AttrMask::MAX_QP_RD_ATOMIC),
            (
                self.en_sqd_async_notify.is_some(),
                AttrMask::EN_SQD_ASYNC_NOTIFY,
            ),
        ];
        for (set, bit) in bits {
            if set {
                m = m.union(bit);
            }
        }
        m
    }
}

/// Attribute mask bits, named after `IBV_QP_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AttrMask(u32);

impl AttrMask {
    const CUR_STATE: Self = Self(1 << 1);
    const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    const ACCESS_FLAGS: Self = Self(1 << 3);
    const PKEY_INDEX: Self = Self(1 << 4);
    const PORT: Self = Self(1 << 5);
    const QKEY: Self = Self(1 << 6);
    const AV: Self = Self(1 << 7);
    const PATH_MTU: Self = Self(1 << 8);
    const TIMEOUT: Self = Self(1 << 9);
    const RETRY_CNT: Self = Self(1 << 10);
    const RNR_RETRY: Self = Self(1 << 11);
    const RQ_PSN: Self = Self(1 << 12);
    const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    const MIN_RNR_TIMER: Self = Self(1 << 15);
    const SQ_PSN: Self = Self(1 << 16);
    const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    const DEST_QPN: Self = Self(1 << 20);

    const NAMES: [(Self, &'static str); 17] = [
        (Self::CUR_STATE, "CUR_STATE"),
        (Self::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
        (Self::ACCESS_FLAGS, "ACCESS_FLAGS"),
        (Self::PKEY_INDEX, "PKEY_INDEX"),
        (Self::PORT, "PORT"),
        (Self::QKEY, "QKEY"),
        (Self::AV, "AV"),
        (Self::PATH_MTU, "PATH_MTU"),
        (Self::TIMEOUT, "TIMEOUT"),
        (Self::RETRY_CNT, "RETRY_CNT"),
        (Self::RNR_RETRY, "RNR_RETRY"),
        (Self::RQ_PSN, "RQ_PSN"),
        (Self::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
        (Self::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
        (Self::SQ_PSN, "SQ_PSN"),
        (Self::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
        (Self::DEST_QPN, "DEST_QPN"),
    ];

    const fn empty() -> Self {
        Self(0)
    }
    const fn union(self, o: Self) -> Self {
        Self(self.0 | o.0)
    }
    const fn minus(self, o: Self) -> Self {
        Self(self.0 & !o.0)
    }
    const fn is_empty(self) -> bool {
        self.0 == 0
    }
    fn names(self) -> String {
        Self::NAMES
            .iter()
            .filter(|(b, _)| self.0 & b.0 != 0)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join("|")
    }
}

/// Required and optional attributes of one transition for one QP type.
struct Rule {
    required: AttrMask,
    optional: AttrMask,
}

/// The transition table (kernel `qp_state_table`, RC/UD/GSI columns). `None` means the
/// transition does not exist.
fn rule(qp_type: QpType, from: QpState, to: QpState) -> Option<Rule> {
    use QpState::*;
    const fn m(bits: &[AttrMask]) -> AttrMask {
        let mut out = AttrMask::empty();
        let mut i = 0;
        while i < bits.len() {
            out = out.union(bits[i]);
            i += 1;
        }
        out
    }
    type A = AttrMask;
    let none = A::empty();
    let r = |required, optional| Some(Rule { required, optional });
    let rc = qp_type == QpType::Rc;
    let gsi = qp_type == QpType::Gsi;
    match (from, to) {
        // Any state may go to RESET or ERR with no attributes.
        (_, Reset) | (_, Err) => r(none, none),
        (Reset, Init) => {
            if rc {
                r(m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]), none)
            } else if gsi {
                r(m(&[A::PKEY_INDEX, A::QKEY]), none)
            } else {
                r(m(&[A::PKEY_INDEX, A::PORT, A::QKEY]), none)
            }
        }
        (Init, Init) => {
            if rc {
                r(none, m(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]))
            } else if gsi {
                r(none, m(&[A::PKEY_INDEX, A::QKEY]))
            } else {
                r(none, m(&[A::PKEY_INDEX, A::PORT, A::QKEY]))
            }
        }
        (Init, Rtr) => {
            if rc {
                r(
                    m(&[
                        A::AV,
                        A::PATH_MTU,
                        A::DEST_QPN,
                        A::RQ_PSN,
                        A::MAX_DEST_RD_ATOMIC,
                        A::MIN_RNR_TIMER,
                    ]),
                    m(&[A::ACCESS_FLAGS, A::PKEY_INDEX]),
                )
            } else {
                r(none, m(&[A::PKEY_INDEX, A::QKEY]))
            }
        }
        (Rtr, Rts) => {
            if rc {
                r(
                    m(&[
                        A::TIMEOUT,
                        A::RETRY_CNT,
                        A::RNR_RETRY,
                        A::SQ_PSN,
                        A::MAX_QP_RD_ATOMIC,
                    ]),
                    m(&[A::CUR_STATE, A::ACCESS_FLAGS, A::MIN_RNR_TIMER]),
                )
            } else {
                r(m(&[A::SQ_PSN]), m(&[A::CUR_STATE, A::QKEY]))
            }
        }
        (Rts, Rts) | (Sqd, Rts) => {
            if rc {
                r(none, m(&[A::CUR_STATE, A::ACCESS_FLAGS, A::MIN_RNR_TIMER]))
            } else {
                r(none, m(&[A::CUR_STATE, A::QKEY]))
            }
        }
        (Rts, Sqd) => r(none, A::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => {
            if rc {
                r(
                    none,
                    m(&[
                        A::PORT,
                        A::AV,
                        A::TIMEOUT,
                        A::RETRY_CNT,
                        A::RNR_RETRY,
                        A::MAX_QP_RD_ATOMIC,
                        A::MAX_DEST_RD_ATOMIC,
                        A::ACCESS_FLAGS,
                        A::PKEY_INDEX,
                        A::MIN_RNR_TIMER,
                    ]),
                )
            } else {
                r(none, m(&[A::PKEY_INDEX, A::QKEY]))
            }
        }
        // SQE exists for unreliable transports only, and only back to RTS.
        (Sqe, Rts) if !rc => r(none, m(&[A::CUR_STATE, A::QKEY])),
        _ => None,
    }
}

/// Checks a `modify_qp` against the IBTA state machine: the transition must exist for this QP
/// type, every required attribute must be present, no attribute outside required ∪ optional
/// may be present, `cur_state` (if given) must equal `current`, and values must be in range.
///
/// # Errors
/// [`VerbsError::IllegalTransition`], [`VerbsError::MissingAttributes`],
/// [`VerbsError::UnexpectedAttributes`] or [`VerbsError::InvalidAttribute`].
pub fn check_modify(qp_type: QpType, current: QpState, attr: &QpAttr) -> Result<(), VerbsError> {
    let to = attr.state.ok_or(VerbsError::InvalidAttribute("state"))?;
    let rule =
        rule(qp_type, current, to).ok_or(VerbsError::IllegalTransition { from: current, to })?;
    let mask = attr.mask();
    let missing = rule.required.minus(mask);
    if !missing.is_empty() {
        return Err(VerbsError::MissingAttributes {
            from: current,
            to,
            missing: missing.names(),
        });
    }
    let extra = mask.minus(rule.required.union(rule.optional));
    if !extra.is_empty() {
        return Err(VerbsError::UnexpectedAttributes {
            from: current,
            to,
            extra: extra.names(),
        });
    }
    if let Some(cur) = attr.cur_state {
        if cur != current {
            return Err(VerbsError::InvalidAttribute("cur_state"));
        }
    }
    if attr.timeout.is_some_and(|t| t > 31) {
        return Err(VerbsError::InvalidAttribute("timeout"));
    }
    if attr.retry_cnt.is_some_and(|t| t > 7) {
        return Err(VerbsError::InvalidAttribute("retry_cnt"));
    }
    if attr.rnr_retry.is_some_and(|t| t > 7) {
        return Err(VerbsError::InvalidAttribute("rnr_retry"));
    }
    if attr.min_rnr_timer.is_some_and(|t| t > 31) {
        return Err(VerbsError::InvalidAttribute("min_rnr_timer"));
    }
    if attr.dest_qpn.is_some_and(|q| q.get() == 0) {
        return Err(VerbsError::InvalidAttribute("dest_qpn"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::setup::RcConnection;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    const ERR: QpState = QpState::Err;

    fn init_attr() -> QpAttr {
        crate::verbs::setup::rc_init_attr()
    }

    fn connection() -> RcConnection {
        RcConnection::new(
            (crate::verbs::Gid::default(), QpNum::new(0x12)),
            PathMtu::Mtu1024,
            Psn::new(0),
            Psn::new(0),
        )
    }

    fn rtr_attr() -> QpAttr {
        connection().rtr_attr()
    }

    fn rts_attr() -> QpAttr {
        connection().rts_attr()
    }

    #[test]
    fn rc_happy_path() {
        check_modify(QpType::Rc, Reset, &init_attr()).unwrap();
        check_modify(QpType::Rc, Init, &rtr_attr()).unwrap();
        check_modify(QpType::Rc, Rtr, &rts_attr()).unwrap();
        check_modify(QpType::Rc, Rts, &QpAttr::to_state(Sqd)).unwrap();
        check_modify(QpType::Rc, Sqd, &QpAttr::to_state(Rts)).unwrap();
        for s in [Reset, Init, Rtr, Rts, Sqd, ERR] {
            check_modify(QpType::Rc, s, &QpAttr::to_state(ERR)).unwrap();
            check_modify(QpType::Rc, s, &QpAttr::to_state(Reset)).unwrap();
        }
    }

    #[test]
    fn illegal_transitions_are_rejected() {
        let table = [
            (Reset, Rtr),
            (Reset, Rts),
            (Init, Rts),
            (Rtr, Init),
            (Rts, Rtr),
            (ERR, Rts),
            (ERR, Init),
            (Sqd, Init),
            (Reset, Sqd),
            (Rtr, Sqd),
        ];
        for (from, to) in table {
            let err = check_modify(QpType::Rc, from, &QpAttr::to_state(to)).unwrap_err();
            assert_eq!(
                err,
                VerbsError::IllegalTransition { from, to },
                "{from:?}->{to:?}"
            );
        }
        // SQE exists only for unreliable QPs.
        assert!(check_modify(QpType::Rc, Sqe, &QpAttr::to_state(Rts)).is_err());
        check_modify(QpType::Ud, Sqe, &QpAttr::to_state(Rts)).unwrap();
    }

    #[test]
    fn missing_and_extra_attributes_are_named() {
        let mut a = rtr_attr();
        a.dest_qpn = None;
        a.rq_psn = None;
        match check_modify(QpType::Rc, Init, &a).unwrap_err() {
            VerbsError::MissingAttributes { missing, .. } => assert_eq!(missing, "RQ_PSN|DEST_QPN"),
            e => panic!("{e:?}"),
        }
        let mut a = init_attr();
        a.sq_psn = Some(Psn::new(1));
        match check_modify(QpType::Rc, Reset, &a).unwrap_err() {
            VerbsError::UnexpectedAttributes { extra, .. } => assert_eq!(extra, "SQ_PSN"),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn ud_and_gsi_need_qkey_not_av() {
        let ud_init = QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(QKey(0x1234)),
            ..QpAttr::to_state(Init)
        };
        check_modify(QpType::Ud, Reset, &ud_init).unwrap();
        assert!(check_modify(QpType::Rc, Reset, &ud_init).is_err());
        let gsi_init = QpAttr {
            pkey_index: Some(0),
            qkey: Some(QKey::GSI),
            ..QpAttr::to_state(Init)
        };
        check_modify(QpType::Gsi, Reset, &gsi_init).unwrap();
        check_modify(QpType::Ud, Init, &QpAttr::to_state(Rtr)).unwrap();
        assert!(check_modify(QpType::Ud, Init, &rtr_attr()).is_err());
        let ud_rts = QpAttr {
            sq_psn: Some(Psn::new(0)),
            ..QpAttr::to_state(Rts)
        };
        check_modify(QpType::Ud, Rtr, &ud_rts).unwrap();
    }

    #[test]
    fn values_are_range_checked() {
        let mut a = rts_attr();
        a.timeout = Some(32);
        assert_eq!(
            check_modify(QpType::Rc, Rtr, &a),
            Err(VerbsError::InvalidAttribute("timeout"))
        );
        let mut a = rts_attr();
        a.cur_state = Some(Init);
        assert_eq!(
            check_modify(QpType::Rc, Rtr, &a),
            Err(VerbsError::InvalidAttribute("cur_state"))
        );
        assert_eq!(
            check_modify(QpType::Rc, Rtr, &QpAttr::default()),
            Err(VerbsError::InvalidAttribute("state"))
        );
    }
}
