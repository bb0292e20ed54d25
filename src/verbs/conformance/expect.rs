//! What a provider is expected to do where real providers are known to depart from the
//! [contract](crate::verbs): the checks compare what they observe with a [`Behaviours`]
//! (the pair's [`ConformancePair::expected`](super::ConformancePair::expected)), so a provider that behaves differently from
//! its description fails, whether it got better or worse. [`Behaviours::SPEC`] is the
//! contract itself; a description of a particular provider (a kernel's rxe, say) is data kept
//! by whoever knows that provider.

use std::fmt;

/// Whether a QP in RTR raises `CommEst` when the first request arrives (`comm_est`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommEst {
    /// Raised once (the contract).
    Raised,
    /// Never raised.
    Never,
}

/// What becomes of a receive posted to an RC QP already in ERR (`drain_wr_after_err`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvInErr {
    /// Completed with `WrFlushErr` (the contract).
    Flushed,
    /// Never completed (its buffer comes back only when the QP is destroyed).
    NeverCompleted,
    /// Flushed in some runs and never completed in others (a race in the provider); either
    /// outcome passes, any other fails.
    FlushedOrNever,
}

/// How often an SRQ-attached QP raises `QpLastWqeReached` (`srq_last_wqe_once`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastWqe {
    /// Once, on the first move to ERR (the contract).
    Once,
    /// Never.
    Never,
    /// On the first move to ERR and again on each later move to ERR.
    AgainOnReErr,
}

impl LastWqe {
    /// The number of `QpLastWqeReached` events raised by the first move to ERR and by a
    /// second one.
    #[must_use]
    pub fn raised(self) -> (usize, usize) {
        match self {
            Self::Once => (1, 0),
            Self::Never => (0, 0),
            Self::AgainOnReErr => (1, 1),
        }
    }
}

/// A provider's behaviour at each point where providers are known to differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behaviours {
    /// `CommEst` on a QP in RTR.
    pub comm_est: CommEst,
    /// A receive posted in ERR.
    pub recv_in_err: RecvInErr,
    /// Last WQE Reached.
    pub last_wqe: LastWqe,
}

impl Behaviours {
    /// The contract: what an unknown provider is held to.
    pub const SPEC: Self = Self {
        comm_est: CommEst::Raised,
        recv_in_err: RecvInErr::Flushed,
        last_wqe: LastWqe::Once,
    };
}

impl Default for Behaviours {
    fn default() -> Self {
        Self::SPEC
    }
}

impl fmt::Display for Behaviours {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let comm_est = match self.comm_est {
            CommEst::Raised => "raised",
            CommEst::Never => "never",
        };
        let recv = match self.recv_in_err {
            RecvInErr::Flushed => "flushed",
            RecvInErr::NeverCompleted => "never completed",
            RecvInErr::FlushedOrNever => "flushed or never completed",
        };
        let last = match self.last_wqe {
            LastWqe::Once => "once",
            LastWqe::Never => "never",
            LastWqe::AgainOnReErr => "again on re-ERR",
        };
        write!(
            f,
            "comm_est {comm_est}, receive posted in ERR {recv}, last WQE reached {last}"
        )
    }
}
