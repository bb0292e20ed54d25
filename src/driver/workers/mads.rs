//! The CM MADs of a multi-worker interface: one transport (control's) carries every worker's.
//!
//! Control's transport is wrapped in a [`RoutedMads`]: what it receives goes to the worker
//! [`mad_owner`] names (control's own endpoint, or a worker's queue), and what the workers
//! queued leaves through it. A follower's transport is a [`WorkerMads`]: its two queues to and
//! from control.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use std::collections::BTreeMap;

use super::mailbox::Mailbox;
use crate::cm::{mad_owner, MadRoute};
use crate::mad::{Mad, MadSendError, MadStats, MadTransport, MAX_PEER_LIDS};
use crate::verbs::{QpNum, Verbs};
use crate::wire::cm::MAD_LEN;
use crate::wire::{Gid, WorkerCount};

/// MADs moved between control and the workers per turn, each way (the queues hold as many).
pub const MAD_BATCH: usize = 256;

/// A MAD control received for a worker, with how its sender reaches the port (control's
/// transport's [`MadTransport::route_of`]: on InfiniBand, its LID), which a passive side's
/// path is made of.
pub type RoutedMad = (Mad, Option<MadRoute>);

/// A follower's CM transport: MADs to and from control's [`RoutedMads`].
#[derive(Debug)]
pub struct WorkerMads {
    inbox: Receiver<RoutedMad>,
    outbox: Mailbox<Mad>,
    stats: MadStats,
    more: bool,
    /// The route each peer's last MAD came by, at most [`MAX_PEER_LIDS`] (as control's QP1
    /// knows peers by LID; the lowest GID goes first when more come).
    routes: BTreeMap<Gid, MadRoute>,
}

impl WorkerMads {
    /// The transport over `inbox` (filled by control) and `outbox` (to control).
    pub fn new(inbox: Receiver<RoutedMad>, outbox: Mailbox<Mad>) -> Self {
        Self {
            inbox,
            outbox,
            stats: MadStats::default(),
            more: false,
            routes: BTreeMap::new(),
        }
    }

    fn note_route(&mut self, from: Gid, route: Option<MadRoute>) {
        let Some(r) = route else {
            return;
        };
        if !self.routes.contains_key(&from) && self.routes.len() >= MAX_PEER_LIDS {
            self.routes.pop_first();
        }
        self.routes.insert(from, r);
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
                Ok(((from, mad), route)) => {
                    self.stats.received += 1;
                    self.note_route(from, route);
                    out.push((from, mad));
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

    fn route_of(&self, from: Gid) -> Option<MadRoute> {
        self.routes.get(&from).copied()
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
    to_workers: Vec<Mailbox<RoutedMad>>,
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
        to_workers: Vec<Mailbox<RoutedMad>>,
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
                    Some(w) if w.post(((from, mad), self.inner.route_of(from))) => {
                        bump(&self.stats.to_workers);
                    }
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

    fn route_of(&self, from: Gid) -> Option<MadRoute> {
        self.inner.route_of(from)
    }

    fn has_more(&self) -> bool {
        self.more || self.inner.has_more()
    }

    fn device_gone(&self) -> bool {
        self.inner.device_gone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::workers::mailbox::{mailbox, Wake};
    use crate::soft::{SoftConfig, SoftVerbs};
    use crate::verbs::{Lid, Sl};
    use crate::wire::cm::{CmMad, CmMessage, Req};

    /// Control's QP1 as the test plays it: it received `inbox`, and knows every peer at LID 7.
    struct Qp1 {
        inbox: Vec<Mad>,
    }

    impl<V: Verbs> MadTransport<V> for Qp1 {
        fn can_send(&self) -> bool {
            true
        }
        fn send(&mut self, _: &mut V, _: Gid, _: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
            Ok(())
        }
        fn poll(&mut self, _: &mut V, out: &mut Vec<Mad>) {
            out.append(&mut self.inbox);
        }
        fn stats(&self) -> MadStats {
            MadStats::default()
        }
        fn provider_qp(&self) -> Option<QpNum> {
            None
        }
        fn route_of(&self, _: Gid) -> Option<MadRoute> {
            Some(route())
        }
    }

    fn route() -> MadRoute {
        MadRoute {
            slid: Lid(7),
            sl: Sl::ZERO,
            dlid_path_bits: 0,
            grh: false,
        }
    }

    fn req_from_qpn(qpn: u32) -> [u8; MAD_LEN] {
        CmMad::new(
            1,
            CmMessage::Req(Req {
                local_qpn: QpNum::new(qpn),
                ..Req::default()
            }),
        )
        .emit()
    }

    /// A REQ for worker 1 reaches it with the route control's QP1 knows for its sender (on
    /// InfiniBand the passive side's path is made of it); one for control stays, and control
    /// asks its QP1 for the route as before.
    #[test]
    fn a_workers_mads_carry_their_senders_route() {
        let poll = mio::Poll::new().unwrap();
        let wake = Wake::new(poll.registry(), mio::Token(0)).unwrap();
        let (to_w1, w1_in) = mailbox::<RoutedMad>(MAD_BATCH, &wake);
        let (from_w, from_w_rx) = mailbox::<Mad>(MAD_BATCH, &wake);
        let peer = Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2));
        let qp1 = Qp1 {
            inbox: vec![(peer, req_from_qpn(0x13)), (peer, req_from_qpn(0x12))],
        };
        let two = WorkerCount::new(2).unwrap();
        let mut routed = RoutedMads::new(Box::new(qp1), two, vec![to_w1], from_w_rx);
        let mut v = SoftVerbs::new(SoftConfig::new(std::net::IpAddr::from([198, 18, 0, 1])));
        let mut control = Vec::new();
        crate::mad::receive(&mut routed, &mut v, &mut control, |from, r, _| {
            assert_eq!((from, r), (peer, Some(route())), "control's own");
        });
        let mut w1 = WorkerMads::new(w1_in, from_w);
        let mut got = Vec::new();
        crate::mad::receive(&mut w1, &mut v, &mut got, |from, r, mad| {
            assert_eq!((from, r), (peer, Some(route())), "worker 1's");
            assert_eq!(mad, &req_from_qpn(0x13));
        });
        assert_eq!(MadTransport::<SoftVerbs>::stats(&w1).received, 1);
        assert_eq!(routed.counters().read().to_workers, 1);
        // A peer it never heard from has no route.
        let other = Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 3));
        assert_eq!(MadTransport::<SoftVerbs>::route_of(&w1, other), None);
    }
}
