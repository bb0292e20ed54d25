//! The CM MADs of a multi-worker interface: one transport (control's) carries every worker's.
//!
//! Control's transport is wrapped in a [`RoutedMads`]: what it receives goes to the worker
//! [`mad_owner`] names (control's own endpoint, or a worker's queue), and what the workers
//! queued leaves through it. A follower's transport is a [`WorkerMads`]: its two queues to and
//! from control.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use super::mailbox::Mailbox;
use crate::cm::mad_owner;
use crate::mad::{Mad, MadSendError, MadStats, MadTransport};
use crate::verbs::{QpNum, Verbs};
use crate::wire::cm::MAD_LEN;
use crate::wire::{Gid, WorkerCount};

/// MADs moved between control and the workers per turn, each way (the queues hold as many).
pub const MAD_BATCH: usize = 256;

/// A follower's CM transport: MADs to and from control's [`RoutedMads`].
#[derive(Debug)]
pub struct WorkerMads {
    inbox: Receiver<Mad>,
    outbox: Mailbox<Mad>,
    stats: MadStats,
    more: bool,
}

impl WorkerMads {
    /// The transport over `inbox` (filled by control) and `outbox` (to control).
    pub fn new(inbox: Receiver<Mad>, outbox: Mailbox<Mad>) -> Self {
        Self {
            inbox,
            outbox,
            stats: MadStats::default(),
            more: false,
        }
    }
}

impl<V: Verbs> MadTransport<V> for WorkerMads {
    fn can_send(&self) -> bool {
        true
    }

    fn send(&mut self, _v: &mut V, to: Gid, mad: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
        if self.outbox.post((to, *mad)) {
            self.stats.sent += 1;
        } else {
            // The CM sends it again.
            self.stats.send_dropped += 1;
        }
        Ok(())
    }

    fn poll(&mut self, _v: &mut V, out: &mut Vec<Mad>) {
        self.more = false;
        for _ in 0..MAD_BATCH {
            match self.inbox.try_recv() {
                Ok(m) => {
                    self.stats.received += 1;
                    out.push(m);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
        self.more = true;
    }

    fn stats(&self) -> MadStats {
        self.stats
    }

    fn provider_qp(&self) -> Option<QpNum> {
        None
    }

    fn has_more(&self) -> bool {
        self.more
    }
}

/// What [`RoutedMads`] counted of the workers' MADs (shared with whoever reports them).
#[derive(Debug, Default)]
pub struct RouteCounters {
    to_workers: AtomicU64,
    to_workers_dropped: AtomicU64,
    from_workers: AtomicU64,
    from_workers_dropped: AtomicU64,
}

/// [`RouteCounters`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteStats {
    /// MADs received for another worker and handed to it.
    pub to_workers: u64,
    /// MADs for another worker dropped: its queue was full (the sender's CM sends again).
    pub to_workers_dropped: u64,
    /// The workers' MADs sent through this transport.
    pub from_workers: u64,
    /// The workers' MADs dropped: the transport had no room (their CM sends again).
    pub from_workers_dropped: u64,
}

impl RouteCounters {
    /// The counts now.
    pub fn read(&self) -> RouteStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RouteStats {
            to_workers: get(&self.to_workers),
            to_workers_dropped: get(&self.to_workers_dropped),
            from_workers: get(&self.from_workers),
            from_workers_dropped: get(&self.from_workers_dropped),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Control's CM transport with the workers' MADs routed through it.
pub struct RoutedMads<V: Verbs> {
    inner: Box<dyn MadTransport<V>>,
    count: WorkerCount,
    /// Worker `i`'s queue at `i - 1` (worker 0 is control itself).
    to_workers: Vec<Mailbox<Mad>>,
    from_workers: Receiver<Mad>,
    scratch: Vec<Mad>,
    stats: Arc<RouteCounters>,
    more: bool,
}

impl<V: Verbs> std::fmt::Debug for RoutedMads<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedMads")
            .field("count", &self.count)
            .field("stats", &self.stats.read())
            .finish_non_exhaustive()
    }
}

impl<V: Verbs> RoutedMads<V> {
    /// `inner` carrying the MADs of `count` workers: `to_workers[i - 1]` is worker `i`'s
    /// queue, `from_workers` what they send.
    pub fn new(
        inner: Box<dyn MadTransport<V>>,
        count: WorkerCount,
        to_workers: Vec<Mailbox<Mad>>,
        from_workers: Receiver<Mad>,
    ) -> Self {
        Self {
            inner,
            count,
            to_workers,
            from_workers,
            scratch: Vec::new(),
            stats: Arc::default(),
            more: false,
        }
    }

    /// Its counters, to read from elsewhere.
    pub fn counters(&self) -> Arc<RouteCounters> {
        Arc::clone(&self.stats)
    }

    /// Sends what the workers queued, while the transport has room.
    fn send_workers(&mut self, v: &mut V) {
        for _ in 0..MAD_BATCH {
            let Ok((to, mad)) = self.from_workers.try_recv() else {
                return;
            };
            if self.inner.can_send() && self.inner.send(v, to, &mad).is_ok() {
                bump(&self.stats.from_workers);
            } else {
                bump(&self.stats.from_workers_dropped);
            }
        }
        self.more = true;
    }
}

impl<V: Verbs> MadTransport<V> for RoutedMads<V> {
    fn can_send(&self) -> bool {
        self.inner.can_send()
    }

    fn send(&mut self, v: &mut V, to: Gid, mad: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
        self.inner.send(v, to, mad)
    }

    fn poll(&mut self, v: &mut V, out: &mut Vec<Mad>) {
        self.more = false;
        self.scratch.clear();
        self.inner.poll(v, &mut self.scratch);
        for (from, mad) in self.scratch.drain(..) {
            match usize::from(mad_owner(&mad, self.count)).checked_sub(1) {
                None => out.push((from, mad)),
                Some(i) => match self.to_workers.get(i) {
                    Some(w) if w.post((from, mad)) => bump(&self.stats.to_workers),
                    _ => bump(&self.stats.to_workers_dropped),
                },
            }
        }
        self.send_workers(v);
    }

    fn stats(&self) -> MadStats {
        self.inner.stats()
    }

    fn provider_qp(&self) -> Option<QpNum> {
        self.inner.provider_qp()
    }

    fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.readiness_fd()
    }

    fn set_peer_lid(&mut self, gid: Gid, lid: u16) {
        self.inner.set_peer_lid(gid, lid);
    }

    fn has_more(&self) -> bool {
        self.more || self.inner.has_more()
    }

    fn device_gone(&self) -> bool {
        self.inner.device_gone()
    }
}
