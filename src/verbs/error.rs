//! Errors returned by verbs.

use super::types::{BufId, QpNum, QpState};

/// Why a verb failed. Mirrors the errno a libibverbs call would return, with the context a
/// caller needs to act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// The transition does not exist in the IBTA state machine for this QP type.
    #[error("illegal QP transition {from:?} -> {to:?}")]
    IllegalTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Required attributes for the transition were not given.
    #[error("QP transition {from:?} -> {to:?} lacks required attributes {missing}")]
    MissingAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// `IBV_QP_*` names of the missing attributes.
        missing: String,
    },
    /// Attributes that the transition does not allow were given.
    #[error("QP transition {from:?} -> {to:?} does not allow attributes {extra}")]
    UnexpectedAttributes {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// `IBV_QP_*` names of the extra attributes.
        extra: String,
    },
    /// An attribute value is out of range or inconsistent (the field is named).
    #[error("invalid QP attribute `{0}`")]
    InvalidAttribute(&'static str),
    /// No such QP.
    #[error("no such QP {0}")]
    NoSuchQp(QpNum),
    /// No such CQ, SRQ, PD or pool.
    #[error("no such {0}")]
    NoSuchObject(&'static str),
    /// The object is still in use (a CQ or SRQ with QPs attached, a PD with objects).
    #[error("{0} is busy")]
    Busy(&'static str),
    /// The verb is not allowed in the QP's current state (e.g. post_send before RTS).
    #[error("operation not allowed on QP {qp} in state {state:?}")]
    InvalidState {
        /// The QP.
        qp: QpNum,
        /// Its state.
        state: QpState,
    },
    /// A receive was posted directly to a QP that takes its receives from an SRQ.
    #[error("QP {0} is attached to an SRQ; post receives to the SRQ")]
    UsesSrq(QpNum),
    /// The work queue is full.
    #[error("work queue full")]
    QueueFull,
    /// A resource limit was reached (QPs, CQs, pools, buffers).
    #[error("out of resources: {0}")]
    OutOfResources(&'static str),
    /// The buffer is not held by the caller (already posted, free, or from another pool).
    #[error("buffer {0:?} is not held by the caller")]
    BufferNotHeld(BufId),
    /// The length exceeds the buffer or the transport's maximum message size.
    #[error("length {len} exceeds the limit {limit}")]
    TooLong {
        /// Requested length.
        len: usize,
        /// Allowed maximum.
        limit: usize,
    },
    /// The work request is malformed for this QP type (e.g. a UD send without a destination).
    #[error("invalid work request: {0}")]
    InvalidWr(&'static str),
    /// The port's P_Key table has no entry of the partition (the value is the P_Key asked
    /// for).
    #[error("the port has no P_Key of partition {0:#06x} in its P_Key table (is the port a member of it?)")]
    NoSuchPKey(u16),
    /// The device context is lost ([`AsyncEvent::DeviceFatal`](super::AsyncEvent)): nothing
    /// works until the device is opened again.
    #[error("the device context is lost (a fatal device event); it must be opened again")]
    DeviceLost,
    /// The provider failed at the OS level.
    #[error("provider I/O error: {0}")]
    Io(String),
}

/// Why a provider could not open its device again ([`Provider::reopen`](super::Provider::reopen)).
#[derive(Debug, thiserror::Error)]
pub enum ReopenError {
    /// The provider cannot reopen its device.
    #[error("this provider cannot reopen its device")]
    Unsupported,
    /// Opening the device failed.
    #[error("{0}")]
    Open(#[source] Box<dyn std::error::Error + Send + Sync>),
}
