//! A provider conformance suite: the [contract](super) checked through the [`Verbs`] trait
//! alone, so the same checks run against the software provider (over
//! [`crate::sim::Fabric`]) and, later, against a libibverbs hardware provider.
//!
//! A [`ConformancePair`] lends two providers whose ports reach each other, and a way to let
//! the fabric between them run ([`ConformancePair::settle`]). Each check opens its own PDs,
//! CQs and buffer pools, creates and connects its own QPs (RESET → INIT → RTR → RTS with the
//! other port's GID, exactly as a CM would), and destroys its QPs before it returns, so the
//! checks are independent and may run in any order on one pair. A check returns `Err` with a
//! description of the first contract violation it saw.
//!
//! Where real providers are known to depart from the contract (`CommEst`, receives posted in
//! ERR, Last WQE Reached), a check holds the provider to the pair's
//! [`ConformancePair::expected`] [`Behaviours`], by default [`Behaviours::SPEC`]: a provider
//! that behaves otherwise than described fails, better or worse.
//!
//! Waiting is done only through [`ConformancePair::settle`], repeated at most
//! [`MAX_SETTLES`] times, so a check never loops unboundedly and never reads a clock: on the
//! simulated fabric a settle runs virtual time; on hardware it polls for a short while.
//!
//! # The checks
//!
//! | Name | What it checks |
//! |---|---|
//! | `qp_state_machine` | [`check_qp_state_machine`] |
//! | `rc_message_sizes` | [`check_rc_message_sizes`] |
//! | `completion_order` | [`check_completion_order`] |
//! | `flush_on_err` | [`check_flush_on_err`] |
//! | `drain_wr_after_err` | [`check_drain_wr_after_err`] |
//! | `srq_last_wqe_once` | [`check_srq_last_wqe_once`] |
//! | `destroy_keeps_srq` | [`check_destroy_keeps_srq`] |
//! | `srq_recv_chain` | [`check_srq_recv_chain`] |
//! | `rnr_then_success` | [`check_rnr_then_success`] |
//! | `rnr_retry_exceeded` | [`check_rnr_retry_exceeded`] |
//! | `retry_exceeded_peer_gone` | [`check_retry_exceeded_peer_gone`] |
//! | `ud_grh_qkey` | [`check_ud_grh_qkey`] |
//! | `buffer_lending` | [`check_buffer_lending`] |
//! | `comm_est` | [`check_comm_est`] |
//! | `object_rules` | [`check_object_rules`] |
//! | `retire_drained` | [`check_retire_drained`] |
//! | `begin_moves` | [`check_begin_moves`] |

use super::setup::{self, RcConnection};
use super::{
    AddressVector, AsyncEvent, BufId, Completion, CqId, Gid, Grh, Lid, Moved, Moves, PathMtu, PdId,
    PoolId, Psn, QKey, QpAttr, QpInit, QpNum, QpState, QpType, Rate, SendWr, Sl, SrqId, SrqInit,
    UdDest, Verbs, VerbsError, WcOpcode, WcStatus, WrId,
};

/// How a check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConformanceError {
    /// A verb the check needs failed (one the contract says succeeds there).
    #[error("{step}: {source}")]
    Verb {
        /// What the check was doing.
        step: String,
        /// The provider's error.
        #[source]
        source: VerbsError,
    },
    /// The provider broke the contract: what it did, against what the contract asks.
    #[error("{0}")]
    Violation(String),
    /// A pool the check allocates from had no free buffer.
    #[error("pool {0:?} exhausted")]
    PoolExhausted(PoolId),
    /// Data the check sends does not fit a buffer of its pool.
    #[error("{len} bytes do not fit a buffer of {cap}")]
    TooBig {
        /// Bytes to send.
        len: usize,
        /// The pool's buffer size.
        cap: usize,
    },
    /// [`run_one`] was asked for a check that does not exist.
    #[error("no conformance check named {0}")]
    NoSuchCheck(String),
}

/// A [`ConformanceError::Violation`] described by a format string.
macro_rules! violation {
    ($($fmt:tt)+) => {
        ConformanceError::Violation(format!($($fmt)+))
    };
}

/// Returns a [`ConformanceError::Violation`] unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(violation!($($fmt)+));
        }
    };
}

mod blocks;
mod checks_data;
mod checks_errors;
mod checks_qp;
mod expect;
mod support;

