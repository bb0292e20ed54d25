//! The coordinator: the [`Endpoint`] composes the parts that own their state (the RX and TX
//! tables, the neighbour cache, the TUN queue, the UD QP, the CM and the timer wheel) and
//! dispatches the driver's calls, the CM's events and the timers to them.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::event::{EventQueue, TxCloseReason, TxFailure};
use super::guard::AnswerBudget;
use super::mcast::{PortChange, SaGroups};
use super::neigh::Neighbours;
use super::rx::{self, RxTable};
use super::tun::TunQueue;
use super::tx::TxTable;
use super::ud::{self, UdQp};
use super::{
    wr, Counters, EndpointConfig, Owner, PoolBytes, QpEnd, Snapshot, Timer, TxSnapshot, CQ_BATCH,
    WR_RECV,
};
use crate::cm::{Cm, CmConfig, CmEvent, CommId, ConnectionManager, KcmCommand, KcmInput, KernelCm};
use crate::timer::{TimerId, TimerWheel};
use crate::verbs::{
    AsyncEvent, BufId, Completion, CqId, Moved, PathMtu, PdId, PoolId, QpNum, SrqId, SrqInit,
    Verbs, VerbsError, WrId,
};
use crate::wire::cm::{ipoib_service_id, IpoibCmData, RejReason, MAD_LEN};
use crate::wire::ipoib::{HwAddr, IPOIB_CM_BUF_SIZE};
use crate::wire::{Gid, IdMap, PeerMap};

/// The IPoIB-CM endpoint. See the [module documentation](super).
#[derive(Debug)]
pub struct Endpoint {
    pub(super) cfg: EndpointConfig,
    /// The index of [`EndpointConfig::pkey`] in the port's P_Key table, for every QP.
    pub(super) pkey_index: u16,
    /// The protection domain of every QP, pool and SRQ of the endpoint.
    pub(super) pd: PdId,
    /// The UD QP (ARP, ND, multicast, datagram mode): control's; `None` on a follower.
    pub(super) ud: Option<UdQp>,
    /// The CM: ours (its MADs travel over the driver's transport) or the kernel's (its
    /// commands are the driver's to execute).
    pub(super) cm: ConnectionManager,
    pub(super) hwaddr: HwAddr,
    /// Our CA GUID (control's, on a follower): in every REQ and REP.
    pub(super) ca_guid: u64,
    /// The shared receive queue of every RX connection (SRQ mode).
    pub(super) srq: Option<SrqId>,
    /// The completion queue of every RX connection.
    pub(super) rx_cq: CqId,
    /// The receive buffers of the SRQ or of the per-connection rings.
    pub(super) rx_pool: PoolId,
    /// The completion queue of every TX connection.
    pub(super) tx_cq: CqId,
    /// The send buffers (their free list is the TX table's).
    pub(super) tx_pool: PoolId,
    /// The neighbour cache: resolution and ageing state per IP address.
    pub(super) neigh: Neighbours,
    /// The paths set for neighbours' ports ([`Endpoint::set_path`]) and the LIDs they name.
    pub(super) paths: super::paths::Paths,
    /// The active connections and the send buffers they share.
    pub(super) tx: TxTable,
    /// The passive connections and the reaper's drain WR.
    pub(super) rx: RxTable,
    /// Which connection each CM id belongs to (kept until the CM forgets the id).
    pub(super) owners: IdMap<CommId, Owner>,
    /// Every deadline of the endpoint (the CM keeps its own).
    pub(super) wheel: TimerWheel<Timer>,
    /// Packets for the TUN device.
    pub(super) tun: TunQueue,
    /// The counters every part adds to.
    pub(super) counters: Counters,
    rng: ChaCha8Rng,
    /// `begin_shutdown` was called: no new connections.
    pub(super) stopping: bool,
    /// The latest `now` handed in (what `poll_timeout` answers when work is pending).
    pub(super) last_now: Instant,
    /// Scratch for completions, shared by the CQ polls.
    pub(super) wcs: Vec<Completion>,
    /// RC packets of the RX completions being handled, waiting for the spare buffers that
    /// take their places on the SRQ (posted as one chain) before they go to the TUN queue:
    /// buffer, IP length. At most [`CQ_BATCH`].
    pub(super) rx_up: Vec<(BufId, usize)>,
    /// The receive WRs of one chain being built (at most [`CQ_BATCH`]).
    pub(super) rx_chain: Vec<(WrId, BufId)>,
    /// Scratch for fired timers.
    fired: Vec<(TimerId, Timer)>,
    /// CM events taken from the CM and not acted on yet, oldest first: those behind the
    /// [`SETUPS_PER_PUMP`]th connection set-up of one pump wait for the next. Bounded by what
    /// the CM's own tables allow it to raise; trimmed to [`crate::cm::QUEUE_KEEP`] when empty.
    cm_events: VecDeque<CmEvent>,
    /// Connection events for the driver ([`Endpoint::poll_event`]).
    pub(super) events: EventQueue,
    /// The `--peer`s' GIDs ([`EndpointConfig::peers`], [`Endpoint::set_peers`]).
    pub(super) peers: PeerMap<Gid, ()>,
    /// Per-sender budgets of ARP/ND answers.
    pub(super) answers: AnswerBudget,
    /// Groups and paths held through an SA client (inert without one).
    pub(super) sa: SaGroups,
    /// Device events for the driver ([`Endpoint::take_device_event`]), at most
    /// [`DEVICE_EVENT_CAP`].
    device_events: Vec<AsyncEvent>,
    /// An event lost the device context ([`AsyncEvent::loses_context`]): the endpoint touches
    /// the verbs no more; the driver reopens the device and builds a new endpoint.
    context_lost: bool,
    /// A follower's part (a worker other than 0 of a multi-worker interface): `None` on
    /// control (or the one worker of an interface).
    pub(super) follower: Option<Box<super::follower::Follower>>,
}

