//! The kernel's CM on the driver's side: executes the endpoint's [`KcmCommand`]s on
//! [`RdmaCm`] and feeds what the event channel reads back as [`KcmInput`]s
//! (`--cm-transport rdmacm`, docs/kernel-cm.md).
//!
//! One listener, an `RDMA_PS_IB` id bound to the `--bind` address and the rdma_cm port; TX
//! connections are `RDMA_PS_IB` ids that resolve the peer's address (its GID's IPv4 or IPv6
//! address at the rdma_cm port, or on InfiniBand an `AF_IB` address at its standard service
//! ID, [`KcmTarget`]) and route by events, at most [`MAX_RESOLVING`] at a time (the rest wait,
//! in order). Every id of a connection is mapped to the endpoint's [`CommId`] both ways; the map
//! holds what [`RdmaCm`]'s table holds (capped by `max_ids`: connection requests beyond it are
//! rejected there and counted in `requests_refused`). As a request or response arrives, the
//! RTR and RTS attributes are read with `rdma_init_qp_attr` and handed in with it: the
//! endpoint moves its own QP. An id ends with `REJECTED`, an error event, `DEVICE_REMOVAL` or
//! `TIMEWAIT_EXIT` (after `DISCONNECTED`); it is destroyed then, or when the endpoint lets go of
//! a connection not yet established.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::cm::{CommId, KcmCommand, KcmInput, KcmTarget, QpMoves, PASSIVE_ID_BASE};
use crate::hw::rdmacm::{
    ConnParam, IbAddr, PortSpace, RdmaCm, RdmaCmError, RdmaCmEvent, RdmaCmEventKind, RdmaCmId,
};
use crate::ipoib::Endpoint;
use crate::wire::{WorkerCount, WorkerId};

use super::KcmSink;
use crate::verbs::setup::RC_RETRY_CNT;
use crate::verbs::{Gid, QpNum, QpState};

use super::KcmStats;

/// Events read from the channel per turn; beyond it the next turn comes at once.
const EVENTS_PER_TURN: usize = 64;

/// Address and route resolutions in flight at once.
const MAX_RESOLVING: usize = 16;

/// How long one address or route resolution may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Backlog of the listener (REQs the kernel holds before we read them).
const BACKLOG: i32 = 64;

/// Where a connection's id is.
#[derive(Debug)]
enum Stage {
    /// `rdma_resolve_addr` issued.
    Addr(Request),
    /// `rdma_resolve_route` issued.
    Route(Request),
    /// REQ sent or received: the kernel's CM runs it.
    Cm,
}

/// What our REQ carries, kept while the address and the route resolve.
#[derive(Debug)]
struct Request {
    /// Our QP.
    qpn: QpNum,
    /// `ipoib_cm_data`.
    private_data: Vec<u8>,
    /// Transport retries, as the endpoint asked ([`KcmCommand::Connect`]).
    retry_count: u8,
    /// RNR retries; the peer's REP echoes them for our QP, as Linux's does.
    rnr_retry_count: u8,
}

#[derive(Debug)]
struct Slot {
    id: RdmaCmId,
    stage: Stage,
    /// `rdma_disconnect` was called (our DREQ, or the DREP of the peer's).
    disconnected: bool,
}

/// The kernel's CM of one node: the rdma_cm event channel and its ids.
#[derive(Debug)]
pub struct KernelCmDriver {
    cm: RdmaCm,
    listener: RdmaCmId,
    /// The `--bind` address: the source of our connections.
    bind: IpAddr,
    port: u16,
    slots: HashMap<CommId, Slot>,
    by_id: HashMap<RdmaCmId, CommId>,
    next_passive: u32,
    /// The interface's workers ([`KernelCmDriver::set_workers`]).
    workers: WorkerCount,
    resolving: usize,
    waiting: VecDeque<(CommId, Gid, KcmTarget, Request)>,
    max_ids: usize,
    stats: KcmStats,
    /// The last turn stopped at [`EVENTS_PER_TURN`], or fed inputs the endpoint has not
    /// seen: the next turn comes at once.
    more: bool,
    /// The listener got `RDMA_CM_EVENT_DEVICE_REMOVAL`: the device is going away, and the
    /// kernel waits for every id on it to be destroyed.
    device_removed: bool,
}

