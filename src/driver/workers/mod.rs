//! One interface on several threads (`--workers N`): control and its workers.
//!
//! Worker 0 is the control side's [`Node`], turned by the daemon's loop with everything that
//! is per interface (the control socket, signals, the underlay, reload). Every other worker is
//! a thread of its own with its own mio loop and a follower [`Node`]: its queue of the
//! multi-queue TUN device, its own provider (on the software fabric, its socket of the
//! reuseport group on the RoCEv2 port, which the kernel picks by the destination QPN's low
//! bits), its own CQs, SRQ, connections in both directions, reaper and timer wheel.
//!
//! Control and the workers talk only through bounded queues, each waking the loop it feeds
//! ([`Mailbox`]); nothing on the packet path takes a lock. What crosses:
//!
//! - CM MADs: control's transport is a [`RoutedMads`] that hands each received MAD to the
//!   worker it is for and sends what the workers' CMs queued ([`WorkerMads`]);
//! - control's resolved neighbours ([`NeighView`]), published to every worker when they
//!   change; the workers' requests ([`FollowerRequest`]: packets only control sends, neighbours to
//!   resolve) and the neighbours they sent to (for ageing);
//! - shutdown, path MTU changes and live settings, control to every worker;
//! - each worker's figures, published every [`REPORT_INTERVAL`] into a slot control reads when
//!   it reports (the one lock, off the packet path).
//!
//! A worker whose thread ends (an I/O error, a panic) or that stops turning for
//! [`STALL_LIMIT`] is reported by [`Workers::check`]; the daemon then exits non-zero rather
//! than run with part of its connections unserved.

mod mads;
mod mailbox;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

pub use mads::{Outbox, RouteCounters, RouteStats, RoutedMad, RoutedMads, WorkerMads, MAD_BATCH};
pub use mailbox::{mailbox, Latest, Mailbox, Wake};

use super::{KcmRoute, Node, NodeConfig, NodeError};
use crate::cm::{KcmCommand, KcmInput};
use crate::ipoib::{FollowerRequest, Interface, LiveSettings, NeighView, TO_CONTROL_MAX};
use crate::mad::{Mad, MadTransport};
use crate::sys::tun::Tun;
use crate::verbs::{PathMtu, Provider};
use crate::wire::{WorkerCount, WorkerId};

