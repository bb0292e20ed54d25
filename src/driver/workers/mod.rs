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
//! - control's port (where the provider shares one), its resolved neighbours with their paths
//!   ([`NeighView`]) and its settings ([`WorkerSettings`]), each the newest as soon as a
//!   worker's queue has room ([`Latest`]); the workers' requests ([`FollowerRequest`]: packets
//!   only control sends, neighbours to resolve) and the neighbours they sent to (for ageing);
//!   the shutdown (`messages.rs`);
//! - datagrams of another worker's QPs, and the bytes of packets handed to control, each
//!   bounded (`handover.rs`);
//! - each worker's figures, published every [`REPORT_INTERVAL`] into a slot control reads when
//!   it reports (the one lock, off the packet path).
//!
//! This file is control's side ([`WorkersSetup`], [`Workers`]); `thread.rs` a worker's loop.
//! A worker whose thread ends (an I/O error, a panic) or that stops turning for
//! [`STALL_LIMIT`] of the time control ran is reported by [`Workers::check`]; the daemon then
//! exits non-zero rather than run with part of its connections unserved (`error.rs`).

mod error;
mod handover;
mod mads;
mod mailbox;
mod messages;
mod thread;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::Poll;

pub use error::{WorkerError, STALL_LIMIT, STOP_GRACE};
pub use handover::{FOREIGN_CAP, HANDED_BYTES_MAX};
pub use mads::{Outbox, RouteCounters, RouteStats, RoutedMad, RoutedMads, WorkerMads, MAD_BATCH};
pub use mailbox::{mailbox, Latest, Mailbox, Wake};
pub use messages::{
    Change, FromWorker, ReportFn, SettingsFn, ToWorker, WorkerSettings, WorkerSpec,
    FROM_WORKERS_CAP, TO_WORKER_CAP,
};
pub use thread::{REPORT_INTERVAL, USED_INTERVAL};

use handover::{Foreign, ForeignRoutes, HandedBytes};
use thread::{Shared, WorkerContext, WAKE};

use super::{KcmRoute, Node};
use crate::cm::KcmInput;
use crate::ipoib::{FollowerRequest, Interface, NeighView};
use crate::mad::{Mad, MadTransport};
use crate::verbs::Provider;
use crate::wire::{WorkerCount, WorkerId};

/// A gap this long between two of control's checks is a pause of the whole process (SIGSTOP,
/// a frozen cgroup, a debugger, a migrated VM), not of one worker: control itself turns at
/// least every second. Each worker's stall is measured from the end of such a pause.
pub const PAUSE_GAP: Duration = Duration::from_secs(3);

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