impl KernelCmDriver {
    /// Opens the event channel for `max_ids` connection ids and listens on `bind`'s rdma_cm
    /// port.
    ///
    /// # Errors
    /// [`RdmaCmError::Unavailable`] without an RDMA CM (`/dev/infiniband/rdma_cm`), else the
    /// failing call.
    pub fn open(bind: SocketAddr, max_ids: usize) -> Result<Self, RdmaCmError> {
        let mut cm = RdmaCm::open(max_ids + 1)?;
        let listener = cm.create_id(PortSpace::Ib)?;
        cm.bind_addr(listener, bind)?;
        cm.listen(listener, BACKLOG)?;
        Ok(Self {
            cm,
            listener,
            bind: bind.ip(),
            port: bind.port(),
            slots: HashMap::new(),
            by_id: HashMap::new(),
            next_passive: 0,
            workers: WorkerCount::ONE,
            resolving: 0,
            waiting: VecDeque::new(),
            max_ids,
            stats: KcmStats::default(),
            more: false,
            device_removed: false,
        })
    }

    /// The event channel's fd, for the poller (read on every turn; readiness only wakes).
    pub fn fd(&self) -> i32 {
        self.cm.io_source().fd
    }

    /// The counters.
    pub fn stats(&self) -> KcmStats {
        KcmStats {
            requests_refused: self.cm.stats().requests_refused,
            ids: self.cm.id_count() as u64,
            ..self.stats
        }
    }

    /// True when the next turn should come at once.
    pub fn has_pending(&self) -> bool {
        self.more
    }

    /// True once the listener was told its device is being removed (`rdma link delete`, a
    /// driver unload, a reset without recovery): the kernel's removal waits until every id
    /// on the device is destroyed, so the node must let go of the device.
    pub fn device_removed(&self) -> bool {
        self.device_removed
    }

    /// Reads up to `EVENTS_PER_TURN` (64) events into the endpoint.
    pub fn receive(&mut self, now: Instant, ep: &mut dyn KcmSink) {
        self.more = false;
        for _ in 0..EVENTS_PER_TURN {
            match self.cm.poll_event() {
                Ok(Some(e)) => {
                    self.stats.events += 1;
                    self.on_event(now, ep, e);
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the rdma_cm event channel failed");
                    self.stats.call_errors += 1;
                    return;
                }
            }
        }
        self.more = true;
    }

    /// Executes every command the endpoint queued (what they raise is about its own ids).
    pub fn execute(&mut self, now: Instant, ep: &mut Endpoint) {
        while let Some(c) = ep.poll_kcm_command() {
            self.execute_one(now, ep, c);
        }
    }

    /// Executes one command (of control's endpoint or a worker's), what it raises handed to
    /// `sink`.
    pub fn execute_one(&mut self, now: Instant, sink: &mut dyn KcmSink, c: KcmCommand) {
        self.stats.commands += 1;
        self.command(now, sink, c);
    }

    /// The interface runs `workers` workers: a connection request goes to the worker in the
    /// low bits of the requester's QPN (as our CM's REQs do), its id tagged with it.
    pub fn set_workers(&mut self, workers: WorkerCount) {
        self.workers = workers;
    }

    fn feed(&mut self, now: Instant, ep: &mut dyn KcmSink, input: KcmInput) {
        ep.handle_kcm_input(now, input);
        self.more = true;
    }

    /// Destroys the id of `comm` and forgets it.
    fn drop_slot(&mut self, comm: CommId) {
        self.waiting.retain(|w| w.0 != comm);
        let Some(s) = self.slots.remove(&comm) else {
            return;
        };
        if matches!(s.stage, Stage::Addr(_) | Stage::Route(_)) {
            self.resolving = self.resolving.saturating_sub(1);
        }
        self.by_id.remove(&s.id);
        let _ = self.cm.destroy(s.id);
    }

