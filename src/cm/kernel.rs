//! The kernel's CM (`ib_cm` through librdmacm) as the endpoint sees it: a sans-IO state
//! machine that queues [`KcmCommand`]s for the driver to execute on `hw::rdmacm::RdmaCm` and
//! takes [`KcmInput`]s (what the driver read from the rdma_cm event channel) back, handing
//! the endpoint the same [`CmEvent`]s as our own [`Cm`](super::Cm).
//!
//! The kernel does the retransmissions, MRA, duplicate and stale REQs, DREQ/DREP crossings and
//! TimeWait: nothing here has a timer. Every id is the endpoint's [`CommId`]: active ids are
//! drawn here, below [`PASSIVE_ID_BASE`]; the driver numbers the ids of connection requests
//! from [`PASSIVE_ID_BASE`] up, so the two never meet.
//!
//! The PSNs, the peer's QPN and the path MTU are the kernel's (`rdma_init_qp_attr`; the RTR's
//! `rq_psn` is rdma_cm's own `seq_num`, the starting PSN its REQ or REP carries): the driver
//! reads the RTR and RTS attributes as a request or a response arrives and hands them in as
//! [`QpMoves`], which the endpoint applies to its QP (the QPs stay ours) before it accepts or
//! establishes.

use crate::wire::WorkerId;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::{AcceptParams, CmEvent, CmState, CmStats, CmUseError, CommId, ConnectParams};
use crate::verbs::{Gid, QpAttr, QpNum};
use crate::wire::cm::RejReason;

/// The first [`CommId`] of an id the driver made for a connection request.
pub const PASSIVE_ID_BASE: u32 = 0x8000_0000;

/// Private data of a REQ after rdma_cm's 36-byte header (92 − 36).
pub const REQ_USER_DATA: usize = 56;

/// The moves of our QP for one connection, as the kernel's CM gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpMoves {
    /// INIT → RTR (peer QPN, our receive PSN, path, MTU).
    pub rtr: QpAttr,
    /// RTR → RTS (our send PSN, timeouts, retries).
    pub rts: QpAttr,
}

/// The link layer of the port the kernel's CM runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// RoCE: a GID is the port's IPv4-mapped or IPv6 address; rdma_cm takes only `AF_INET` and
    /// `AF_INET6` ids there (an `AF_IB` id fails route resolution with `ENODEV`).
    Ethernet,
    /// Native InfiniBand: `AF_IB` ids name a GID and a raw service ID.
    InfiniBand,
}

/// Where a TX connection on the kernel's CM goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KcmTarget {
    /// The peer's rdma_cm port: an `AF_INET`/`AF_INET6` id to the IP form of its GID (rdma_cm
    /// puts its `cma_hdr` before `ipoib_cm_data`).
    RdmaCmPort,
    /// A raw service ID through an `AF_IB` id (`sockaddr_ib`: the peer's GID, `sib_sid`, mask
    /// all ones, `sib_pkey`); rdma_cm puts no header before `ipoib_cm_data` for `AF_IB`.
    IbService {
        /// `sib_sid`: the peer's standard IPoIB-CM service ID.
        service_id: u64,
        /// `sib_pkey`: the full P_Key of the partition.
        pkey: u16,
    },
}

impl KcmTarget {
    /// How to reach the service `service_id` a connection asks for, from a port with link
    /// layer `link` whose rdma_cm service (the same port on every daemon) is `rdma_cm_service`:
    /// that service at the peer's rdma_cm port; any other (a peer without flag `0x20`: kernel
    /// `ipoib_cm` or our CM at its standard service ID) through `AF_IB` on InfiniBand, and on
    /// RoCE, where there is no other kind of id, the rdma_cm port too.
    #[must_use]
    pub const fn choose(link: LinkLayer, rdma_cm_service: u64, service_id: u64, pkey: u16) -> Self {
        match link {
            LinkLayer::InfiniBand if service_id != rdma_cm_service => {
                Self::IbService { service_id, pkey }
            }
            LinkLayer::InfiniBand | LinkLayer::Ethernet => Self::RdmaCmPort,
        }
    }
}