/// Most device events held for the driver; more are dropped (the driver reads them every
/// turn, and after a context-losing one the endpoint reads no more).
const DEVICE_EVENT_CAP: usize = 16;

impl EndpointConfig {
    /// The bytes of the buffer pools [`Endpoint::new`] creates, on a port whose largest MTU
    /// is `port_max`: every buffer a packet can fill, whatever the traffic.
    pub fn pool_bytes(&self, port_max: PathMtu) -> PoolBytes {
        let cm_buf = IPOIB_CM_BUF_SIZE as usize;
        PoolBytes {
            rx: self.rx_pool_buffers() * cm_buf,
            tx: self.tx_depth as usize * cm_buf,
            ud: self.ud_pool_buffers() * ud::ud_buf_len(port_max.max(self.path_mtu)),
        }
    }
}

impl Endpoint {
    /// Sets up the interface on `v`: UD QP attached to its multicast groups (the broadcast
    /// group, and all-nodes and solicited-node groups for IPv6 addresses), the CM listening
    /// on both IPoIB-CM service IDs and on the rdma_cm service
    /// ([`EndpointConfig::rdma_cm_port`]), the SRQ (or the pool for per-QP rings), and the send
    /// buffers.
    ///
    /// `cm_qp` is the QP the driver's CM MAD transport holds on `v`
    /// ([`MadTransport::provider_qp`](crate::mad::MadTransport::provider_qp): QP1, or `None`
    /// for a transport beside the provider); it counts in `qp_created` with the endpoint's
    /// own QPs, so that `qp_created - qp_destroyed` is every QP of the interface.
    ///
    /// # Errors
    /// Any verbs error of the set-up.
    pub fn new<V: Verbs>(
        now: Instant,
        v: &mut V,
        cfg: EndpointConfig,
        cm_qp: Option<QpNum>,
    ) -> Result<Self, VerbsError> {
        Self::build(now, v, cfg, cm_qp, None)
    }

    /// Sets up a follower (`cfg.worker` a worker other than 0, see module `worker`) of the
    /// interface whose hardware address and CA GUID `interface` are (control's): its CM
    /// listens on that address's service IDs and names that CA GUID, and it sends nothing of its own over its UD QP (no groups, no
    /// announcements, no resolution: control does those). Its CM's MADs travel through
    /// control's transport.
    ///
    /// # Errors
    /// Any verbs error of the set-up.
    pub fn new_follower<V: Verbs>(
        now: Instant,
        v: &mut V,
        cfg: EndpointConfig,
        interface: super::Interface,
    ) -> Result<Self, VerbsError> {
        Self::build(now, v, cfg, None, Some(interface))
    }