    /// A call on `comm` failed: the id goes, the endpoint hears `UNREACHABLE`.
    fn fail(&mut self, now: Instant, ep: &mut dyn KcmSink, comm: CommId, e: &RdmaCmError) {
        tracing::debug!(id = comm.0, error = %e, "rdma_cm call failed");
        self.stats.call_errors += 1;
        self.drop_slot(comm);
        self.feed(now, ep, KcmInput::Unreachable { id: comm });
        self.start_waiting(now, ep);
    }

    fn id_of(&self, comm: CommId) -> Option<RdmaCmId> {
        self.slots.get(&comm).map(|s| s.id)
    }

    fn command(&mut self, now: Instant, ep: &mut dyn KcmSink, c: KcmCommand) {
        let comm = c.id();
        match c {
            KcmCommand::Connect {
                peer,
                target,
                qpn,
                private_data,
                retry_count,
                rnr_retry_count,
                ..
            } => {
                let req = Request {
                    qpn,
                    private_data,
                    retry_count,
                    rnr_retry_count,
                };
                if self.resolving >= MAX_RESOLVING {
                    if self.waiting.len() >= self.max_ids {
                        self.feed(now, ep, KcmInput::Unreachable { id: comm });
                        return;
                    }
                    self.stats.connects_queued += 1;
                    self.waiting.push_back((comm, peer, target, req));
                    return;
                }
                self.start_connect(now, ep, comm, (peer, target), req);
            }
            KcmCommand::Accept {
                qpn,
                srq,
                private_data,
                rnr_retry_count,
                ..
            } => {
                let Some(id) = self.id_of(comm) else { return };
                // A REP has no transport retries of its own: those are the REQ's.
                let p = conn_param(qpn, srq, &private_data, (RC_RETRY_CNT, rnr_retry_count));
                if let Err(e) = self.cm.accept(id, &p) {
                    self.fail(now, ep, comm, &e);
                }
            }
            KcmCommand::Reject { .. } => {
                if let Some(id) = self.id_of(comm) {
                    let _ = self.cm.reject(id, &[]);
                }
                self.drop_slot(comm);
            }
            KcmCommand::Establish { .. } => {
                let Some(id) = self.id_of(comm) else { return };
                if let Err(e) = self.cm.establish(id) {
                    self.fail(now, ep, comm, &e);
                }
            }
            KcmCommand::Disconnect { .. } => {
                let Some(s) = self.slots.get_mut(&comm) else {
                    return;
                };
                if s.disconnected {
                    return;
                }
                s.disconnected = true;
                let id = s.id;
                if let Err(e) = self.cm.disconnect(id) {
                    // No DREQ left: the connection is over here; the peer's CM times out.
                    tracing::debug!(id = comm.0, error = %e, "rdma_disconnect failed");
                    self.stats.call_errors += 1;
                    self.drop_slot(comm);
                    self.feed(now, ep, KcmInput::Disconnected { id: comm });
                    self.feed(now, ep, KcmInput::TimewaitExit { id: comm });
                }
            }
            KcmCommand::Destroy { .. } => {
                self.drop_slot(comm);
                self.start_waiting(now, ep);
            }
            KcmCommand::Notify { .. } => {
                let Some(id) = self.id_of(comm) else { return };
                if let Err(e) = self.cm.notify_comm_est(id) {
                    tracing::debug!(id = comm.0, error = %e, "rdma_notify failed");
                    self.stats.call_errors += 1;
                }
            }
        }
    }

    /// Starts the connects that waited for a resolution slot.
    fn start_waiting(&mut self, now: Instant, ep: &mut dyn KcmSink) {
        while self.resolving < MAX_RESOLVING {
            let Some((comm, peer, target, req)) = self.waiting.pop_front() else {
                break;
            };
            self.start_connect(now, ep, comm, (peer, target), req);
        }
    }