/// Messages control queues for each worker at most (a full queue keeps the newest neighbour
/// view for the next turn).
pub const TO_WORKER_CAP: usize = 64;
/// Requests the workers queue for control at most, together.
pub const FROM_WORKERS_CAP: usize = 4096;
/// How often a worker publishes its figures.
pub const REPORT_INTERVAL: Duration = Duration::from_millis(250);
/// How often a worker tells control which neighbours it sent to.
pub const USED_INTERVAL: Duration = Duration::from_secs(1);
/// A worker that has not turned for this long, while control did, is stalled (an idle one
/// turns every second).
pub const STALL_LIMIT: Duration = Duration::from_secs(10);
/// A gap this long between two of control's checks is a pause of the whole process (SIGSTOP,
/// a frozen cgroup, a debugger, a migrated VM), not of one worker: control itself turns at
/// least every second. Each worker's stall is measured from the end of such a pause.
pub const PAUSE_GAP: Duration = Duration::from_secs(3);
/// How long past its drain a worker may take to end at shutdown before the daemon gives up on
/// it ([`Workers::overdue`]).
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Datagrams for one worker that others received (a GRO buffer of several workers' QPs) and
/// hand over, queued at most; more are dropped (the RC sender retransmits them).
pub const FOREIGN_CAP: usize = 1024;
/// Bytes of IP packets the followers hand to control to send (multicast and broadcast, a peer
/// that takes one connection, datagram sends) queued at most, together: more are dropped and
/// counted (`tx_dropped`), as a full send queue drops them. What bounds their memory, which the
/// daemon's stated need counts.
pub const HANDED_BYTES_MAX: usize = 16 << 20;
/// A worker loop's longest sleep.
const IDLE_WAKE: Duration = Duration::from_secs(1);
/// The token of a worker loop's wake-up; its node's tokens follow.
const WAKE: Token = Token(0);

/// A change control makes on a worker's node once (set-up, `--fault-worker`), run in the
/// worker's thread at the start of its next turn; one that finds the worker's queue full is
/// lost (settings travel as [`WorkerSettings`], whose newest always arrives).
pub type Change<P> = Box<dyn FnOnce(&mut Node<P>, Instant) + Send>;

/// What control decides for every worker's node: the `--bind` link's MTU (the provider's port
/// follows it), the path MTU chosen from it, and the live settings a reload changes. One
/// value whose newest always reaches every worker ([`Latest`]: a full queue holds it for a
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

/// The bytes of packets the followers handed to control and control has not taken yet,
/// against [`HANDED_BYTES_MAX`].
#[derive(Debug, Default)]
struct HandedBytes(AtomicUsize);

impl HandedBytes {
    /// Takes room for `bytes`; false (nothing taken) where it would pass the bound.
    fn take(&self, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&n| n <= HANDED_BYTES_MAX)
            })
            .is_ok()
    }

    /// Gives back the room of `bytes` taken.
    fn release(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// What a worker publishes for control to read.
#[derive(Debug)]
struct Shared<R> {
    report: Mutex<Option<R>>,
    /// Milliseconds since the workers started at its last turn.
    heartbeat_ms: AtomicU64,
    /// Datagrams it received for other workers and dropped: their queues were full.
    foreign_dropped: AtomicU64,
    /// Packets it had for control to send and dropped: [`HANDED_BYTES_MAX`] were queued.
    handed_dropped: AtomicU64,
}

/// Control's handle on one worker.
struct Handle<P: Provider, R> {
    slot: WorkerId,
    to: Mailbox<ToWorker<P>>,
    thread: Option<JoinHandle<Result<(), WorkerError>>>,
    shared: Arc<Shared<R>>,
    /// Control's port, neighbours and settings, each queued as soon as there is room (in
    /// that order: a view may name paths through the port).
    port: Latest<P::PortView>,
    view: Latest<NeighView>,
    settings: Latest<WorkerSettings>,
    /// Shutdown asked and not queued yet.
    stop: bool,
}

impl<P: Provider, R> Handle<P, R> {
    /// Queues what is pending for the worker, in order, while its queue has room.
    fn flush(&mut self) {
        let to = &self.to;
        let _ = self.port.flush(|v| to.post(ToWorker::Port(v)))
            && self.view.flush(|v| to.post(ToWorker::Neighbours(v)))
            && self.settings.flush(|v| to.post(ToWorker::Settings(v)));
    }
}

/// A datagram one worker received for another: its sender and bytes.
type Foreign = (SocketAddr, Vec<u8>);

/// Where every worker's foreign datagrams go (index: the worker), and this loop's own.
struct ForeignRoutes {
    to: Vec<Mailbox<Foreign>>,
    inbox: Receiver<Foreign>,
}

impl ForeignRoutes {
    /// Hands the datagrams `prov` received for other workers to them; returns how many
    /// were dropped (a full queue).
    fn send<P: Provider>(&self, prov: &mut P) -> u64 {
        let mut dropped = 0;
        prov.take_foreign(&mut |worker, src, d| {
            let sent = self
                .to
                .get(usize::from(worker))
                .is_some_and(|m| m.post((src, d.to_vec())));
            dropped += u64::from(!sent);
        });
        dropped
    }

    /// Gives `prov` what the other workers received for it (bounded); true if any.
    fn accept<P: Provider>(&self, now: Instant, prov: &mut P) -> bool {
        let mut any = false;
        for _ in 0..FOREIGN_CAP {
            let Ok((src, d)) = self.inbox.try_recv() else {
                break;
            };
            prov.accept_foreign(now, src, &d);
            any = true;
        }
        any
    }
}

/// The queues of the workers, made before control's node (whose transport they route) and
/// the workers' threads (which they are handed to).
pub struct WorkersSetup {
    count: WorkerCount,
    polls: Vec<(Poll, Arc<Wake>)>,
    kcm_to: Vec<Mailbox<KcmInput>>,
    kcm_in: Vec<Receiver<KcmInput>>,
    foreign_to: Vec<Mailbox<Foreign>>,
    foreign_in: Vec<Receiver<Foreign>>,
    mads_to: Vec<Mailbox<RoutedMad>>,
    mads_in: Vec<Receiver<RoutedMad>>,
    mads_out: Mailbox<Mad>,
    mads_out_rx: Option<Receiver<Mad>>,
    mads_queued: Arc<Outbox>,
    /// What control's [`RoutedMads`] counts, once made.
    mad_routes: Option<Arc<RouteCounters>>,
    asks: Mailbox<FromWorker>,
    asks_rx: Receiver<FromWorker>,
    handed: Arc<HandedBytes>,
}

impl std::fmt::Debug for WorkersSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkersSetup")
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl WorkersSetup {
    /// The queues of `count` workers (1..count) and control, whose loop `control` wakes.
    ///
    /// # Errors
    /// A worker's poll or wake-up could not be made.
    pub fn new(count: WorkerCount, control: &Arc<Wake>) -> io::Result<Self> {
        let others = usize::from(count.get()).saturating_sub(1);
        let mut polls = Vec::with_capacity(others);
        let (mut mads_to, mut mads_in) = (Vec::new(), Vec::new());
        let (mut kcm_to, mut kcm_in) = (Vec::new(), Vec::new());
        for _ in 0..others {
            let poll = Poll::new()?;
            let wake = Wake::new(poll.registry(), WAKE)?;
            let (tx, rx) = mailbox(MAD_BATCH, &wake);
            mads_to.push(tx);
            mads_in.push(rx);
            let (tx, rx) = mailbox(MAD_BATCH, &wake);
            kcm_to.push(tx);
            kcm_in.push(rx);
            polls.push((poll, wake));
        }
        let room = MAD_BATCH * others.max(1);
        let (mads_out, mads_out_rx) = mailbox(room, control);
        let (asks, asks_rx) = mailbox(FROM_WORKERS_CAP, control);
        let handed = Arc::new(HandedBytes::default());
        let wakes = std::iter::once(control).chain(polls.iter().map(|(_, w)| w));
        let (foreign_to, foreign_in) = wakes.map(|w| mailbox(FOREIGN_CAP, w)).unzip();
        Ok(Self {
            count,
            polls,
            kcm_to,
            kcm_in,
            foreign_to,
            foreign_in,
            mads_to,
            mads_in,
            mads_out,
            mads_out_rx: Some(mads_out_rx),
            mads_queued: Outbox::new(room),
            mad_routes: None,
            asks,
            asks_rx,
            handed,
        })
    }

    /// Control's CM transport `inner`, with the workers' MADs routed through it. Call it once.
    pub fn routed<V: crate::verbs::Verbs>(
        &mut self,
        inner: Box<dyn MadTransport<V>>,
    ) -> RoutedMads<V> {
        let rx = self
            .mads_out_rx
            .take()
            .unwrap_or_else(|| std::sync::mpsc::sync_channel(0).1);
        let routed = RoutedMads::new(
            inner,
            self.count,
            self.mads_to.clone(),
            rx,
            Arc::clone(&self.mads_queued),
        );
        self.mad_routes = Some(routed.counters());
        routed
    }

    /// Where control's node hands the workers' kernel CM inputs ([`Node::route_kcm`]).
    pub fn kcm_route(&self) -> KcmRoute {
        KcmRoute {
            count: self.count,
            to: self.kcm_to.clone(),
            dropped: 0,
        }
    }

    /// Starts a thread for each of `specs` (workers 1.. in order), their followers speaking
    /// with `interface` (control's hardware address); each publishes `report(node, now)`.
    ///
    /// # Errors
    /// A thread could not be spawned.
    pub fn spawn<P, R>(
        self,
        interface: Interface,
        specs: Vec<WorkerSpec<P>>,
        report: ReportFn<P, R>,
        settings: SettingsFn<P>,
    ) -> io::Result<Workers<P, R>>
    where
        P: Provider + 'static,
        R: Send + 'static,
    {
        let started = Instant::now();
        let mut handles = Vec::with_capacity(specs.len());
        let mut foreign_in = self.foreign_in.into_iter();
        let control_foreign = ForeignRoutes {
            to: self.foreign_to.clone(),
            inbox: foreign_in
                .next()
                .unwrap_or_else(|| std::sync::mpsc::sync_channel(0).1),
        };
        let parts = self
            .polls
            .into_iter()
            .zip(self.mads_in)
            .zip(foreign_in)
            .zip(self.kcm_in);
        for (spec, ((((poll, wake), mads_in), foreign), kcm_in)) in specs.into_iter().zip(parts) {
            let (to, inbox) = mailbox(TO_WORKER_CAP, &wake);
            let shared = Arc::new(Shared {
                report: Mutex::new(None),
                heartbeat_ms: AtomicU64::new(0),
                foreign_dropped: AtomicU64::new(0),
                handed_dropped: AtomicU64::new(0),
            });
            let slot = spec.slot;
            let ctx = WorkerContext {
                poll,
                wake,
                inbox,
                mads: WorkerMads::new(
                    mads_in,
                    self.mads_out.clone(),
                    Arc::clone(&self.mads_queued),
                ),
                kcm_in,
                foreign: ForeignRoutes {
                    to: self.foreign_to.clone(),
                    inbox: foreign,
                },
                asks: self.asks.clone(),
                handed: Arc::clone(&self.handed),
                shared: Arc::clone(&shared),
                report: Arc::clone(&report),
                settings: Arc::clone(&settings),
                interface,
                started,
            };
            let thread = std::thread::Builder::new()
                .name(format!("ipoib-w{}", slot.index()))
                .spawn(move || ctx.run(spec))?;
            handles.push(Handle {
                slot,
                to,
                thread: Some(thread),
                shared,
                port: Latest::default(),
                view: Latest::default(),
                settings: Latest::default(),
                stop: false,
            });
        }
        Ok(Workers {
            count: self.count,
            handles,
            foreign: control_foreign,
            foreign_dropped: 0,
            asks: self.asks_rx,
            handed: self.handed,
            mad_routes: self.mad_routes.unwrap_or_default(),
            port_generation: None,
            generation: None,
            settings: None,
            started,
            last_check: None,
            resumed: started,
            stopping: false,
            stop_limit: None,
            more: false,
        })
    }
}

/// Control's side of the workers 1.. of an interface (worker 0 is control's own node).
pub struct Workers<P: Provider, R> {
    count: WorkerCount,
    handles: Vec<Handle<P, R>>,
    /// Datagrams control's provider received for the workers, and theirs for control.
    foreign: ForeignRoutes,
    /// Of those control handed over, dropped for a full queue.
    foreign_dropped: u64,
    asks: Receiver<FromWorker>,
    handed: Arc<HandedBytes>,
    /// What control's transport counted of the workers' MADs.
    mad_routes: Arc<RouteCounters>,
    /// The port view's generation last published.
    port_generation: Option<u64>,
    /// The neighbour generation last published.
    generation: Option<u64>,
    /// The settings last published.
    settings: Option<WorkerSettings>,
    started: Instant,
    /// Control's last check, and when the last pause of the process ended (see
    /// [`PAUSE_GAP`]).
    last_check: Option<Instant>,
    resumed: Instant,
    stopping: bool,
    /// When the shutdown began, and how long the workers have to end.
    stop_limit: Option<(Instant, Duration)>,
    /// The last turn stopped at its bound with requests left.
    more: bool,
}

impl<P: Provider, R> std::fmt::Debug for Workers<P, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("count", &self.count)
            .field("stopping", &self.stopping)
            .finish_non_exhaustive()
    }
}

