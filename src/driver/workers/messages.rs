//! What crosses between control and the workers (besides MADs, datagrams and reports): the
//! messages each way, the settings control decides for every worker, and what a worker's
//! thread is given.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::cm::KcmCommand;
use crate::driver::{Node, NodeConfig};
use crate::ipoib::{FollowerRequest, LiveSettings, NeighView};
use crate::sys::tun::Tun;
use crate::verbs::{PathMtu, Provider};
use crate::wire::WorkerId;

/// Messages control queues for each worker at most (a full queue keeps the newest neighbour
/// view for the next turn).
pub const TO_WORKER_CAP: usize = 64;

/// Requests the workers queue for control at most, together.
pub const FROM_WORKERS_CAP: usize = 4096;

/// A change control makes on a worker's node once (set-up, `--fault-worker`), run in the
/// worker's thread at the start of its next turn; one that finds the worker's queue full is
/// lost (settings travel as [`WorkerSettings`], whose newest always arrives).
pub type Change<P> = Box<dyn FnOnce(&mut Node<P>, Instant) + Send>;

/// What control decides for every worker's node: the `--bind` link's MTU (the provider's port
/// follows it), the path MTU chosen from it, and the live settings a reload changes. One
/// value whose newest always reaches every worker ([`Latest`](super::Latest): a full queue holds it for a
/// later turn), so no change is lost for good and none arrives after a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerSettings {
    /// The `--bind` link's MTU in bytes.
    pub link_mtu: u32,
    /// The path MTU.
    pub path_mtu: PathMtu,
    /// The endpoint's live settings.
    pub live: LiveSettings,
}

/// Makes a worker's node follow [`WorkerSettings`], in its thread (the daemon's: it knows
/// how its provider follows a link MTU). Applying the same settings twice changes nothing.
pub type SettingsFn<P> = Arc<dyn Fn(&mut Node<P>, &WorkerSettings, Instant) + Send + Sync>;

/// What control tells a worker.
pub enum ToWorker<P: Provider> {
    /// Control's port from now on ([`Provider::port_view`]), published before the neighbour
    /// view that may name paths through it.
    Port(Arc<P::PortView>),
    /// Control's resolved neighbours from now on.
    Neighbours(Arc<NeighView>),
    /// Control's settings from now on.
    Settings(Arc<WorkerSettings>),
    /// A change to make.
    Apply(Change<P>),
    /// Shut down: DREQ every connection, drain, and end the thread.
    Shutdown,
}

/// What a worker tells control.
#[derive(Debug)]
pub enum FromWorker {
    /// A follower's request ([`crate::ipoib::Endpoint::poll_to_control`]).
    Ask(FollowerRequest),
    /// The neighbours it sent to since it last said.
    Used(Vec<IpAddr>),
    /// A command of its kernel CM, for control's event channel (`--cm-transport rdmacm`).
    Kcm(KcmCommand),
}

/// What a worker's thread is given: its slot, how to open its provider (in the thread: a
/// libibverbs context is the thread's), its node's settings and its queue of the interface.
pub struct WorkerSpec<P: Provider> {
    /// Which worker.
    pub slot: WorkerId,
    /// Opens its provider.
    pub open: Box<dyn FnOnce() -> io::Result<P> + Send>,
    /// Its node's settings (`endpoint.worker` is `slot`).
    pub node: NodeConfig,
    /// Its queue of the interface.
    pub tun: Tun,
    /// A change made on its node once it is set up, before its first turn.
    pub setup: Option<Change<P>>,
}

/// Builds a worker's report from its node, in its thread (so it may read the thread's own
/// clocks).
pub type ReportFn<P, R> = Arc<dyn Fn(&Node<P>, Instant) -> R + Send + Sync>;