    /// Resolves the address of `peer`: the IP form of its GID at our rdma_cm port, or for
    /// [`KcmTarget::IbService`] an `AF_IB` address (its GID, the service ID, the P_Key; the
    /// kernel picks the device whose GID table reaches it and adds no `cma_hdr`).
    fn start_connect(
        &mut self,
        now: Instant,
        ep: &mut dyn KcmSink,
        comm: CommId,
        (peer, target): (Gid, KcmTarget),
        req: Request,
    ) {
        let id = match self.cm.create_id(PortSpace::Ib) {
            Ok(id) => id,
            Err(e) => {
                tracing::debug!(error = %e, "rdma_create_id failed");
                self.stats.call_errors += 1;
                self.feed(now, ep, KcmInput::Unreachable { id: comm });
                return;
            }
        };
        self.slots.insert(
            comm,
            Slot {
                id,
                stage: Stage::Addr(req),
                disconnected: false,
            },
        );
        self.by_id.insert(id, comm);
        self.resolving += 1;
        let r = match target {
            KcmTarget::RdmaCmPort => {
                let dst_ip = peer.to_ip();
                let src = (dst_ip.is_ipv4() == self.bind.is_ipv4())
                    .then(|| SocketAddr::new(self.bind, 0));
                let dst = SocketAddr::new(dst_ip, self.port);
                self.cm.resolve_addr(id, src, dst, RESOLVE_TIMEOUT)
            }
            KcmTarget::IbService { service_id, pkey } => {
                let dst = IbAddr {
                    gid: peer,
                    service_id,
                    pkey,
                };
                self.cm.resolve_addr_ib(id, dst, RESOLVE_TIMEOUT)
            }
        };
        if let Err(e) = r {
            self.fail(now, ep, comm, &e);
        }
    }

    /// The RTR and RTS attributes of `id`'s connection.
    fn moves(&mut self, id: RdmaCmId) -> Result<QpMoves, RdmaCmError> {
        let rtr = self.cm.init_qp_attr(id, QpState::Rtr)?.attr;
        let rts = self.cm.init_qp_attr(id, QpState::Rts)?.attr;
        Ok(QpMoves { rtr, rts })
    }

    /// A free id for a connection request to `worker` (its index in the low bits).
    fn new_passive_id(&mut self, worker: u8) -> CommId {
        let slot = WorkerId::new(worker, self.workers).unwrap_or(WorkerId::SINGLE);
        loop {
            let id = CommId(PASSIVE_ID_BASE | (slot.tag(self.next_passive) & !PASSIVE_ID_BASE));
            self.next_passive = self.next_passive.wrapping_add(1);
            if !self.slots.contains_key(&id) {
                return id;
            }
        }
    }

