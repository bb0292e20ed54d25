//! Why a worker failed, and the time limits control holds it to.

use std::io;
use std::time::Duration;

use crate::driver::NodeError;

/// A worker that has not turned for this long, while control did, is stalled (an idle one
/// turns every second).
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// How long past its drain a worker may take to end at shutdown before the daemon gives up on
/// it ([`Workers::overdue`](super::Workers::overdue)).
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Why a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Its provider could not be opened.
    #[error("worker {worker}: provider: {source}")]
    Open {
        /// The worker.
        worker: u8,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Its node could not be set up.
    #[error("worker {worker}: {source}")]
    Node {
        /// The worker.
        worker: u8,
        /// Why.
        #[source]
        source: NodeError,
    },
    /// Its loop failed.
    #[error("worker {worker}: event loop: {source}")]
    Io {
        /// The worker.
        worker: u8,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Its thread panicked.
    #[error("worker {0}: panicked")]
    Panicked(u8),
    /// Its thread ended before it was told to.
    #[error("worker {0}: ended unasked")]
    Ended(u8),
    /// It has not turned for [`STALL_LIMIT`].
    #[error("worker {0}: stalled (no turn for {STALL_LIMIT:?})")]
    Stalled(u8),
    /// Its device context was lost and not opened again (an interface of several workers is
    /// not rebuilt in place): the daemon exits as for its own device.
    #[error("worker {worker}: {why}")]
    DeviceLost {
        /// The worker.
        worker: u8,
        /// Why, one line.
        why: String,
    },
    /// It did not end within its drain and [`STOP_GRACE`] of the shutdown.
    #[error("worker {worker}: did not end within {limit:?} of the shutdown")]
    Overdue {
        /// The worker.
        worker: u8,
        /// How long it was given.
        limit: Duration,
    },
}
