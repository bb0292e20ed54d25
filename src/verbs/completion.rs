//! Work completions and asynchronous events.

use super::av::{Lid, Sl};
use super::types::{BufId, CqId, QpNum, SrqId, WrId};

/// Completion status (`enum ibv_wc_status`, IBTA names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The WR completed.
    Success,
    /// Local length error: an incoming message did not fit the receive buffer.
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local protection error.
    LocProtErr,
    /// The WR was flushed because the QP is in the error state.
    WrFlushErr,
    /// Unexpected response opcode from the responder.
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// The responder NAKed the request as invalid (NAK code 1).
    RemInvReqErr,
    /// The responder NAKed a remote access violation (NAK code 2).
    RemAccessErr,
    /// The responder NAKed a remote operational error (NAK code 3).
    RemOpErr,
    /// Transport retries (timeouts or PSN-sequence NAKs) exhausted.
    RetryExcErr,
    /// RNR retries exhausted.
    RnrRetryExcErr,
    /// Any other error.
    GeneralErr,
}

impl WcStatus {
    /// libibverbs' `ibv_wc_status_str` wording.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::GeneralErr => "general error",
        }
    }
}

/// What kind of WR completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A send WR.
    Send,
    /// A receive WR.
    Recv,
}

/// One work completion (`struct ibv_wc`).
///
/// On error completions only `wr_id`, `status`, `opcode`, `qp` and `buf` are meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The WR's id, as posted.
    pub wr_id: WrId,
    /// Outcome.
    pub status: WcStatus,
    /// Send or receive.
    pub opcode: WcOpcode,
    /// Bytes received (receives only; for UD including the 40-byte GRH area).
    pub byte_len: u32,
    /// The local QP the WR ran on (for SRQ receives, the QP that consumed it).
    pub qp: QpNum,
    /// The buffer the WR carried, now held by the caller again.
    pub buf: Option<BufId>,
    /// Immediate data of a SEND_WITH_IMMEDIATE.
    pub imm: Option<u32>,
    /// UD receives: the sender's QPN (`src_qp`).
    pub src_qp: Option<QpNum>,
    /// UD receives: the UDP source port of the RoCEv2 datagram, where the provider sees it
    /// (the software provider; `None` from libibverbs, whose work completion does not carry
    /// it). RoCEv2 makes it an entropy field, which a sender keeps fixed per QP.
    pub src_port: Option<u16>,
    /// UD receives: the buffer starts with a 40-byte GRH area (`IBV_WC_GRH`). Without it
    /// (IB unicast) those 40 bytes hold nothing meaningful and the sender is
    /// (`slid`, `src_qp`).
    pub grh: bool,
    /// UD receives: the sender's LID (`wc.slid`), where the link layer has LIDs (`None` on
    /// RoCE and from the software provider).
    pub slid: Option<Lid>,
    /// UD receives: the service level the message came on (`wc.sl`; 0 on RoCE).
    pub sl: Sl,
    /// UD receives: the destination LID's path bits (`wc.dlid_path_bits`; 0 without LMC).
    pub dlid_path_bits: u8,
}

impl Completion {
    /// A send WR's completion: `status`, and none of the fields only receives have.
    pub fn of_send(wr_id: WrId, qp: QpNum, buf: Option<BufId>, status: WcStatus) -> Self {
        Self {
            wr_id,
            status,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp,
            buf,
            imm: None,
            src_qp: None,
            src_port: None,
            grh: false,
            slid: None,
            sl: Sl::default(),
            dlid_path_bits: 0,
        }
    }
}

/// Asynchronous events (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// An SRQ-attached QP in the error state will consume no more SRQ WQEs (IBTA o11-5.2.5).
    QpLastWqeReached(QpNum),
    /// The QP hit a fatal error and moved to the error state.
    QpFatal(QpNum),
    /// The QP received a request it rejected as invalid and moved to the error state.
    QpReqErr(QpNum),
    /// The QP saw a remote access violation and moved to the error state.
    QpAccessErr(QpNum),
    /// First packet arrived on a QP in RTR (communication established).
    CommEst(QpNum),
    /// The send queue drained after a move to SQD.
    SqDrained(QpNum),
    /// The SRQ's WQE count fell below its armed limit.
    SrqLimitReached(SrqId),
    /// The port became active.
    PortActive,
    /// The port went down.
    PortErr,
    /// The port's LID changed (`IBV_EVENT_LID_CHANGE`).
    LidChange,
    /// The port's P_Key table changed (`IBV_EVENT_PKEY_CHANGE`).
    PkeyChange,
    /// The SM of the port changed (`IBV_EVENT_SM_CHANGE`).
    SmChange,
    /// The SM asks every client to register again (`IBV_EVENT_CLIENT_REREGISTER`).
    ClientReregister,
    /// The port's GID table changed (`IBV_EVENT_GID_CHANGE`): on RoCE an address came or went.
    GidChange,
    /// The CQ overran or failed (`IBV_EVENT_CQ_ERR`): completions were lost, so the state of
    /// every work queue that reports to it is unknown.
    CqErr(CqId),
    /// The SRQ failed (`IBV_EVENT_SRQ_ERR`): it takes and completes no more receives.
    SrqErr(SrqId),
    /// The device context is lost (`IBV_EVENT_DEVICE_FATAL`, a firmware reset or the device
    /// removed): every object of it is dead and every later verb fails, until the device is
    /// opened again ([`Provider::reopen`](crate::verbs::Provider::reopen)).
    DeviceFatal,
}

impl AsyncEvent {
    /// The event leaves the device context unusable for IPoIB-CM: the device is lost, or a
    /// CQ or SRQ that every connection shares failed. The driver tears everything down and
    /// opens the device again.
    pub const fn loses_context(&self) -> bool {
        matches!(self, Self::DeviceFatal | Self::CqErr(_) | Self::SrqErr(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_and_shared_queue_errors_lose_the_context() {
        assert!(AsyncEvent::DeviceFatal.loses_context());
        assert!(AsyncEvent::CqErr(CqId(1)).loses_context());
        assert!(AsyncEvent::SrqErr(SrqId(1)).loses_context());
        for ev in [
            AsyncEvent::GidChange,
            AsyncEvent::QpFatal(QpNum::new(5)),
            AsyncEvent::PortErr,
        ] {
            assert!(!ev.loses_context(), "{ev:?}");
        }
    }
}
