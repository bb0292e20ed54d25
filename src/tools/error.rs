//! Why a tool's run failed: one variant per thing that can fail, each naming what failed.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use crate::cm::{CmEvent, CmUseError};
use crate::verbs::{Completion, VerbsError};
use crate::wire::cm::RejReason;

/// What went wrong, for a one-line message and a non-zero exit ([`PingpongError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum PingpongError {
    /// A step of the TCP QP-info exchange failed.
    #[error("QP info exchange: {step}: {source}")]
    Exchange {
        /// What the exchange was doing (rdma-core's wording: "Couldn't connect to HOST:PORT").
        step: String,
        /// The socket's error.
        #[source]
        source: io::Error,
    },
    /// The peer's QP-info message did not parse.
    #[error("QP info exchange: bad remote address: unparseable")]
    BadRemoteAddress,
    /// The server's wait for a client ended at the deadline.
    #[error("QP info exchange: accept: no client before the deadline")]
    NoClient,
    /// The software provider could not bind its UDP socket.
    #[error("provider: bind {local} udp {port}: {source}")]
    Bind {
        /// The local underlay address.
        local: IpAddr,
        /// The RoCEv2 UDP port.
        port: u16,
        /// The socket's error.
        #[source]
        source: io::Error,
    },
    /// A verb failed.
    #[error("provider: {step}: {source}")]
    Verbs {
        /// What the tool was doing.
        step: &'static str,
        /// The provider's error.
        #[source]
        source: VerbsError,
    },
    /// The buffer pool had no buffer left for the set-up.
    #[error("provider: buffer pool exhausted")]
    PoolExhausted,
    /// A completion came back without the buffer its WR was posted with.
    #[error("provider: completion of wr_id {} without its buffer", .0.wr_id.0)]
    NoBuffer(Completion),
    /// A work completion failed.
    #[error("Failed status {status} for wr_id {wr_id}", status = .0.status.as_str(), wr_id = .0.wr_id.0)]
    Completion(Completion),
    /// A received payload differed from what was sent.
    #[error("payload mismatch in message {0}")]
    Mismatch(u32),
    /// The run did not finish in time.
    #[error("timed out after {after:?} ({sends} sends and {recvs} receives completed)")]
    Timeout {
        /// The deadline the run had.
        after: Duration,
        /// Sends completed by then.
        sends: u32,
        /// Receives completed by then.
        recvs: u32,
    },
    /// An I/O error of the event loop.
    #[error("event loop: {0}")]
    Io(#[from] io::Error),
    /// The CM refused a call.
    #[error("CM: {step}: {source}")]
    Cm {
        /// The call (connect, accept, rtu, disconnect).
        step: &'static str,
        /// Why the CM refused it.
        #[source]
        source: CmUseError,
    },
    /// No CM event of the kind awaited came before the deadline.
    #[error("CM: timed out waiting for {0}")]
    CmTimeout(&'static str),
    /// The peer rejected the connection.
    #[error("CM: connection rejected: {0:?}")]
    Rejected(RejReason),
    /// Every REQ went unanswered.
    #[error("CM: no answer from {0} after all REQ retries")]
    NoAnswer(IpAddr),
    /// The peer disconnected or rejected during the run.
    #[error("CM: peer went away: {0:?}")]
    PeerWentAway(Box<CmEvent>),
    /// A command-line combination that cannot work.
    #[error("{0}")]
    Usage(&'static str),
}

impl PingpongError {
    /// A verb's error at `step`, for `map_err`.
    pub(crate) fn verbs(step: &'static str) -> impl FnOnce(VerbsError) -> Self {
        move |source| Self::Verbs { step, source }
    }

    /// A socket's error at `step` of the exchange, for `map_err`.
    pub(crate) fn exchange(step: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let step = step.into();
        move |source| Self::Exchange { step, source }
    }

    /// A CM call's refusal, for `map_err`.
    pub(crate) fn cm(step: &'static str) -> impl FnOnce(CmUseError) -> Self {
        move |source| Self::Cm { step, source }
    }

    /// The process exit status: 2 for a usage error (the run never started), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            _ => 1,
        }
    }
}