/// What the driver does on the kernel's CM for the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KcmCommand {
    /// Resolve `peer`'s address and route, then send the REQ for our QP `qpn`.
    Connect {
        /// The endpoint's id.
        id: CommId,
        /// The peer's GID (an IPv4-mapped or IPv6 address on RoCE).
        peer: Gid,
        /// Which id and destination address ([`KcmTarget::choose`]).
        target: KcmTarget,
        /// Our QP.
        qpn: QpNum,
        /// `ipoib_cm_data` (after the kernel's `cma_hdr`, or alone for `AF_IB`).
        private_data: Vec<u8>,
        /// The REQ's transport retries ([`ConnectParams::retry_count`]).
        retry_count: u8,
        /// The REQ's RNR retries ([`ConnectParams::rnr_retry_count`]): the passive side echoes
        /// them in its REP for our QP, as Linux's `ipoib_cm` does.
        rnr_retry_count: u8,
    },
    /// Send the REP of a request for our QP `qpn` (already in RTS).
    Accept {
        /// The endpoint's id.
        id: CommId,
        /// Our QP.
        qpn: QpNum,
        /// Whether it receives from an SRQ.
        srq: bool,
        /// `ipoib_cm_data` (at the start of the REP).
        private_data: Vec<u8>,
        /// The REP's RNR retries, the sender's QP's ([`AcceptParams::rnr_retry_count`]).
        rnr_retry_count: u8,
    },
    /// Reject a request (or a response) and destroy the id.
    Reject {
        /// The endpoint's id.
        id: CommId,
    },
    /// Send the RTU after our QP reached RTS on a response.
    Establish {
        /// The endpoint's id.
        id: CommId,
    },
    /// Send the DREQ of an established connection (the id stays until TimeWait ends).
    Disconnect {
        /// The endpoint's id.
        id: CommId,
    },
    /// Destroy the id of a connection not established (the kernel sends the REJ it owes).
    Destroy {
        /// The endpoint's id.
        id: CommId,
    },
    /// The passive QP received before the RTU (`IB_EVENT_COMM_EST`): `rdma_notify`.
    Notify {
        /// The endpoint's id.
        id: CommId,
    },
}

impl KcmCommand {
    /// The id the command is about.
    pub const fn id(&self) -> CommId {
        match self {
            Self::Connect { id, .. }
            | Self::Accept { id, .. }
            | Self::Reject { id }
            | Self::Establish { id }
            | Self::Disconnect { id }
            | Self::Destroy { id }
            | Self::Notify { id } => *id,
        }
    }
}

/// What the driver read from the kernel's CM, by the endpoint's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KcmInput {
    /// `CONNECT_REQUEST` on our listener: the driver made id `id` for it.
    Request {
        /// The new id (from [`PASSIVE_ID_BASE`]).
        id: CommId,
        /// The peer, from the `cma_hdr`'s source address.
        peer: Gid,
        /// The peer's QP.
        remote_qpn: QpNum,
        /// The user data after the `cma_hdr`.
        private_data: Vec<u8>,
        /// How our QP moves for it.
        moves: QpMoves,
    },
    /// `CONNECT_RESPONSE` (a REP) for our REQ.
    Response {
        /// The id.
        id: CommId,
        /// The peer's QP.
        remote_qpn: QpNum,
        /// The REP's private data.
        private_data: Vec<u8>,
        /// How our QP moves for it.
        moves: QpMoves,
    },
    /// `ESTABLISHED` (the RTU on the passive side, or after `rdma_notify`).
    Established {
        /// The id.
        id: CommId,
    },
    /// `REJECTED` with the REJ's reason; the driver destroyed the id.
    Rejected {
        /// The id.
        id: CommId,
        /// The IB REJ reason (`event->status`).
        reason: u16,
    },
    /// `UNREACHABLE`, `ADDR_ERROR`, `ROUTE_ERROR`, `CONNECT_ERROR`, or a librdmacm call that
    /// failed: the driver destroyed the id.
    Unreachable {
        /// The id.
        id: CommId,
    },
    /// `DISCONNECTED`: the peer's DREQ (answered), the DREP of ours, or a DREQ timeout.
    Disconnected {
        /// The id.
        id: CommId,
    },
    /// `TIMEWAIT_EXIT`: the driver destroyed the id; our QPN may be used again.
    TimewaitExit {
        /// The id.
        id: CommId,
    },
    /// `DEVICE_REMOVAL`: the driver destroyed the id.
    DeviceRemoval {
        /// The id.
        id: CommId,
    },
}