impl<P: Provider, R: Clone> Workers<P, R> {
    /// How many workers the interface has, control's included.
    pub fn count(&self) -> WorkerCount {
        self.count
    }

    /// One turn of control's side, after control's node turned: publishes control's port
    /// and neighbours where they changed (each worker's newest view queued as soon as its
    /// queue has room), and handles what the workers asked (bounded; see
    /// [`Workers::has_pending`]).
    pub fn turn(&mut self, now: Instant, node: &mut Node<P>) {
        self.foreign_dropped += self.foreign.send(node.provider_mut());
        let accepted = self.foreign.accept(now, node.provider_mut());
        let port_generation = node.provider().port_view_generation();
        if self.port_generation != Some(port_generation) {
            self.port_generation = Some(port_generation);
            if let Some(view) = node.provider().port_view().map(Arc::new) {
                for h in &mut self.handles {
                    h.port.set(Arc::clone(&view));
                }
            }
        }
        let generation = node.endpoint().neighbour_generation();
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            let view = Arc::new(node.endpoint().neighbour_view());
            for h in &mut self.handles {
                h.view.set(Arc::clone(&view));
            }
        }
        for h in &mut self.handles {
            h.flush();
            if h.stop && h.to.post(ToWorker::Shutdown) {
                h.stop = false;
            }
        }
        // What was accepted completes at control's next turn: it follows at once.
        self.more = accepted;
        for _ in 0..FROM_WORKERS_CAP {
            match self.asks.try_recv() {
                Ok(FromWorker::Ask(FollowerRequest::Packet(p))) => {
                    self.handed.release(p.len());
                    node.hand_in(now, &p);
                }
                Ok(FromWorker::Ask(FollowerRequest::Resolve(ip))) => {
                    node.reconfigure(now, |ep, v| ep.resolve_for_worker(now, v, ip));
                }
                Ok(FromWorker::Ask(FollowerRequest::Failed(hw))) => {
                    node.reconfigure(now, |ep, v| ep.binding_failed_at(now, v, hw));
                }
                Ok(FromWorker::Ask(FollowerRequest::Restarted {
                    gid,
                    ud_qpn,
                    ca_guid,
                })) => {
                    node.reconfigure(now, |ep, v| ep.peer_restarted(now, v, gid, ud_qpn, ca_guid));
                }
                Ok(FromWorker::Used(ips)) => node.endpoint_mut().neighbours_used(now, &ips),
                Ok(FromWorker::Kcm(c)) => node.execute_kcm(now, c),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
        self.more = true;
    }

    /// Datagrams a provider (control's or a worker's) received for another worker and
    /// dropped: its queue was full.
    pub fn foreign_dropped(&self) -> u64 {
        let workers: u64 = self
            .handles
            .iter()
            .map(|h| h.shared.foreign_dropped.load(Ordering::Relaxed))
            .sum();
        self.foreign_dropped + workers
    }

    /// Packets the followers had for control to send and dropped at [`HANDED_BYTES_MAX`].
    pub fn handed_dropped(&self) -> u64 {
        self.handles
            .iter()
            .map(|h| h.shared.handed_dropped.load(Ordering::Relaxed))
            .sum()
    }

    /// The workers' MADs control's transport carried, held back and dropped.
    pub fn mad_routes(&self) -> RouteStats {
        self.mad_routes.read()
    }

    /// The last turn left requests: the next should follow at once.
    pub fn has_pending(&self) -> bool {
        self.more
    }

    /// Control's settings are `s` from now on: every worker gets them (unless they are the
    /// ones it has), as soon as its queue has room.
    pub fn set_settings(&mut self, s: WorkerSettings) {
        if self.settings == Some(s) {
            return;
        }
        self.settings = Some(s);
        let s = Arc::new(s);
        for h in &mut self.handles {
            h.settings.set(Arc::clone(&s));
            h.flush();
        }
    }

    /// Makes the change `make()` builds on every worker's node, in its thread (a worker
    /// whose queue is full misses it, with a warning).
    pub fn apply(&self, what: &str, make: impl Fn() -> Change<P>) {
        for h in &self.handles {
            if !h.to.post(ToWorker::Apply(make())) {
                tracing::warn!(
                    worker = h.slot.index(),
                    "{what} did not reach the worker: its queue is full"
                );
            }
        }
    }

    /// Tells every worker to shut down (queued on the next turn where a queue is full): each
    /// has its `drain` (the same as control's) and [`STOP_GRACE`] to end.
    pub fn begin_shutdown(&mut self, now: Instant, drain: Duration) {
        self.stopping = true;
        self.stop_limit = Some((now, drain + STOP_GRACE));
        for h in &mut self.handles {
            h.stop = !h.to.post(ToWorker::Shutdown);
        }
    }

    /// Whether [`Workers::begin_shutdown`] was called.
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// A worker whose thread has not ended within its time to shut down (a thread stuck where
    /// the daemon cannot reach it: the process exits without it).
    ///
    /// # Errors
    /// [`WorkerError::Overdue`] naming the first such worker.
    pub fn overdue(&self, now: Instant) -> Result<(), WorkerError> {
        let Some((began, limit)) = self.stop_limit else {
            return Ok(());
        };
        if now.saturating_duration_since(began) < limit {
            return Ok(());
        }
        match self
            .handles
            .iter()
            .find(|h| h.thread.as_ref().is_some_and(|t| !t.is_finished()))
        {
            Some(h) => Err(WorkerError::Overdue {
                worker: h.slot.index(),
                limit,
            }),
            None => Ok(()),
        }
    }

    /// Whether every worker's thread has ended.
    pub fn all_ended(&self) -> bool {
        self.handles
            .iter()
            .all(|h| h.thread.as_ref().is_none_or(JoinHandle::is_finished))
    }

    /// A worker that failed: its thread ended (before shutdown, or with an error) or it has
    /// not turned for [`STALL_LIMIT`] of the time control ran (a pause of the whole process
    /// is no stall: see [`PAUSE_GAP`]). Joins the threads that ended. Call it on every turn
    /// of control's.
    ///
    /// # Errors
    /// The first failure found.
    pub fn check(&mut self, now: Instant) -> Result<(), WorkerError> {
        if self
            .last_check
            .is_some_and(|at| now.saturating_duration_since(at) >= PAUSE_GAP)
        {
            self.resumed = now;
        }
        self.last_check = Some(now);
        let since_start = now.saturating_duration_since(self.started);
        let since_resumed = now.saturating_duration_since(self.resumed);
        for h in &mut self.handles {
            let index = h.slot.index();
            if h.thread.as_ref().is_some_and(JoinHandle::is_finished) {
                let ended = h.thread.take().map(JoinHandle::join);
                match ended {
                    Some(Err(_)) => return Err(WorkerError::Panicked(index)),
                    Some(Ok(Err(e))) => return Err(e),
                    Some(Ok(Ok(()))) if !self.stopping => return Err(WorkerError::Ended(index)),
                    _ => {}
                }
                continue;
            }
            if h.thread.is_none() || self.stopping {
                continue;
            }
            let beat = Duration::from_millis(h.shared.heartbeat_ms.load(Ordering::Relaxed));
            let silent = since_start.saturating_sub(beat).min(since_resumed);
            if silent > STALL_LIMIT {
                return Err(WorkerError::Stalled(index));
            }
        }
        Ok(())
    }

    /// Waits for every thread to end (after [`Workers::begin_shutdown`] and
    /// [`Workers::all_ended`], this does not block).
    ///
    /// # Errors
    /// The first worker that failed.
    pub fn join(mut self) -> Result<(), WorkerError> {
        let mut first = Ok(());
        for h in &mut self.handles {
            let index = h.slot.index();
            let r = match h.thread.take().map(JoinHandle::join) {
                Some(Err(_)) => Err(WorkerError::Panicked(index)),
                Some(Ok(r)) => r,
                None => Ok(()),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Each worker's latest report (workers 1.. in order; `None` before its first).
    pub fn reports(&self) -> Vec<(WorkerId, Option<R>)> {
        self.handles
            .iter()
            .map(|h| {
                let r = h
                    .shared
                    .report
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                (h.slot, r)
            })
            .collect()
    }
}

/// What a worker's thread owns besides its spec.
struct WorkerContext<P: Provider, R> {
    poll: Poll,
    wake: Arc<Wake>,
    inbox: Receiver<ToWorker<P>>,
    mads: WorkerMads,
    /// What control's event channel read for this worker's kernel CM ids.
    kcm_in: Receiver<KcmInput>,
    foreign: ForeignRoutes,
    asks: Mailbox<FromWorker>,
    handed: Arc<HandedBytes>,
    shared: Arc<Shared<R>>,
    report: ReportFn<P, R>,
    settings: SettingsFn<P>,
    interface: Interface,
    started: Instant,
}

impl<P: Provider, R> WorkerContext<P, R> {
    /// The worker's thread: its loop until its shutdown is over.
    fn run(mut self, spec: WorkerSpec<P>) -> Result<(), WorkerError> {
        let worker = spec.slot.index();
        let prov = (spec.open)().map_err(|source| WorkerError::Open { worker, source })?;
        let mut node = Node::follower(
            Instant::now(),
            prov,
            spec.node,
            Box::new(self.mads),
            spec.tun,
            self.interface,
            self.poll.registry(),
            WAKE.0 + 1,
        )
        .map_err(|source| WorkerError::Node { worker, source })?;
        if let Some(setup) = spec.setup {
            setup(&mut node, Instant::now());
        }
        let io = |source| WorkerError::Io { worker, source };
        let mut events = Events::with_capacity(256);
        let mut used = Vec::new();
        let mut next_used = Instant::now() + USED_INTERVAL;
        let mut next_report = Instant::now();
        loop {
            let now = Instant::now();
            let timeout = if node.has_pending_input() {
                Duration::ZERO
            } else {
                [node.poll_timeout(), Some(next_used), Some(next_report)]
                    .into_iter()
                    .flatten()
                    .min()
                    .map_or(IDLE_WAKE, |t| t.saturating_duration_since(now))
                    .min(IDLE_WAKE)
            };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
            let now = Instant::now();
            self.wake.clear();
            for ev in &events {
                node.note_readiness(ev.token());
            }
            for _ in 0..TO_WORKER_CAP {
                match self.inbox.try_recv() {
                    Ok(ToWorker::Port(view)) => node.provider_mut().follow_port_view(&view),
                    Ok(ToWorker::Neighbours(view)) => {
                        node.reconfigure(now, |ep, v| ep.set_neighbour_view(now, v, view));
                    }
                    Ok(ToWorker::Settings(s)) => (self.settings)(&mut node, &s, now),
                    Ok(ToWorker::Apply(change)) => change(&mut node, now),
                    // Control is gone: so is the interface's reason to run.
                    Ok(ToWorker::Shutdown) | Err(TryRecvError::Disconnected) => {
                        node.begin_shutdown(now);
                        break;
                    }
                    Err(TryRecvError::Empty) => break,
                }
            }
            // Before the turn: what they complete is the endpoint's in this turn.
            self.foreign.accept(now, node.provider_mut());
            for _ in 0..MAD_BATCH {
                let Ok(input) = self.kcm_in.try_recv() else {
                    break;
                };
                node.endpoint_mut().handle_kcm_input(now, input);
            }
            node.turn(now).map_err(io)?;
            // Its kernel CM's commands run on control's event channel.
            for _ in 0..MAD_BATCH {
                let Some(c) = node.endpoint_mut().poll_kcm_command() else {
                    break;
                };
                // Lost with a full queue: the connection times out and is tried again.
                let _ = self.asks.post(FromWorker::Kcm(c));
            }
            let dropped = self.foreign.send(node.provider_mut());
            self.shared
                .foreign_dropped
                .fetch_add(dropped, Ordering::Relaxed);
            for _ in 0..TO_CONTROL_MAX {
                let Some(ask) = node.endpoint_mut().poll_to_control() else {
                    break;
                };
                let bytes = match &ask {
                    FollowerRequest::Packet(p) => p.len(),
                    _ => 0,
                };
                if !self.handed.take(bytes) {
                    node.endpoint_mut().count_tx_dropped(1);
                    self.shared.handed_dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if !self.asks.post(FromWorker::Ask(ask)) {
                    self.handed.release(bytes);
                    node.endpoint_mut().count_tx_dropped(1);
                }
            }
            if now >= next_used {
                next_used = now + USED_INTERVAL;
                node.endpoint_mut().take_used_neighbours(&mut used);
                if !used.is_empty() {
                    // Lost with a full queue: the next second's list says it again.
                    let _ = self.asks.post(FromWorker::Used(std::mem::take(&mut used)));
                }
            }
            node.flush(now, self.poll.registry()).map_err(io)?;
            if let Some(why) = node.device_gave_up() {
                return Err(WorkerError::DeviceLost {
                    worker,
                    why: why.to_owned(),
                });
            }
            let beat = now.saturating_duration_since(self.started).as_millis();
            self.shared
                .heartbeat_ms
                .store(u64::try_from(beat).unwrap_or(u64::MAX), Ordering::Relaxed);
            let finish = node.should_finish(now);
            if now >= next_report || finish {
                next_report = now + REPORT_INTERVAL;
                let r = (self.report)(&node, now);
                *self
                    .shared
                    .report
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(r);
            }
            if finish {
                return node.finish(now).map_err(io);
            }
        }
    }
}