pub use blocks::*;
pub use checks_data::{
    check_buffer_lending, check_completion_order, check_rc_message_sizes, check_ud_grh_qkey,
};
pub use checks_errors::{
    check_comm_est, check_destroy_keeps_srq, check_drain_wr_after_err, check_flush_on_err,
    check_retry_exceeded_peer_gone, check_rnr_retry_exceeded, check_rnr_then_success,
    check_srq_last_wqe_once, check_srq_recv_chain, WATCHDOG_DESTROYS,
};
pub use checks_qp::{
    check_begin_moves, check_object_rules, check_qp_state_machine, check_retire_drained,
    MOVES_ROUNDS, RETIRE_ROUNDS,
};
pub use expect::{Behaviours, CommEst, LastWqe, RecvInErr};

/// Two providers that can reach each other, and a way to let the fabric between them run.
pub trait ConformancePair<V: Verbs> {
    /// The two providers, called `a` and `b` by the checks.
    fn providers(&mut self) -> (&mut V, &mut V);

    /// Lets the fabric run for a while: deliver what is in flight, fire due timers, and
    /// process what that causes, until nothing is left or some bound is reached. A check
    /// that waits for something calls this up to [`MAX_SETTLES`] times, so one settle must be
    /// long enough for a few retransmit timeouts of `timeout` 10 (4 ms) or RNR back-offs of
    /// [`RcParams::min_rnr_timer`] 14 (1.28 ms) to pass.
    fn settle(&mut self);

    /// What the providers do where providers are known to differ; the checks fail where
    /// they see otherwise. The contract, unless the pair knows its providers.
    fn expected(&self) -> Behaviours {
        Behaviours::SPEC
    }
}

/// A pair held to `expected` instead of its own [`ConformancePair::expected`].
#[derive(Debug)]
pub struct Expecting<'a, P> {
    /// The pair the checks run on.
    pub pair: &'a mut P,
    /// What its providers are expected to do.
    pub expected: Behaviours,
}

impl<V: Verbs, P: ConformancePair<V>> ConformancePair<V> for Expecting<'_, P> {
    fn providers(&mut self) -> (&mut V, &mut V) {
        self.pair.providers()
    }

    fn settle(&mut self) {
        self.pair.settle();
    }

    fn expected(&self) -> Behaviours {
        self.expected
    }
}

/// A check: a name and the function that runs it.
pub type Check<P> = (&'static str, fn(&mut P) -> Result<(), ConformanceError>);

/// Most [`ConformancePair::settle`] calls a check makes while waiting for one thing.
pub const MAX_SETTLES: usize = 64;

/// Every check, in the order [`run_all`] runs them.
pub fn checks<V: Verbs, P: ConformancePair<V>>() -> Vec<Check<P>> {
    vec![
        ("qp_state_machine", check_qp_state_machine::<V, P>),
        ("rc_message_sizes", check_rc_message_sizes::<V, P>),
        ("completion_order", check_completion_order::<V, P>),
        ("flush_on_err", check_flush_on_err::<V, P>),
        ("drain_wr_after_err", check_drain_wr_after_err::<V, P>),
        ("srq_last_wqe_once", check_srq_last_wqe_once::<V, P>),
        ("destroy_keeps_srq", check_destroy_keeps_srq::<V, P>),
        ("srq_recv_chain", check_srq_recv_chain::<V, P>),
        ("rnr_then_success", check_rnr_then_success::<V, P>),
        ("rnr_retry_exceeded", check_rnr_retry_exceeded::<V, P>),
        (
            "retry_exceeded_peer_gone",
            check_retry_exceeded_peer_gone::<V, P>,
        ),
        ("ud_grh_qkey", check_ud_grh_qkey::<V, P>),
        ("buffer_lending", check_buffer_lending::<V, P>),
        ("comm_est", check_comm_est::<V, P>),
        ("object_rules", check_object_rules::<V, P>),
        ("retire_drained", check_retire_drained::<V, P>),
        ("begin_moves", check_begin_moves::<V, P>),
    ]
}

/// Runs every check on `pair`, in order; returns each check's name and outcome.
pub fn run_all<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Vec<(&'static str, Result<(), ConformanceError>)> {
    checks::<V, P>()
        .into_iter()
        .map(|(name, f)| (name, f(pair)))
        .collect()
}

/// Runs the check called `name`.
///
/// # Errors
/// The check's failure, or an error naming an unknown check.
pub fn run_one<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
    name: &str,
) -> Result<(), ConformanceError> {
    let (_, f) = checks::<V, P>()
        .into_iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| ConformanceError::NoSuchCheck(name.to_owned()))?;
    f(pair)
}