impl KcmInput {
    /// The id the input is about.
    pub const fn id(&self) -> CommId {
        match self {
            Self::Request { id, .. }
            | Self::Response { id, .. }
            | Self::Established { id }
            | Self::Rejected { id, .. }
            | Self::Unreachable { id }
            | Self::Disconnected { id }
            | Self::TimewaitExit { id }
            | Self::DeviceRemoval { id } => *id,
        }
    }
}

/// The state of one id, in [`CmState`]'s names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Conn {
    state: CmState,
    /// Ours (REQ sent) or the peer's (REQ received).
    active: bool,
}

/// The kernel's CM as a state machine. See the [module documentation](self).
#[derive(Debug)]
pub struct KernelCm {
    conns: HashMap<CommId, Conn>,
    /// Kept from the request or response until the endpoint took them.
    moves: HashMap<CommId, QpMoves>,
    commands: VecDeque<KcmCommand>,
    events: VecDeque<CmEvent>,
    next_id: u32,
    max_ids: usize,
    /// The service ID of the rdma_cm port the REQs came to (what `ReqReceived` names).
    service_id: u64,
    link: LinkLayer,
    /// The full P_Key of `AF_IB` destinations.
    pkey: u16,
    /// The worker whose ids these are: its index is in their low bits
    /// ([`KernelCm::with_worker`]).
    slot: WorkerId,
    stats: CmStats,
}

impl KernelCm {
    /// A kernel CM for at most `max_ids` ids at a time, listening (the driver's listener) on
    /// `service_id`, on a port of link layer `link` and the partition of full P_Key `pkey`.
    #[must_use]
    pub fn new(max_ids: usize, service_id: u64, link: LinkLayer, pkey: u16, seed: u32) -> Self {
        Self {
            conns: HashMap::new(),
            moves: HashMap::new(),
            commands: VecDeque::new(),
            events: VecDeque::new(),
            next_id: (seed % (PASSIVE_ID_BASE - 1)).max(1),
            max_ids,
            service_id,
            link,
            pkey,
            slot: WorkerId::SINGLE,
            stats: CmStats::default(),
        }
    }

    /// The CM of worker `slot` of an interface: its ids carry the worker's index in their
    /// low bits (and stay below [`PASSIVE_ID_BASE`]), so that the driver, which runs every
    /// worker's kernel CM ids on one event channel, hands each input to its worker.
    #[must_use]
    pub fn with_worker(mut self, slot: WorkerId) -> Self {
        self.slot = slot;
        self.next_id = (self.next_id % self.id_space()).max(1);
        self
    }

    /// How many untagged values the ids take: all tagged ids are below [`PASSIVE_ID_BASE`].
    fn id_space(&self) -> u32 {
        PASSIVE_ID_BASE >> self.slot.count().bits()
    }

    fn alloc_id(&mut self) -> Option<CommId> {
        let space = self.id_space();
        for _ in 0..=self.max_ids {
            let id = CommId(self.slot.tag(self.next_id));
            self.next_id = if self.next_id + 1 >= space {
                1
            } else {
                self.next_id + 1
            };
            if !self.conns.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    fn set(&mut self, id: CommId, state: CmState) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = state;
        }
    }

    fn forget(&mut self, id: CommId) -> Option<Conn> {
        self.moves.remove(&id);
        self.conns.remove(&id)
    }