    fn on_event(&mut self, now: Instant, ep: &mut dyn KcmSink, e: RdmaCmEvent) {
        if let RdmaCmEventKind::ConnectRequest(req) = e.kind {
            self.on_request(now, ep, e.id, req);
            return;
        }
        if e.id == self.listener {
            if e.kind == RdmaCmEventKind::DeviceRemoval {
                self.device_removed = true;
            }
            return;
        }
        let Some(&comm) = self.by_id.get(&e.id) else {
            return;
        };
        match e.kind {
            RdmaCmEventKind::AddrResolved => {
                let Some(s) = self.slots.get_mut(&comm) else {
                    return;
                };
                if let Stage::Addr(req) = std::mem::replace(&mut s.stage, Stage::Cm) {
                    s.stage = Stage::Route(req);
                    if let Err(err) = self.cm.resolve_route(e.id, RESOLVE_TIMEOUT) {
                        self.fail(now, ep, comm, &err);
                    }
                }
            }
            RdmaCmEventKind::RouteResolved => {
                let Some(s) = self.slots.get_mut(&comm) else {
                    return;
                };
                if let Stage::Route(req) = std::mem::replace(&mut s.stage, Stage::Cm) {
                    self.resolving = self.resolving.saturating_sub(1);
                    let retries = (req.retry_count, req.rnr_retry_count);
                    let p = conn_param(req.qpn, false, &req.private_data, retries);
                    if let Err(err) = self.cm.connect(e.id, &p) {
                        self.fail(now, ep, comm, &err);
                    }
                    self.start_waiting(now, ep);
                }
            }
            RdmaCmEventKind::ConnectResponse {
                remote_qpn,
                private_data,
            } => match self.moves(e.id) {
                Ok(moves) => self.feed(
                    now,
                    ep,
                    KcmInput::Response {
                        id: comm,
                        remote_qpn,
                        private_data,
                        moves,
                    },
                ),
                Err(err) => {
                    let _ = self.cm.reject(e.id, &[]);
                    self.fail(now, ep, comm, &err);
                }
            },
            RdmaCmEventKind::Established => {
                self.feed(now, ep, KcmInput::Established { id: comm });
            }
            RdmaCmEventKind::Rejected { reason, .. } => {
                self.drop_slot(comm);
                let reason = u16::try_from(reason).unwrap_or(u16::MAX);
                self.feed(now, ep, KcmInput::Rejected { id: comm, reason });
                self.start_waiting(now, ep);
            }
            RdmaCmEventKind::Failed { what, status } => {
                tracing::debug!(id = comm.0, what, status, "rdma_cm connection failed");
                self.drop_slot(comm);
                self.feed(now, ep, KcmInput::Unreachable { id: comm });
                self.start_waiting(now, ep);
            }
            RdmaCmEventKind::Disconnected => {
                if let Some(s) = self.slots.get_mut(&comm) {
                    if !s.disconnected {
                        // The peer's DREQ: the DREP.
                        s.disconnected = true;
                        let _ = self.cm.disconnect(e.id);
                    }
                }
                self.feed(now, ep, KcmInput::Disconnected { id: comm });
            }
            RdmaCmEventKind::TimewaitExit => {
                self.drop_slot(comm);
                self.feed(now, ep, KcmInput::TimewaitExit { id: comm });
            }
            RdmaCmEventKind::DeviceRemoval => {
                self.drop_slot(comm);
                self.feed(now, ep, KcmInput::DeviceRemoval { id: comm });
            }
            RdmaCmEventKind::ConnectRequest(_) | RdmaCmEventKind::Other(_) => {}
        }
    }

    fn on_request(
        &mut self,
        now: Instant,
        ep: &mut dyn KcmSink,
        id: RdmaCmId,
        req: crate::hw::rdmacm::ConnectRequest,
    ) {
        let peer = req.peer.map(|a| Gid::from_ip(a.ip()));
        let (Some(peer), true) = (peer, req.listener == self.listener) else {
            let _ = self.cm.reject(id, &[]);
            let _ = self.cm.destroy(id);
            return;
        };
        let moves = match self.moves(id) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "rdma_init_qp_attr of a request failed");
                self.stats.call_errors += 1;
                let _ = self.cm.reject(id, &[]);
                let _ = self.cm.destroy(id);
                return;
            }
        };
        let comm = self.new_passive_id(self.workers.owner_of_qpn(req.remote_qpn));
        self.slots.insert(
            comm,
            Slot {
                id,
                stage: Stage::Cm,
                disconnected: false,
            },
        );
        self.by_id.insert(id, comm);
        self.feed(
            now,
            ep,
            KcmInput::Request {
                id: comm,
                peer,
                remote_qpn: req.remote_qpn,
                private_data: req.private_data,
                moves,
            },
        );
    }
}

/// The `conn_param` of our QP `qpn` with `(retry_count, rnr_retry_count)`.
fn conn_param(
    qpn: QpNum,
    srq: bool,
    private_data: &[u8],
    (retry_count, rnr_retry_count): (u8, u8),
) -> ConnParam<'_> {
    ConnParam {
        qp_num: qpn,
        srq,
        private_data,
        responder_resources: 0,
        initiator_depth: 0,
        retry_count,
        rnr_retry_count,
    }
}