    fn build<V: Verbs>(
        now: Instant,
        v: &mut V,
        cfg: EndpointConfig,
        cm_qp: Option<QpNum>,
        follows: Option<super::Interface>,
    ) -> Result<Self, VerbsError> {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let mut counters = Counters::default();
        let pkey_index = v.pkey_index(cfg.pkey)?;
        let pd = v.alloc_pd()?;
        // A follower speaks with control's hardware address and hands it every datagram
        // send: it has no UD QP of its own.
        let port = v.port_attr();
        let (ud, hwaddr) = match follows {
            Some(i) => (None, i.hwaddr),
            None => {
                let ud = ud::open_ud(v, pd, &cfg, pkey_index)?;
                let hwaddr = HwAddr::new(cfg.hwaddr_flags(), ud.qp, port.gid);
                (Some(ud), hwaddr)
            }
        };
        counters.qp_created += u64::from(ud.is_some()) + u64::from(cm_qp.is_some());
        let own_guid = rng.gen::<u64>() | 1;
        let ca_guid = follows.map_or(own_guid, |i| i.ca_guid);
        let mut cm_cfg = CmConfig::new(port.gid, ca_guid);
        cm_cfg.comm_id_seed = rng.gen();
        cm_cfg.comm_id_slot = cfg.worker;
        cm_cfg.cm_response_timeout = cfg.cm_response_timeout;
        cm_cfg.pkey = cfg.mgid_pkey();
        let cm = match cfg.kernel_cm {
            Some(k) => ConnectionManager::Kernel(
                KernelCm::new(k.max_ids, k.service_id, k.link, cfg.mgid_pkey(), rng.gen())
                    .with_worker(cfg.worker),
            ),
            None => {
                let mut cm = Cm::new(cm_cfg);
                // Linux uses 0x1000…|QPN; RFC 4755 says 0x0100…|QPN. Accept both.
                if cfg.listen_ipoib_service {
                    cm.listen(ipoib_service_id(hwaddr.qpn, true), u64::MAX);
                    cm.listen(ipoib_service_id(hwaddr.qpn, false), u64::MAX);
                }
                // And rdma_cm's, where peers on the kernel's CM connect (`cma_hdr` framing).
                cm.listen(cfg.rdma_cm_service_id(), u64::MAX);
                ConnectionManager::Ours(cm)
            }
        };
        let buf_len = IPOIB_CM_BUF_SIZE as usize;
        // Room for every completion that can be waiting at once: one per receive buffer in
        // circulation (the SRQ's, or every ring's) and one per RX QP for its drain WR.
        let rx_qps = (cfg.max_conn_qp + cfg.max_pending_rx) as u32;
        let recv_bufs = if cfg.srq {
            cfg.srq_depth
        } else {
            cfg.nonsrq_ring * rx_qps
        };
        let rx_cq = v.create_cq(recv_bufs + rx_qps + 16)?;
        let tx_cq = v.create_cq(cfg.tx_depth + 16)?;
        let (srq, rx_pool) = if cfg.srq {
            // The SRQ's buffers and the spares that take the place of those whose packets
            // wait for the TUN device.
            let pool = v.create_pool(pd, buf_len, cfg.rx_pool_buffers())?;
            let srq = v.create_srq(&SrqInit {
                pd,
                max_wr: cfg.srq_depth,
                limit: super::srq_limit(cfg.srq_depth),
            })?;
            // Filled in chains of CQ_BATCH receives, one doorbell each.
            let mut chain = Vec::with_capacity(CQ_BATCH);
            let mut left = cfg.srq_depth as usize;
            while left > 0 {
                chain.clear();
                for _ in 0..left.min(CQ_BATCH) {
                    let b = v
                        .pools_mut()
                        .alloc(pool)
                        .ok_or(VerbsError::OutOfResources("SRQ buffers"))?;
                    chain.push((wr(WR_RECV), b));
                }
                if v.post_srq_recvs(srq, &chain)? < chain.len() {
                    return Err(VerbsError::OutOfResources("SRQ receives"));
                }
                left -= chain.len();
            }
            (Some(srq), pool)
        } else {
            // One ring per connection, established or half-open, plus one for a connection
            // being evicted, and the spares that take the places of those buffers whose
            // packets wait for the TUN device.
            (None, v.create_pool(pd, buf_len, cfg.rx_pool_buffers())?)
        };
        let tx_pool = v.create_pool(pd, buf_len, cfg.tx_depth as usize)?;
        let mut tx_free = Vec::with_capacity(cfg.tx_depth as usize);
        for _ in 0..cfg.tx_depth {
            tx_free.push(
                v.pools_mut()
                    .alloc(tx_pool)
                    .ok_or(VerbsError::OutOfResources("TX buffers"))?,
            );
        }
        let mut neigh = Neighbours::new(cfg.neigh_max, cfg.neigh_max_per_source);
        for (ip, hw) in &cfg.static_neighbours {
            neigh.add_static(*ip, *hw, now);
        }
        if cfg.pin_peer_neighbours {
            neigh.set_pinned(&cfg.peers);
        }
        let peers = cfg.peers.iter().map(|g| (*g, ())).collect();
        let answers = AnswerBudget::new(cfg.seed ^ 0x0061_6e73_7765_7273);
        let mut ep = Self {
            pkey_index,
            pd,
            ud,
            cm,
            hwaddr,
            ca_guid,
            srq,
            rx_cq,
            rx_pool,
            tx_cq,
            tx_pool,
            neigh,
            paths: super::paths::Paths::new(cfg.neigh_max),
            tx: TxTable::new(tx_free),
            rx: RxTable::default(),
            owners: IdMap::default(),
            wheel: TimerWheel::new(now, Duration::from_millis(1)),
            tun: TunQueue::default(),
            counters,
            rng,
            stopping: false,
            last_now: now,
            wcs: Vec::with_capacity(CQ_BATCH),
            rx_up: Vec::with_capacity(CQ_BATCH),
            rx_chain: Vec::with_capacity(CQ_BATCH),
            fired: Vec::new(),
            cm_events: VecDeque::new(),
            events: EventQueue::default(),
            sa: SaGroups::default(),
            device_events: Vec::new(),
            context_lost: false,
            follower: follows.map(|_| Box::new(super::follower::Follower::new(cfg.neigh_max))),
            peers,
            answers,
            cfg,
        };
        if ep.follower.is_none() {
            ep.announce(v);
        }
        Ok(ep)
    }