    /// Queues the REQ of our QP (state ReqSent), to `p.service_id` as [`KcmTarget::choose`]
    /// reaches it.
    ///
    /// # Errors
    /// [`CmUseError::PrivateDataTooLong`] beyond 56 bytes, [`CmUseError::NoResources`] when
    /// `max_ids` ids are live.
    pub fn connect(&mut self, _now: Instant, p: ConnectParams) -> Result<CommId, CmUseError> {
        if p.private_data.len() > REQ_USER_DATA {
            return Err(CmUseError::PrivateDataTooLong);
        }
        if self.conns.len() >= self.max_ids {
            self.stats.ids_exhausted += 1;
            return Err(CmUseError::NoResources);
        }
        let id = self.alloc_id().ok_or(CmUseError::NoResources)?;
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqSent,
                active: true,
            },
        );
        self.commands.push_back(KcmCommand::Connect {
            id,
            peer: p.peer,
            target: KcmTarget::choose(self.link, self.service_id, p.service_id, self.pkey),
            qpn: p.local_qpn,
            private_data: p.private_data,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
        });
        Ok(id)
    }

    /// Queues the REP of a request (state RepSent); the QP is in RTS already.
    ///
    /// # Errors
    /// [`CmUseError::NoSuchId`], [`CmUseError::WrongState`] unless ReqRcvd,
    /// [`CmUseError::PrivateDataTooLong`] beyond 196 bytes.
    pub fn accept(&mut self, _now: Instant, id: CommId, p: AcceptParams) -> Result<(), CmUseError> {
        let c = self.conns.get(&id).ok_or(CmUseError::NoSuchId)?;
        if c.state != CmState::ReqRcvd {
            return Err(CmUseError::WrongState(c.state));
        }
        if p.private_data.len() > 196 {
            return Err(CmUseError::PrivateDataTooLong);
        }
        self.set(id, CmState::RepSent);
        self.moves.remove(&id);
        self.commands.push_back(KcmCommand::Accept {
            id,
            qpn: p.local_qpn,
            srq: p.srq,
            private_data: p.private_data,
            rnr_retry_count: p.rnr_retry_count,
        });
        Ok(())
    }

    /// Queues the REJ of a request or response; the id is gone at once.
    ///
    /// # Errors
    /// [`CmUseError::NoSuchId`]; [`CmUseError::WrongState`] from Established on.
    pub fn reject(
        &mut self,
        _now: Instant,
        id: CommId,
        _reason: RejReason,
    ) -> Result<(), CmUseError> {
        let c = self.conns.get(&id).ok_or(CmUseError::NoSuchId)?;
        match c.state {
            CmState::ReqSent | CmState::ReqRcvd | CmState::RepRcvd | CmState::RepSent => {}
            s => return Err(CmUseError::WrongState(s)),
        }
        self.forget(id);
        // rdma_reject sends REJ Consumer Defined whatever the reason: the kernel's CM has no
        // other for its users.
        self.stats.rej_sent += 1;
        self.commands.push_back(KcmCommand::Reject { id });
        Ok(())
    }

    /// Queues the RTU after a response (state Established; an [`CmEvent::Established`]
    /// follows).
    ///
    /// # Errors
    /// [`CmUseError::NoSuchId`], [`CmUseError::WrongState`] unless RepRcvd.
    pub fn rtu(&mut self, _now: Instant, id: CommId) -> Result<(), CmUseError> {
        let c = self.conns.get(&id).ok_or(CmUseError::NoSuchId)?;
        if c.state != CmState::RepRcvd {
            return Err(CmUseError::WrongState(c.state));
        }
        self.set(id, CmState::Established);
        self.moves.remove(&id);
        self.commands.push_back(KcmCommand::Establish { id });
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// The passive QP received before the RTU: `rdma_notify` (the kernel then reports
    /// `ESTABLISHED`). Ignored in any other state.
    pub fn notify_comm_est(&mut self, _now: Instant, id: CommId) {
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.state == CmState::RepSent)
        {
            self.commands.push_back(KcmCommand::Notify { id });
        }
    }

    /// Ends a connection: a DREQ from Established (state DreqSent); before it, the id is
    /// destroyed (the kernel's CM sends the REJ); from DreqSent, DreqRcvd or TimeWait,
    /// nothing.
    ///
    /// # Errors
    /// [`CmUseError::NoSuchId`].
    pub fn disconnect(&mut self, _now: Instant, id: CommId) -> Result<(), CmUseError> {
        let c = self.conns.get(&id).ok_or(CmUseError::NoSuchId)?;
        match c.state {
            CmState::Established => {
                self.set(id, CmState::DreqSent);
                self.commands.push_back(KcmCommand::Disconnect { id });
            }
            CmState::DreqSent | CmState::DreqRcvd | CmState::TimeWait => {}
            _ => {
                self.forget(id);
                self.commands.push_back(KcmCommand::Destroy { id });
            }
        }
        Ok(())
    }

    /// The state of a live id; `None` once it is gone.
    #[must_use]
    pub fn state(&self, id: CommId) -> Option<CmState> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// The QP moves of a request or response not yet accepted or established.
    #[must_use]
    pub fn qp_moves(&self, id: CommId) -> Option<QpMoves> {
        self.moves.get(&id).copied()
    }

    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<KcmCommand> {
        let c = self.commands.pop_front();
        super::trim_drained(&mut self.commands);
        c
    }

    /// The next event for the endpoint.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        let e = self.events.pop_front();
        super::trim_drained(&mut self.events);
        e
    }

    /// Counters (the fields that mean something here: `rej_sent`, `rej_received`,
    /// `timeouts`, `ids_exhausted`, `dropped_unknown`, `dropped_unexpected`).
    #[must_use]
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// Live ids.
    #[must_use]
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no id is live.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Takes what the driver read from the kernel's CM.
    pub fn handle_input(&mut self, _now: Instant, input: KcmInput) {
        let id = input.id();
        if let KcmInput::Request {
            peer,
            remote_qpn,
            private_data,
            moves,
            ..
        } = input
        {
            self.on_request(id, peer, remote_qpn, &private_data, moves);
            return;
        }
        let Some(c) = self.conns.get(&id).copied() else {
            // An id the endpoint already let go (rejected or destroyed): nothing to tell.
            self.stats.dropped_unknown += 1;
            if matches!(input, KcmInput::Response { .. }) {
                self.commands.push_back(KcmCommand::Reject { id });
            }
            return;
        };
        match input {
            KcmInput::Request { .. } => {}
            KcmInput::Response {
                remote_qpn,
                private_data,
                moves,
                ..
            } => {
                if c.state != CmState::ReqSent {
                    self.stats.dropped_unexpected += 1;
                    return;
                }
                self.set(id, CmState::RepRcvd);
                self.moves.insert(id, moves);
                let pd = padded::<196>(&private_data);
                self.events.push_back(CmEvent::RepReceived {
                    id,
                    remote_ca_guid: 0,
                    remote_qpn,
                    remote_psn: moves.rts.sq_psn.unwrap_or_default(),
                    rnr_retry_count: moves.rts.rnr_retry.unwrap_or(7),
                    private_data: pd,
                });
            }
            KcmInput::Established { .. } => {
                if c.state == CmState::RepSent {
                    self.set(id, CmState::Established);
                    self.events.push_back(CmEvent::Established { id });
                } else {
                    self.stats.dropped_unexpected += 1;
                }
            }
            KcmInput::Rejected { reason, .. } => {
                self.forget(id);
                self.stats.rej_received += 1;
                // rdma_cm hands no ARI to its users.
                self.events.push_back(CmEvent::Rejected {
                    id,
                    reason: RejReason::from_code(reason),
                    acceptable_mtu: None,
                });
            }
            KcmInput::Unreachable { .. } => {
                self.forget(id);
                self.stats.timeouts += 1;
                self.events
                    .push_back(CmEvent::TimedOut { id, state: c.state });
            }
            KcmInput::Disconnected { .. } => match c.state {
                CmState::Established => {
                    self.set(id, CmState::TimeWait);
                    self.events.push_back(CmEvent::DisconnectReceived { id });
                }
                CmState::DreqSent => {
                    self.set(id, CmState::TimeWait);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
                CmState::TimeWait | CmState::DreqRcvd => {}
                _ => {
                    // Before Established (the kernel ended a half-open id): a failure.
                    self.set(id, CmState::TimeWait);
                    self.events.push_back(CmEvent::Rejected {
                        id,
                        reason: RejReason::ConsumerDefined,
                        acceptable_mtu: None,
                    });
                }
            },
            KcmInput::TimewaitExit { .. } => {
                self.forget(id);
                self.events.push_back(CmEvent::TimeWaitExit { id });
            }
            KcmInput::DeviceRemoval { .. } => {
                self.forget(id);
                let e = if c.state == CmState::Established || !c.active {
                    CmEvent::DisconnectReceived { id }
                } else {
                    CmEvent::Rejected {
                        id,
                        reason: RejReason::ConsumerDefined,
                        acceptable_mtu: None,
                    }
                };
                self.events.push_back(e);
                self.events.push_back(CmEvent::TimeWaitExit { id });
            }
        }
    }

    fn on_request(
        &mut self,
        id: CommId,
        peer: Gid,
        remote_qpn: QpNum,
        private_data: &[u8],
        moves: QpMoves,
    ) {
        if self.conns.contains_key(&id) {
            self.stats.duplicates += 1;
            return;
        }
        if self.conns.len() >= self.max_ids {
            self.stats.ids_exhausted += 1;
            self.stats.rej_sent += 1;
            self.commands.push_back(KcmCommand::Reject { id });
            return;
        }
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqRcvd,
                active: false,
            },
        );
        self.moves.insert(id, moves);
        let pd = padded::<92>(private_data);
        let path_mtu = moves.rtr.path_mtu.unwrap_or(crate::verbs::PathMtu::Mtu1024);
        self.events.push_back(CmEvent::ReqReceived {
            id,
            peer,
            remote_ca_guid: 0,
            service_id: self.service_id,
            remote_qpn,
            remote_psn: moves.rts.sq_psn.unwrap_or_default(),
            path_mtu,
            // Informative only: the kernel's attributes (`qp_moves`) give the RX QP its
            // address vector; the local GID is the kernel's choice.
            path: crate::verbs::Path::roce(Gid::default(), peer, path_mtu),
            retry_count: moves.rts.retry_cnt.unwrap_or(7),
            rnr_retry_count: moves.rts.rnr_retry.unwrap_or(7),
            private_data: pd,
        });
    }
}

