//! The CM MADs of a multi-worker interface: one transport (control's) carries every worker's.
//!
//! Control's transport is wrapped in a [`RoutedMads`]: what it receives goes to the worker
//! [`mad_owner`] names (control's own endpoint, or a worker's queue), and what the workers
//! queued leaves through it. A follower's transport is a [`WorkerMads`]: its two queues to and
//! from control.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// The workers' MADs queued for control and not yet taken by its [`RoutedMads`], against the
/// queue's room: a worker's transport has room while some is left ([`MadTransport::can_send`]),
/// so a full queue holds MADs in the worker's CM (sent on a later turn) instead of dropping
/// them.
#[derive(Debug)]
pub struct Outbox {
    queued: AtomicUsize,
    room: usize,
}

impl Outbox {
    /// A queue that holds `room` MADs.
    pub fn new(room: usize) -> Arc<Self> {
        Arc::new(Self {
            queued: AtomicUsize::new(0),
            room,
        })
    }

    fn has_room(&self) -> bool {
        self.queued.load(Ordering::Acquire) < self.room
    }
}

/// A follower's CM transport: MADs to and from control's [`RoutedMads`].
#[derive(Debug)]
pub struct WorkerMads {
    inbox: Receiver<RoutedMad>,
    outbox: Mailbox<Mad>,
    queued: Arc<Outbox>,
    stats: MadStats,
    more: bool,
    /// The route each peer's last MAD came by, at most [`MAX_PEER_LIDS`] (as control's QP1
    /// knows peers by LID; the lowest GID goes first when more come).
    routes: BTreeMap<Gid, MadRoute>,
}

impl WorkerMads {
    /// The transport over `inbox` (filled by control) and `outbox` (to control, which
    /// `queued` counts).
    pub fn new(inbox: Receiver<RoutedMad>, outbox: Mailbox<Mad>, queued: Arc<Outbox>) -> Self {
        Self {
            inbox,
            outbox,
            queued,
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
        self.queued.has_room()
    }

    fn send(&mut self, _v: &mut V, to: Gid, mad: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
        // Counted before it is queued: control may take it at once.
        self.queued.queued.fetch_add(1, Ordering::AcqRel);
        if self.outbox.post((to, *mad)) {
            self.stats.sent += 1;
        } else {
            // Another worker took the last room since `can_send`: the CM sends it again.
            self.queued.queued.fetch_sub(1, Ordering::AcqRel);
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
    queued: Arc<Outbox>,
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
        queued: Arc<Outbox>,
    ) -> Self {
        Self {
            inner,
            count,
            to_workers,
            from_workers,
            queued,
            scratch: Vec::new(),
            stats: Arc::default(),
            more: false,
        }
    }

    /// Its counters, to read from elsewhere.
    pub fn counters(&self) -> Arc<RouteCounters> {
        Arc::clone(&self.stats)
    }

    /// Sends what the workers queued while the transport has room; the rest waits in the
    /// queue (whose room the workers' transports see: their CMs hold what does not fit).
    fn send_workers(&mut self, v: &mut V) {
        for _ in 0..MAD_BATCH {
            if !self.inner.can_send() {
                // The next turn follows at once: the transport's room comes back as its sends
                // complete.
                self.more = true;
                return;
            }
            let Ok((to, mad)) = self.from_workers.try_recv() else {
                return;
            };
            self.queued.queued.fetch_sub(1, Ordering::AcqRel);
            if self.inner.send(v, to, &mad).is_ok() {
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

    /// Control's QP1 as the test plays it: it received `inbox`, knows every peer at LID 7,
    /// and has room for `room` more sends.
    struct Qp1 {
        inbox: Vec<Mad>,
        room: Arc<AtomicUsize>,
    }

    impl<V: Verbs> MadTransport<V> for Qp1 {
        fn can_send(&self) -> bool {
            self.room.load(Ordering::Relaxed) > 0
        }
        fn send(&mut self, _: &mut V, _: Gid, _: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
            self.room.fetch_sub(1, Ordering::Relaxed);
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
            room: Arc::new(AtomicUsize::new(64)),
        };
        let two = WorkerCount::new(2).unwrap();
        let queued = Outbox::new(MAD_BATCH);
        let mut routed = RoutedMads::new(
            Box::new(qp1),
            two,
            vec![to_w1],
            from_w_rx,
            Arc::clone(&queued),
        );
        let mut v = SoftVerbs::new(SoftConfig::new(std::net::IpAddr::from([198, 18, 0, 1])));
        let mut control = Vec::new();
        crate::mad::receive(&mut routed, &mut v, &mut control, |from, r, _| {
            assert_eq!((from, r), (peer, Some(route())), "control's own");
        });
        let mut w1 = WorkerMads::new(w1_in, from_w, queued);
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

    /// While control's transport has no room, the workers' MADs wait in their queue and the
    /// workers' transports say they have none (their CMs hold the rest): nothing is dropped;
    /// as room comes back the queue drains in order.
    #[test]
    fn a_full_transport_holds_the_workers_mads_back() {
        let poll = mio::Poll::new().unwrap();
        let wake = Wake::new(poll.registry(), mio::Token(0)).unwrap();
        let (_to_w1, w1_in) = mailbox::<RoutedMad>(MAD_BATCH, &wake);
        let (from_w, from_w_rx) = mailbox::<Mad>(4, &wake);
        let room = Arc::new(AtomicUsize::new(0));
        let qp1 = Qp1 {
            inbox: Vec::new(),
            room: Arc::clone(&room),
        };
        let queued = Outbox::new(4);
        let two = WorkerCount::new(2).unwrap();
        let mut routed = RoutedMads::new(
            Box::new(qp1),
            two,
            Vec::new(),
            from_w_rx,
            Arc::clone(&queued),
        );
        let mut w1 = WorkerMads::new(w1_in, from_w, queued);
        let mut v = SoftVerbs::new(SoftConfig::new(std::net::IpAddr::from([198, 18, 0, 1])));
        let peer = Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2));
        let mut pending: Vec<Mad> = (0..6).map(|i| (peer, req_from_qpn(2 * i + 1))).collect();
        pending.reverse();
        crate::mad::send_while_room(&mut w1, &mut v, || pending.pop());
        assert_eq!(pending.len(), 2, "four fit the queue; the CM keeps two");
        assert!(!MadTransport::<SoftVerbs>::can_send(&w1));
        let mut out = Vec::new();
        MadTransport::poll(&mut routed, &mut v, &mut out);
        assert!(
            MadTransport::<SoftVerbs>::has_more(&routed),
            "waits for room"
        );
        assert_eq!(
            routed.counters().read(),
            RouteStats::default(),
            "nothing sent or dropped"
        );
        room.store(3, Ordering::Relaxed);
        MadTransport::poll(&mut routed, &mut v, &mut out);
        let stats = routed.counters().read();
        assert_eq!((stats.from_workers, stats.from_workers_dropped), (3, 0));
        assert!(MadTransport::<SoftVerbs>::can_send(&w1), "room again");
        crate::mad::send_while_room(&mut w1, &mut v, || pending.pop());
        assert!(pending.is_empty());
        assert_eq!(MadTransport::<SoftVerbs>::stats(&w1).send_dropped, 0);
    }
}