    /// Our 20-byte hardware address (flags, UD QPN, GID).
    pub fn hwaddr(&self) -> HwAddr {
        self.hwaddr
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// The `--peer`s' GIDs from now on: senders the node knows, and with
    /// [`EndpointConfig::pin_peer_neighbours`] the sources whose bindings are pinned.
    pub fn set_peers(&mut self, peers: &[Gid]) {
        self.peers = peers.iter().map(|g| (*g, ())).collect();
        if self.cfg.pin_peer_neighbours {
            self.neigh.set_pinned(peers);
        }
        self.cfg.peers = peers.to_vec();
    }

    /// Counts this endpoint's RX connections into `share`, which every worker of the
    /// interface shares: `max_conn_qp` and `max_pending_rx` then bound them all together
    /// (each worker evicts or rejects among its own). Call it before the first REQ.
    pub fn share_rx_budget(&mut self, share: std::sync::Arc<super::InterfaceRxCounts>) {
        self.rx.share_budget(share);
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Continues the counters of `old`, the endpoint this one replaces on a reopened device:
    /// the old one's QPs went with its device context (counted destroyed), this one's are
    /// added.
    pub fn carry_counters(&mut self, old: Counters) {
        let mine = self.counters;
        self.counters = old;
        self.counters.qp_destroyed = old.qp_created + mine.qp_destroyed;
        self.counters.qp_created += mine.qp_created;
    }

    /// The next device event the driver acts on: one that lost the device context
    /// ([`AsyncEvent::loses_context`]), [`AsyncEvent::GidChange`], or
    /// [`AsyncEvent::PortActive`] (the port's MTU may have changed).
    pub fn take_device_event(&mut self) -> Option<AsyncEvent> {
        (!self.device_events.is_empty()).then(|| self.device_events.remove(0))
    }

    /// An event lost the device context: the endpoint no longer touches the verbs.
    pub fn context_lost(&self) -> bool {
        self.context_lost
    }

    /// The CM's counters.
    pub fn cm_stats(&self) -> crate::cm::CmStats {
        self.cm.stats()
    }

    /// Hands the CM a MAD that the driver's transport received from `from`. Call it before
    /// [`handle_verbs`](Self::handle_verbs) on the same turn, which acts on what it brought.
    pub fn handle_mad(&mut self, now: Instant, from: Gid, mad: &[u8; MAD_LEN]) {
        self.handle_routed_mad(now, from, None, mad);
    }

    /// [`handle_mad`](Self::handle_mad) for a MAD that came with its LIDs (`route`: an
    /// InfiniBand port), which a REQ's passive path takes.
    pub fn handle_routed_mad(
        &mut self,
        now: Instant,
        from: Gid,
        route: Option<crate::cm::MadRoute>,
        mad: &[u8; MAD_LEN],
    ) {
        self.last_now = self.last_now.max(now);
        self.cm.handle_routed_mad(now, from, route, mad);
    }

    /// The next CM MAD to send, with its destination. A MAD the transport has no room for
    /// stays here until the next turn ([`poll_timeout`](Self::poll_timeout) asks for one at
    /// once): taking it only to drop it would cost the peer a CM retransmission timeout.
    pub fn poll_mad(&mut self) -> Option<(Gid, [u8; MAD_LEN])> {
        self.cm.poll_transmit()
    }

    /// The next command for the driver's kernel CM (never one on our CM). Take them all
    /// after every call that may act on a connection, as with [`poll_mad`](Self::poll_mad).
    pub fn poll_kcm_command(&mut self) -> Option<KcmCommand> {
        self.cm.poll_command()
    }

    /// Hands the endpoint what the driver read from the kernel's CM. Call it before
    /// [`handle_verbs`](Self::handle_verbs) on the same turn, which acts on it.
    pub fn handle_kcm_input(&mut self, now: Instant, input: KcmInput) {
        self.last_now = self.last_now.max(now);
        self.cm.handle_input(now, input);
    }

    /// True when the kernel's CM runs the connections.
    pub fn kernel_cm(&self) -> bool {
        self.cm.is_kernel()
    }

    /// Live RX connections (any state).
    pub fn rx_count(&self) -> usize {
        self.rx.len()
    }

    /// Live TX connections (any state).
    pub fn tx_count(&self) -> usize {
        self.tx.len()
    }

    /// When [`Endpoint::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // MADs waiting for room in the driver's transport: come back at once (QP1's send
        // buffers return with the completions the transport reaps on the next turn).
        let pending = self.cm.has_transmit().then_some(self.last_now);
        // CM events left by a pump that did its share of set-ups: on the next turn.
        let deferred = (!self.cm_events.is_empty()).then_some(self.last_now);
        [
            self.wheel.poll_timeout(),
            self.cm.poll_timeout(),
            pending,
            deferred,
            self.follower.as_ref().and_then(|f| f.poll_timeout()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Fires due timers: RX staleness, teardown watchdogs, neighbour retries and ageing, CM
    /// retransmissions.
    pub fn handle_timeout<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        self.last_now = self.last_now.max(now);
        let mut fired = std::mem::take(&mut self.fired);
        fired.clear();
        self.wheel.expire(now, &mut fired);
        for (id, t) in fired.drain(..) {
            match t {
                Timer::RxStale(qpn) => self.on_rx_stale_timer(now, v, qpn, id),
                Timer::RxWatchdog(qpn) => self.on_rx_watchdog(v, qpn, id),
                Timer::TxWatchdog(qpn) => self.on_tx_watchdog(now, v, qpn, id),
                Timer::TxStall(qpn) => self.on_tx_stall_timer(now, v, qpn, id),
                Timer::NeighResolve(ip) => self.on_resolve_timer(now, v, ip, id),
                Timer::NeighAge(ip) => self.on_neigh_age_timer(now, v, ip, id),
            }
        }
        self.fired = fired;
        self.expire_waiting(now);
        self.cm.handle_timeout(now);
        self.pump_cm(now, v);
    }

    /// Reaps completions and async events and acts on the CM's events (of the MADs handed to
    /// [`handle_mad`](Self::handle_mad) too).
    pub fn handle_verbs<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        self.last_now = self.last_now.max(now);
        for _ in 0..1024 {
            if self.context_lost {
                return;
            }
            let Some(ev) = v.poll_async_event() else {
                break;
            };
            self.on_async_event(now, v, ev);
        }
        if self.context_lost {
            return;
        }
        for _ in 0..MOVED_PER_TURN {
            let Some(m) = v.poll_moved() else {
                break;
            };
            self.on_moved(now, v, m);
        }
        self.poll_ud(now, v);
        self.poll_rx_cq(now, v);
        self.poll_tx_cq(now, v);
        self.pump_cm(now, v);
    }

    fn on_async_event<V: Verbs>(&mut self, now: Instant, v: &mut V, ev: AsyncEvent) {
        match ev {
            AsyncEvent::QpLastWqeReached(qpn) => self.on_last_wqe(v, qpn),
            AsyncEvent::SrqLimitReached(srq) if Some(srq) == self.srq => self.on_srq_limit(v),
            AsyncEvent::CommEst(qpn) => {
                if let Some(id) = self.rx.get(&qpn).map(|r| r.id) {
                    self.cm.notify_comm_est(now, id);
                }
            }
            AsyncEvent::QpFatal(qpn) | AsyncEvent::QpReqErr(qpn) | AsyncEvent::QpAccessErr(qpn) => {
                if self.rx.contains(&qpn) {
                    self.start_rx_teardown(now, v, qpn, rx::Why::Error);
                } else if self.tx.contains(&qpn) {
                    self.fail_tx(now, v, qpn, TxFailure::SendError);
                }
            }
            AsyncEvent::PortActive => {
                self.port_changed(v, PortChange::Active);
                // The port may be back at another MTU: the driver reads it again.
                self.push_device_event(ev);
            }
            AsyncEvent::PortErr => self.port_changed(v, PortChange::Down),
            AsyncEvent::LidChange => self.port_changed(v, PortChange::LidChange),
            AsyncEvent::SmChange => self.port_changed(v, PortChange::SmChange),
            AsyncEvent::ClientReregister => self.port_changed(v, PortChange::ClientReregister),
            AsyncEvent::PkeyChange => self.port_changed(v, PortChange::PkeyChange),
            AsyncEvent::GidChange => self.push_device_event(ev),
            e if e.loses_context() => {
                self.context_lost = true;
                self.push_device_event(ev);
            }
            _ => {}
        }
    }

    /// QP moves the provider finished ([`Verbs::begin_moves`]): a preparing RX connection
    /// sends its REP, a TX connection its RTU; the result of a move to ERR, or of one whose
    /// connection closed meanwhile, matters only as a failure, logged.
    pub(super) fn on_moved<V: Verbs>(&mut self, now: Instant, v: &mut V, m: Moved) {
        if self.rx.get(&m.qp).is_some_and(|r| r.preparing.is_some()) {
            self.on_rx_qp_moved(now, v, m.qp, m.result);
        } else if self.tx.get(&m.qp).is_some_and(|t| t.moving.is_some()) {
            self.on_tx_qp_moved(now, v, m.qp, m.result);
        } else if let Err(e) = m.result {
            tracing::warn!(qp = %m.qp, error = %e, "moving a QP failed");
        }
    }

    fn push_device_event(&mut self, ev: AsyncEvent) {
        if self.device_events.len() < DEVICE_EVENT_CAP {
            self.device_events.push(ev);
        }
    }

    /// Acts on the CM's events, in order; the MADs they make wait for
    /// [`poll_mad`](Self::poll_mad). A REQ accepted or a REP answered moves a QP through three
    /// modifies, each a firmware command on a ConnectX, on the event loop's thread where the
    /// provider makes them there ([`Verbs::begin_moves`] answers `Done`): after
    /// [`SETUPS_PER_PUMP`] of those set-ups the events behind them wait, in order, for the
    /// next pump, which [`poll_timeout`](Self::poll_timeout) asks for at once. A burst of
    /// connections then holds a turn's packets behind a bounded number of set-ups (two pumps
    /// a turn).
    fn pump_cm<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        let mut setups = 0;
        for _ in 0..16 {
            while let Some(e) = self.cm.poll_event() {
                self.cm_events.push_back(e);
            }
            if self.cm_events.is_empty() {
                break;
            }
            while let Some(e) = self.cm_events.pop_front() {
                if sets_up_a_qp(&e) {
                    if setups == SETUPS_PER_PUMP {
                        self.cm_events.push_front(e);
                        return;
                    }
                    setups += 1;
                }
                self.on_cm_event(now, v, e);
            }
        }
        if self.cm_events.capacity() > crate::cm::QUEUE_KEEP {
            self.cm_events.shrink_to(crate::cm::QUEUE_KEEP);
        }
    }

    fn on_cm_event<V: Verbs>(&mut self, now: Instant, v: &mut V, e: CmEvent) {
        match e {
            CmEvent::ReqReceived {
                id,
                peer,
                remote_ca_guid,
                service_id,
                remote_qpn,
                remote_psn,
                path_mtu,
                path,
                rnr_retry_count,
                private_data,
                ..
            } => self.on_req(
                now,
                v,
                id,
                peer,
                remote_ca_guid,
                remote_qpn,
                remote_psn,
                crate::verbs::Path {
                    mtu: path_mtu,
                    ..path
                },
                rnr_retry_count,
                service_id,
                &private_data,
            ),
            CmEvent::RepReceived {
                id,
                remote_ca_guid,
                remote_qpn,
                remote_psn,
                private_data,
                ..
            } => self.on_rep(
                now,
                v,
                id,
                remote_ca_guid,
                remote_qpn,
                remote_psn,
                &private_data,
            ),
            CmEvent::Established { id } => {
                if let Some(Owner::Rx(qpn)) = self.owners.get(&id).copied() {
                    self.on_rx_established(now, v, qpn);
                }
            }
            CmEvent::TimedOut { id, .. }
                if matches!(self.owners.get(&id), Some(Owner::Rx(q))
                    if self.rx.get(q).is_some_and(|r| !r.established)) =>
            {
                if let Some(Owner::Rx(qpn)) = self.owners.get(&id).copied() {
                    self.start_rx_teardown(now, v, qpn, rx::Why::HalfOpenTimeout);
                }
            }
            CmEvent::Rejected {
                id,
                reason: RejReason::InvalidServiceId,
                ..
            } if self.may_retry_at_rdma_cm(id) => self.retry_at_rdma_cm(now, v, id),
            CmEvent::Rejected {
                id,
                reason: RejReason::InvalidMtu,
                acceptable_mtu: Some(mtu),
            } if self.may_retry_at_mtu(id, mtu) => self.retry_at_mtu(now, v, id, mtu),
            CmEvent::Rejected { id, .. } | CmEvent::TimedOut { id, .. } => {
                let why = match e {
                    CmEvent::Rejected { .. } => TxFailure::Rejected,
                    _ => TxFailure::TimedOut,
                };
                match self.owners.get(&id).copied() {
                    Some(Owner::Tx(qpn)) => self.fail_tx(now, v, qpn, why),
                    Some(Owner::Rx(qpn)) => self.start_rx_teardown(now, v, qpn, rx::Why::Remote),
                    None => {}
                }
            }
            CmEvent::DisconnectReceived { id } | CmEvent::Disconnected { id } => {
                match self.owners.get(&id).copied() {
                    // The peer's DREQ (first, or crossing ours): an orderly close. The peer may
                    // have changed its MTU since it capped ours: the next REQ asks at ours.
                    Some(Owner::Tx(qpn)) => {
                        if let Some(peer) = self.tx.get(&qpn).map(|t| t.peer.gid) {
                            self.paths.uncap_mtu(peer);
                        }
                        self.close_tx(now, v, qpn, TxCloseReason::PeerDisconnected, None);
                    }
                    Some(Owner::Rx(qpn)) => self.start_rx_teardown(now, v, qpn, rx::Why::Remote),
                    None => {}
                }
            }
            CmEvent::TimeWaitExit { id } => {
                self.owners.remove(&id);
            }
        }
    }

    /// Private data of our REQs and REPs: our UD QPN and receive size.
    pub(super) fn cm_private_data(&self) -> Vec<u8> {
        IpoibCmData {
            // The interface's UD QPN (control's, on a follower): what peers know us by.
            qpn: self.hwaddr.qpn,
            mtu: IPOIB_CM_BUF_SIZE,
        }
        .to_bytes()
        .to_vec()
    }

    pub(super) fn arm(&mut self, at: Instant, t: Timer) -> TimerId {
        self.wheel.insert(at, t)
    }

    /// Destroys a QP and counts it: a drained one through [`Verbs::retire_qp`] (the provider
    /// may do it off the event loop), any other at once.
    pub(super) fn destroy_qp<V: Verbs>(&mut self, v: &mut V, qpn: QpNum, end: QpEnd) {
        let r = match end {
            QpEnd::Drained => v.retire_qp(qpn),
            QpEnd::Forced => v.destroy_qp(qpn),
        };
        match r {
            Ok(()) => self.counters.qp_destroyed += 1,
            Err(e) => tracing::warn!(qp = %qpn, error = %e, "destroy_qp failed"),
        }
    }

    /// Begins an orderly stop: no new connections; DREQ and tear down everything. Call
    /// [`Endpoint::is_stopped`] to see when all RC QPs are gone (bounded by `drain_timeout`).
    pub fn begin_shutdown<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        self.stopping = true;
        for qpn in self.tx.qpns() {
            self.close_tx(now, v, qpn, TxCloseReason::Shutdown, None);
        }
        for qpn in self.rx.qpns() {
            self.start_rx_teardown(now, v, qpn, rx::Why::Shutdown);
        }
        self.pump_cm(now, v);
    }