/// `data` in `N` bytes, zero-padded (or cut: the kernel never hands more than a CM message
/// holds).
fn padded<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    for (o, d) in out.iter_mut().zip(data) {
        *o = *d;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{PathMtu, Psn, QpState};
    use std::net::Ipv4Addr;

    fn moves() -> QpMoves {
        QpMoves {
            rtr: QpAttr {
                path_mtu: Some(PathMtu::Mtu1024),
                rq_psn: Some(Psn::new(5)),
                ..QpAttr::to_state(QpState::Rtr)
            },
            rts: QpAttr {
                sq_psn: Some(Psn::new(9)),
                ..QpAttr::to_state(QpState::Rts)
            },
        }
    }

    fn params(qpn: u32) -> ConnectParams {
        ConnectParams {
            peer: Gid::from(Ipv4Addr::new(10, 0, 0, 2)),
            service_id: 0,
            local_qpn: QpNum::new(qpn),
            starting_psn: Psn::new(0),
            path_mtu: PathMtu::Mtu1024,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            local_ack_timeout: 14,
            path: None,
            private_data: vec![1; 8],
        }
    }

    #[test]
    fn an_active_connection_runs_connect_response_establish_disconnect_timewait() {
        let now = Instant::now();
        let mut k = KernelCm::new(8, 0x13F_12B9, LinkLayer::Ethernet, 0xffff, 7);
        let id = k.connect(now, params(0x20)).unwrap();
        assert!(id.0 < PASSIVE_ID_BASE);
        assert!(
            matches!(k.poll_command(), Some(KcmCommand::Connect { qpn, .. }) if qpn.get() == 0x20)
        );
        k.handle_input(
            now,
            KcmInput::Response {
                id,
                remote_qpn: QpNum::new(0x31),
                private_data: vec![2; 8],
                moves: moves(),
            },
        );
        assert!(
            matches!(k.poll_event(), Some(CmEvent::RepReceived { remote_psn, .. }) if remote_psn == Psn::new(9))
        );
        assert_eq!(k.qp_moves(id), Some(moves()));
        k.rtu(now, id).unwrap();
        assert_eq!(k.poll_command(), Some(KcmCommand::Establish { id }));
        assert_eq!(k.poll_event(), Some(CmEvent::Established { id }));
        assert_eq!(k.qp_moves(id), None);
        k.disconnect(now, id).unwrap();
        assert_eq!(k.poll_command(), Some(KcmCommand::Disconnect { id }));
        k.disconnect(now, id).unwrap();
        assert_eq!(k.poll_command(), None, "one DREQ");
        k.handle_input(now, KcmInput::Disconnected { id });
        assert_eq!(k.poll_event(), Some(CmEvent::Disconnected { id }));
        assert_eq!(k.state(id), Some(CmState::TimeWait));
        k.handle_input(now, KcmInput::TimewaitExit { id });
        assert_eq!(k.poll_event(), Some(CmEvent::TimeWaitExit { id }));
        assert_eq!(k.state(id), None);
    }

    /// Link layer × the service a connection asks for (the rdma_cm service for a peer with
    /// flag `0x20`, its standard IPoIB-CM service ID for any other).
    #[test]
    fn the_target_is_af_ib_only_on_infiniband_and_only_off_the_rdma_cm_service() {
        const RDMA_CM: u64 = 0x13F_12B9;
        let standard = crate::wire::cm::ipoib_service_id(QpNum::new(0x48), true);
        assert_eq!(standard, 0x1000_0000_0000_0048);
        let cases = [
            (LinkLayer::Ethernet, RDMA_CM, KcmTarget::RdmaCmPort),
            (LinkLayer::Ethernet, standard, KcmTarget::RdmaCmPort),
            (LinkLayer::InfiniBand, RDMA_CM, KcmTarget::RdmaCmPort),
            (
                LinkLayer::InfiniBand,
                standard,
                KcmTarget::IbService {
                    service_id: standard,
                    pkey: 0xffff,
                },
            ),
        ];
        for (link, sid, want) in cases {
            assert_eq!(
                KcmTarget::choose(link, RDMA_CM, sid, 0xffff),
                want,
                "{link:?} {sid:#x}"
            );
            let mut k = KernelCm::new(4, RDMA_CM, link, 0xffff, 1);
            k.connect(
                Instant::now(),
                ConnectParams {
                    service_id: sid,
                    ..params(0x20)
                },
            )
            .unwrap();
            // `ipoib_cm_data` as it came, either way: rdma_cm frames the `AF_INET` REQ, and
            // puts nothing before it for `AF_IB`.
            assert!(matches!(
                k.poll_command(),
                Some(KcmCommand::Connect { target, private_data, .. })
                    if target == want && private_data == [1; 8]
            ));
        }
    }

    #[test]
    fn requests_beyond_the_cap_are_rejected_and_counted() {
        let now = Instant::now();
        let mut k = KernelCm::new(1, 0, LinkLayer::Ethernet, 0xffff, 1);
        let req = |n| KcmInput::Request {
            id: CommId(PASSIVE_ID_BASE + n),
            peer: Gid::from(Ipv4Addr::new(10, 0, 0, 2)),
            remote_qpn: QpNum::new(0x40 + n),
            private_data: vec![0; 56],
            moves: moves(),
        };
        k.handle_input(now, req(1));
        assert!(matches!(k.poll_event(), Some(CmEvent::ReqReceived { .. })));
        k.handle_input(now, req(2));
        assert_eq!(
            k.poll_command(),
            Some(KcmCommand::Reject {
                id: CommId(PASSIVE_ID_BASE + 2)
            })
        );
        assert_eq!(k.stats().ids_exhausted, 1);
        assert_eq!(k.len(), 1);
        assert!(
            k.connect(now, params(0x21)).is_err(),
            "the cap holds for ours too"
        );
    }

    #[test]
    fn a_response_for_an_id_let_go_is_rejected() {
        let now = Instant::now();
        let mut k = KernelCm::new(4, 0, LinkLayer::Ethernet, 0xffff, 1);
        let id = k.connect(now, params(0x20)).unwrap();
        k.disconnect(now, id).unwrap();
        let _ = k.poll_command();
        assert_eq!(k.poll_command(), Some(KcmCommand::Destroy { id }));
        k.handle_input(
            now,
            KcmInput::Response {
                id,
                remote_qpn: QpNum::new(1),
                private_data: vec![],
                moves: moves(),
            },
        );
        assert_eq!(k.poll_command(), Some(KcmCommand::Reject { id }));
        assert_eq!(k.poll_event(), None);
    }
}
