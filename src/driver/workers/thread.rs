//! A worker's thread: its own mio loop around its follower node, fed by control through
//! bounded queues, publishing its heartbeat and report.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use super::error::WorkerError;
use super::handover::{ForeignRoutes, HandedBytes};
use super::mads::{WorkerMads, MAD_BATCH};
use super::mailbox::{Mailbox, Wake};
use super::messages::{FromWorker, ReportFn, SettingsFn, ToWorker, WorkerSpec, TO_WORKER_CAP};
use crate::cm::KcmInput;
use crate::driver::Node;
use crate::ipoib::{FollowerRequest, Interface, TO_CONTROL_MAX};
use crate::verbs::Provider;

/// How often a worker publishes its figures.
pub const REPORT_INTERVAL: Duration = Duration::from_millis(250);

/// How often a worker tells control which neighbours it sent to.
pub const USED_INTERVAL: Duration = Duration::from_secs(1);

/// A worker loop's longest sleep.
pub(super) const IDLE_WAKE: Duration = Duration::from_secs(1);

/// The token of a worker loop's wake-up; its node's tokens follow.
pub(super) const WAKE: Token = Token(0);

/// What a worker publishes for control to read.
#[derive(Debug)]
pub(super) struct Shared<R> {
    pub(super) report: Mutex<Option<R>>,
    /// Milliseconds since the workers started at its last turn.
    pub(super) heartbeat_ms: AtomicU64,
    /// Datagrams it received for other workers and dropped: their queues were full.
    pub(super) foreign_dropped: AtomicU64,
    /// Packets it had for control to send and dropped: [`HANDED_BYTES_MAX`] were queued.
    pub(super) handed_dropped: AtomicU64,
}

/// What a worker's thread owns besides its spec.
pub(super) struct WorkerContext<P: Provider, R> {
    pub(super) poll: Poll,
    pub(super) wake: Arc<Wake>,
    pub(super) inbox: Receiver<ToWorker<P>>,
    pub(super) mads: WorkerMads,
    /// What control's event channel read for this worker's kernel CM ids.
    pub(super) kcm_in: Receiver<KcmInput>,
    pub(super) foreign: ForeignRoutes,
    pub(super) asks: Mailbox<FromWorker>,
    pub(super) handed: Arc<HandedBytes>,
    pub(super) shared: Arc<Shared<R>>,
    pub(super) report: ReportFn<P, R>,
    pub(super) settings: SettingsFn<P>,
    pub(super) interface: Interface,
    pub(super) started: Instant,
}

impl<P: Provider, R> WorkerContext<P, R> {
    /// The worker's thread: its loop until its shutdown is over.
    pub(super) fn run(mut self, spec: WorkerSpec<P>) -> Result<(), WorkerError> {
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
