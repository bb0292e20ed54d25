//! The driver: the edge where the sans-IO cores meet the operating system's event loop.
//!
//! A [`Node`] owns one IPoIB interface: the provider and its descriptors
//! ([`ProviderSources`]), the [`Endpoint`](crate::ipoib::Endpoint), the CM MAD transport that
//! [`CmTransport`](crate::mad::CmTransport) names, and the TUN device. It never reads the
//! clock and never sleeps: its caller owns the mio [`Poll`](mio::Poll), reads the clock once
//! per turn and passes that `now` to every call of the turn.
//!
//! # Calling protocol
//!
//! 1. [`Node::new`] sets the interface up and registers the node's descriptors with the
//!    caller's registry on the tokens `first_token..`[`Node::tokens_end`]; the caller's own
//!    tokens lie outside that range.
//! 2. Each turn of the loop:
//!    - poll with a timeout of zero while [`Node::has_pending_input`], else until
//!      [`Node::poll_timeout`] (the earliest of the caller's own deadlines with it);
//!    - read the clock once: `now`;
//!    - for every event, [`Node::note_readiness`] with its token (`false`: not the node's);
//!    - [`Node::turn`]`(now)`: provider input, CM MADs, completions, TUN writes and reads,
//!      the endpoint's timers;
//!    - the caller's own work that reads the node's state ([`Node::endpoint`],
//!      [`Node::provider`], [`Node::mad_stats`]) and may call [`Node::begin_shutdown`];
//!    - [`Node::flush`]`(now, registry)`: what the turn queued leaves, together;
//!    - if [`Node::should_finish`]`(now)`, [`Node::finish`]`(now)` and leave the loop.
//! 3. [`Node::begin_shutdown`] (on a signal, say) DREQs every connection; the loop goes on
//!    turning until every connection is gone or the endpoint's `drain_timeout` has passed.
//!
//! [`ProviderSources`] alone is the registration part, for loops that drive a provider
//! without a node (the tools).

pub(crate) mod event_log;
#[cfg(feature = "verbs")]
mod kcm;
#[cfg(not(feature = "verbs"))]
mod kcm_stub;
mod node;
mod sa;
mod sources;
mod tun;
pub mod workers;

#[cfg(feature = "verbs")]
pub use kcm::KernelCmDriver;
#[cfg(not(feature = "verbs"))]
pub use kcm_stub::KernelCmDriver;

pub use node::{
    addr_list, DeviceStats, KcmRoute, Node, NodeConfig, NodeError, ReopenBackoff, EARLY_ACK_BATCH,
    REOPEN_FIRST_DELAY, REOPEN_MAX_DELAY, REOPEN_MAX_FAILURES, TUN_BATCH,
};
pub use sa::{SaDriver, SaDriverStats, SaPort, POLL_INTERVAL, READ_BATCH};
pub use sources::ProviderSources;
pub use tun::TunStats;

/// Where the kernel's CM driver hands what its event channel read and what its calls raise:
/// an endpoint, or, with several workers, control's router to the endpoint each id is of.
pub trait KcmSink {
    /// One input for the endpoint of `input.id()`.
    fn handle_kcm_input(&mut self, now: std::time::Instant, input: crate::cm::KcmInput);
}

impl KcmSink for crate::ipoib::Endpoint {
    fn handle_kcm_input(&mut self, now: std::time::Instant, input: crate::cm::KcmInput) {
        Self::handle_kcm_input(self, now, input);
    }
}

/// What the driver's side of the kernel's CM counted (`--cm-transport rdmacm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KcmStats {
    /// Events read from the channel.
    pub events: u64,
    /// Commands executed.
    pub commands: u64,
    /// librdmacm calls that failed (the connection was failed with them).
    pub call_errors: u64,
    /// Connection requests refused for a full id table.
    pub requests_refused: u64,
    /// Connects that waited for a resolution slot.
    pub connects_queued: u64,
    /// Live ids (the listener included).
    pub ids: u64,
}