    /// True once every RC connection is destroyed after [`Endpoint::begin_shutdown`].
    pub fn is_stopped(&self) -> bool {
        self.stopping && self.rx.is_empty() && self.tx.is_empty()
    }

    /// Destroys whatever is left (the shutdown bound passed), counting drain timeouts.
    pub fn force_stop<V: Verbs>(&mut self, v: &mut V) {
        for qpn in self.rx.qpns() {
            self.counters.drain_timeouts += 1;
            self.destroy_rx(v, qpn, QpEnd::Forced);
        }
        for qpn in self.tx.qpns() {
            self.destroy_tx(v, qpn, QpEnd::Forced);
        }
    }

    /// A snapshot for status output.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let mut neighbours: Vec<_> = self
            .neigh
            .iter()
            .map(|(ip, n)| (*ip, n.hw(), n.state()))
            .collect();
        neighbours.sort_unstable_by_key(|(ip, ..)| *ip);
        neighbours.truncate(super::SNAPSHOT_NEIGHBOURS);
        let mut tx: Vec<_> = self
            .tx
            .iter()
            .map(|(q, t)| TxSnapshot {
                peer: t.peer,
                qpn: *q,
                state: t.state,
                mtu: t.mtu,
                queued: t.queue.len(),
                in_flight: t.outstanding,
                path: self.path(t.peer.gid),
            })
            .collect();
        tx.sort_by_key(|t| t.qpn);
        let mut rx: Vec<_> = self
            .rx
            .iter()
            .map(|(q, r)| {
                (
                    r.peer,
                    *q,
                    r.state(),
                    now.saturating_duration_since(r.last_rx),
                )
            })
            .collect();
        rx.sort_by_key(|(_, q, ..)| *q);
        Snapshot {
            hwaddr: self.hwaddr,
            mtu: self.cfg.interface_mtu(),
            mode: self.cfg.mode,
            neighbours,
            neigh_counts: self.neigh.counts(),
            neigh_max: self.cfg.neigh_max,
            tx,
            rx,
            counters: self.counters,
        }
    }

    /// Our address of `dst`'s family in the same subnet as `dst`, or the first one of that
    /// family (the source of ARP requests and Neighbor Solicitations).
    pub(super) fn our_addr_for(&self, dst: IpAddr) -> Option<IpAddr> {
        let mut first = None;
        for &(ip, prefix) in &self.cfg.addrs {
            if ip.is_ipv4() != dst.is_ipv4() {
                continue;
            }
            first.get_or_insert(ip);
            if super::resolve::same_prefix(ip, dst, prefix) {
                return Some(ip);
            }
        }
        first
    }

    /// True if `ip` is one of the interface's addresses.
    pub(super) fn is_ours(&self, ip: IpAddr) -> bool {
        self.cfg.addrs.iter().any(|(a, _)| *a == ip)
    }

    /// A random number from the endpoint's generator.
    pub(super) fn rng_u64(&mut self) -> u64 {
        self.rng.gen()
    }

    pub(super) fn random_psn(&mut self) -> crate::verbs::Psn {
        crate::verbs::Psn::new(self.rng.gen())
    }
}

/// Connection set-ups (a REQ accepted, a REP answered) one pump of the CM's events does; the
/// events behind them wait for the next pump, on the next turn.
pub(crate) const SETUPS_PER_PUMP: usize = 8;

/// Results of QP moves taken from the provider a turn: more than its command thread holds
/// (`hw::commands`' queue of 256 jobs).
const MOVED_PER_TURN: usize = 1024;

/// Whether acting on `e` sets up a QP (moves it to RTR and RTS).
fn sets_up_a_qp(e: &CmEvent) -> bool {
    matches!(e, CmEvent::ReqReceived { .. } | CmEvent::RepReceived { .. })
}
