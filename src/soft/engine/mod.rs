//! [`SoftVerbs`]: the QP table beside the [`Device`], the [`Verbs`] implementation, and (in
//! the child modules) the datagrams in and out and the timers.

mod icrc_peers;
mod moves;
mod rx;
mod timers;
mod tx;

pub use moves::MOVES_LATER_BY;

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::config::{SoftConfig, MAX_RC_MSG};
use super::device::Device;
use super::fault::FaultInjector;
use super::objects::{QpTable, RecvInfo};
use super::qp::{Qp, RecvWqe, SendWqe};
use super::stats::SoftStats;
use crate::verbs::{
    check_modify, AsyncEvent, BufId, BufPools, Completion, CqId, Gid, Moved, Moves, PKey, PathMtu,
    PdId, PoolId, PortAttr, QpAttr, QpInit, QpNum, QpState, QpType, SendWr, SrqId, SrqInit, Verbs,
    VerbsError, WcStatus, WrId,
};
use crate::wire::icrc::Ipv4IdShiftCache;

/// The software RC/UD provider engine. See the [module docs](super).
#[derive(Debug)]
pub struct SoftVerbs {
    pub(super) qps: QpTable,
    pub(super) dev: Device,
    /// Transmit-side faults; bypassed while its configuration is clean.
    faults: FaultInjector,
    /// The packet being built while faults are injected (they take an owned copy).
    scratch: Vec<u8>,
    /// How IPv4 ICRCs change with the IP ID, by datagram length, to solve for the ID of a
    /// datagram whose ICRC fails with ID 0 (see [`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)).
    id_shifts: Ipv4IdShiftCache,
    /// Peers whose ICRCs checked only with a foreign nonzero IPv4 ID.
    id_solved_peers: icrc_peers::IdSolvedPeers,
    /// The context is lost ([`SoftVerbs::fail_device`]): every verb that can fail fails,
    /// nothing is sent, received or completed.
    lost: bool,
    /// When [`FaultConfig::device_fatal_after`](super::FaultConfig) makes the device fail:
    /// that long after the first [`SoftVerbs::handle_timeout`] (`None`: never, or not yet
    /// known).
    fatal_at: Option<Instant>,
    /// Moves started under [`Quirks::moves_later`](super::Quirks::moves_later).
    later: moves::LaterMoves,
}

impl SoftVerbs {
    /// A provider with the given configuration. No QP exists yet (not even QP1).
    pub fn new(cfg: SoftConfig) -> Self {
        Self {
            qps: QpTable::new(cfg.qpn_seed, cfg.workers),
            faults: FaultInjector::new(cfg.faults),
            dev: Device::new(cfg),
            scratch: Vec::with_capacity(8192),
            id_shifts: Ipv4IdShiftCache::default(),
            id_solved_peers: icrc_peers::IdSolvedPeers::default(),
            lost: false,
            fatal_at: None,
            later: moves::LaterMoves::default(),
        }
    }

    /// Loses the device context, as a firmware reset does (the fatal-event injection): raises
    /// [`AsyncEvent::DeviceFatal`] (the events queued before it are dropped); from now on
    /// every verb that can fail fails with [`VerbsError::DeviceLost`] (destroying objects
    /// excepted, as on hardware), no completion or event comes, and datagrams are neither
    /// sent nor received. Only a new engine ([`SoftProvider::reopen`](super::provider::SoftProvider))
    /// works again.
    pub fn fail_device(&mut self) {
        if self.lost {
            return;
        }
        self.lost = true;
        self.dev.events.clear();
        self.dev.events.push_back(AsyncEvent::DeviceFatal);
    }

    /// The context is lost ([`SoftVerbs::fail_device`]).
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// A fresh engine for the same device, as opening it again gives: no objects, a new QPN
    /// seed (the QPNs of a new context differ from the old one's), the multicast peers and
    /// the counters carried over, and no fatal event armed.
    pub fn reopened(&self, qpn_seed: u64) -> Self {
        let mut cfg = self.dev.cfg;
        cfg.qpn_seed = qpn_seed;
        cfg.faults.device_fatal_after = None;
        let mut new = Self::new(cfg);
        new.dev
            .mcast
            .set_peers(cfg.local_ip, self.dev.mcast.peers.clone());
        new.dev.stats = self.dev.stats;
        new.faults.carry_stats(&self.faults);
        new
    }

    /// `Err(DeviceLost)` once the context is lost.
    fn alive(&self) -> Result<(), VerbsError> {
        if self.lost {
            Err(VerbsError::DeviceLost)
        } else {
            Ok(())
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SoftConfig {
        &self.dev.cfg
    }

    /// Sets the port's active MTU ([`SoftConfig::port_mtu`]: what the underlay link carries
    /// now). QPs keep the path MTU they were moved to; a move to a larger one than this is
    /// refused from now on.
    pub fn set_port_mtu(&mut self, mtu: PathMtu) {
        self.dev.cfg.port_mtu = mtu;
    }

    /// Queues a port event (`LidChange`, `SmChange`, `ClientReregister`, `PkeyChange`,
    /// `PortActive`, `PortErr`, `GidChange`) as a subnet manager (or an address change)
    /// would cause it: the software fabric has no SM, so tests and tools stand in for one.
    /// Other events are ignored (the engine raises those itself).
    pub fn raise_port_event(&mut self, ev: AsyncEvent) {
        if matches!(
            ev,
            AsyncEvent::LidChange
                | AsyncEvent::SmChange
                | AsyncEvent::ClientReregister
                | AsyncEvent::PkeyChange
                | AsyncEvent::PortActive
                | AsyncEvent::PortErr
                | AsyncEvent::GidChange
        ) {
            self.dev.events.push_back(ev);
        }
    }

    /// Sets the underlay addresses that multicast UD sends (a destination GID starting with
    /// `ff`, the IPoIB broadcast group among them) are fanned out to, one unicast copy each.
    /// This is how the software provider carries IB multicast over an underlay without IP
    /// multicast ([`SoftConfig::multicast`] off, or peers off the link): receivers deliver a
    /// packet for QPN 0xFFFFFF that came by unicast to every UD QP attached to a group.
    pub fn set_mcast_peers(&mut self, peers: Vec<IpAddr>) {
        self.dev.mcast.set_peers(self.dev.cfg.local_ip, peers);
    }

    /// The IP multicast groups the attached MGIDs map to (none with [`SoftConfig::multicast`]
    /// off), sorted: the groups the provider's sockets must have joined. On an InfiniBand
    /// link: the beacon group and the group of each attached MLID.
    pub fn ip_multicast_groups(&self) -> Vec<IpAddr> {
        let local = self.dev.cfg.local_ip;
        if !self.dev.cfg.multicast {
            Vec::new()
        } else if self.dev.ib.is_some() {
            let mut g = vec![crate::soft::ib::beacon_group(local)];
            g.extend(
                self.dev
                    .mcast
                    .mlids()
                    .into_iter()
                    .map(|m| crate::soft::ib::mlid_group(m, local)),
            );
            g
        } else {
            self.dev.mcast.ip_groups(local)
        }
    }

    /// Sets what the InfiniBand port is ([`SoftLink::Infiniband`](crate::soft::SoftLink)):
    /// what the SM made of it, read from its SMA, at `now`. A change is beaconed at once,
    /// and from the first call on the port beacons every
    /// [`BEACON_INTERVAL`](crate::soft::ib::BEACON_INTERVAL). Nothing on a RoCEv2 link.
    pub fn set_ib_port(&mut self, now: Instant, mut attr: crate::soft::IbPortAttr) {
        let Some(ib) = self.dev.ib.as_mut() else {
            return;
        };
        attr.pkeys.truncate(crate::soft::ib::MAX_PKEYS);
        if ib.port != attr || ib.beacon_at.is_none() {
            ib.port_generation += u64::from(ib.port != attr);
            ib.port = attr;
            ib.beacon_at = Some(now);
        }
    }

    /// A number that changes whenever [`ib_port_view`](Self::ib_port_view) would give another
    /// view; 0 on RoCEv2.
    pub fn ib_port_view_generation(&self) -> u64 {
        self.dev
            .ib
            .as_ref()
            .map_or(0, crate::soft::ib::IbLink::view_generation)
    }

    /// What the other workers' providers copy of this InfiniBand port: its attributes and
    /// routes ([`IbPortView`](crate::soft::IbPortView)); `None` on RoCEv2.
    pub fn ib_port_view(&self) -> Option<crate::soft::IbPortView> {
        self.dev.ib.as_ref().map(crate::soft::ib::IbLink::view)
    }

    /// A follower's InfiniBand port becomes `view`, control's: its attributes and routes,
    /// wholesale (it neither beacons nor learns routes itself). The port events a device
    /// would raise for the change are raised: `PORT_ACTIVE` or `PORT_ERR` as it comes up or
    /// goes down, and while it stays active `LID_CHANGE`, `SM_CHANGE`, `PKEY_CHANGE`. Nothing
    /// on a RoCEv2 link.
    pub fn follow_ib_port(&mut self, view: &crate::soft::IbPortView) {
        let Some(ib) = self.dev.ib.as_mut() else {
            return;
        };
        let (old, new) = (&ib.port, view.port());
        let events = match (old.active, new.active) {
            (false, true) => vec![AsyncEvent::PortActive],
            (true, false) => vec![AsyncEvent::PortErr],
            (false, false) => Vec::new(),
            (true, true) => [
                (
                    (old.lid, old.lmc) != (new.lid, new.lmc),
                    AsyncEvent::LidChange,
                ),
                (old.sm_lid != new.sm_lid, AsyncEvent::SmChange),
                (old.pkeys != new.pkeys, AsyncEvent::PkeyChange),
            ]
            .into_iter()
            .filter_map(|(changed, ev)| changed.then_some(ev))
            .collect(),
        };
        ib.port_generation += u64::from(ib.port != *new);
        ib.port = new.clone();
        ib.routes = view.routes_table().clone();
        for ev in events {
            self.raise_port_event(ev);
        }
    }

    /// The InfiniBand port's attributes; `None` on a RoCEv2 link.
    pub fn ib_port(&self) -> Option<&crate::soft::IbPortAttr> {
        self.dev.ib.as_ref().map(|ib| &ib.port)
    }

    /// Routes the InfiniBand link holds (ports heard beaconing); 0 on RoCEv2.
    pub fn ib_routes(&self) -> usize {
        self.dev.ib.as_ref().map_or(0, |ib| ib.routes.len())
    }

    /// Changes whenever a multicast group gains its first member or loses its last one (then
    /// [`ip_multicast_groups`](Self::ip_multicast_groups) may have changed).
    pub fn multicast_generation(&self) -> u64 {
        self.dev.mcast.generation()
    }

    /// The peers whose IPv4 ICRCs were first seen, since the last call, to check only with a
    /// nonzero IP ID that is no GSO segment index of ours (a sender that picks its own IDs,
    /// such as Linux `rdma_rxe`); each peer is handed out once, at most 64 are remembered
    /// (the rest are counted in [`SoftStats::icrc_id_peers_untracked`]).
    pub fn take_id_solved_peers(&mut self) -> Vec<IpAddr> {
        self.id_solved_peers.take()
    }

    /// Bytes the room for `packets` requests held out of sequence takes
    /// ([`SoftConfig::reorder_hold_packets`]), once taken.
    pub const fn reorder_hold_bytes(packets: usize) -> usize {
        crate::soft::reorder::HoldBudget::bytes_for(packets)
    }

    /// Takes the room for requests held out of sequence now and writes it through, so that
    /// its memory is the process's from the start rather than at the first reordering (a
    /// new engine leaves it until first needed, which keeps simulated fabrics cheap).
    pub fn commit_reorder_hold(&mut self) {
        self.dev.hold_budget.commit();
    }

    /// Counters.
    pub fn stats(&self) -> SoftStats {
        let mut s = self.dev.stats;
        s.faults = self.faults.stats();
        s.rx_held_now = self.dev.hold_budget.held() as u64;
        s
    }

    /// The UDP address packets for `gid` are sent to.
    pub fn peer_addr(&self, gid: Gid) -> SocketAddr {
        SocketAddr::new(gid.to_ip(), self.dev.cfg.dst_port)
    }

    fn qp(&self, qpn: QpNum) -> Result<&Qp, VerbsError> {
        self.qps.get(qpn).ok_or(VerbsError::NoSuchQp(qpn))
    }
}

impl Verbs for SoftVerbs {
    fn port_attr(&self) -> PortAttr {
        match &self.dev.ib {
            // What fits the underlay and the IB port's MTU both.
            Some(ib) => PortAttr {
                gid: ib.port.gid,
                active_mtu: self.dev.cfg.port_mtu.min(ib.port.mtu),
                max_mtu: PathMtu::Mtu4096,
                max_msg_size: MAX_RC_MSG,
                active: ib.port.active,
                lids: Some(crate::verbs::PortLids {
                    lid: ib.port.lid,
                    lmc: ib.port.lmc,
                    sm_lid: ib.port.sm_lid,
                    sm_sl: ib.port.sm_sl,
                }),
            },
            None => PortAttr {
                gid: Gid::from_ip(self.dev.cfg.local_ip),
                active_mtu: self.dev.cfg.port_mtu,
                max_mtu: PathMtu::Mtu4096,
                max_msg_size: MAX_RC_MSG,
                active: true,
                lids: None,
            },
        }
    }

    /// RoCEv2: the table has one entry, [`SoftConfig::pkey`], at index 0. InfiniBand: the
    /// port's table as the SM set it.
    fn pkey_index(&self, pkey: PKey) -> Result<u16, VerbsError> {
        if let Some(ib) = &self.dev.ib {
            return ib
                .port
                .pkey_index(pkey.0)
                .ok_or(VerbsError::NoSuchPKey(pkey.0));
        }
        if self.dev.cfg.pkey.same_partition(pkey) {
            Ok(0)
        } else {
            Err(VerbsError::NoSuchPKey(pkey.0))
        }
    }

    fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        self.alive()?;
        Ok(self.dev.objects.alloc_pd())
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        self.dev.objects.dealloc_pd(pd)
    }

    fn create_pool(
        &mut self,
        pd: PdId,
        buf_len: usize,
        count: usize,
    ) -> Result<PoolId, VerbsError> {
        self.alive()?;
        self.dev.objects.create_pool(pd, buf_len, count)
    }

    fn pools(&self) -> &BufPools {
        &self.dev.objects.pools
    }

    fn pools_mut(&mut self) -> &mut BufPools {
        &mut self.dev.objects.pools
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError> {
        self.alive()?;
        Ok(self.dev.objects.create_cq(depth))
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        let in_use = self.qps.uses_cq(cq);
        self.dev.objects.destroy_cq(cq, in_use)
    }

    fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.lost {
            return 0;
        }
        self.dev.objects.poll_cq(cq, out, max)
    }

    fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError> {
        self.alive()?;
        self.dev.objects.create_srq(init)
    }

    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        self.alive()?;
        self.dev.objects.modify_srq(srq, limit)
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        self.alive()?;
        self.dev.objects.post_srq_recv(srq, wr_id, buf)
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        self.dev.objects.destroy_srq(srq)
    }

    fn srq_posted(&self, srq: SrqId) -> Result<usize, VerbsError> {
        self.dev.objects.srq_posted(srq)
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpNum, VerbsError> {
        self.alive()?;
        self.dev.objects.check_qp_init(init)?;
        if self.qps.len() >= self.dev.cfg.max_qps {
            return Err(VerbsError::OutOfResources("QPs"));
        }
        let num = if init.qp_type == QpType::Gsi {
            if self.qps.contains(QpNum::GSI) {
                return Err(VerbsError::OutOfResources("QP1 exists"));
            }
            QpNum::GSI
        } else {
            self.qps
                .alloc_qpn()
                .ok_or(VerbsError::OutOfResources("QPNs"))?
        };
        self.dev.objects.add_qp_user(init);
        let default_mtu = self.dev.cfg.port_mtu;
        self.qps
            .insert(Qp::new(num, init.qp_type, init, default_mtu));
        Ok(num)
    }

    fn modify_qp(&mut self, qpn: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
        self.settle(qpn);
        self.modify_now(qpn, attr)
    }

    /// Under [`Quirks::moves_later`](super::Quirks::moves_later), queues the moves for the
    /// engine's timers ([`moves::MOVES_LATER_BY`] later); else does them now.
    fn begin_moves(&mut self, qp: QpNum, attrs: &[QpAttr]) -> Result<Moves, VerbsError> {
        self.alive()?;
        self.qp(qp)?;
        if !self.dev.cfg.quirks.moves_later {
            for a in attrs {
                self.modify_qp(qp, a)?;
            }
            return Ok(Moves::Done);
        }
        self.dev.stats.moves_started += 1;
        self.later.start(qp, attrs);
        Ok(Moves::Started)
    }

    fn poll_moved(&mut self) -> Option<Moved> {
        self.later.next_done()
    }

    fn query_qp_state(&self, qp: QpNum) -> Result<QpState, VerbsError> {
        Ok(self.qp(qp)?.state)
    }

    fn post_send(&mut self, qpn: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
        self.settle(qpn);
        self.post_send_now(qpn, wr)
    }

    fn post_recv(&mut self, qpn: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        self.settle(qpn);
        self.post_recv_now(qpn, wr_id, buf)
    }
    fn destroy_qp(&mut self, qpn: QpNum) -> Result<(), VerbsError> {
        self.later.forget(qpn);
        let mut qp = self.qps.remove(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        self.dev.drop_held(&mut qp);
        if self.dev.cfg.quirks.clean_cq_on_destroy {
            self.dev.objects.clean_cqs_of(&qp);
        }
        self.dev.objects.release_qp(&qp);
        self.dev.mcast.forget(qpn);
        Ok(())
    }

    /// Destroys the QP at once, as [`Verbs::destroy_qp`] does, and counts a caller that
    /// retired a QP with work still outstanding ([`SoftStats::retired_undrained`]): a send or
    /// a receive of its own posted and not completed, a message half received, or a
    /// completion not polled. A provider that destroys later (the hardware provider) may lose
    /// such work.
    fn retire_qp(&mut self, qpn: QpNum) -> Result<(), VerbsError> {
        let qp = self.qp(qpn)?;
        let undrained = !qp.req.sq.is_empty()
            || !qp.rq.is_empty()
            || qp.resp.filling.is_some()
            || self.dev.objects.has_completions_of(qp);
        self.dev.stats.qps_retired += 1;
        if undrained {
            self.dev.stats.retired_undrained += 1;
        }
        self.destroy_qp(qpn)
    }

    fn qp_count(&self) -> usize {
        self.qps.len()
    }

    fn attach_mcast(&mut self, qpn: QpNum, mgid: Gid, mlid: u16) -> Result<(), VerbsError> {
        self.alive()?;
        let qp = self.qps.get(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if qp.qp_type != QpType::Ud || mgid.0[0] != 0xFF {
            return Err(VerbsError::InvalidWr(
                "multicast needs a UD QP and an ff00::/8 MGID",
            ));
        }
        self.dev.mcast.attach(qpn, mgid, mlid);
        Ok(())
    }

    fn detach_mcast(&mut self, qpn: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        self.alive()?;
        self.dev.mcast.detach(qpn, mgid)
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.dev.events.pop_front()
    }
}

/// The verbs a later move ([`moves`]) waits for, done at once, and the later moves.
impl SoftVerbs {
    /// Does the moves that are due at `now`.
    fn do_due_moves(&mut self, now: Instant) {
        while let Some((qp, attrs)) = self.later.pop_due(now) {
            self.do_moves(qp, &attrs);
        }
    }

    /// Does `qp`'s moves now, if any wait: a verb on it finds them done.
    fn settle(&mut self, qp: QpNum) {
        for attrs in self.later.take_waiting(qp) {
            self.dev.stats.moves_settled += 1;
            self.do_moves(qp, &attrs);
        }
    }

    fn do_moves(&mut self, qp: QpNum, attrs: &[QpAttr]) {
        let result = attrs.iter().try_for_each(|a| self.modify_now(qp, a));
        self.later.push_done(Moved { qp, result });
    }

    fn modify_now(&mut self, qpn: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
        self.alive()?;
        let port_mtu = self.dev.cfg.port_mtu;
        let local_v4 = self.dev.cfg.local_ip.is_ipv4();
        let ib_pkeys = self.dev.ib.as_ref().map(|ib| ib.port.pkeys.len());
        let qp = self.qps.get_mut(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        check_modify(qp.qp_type, qp.state, attr)?;
        // RoCEv2: the P_Key table has one entry; InfiniBand: the port's.
        let pkey_entries = ib_pkeys.unwrap_or(1);
        if attr
            .pkey_index
            .is_some_and(|i| usize::from(i) >= pkey_entries)
        {
            return Err(VerbsError::InvalidAttribute("pkey_index"));
        }
        if attr.path_mtu.is_some_and(|m| m > port_mtu) {
            return Err(VerbsError::InvalidAttribute("path_mtu"));
        }
        if let (Some(av), Some(_)) = (attr.av, ib_pkeys) {
            // InfiniBand routes by the DLID (and a GRH's DGID names a GID, not an address).
            if av.dlid == crate::verbs::Lid::NONE {
                return Err(VerbsError::InvalidAttribute("av without a DLID"));
            }
        } else if let Some(av) = attr.av {
            // RoCEv2 routes by the GRH's destination: an address vector without one (an IB
            // LID route) names no IP address (rxe: `rdma_check_ah_attr`).
            match av.dgid() {
                None => return Err(VerbsError::InvalidAttribute("av without a GRH")),
                Some(g) if g.to_ip().is_ipv4() != local_v4 => {
                    return Err(VerbsError::InvalidAttribute("av"))
                }
                Some(_) => {}
            }
        }
        let to = attr.state.unwrap_or(qp.state);
        qp.apply_attrs(attr);
        match to {
            QpState::Err => self.dev.enter_error(qp),
            QpState::Reset => {
                // Reset drains the queues without completions (rxe_qp_reset).
                for w in qp.req.sq.drain(..) {
                    if let Some(b) = w.wr.buf {
                        self.dev.objects.pools.release(b);
                    }
                }
                for w in qp.rq.drain(..) {
                    self.dev.objects.pools.release(w.buf);
                }
                if let Some(f) = qp.resp.filling.take() {
                    self.dev.objects.pools.release(f.wqe.buf);
                }
                self.dev.drop_held(qp);
                qp.reset();
            }
            QpState::Sqd => {
                // `SqDrained` is raised when the WQEs already begun have completed, which
                // may be now or after their ACKs arrive.
                qp.state = QpState::Sqd;
                qp.sqd_notify |= attr.en_sqd_async_notify == Some(true);
                self.dev.check_sq_drained(qp);
            }
            s => {
                qp.state = s;
                qp.sqd_notify = false;
            }
        }
        if qp.has_work() {
            self.dev.sched.mark_ready(qp);
        }
        Ok(())
    }

    fn post_send_now(&mut self, qpn: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
        self.alive()?;
        let port_mtu = self.dev.cfg.port_mtu.bytes();
        let ib = self.dev.ib.is_some();
        let qp = self.qps.get_mut(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(VerbsError::InvalidState {
                qp: qpn,
                state: qp.state,
            });
        }
        if qp.req.sq.len() >= qp.max_send_wr.max(1) as usize {
            return Err(VerbsError::QueueFull);
        }
        let limit = match qp.qp_type {
            QpType::Rc => MAX_RC_MSG,
            QpType::Ud | QpType::Gsi => {
                match wr.ud {
                    None => return Err(VerbsError::InvalidWr("UD send without a destination")),
                    Some(d) if ib && d.av.dlid == crate::verbs::Lid::NONE => {
                        return Err(VerbsError::InvalidWr("UD send without a DLID"))
                    }
                    Some(d) if !ib && d.av.grh.is_none() => {
                        return Err(VerbsError::InvalidWr("UD send without a GRH"))
                    }
                    Some(_) => {}
                }
                port_mtu
            }
        };
        let buf_len = match wr.buf {
            Some(b) => self.dev.objects.pools.buf_len(b.pool)?,
            None => 0,
        };
        if wr.len > limit.min(buf_len) {
            return Err(VerbsError::TooLong {
                len: wr.len,
                limit: limit.min(buf_len),
            });
        }
        if let Some(b) = wr.buf {
            self.dev.objects.pools.lend(b)?;
        }
        let w = SendWqe {
            wr: *wr,
            first_psn: qp.req.psn,
            npkts: 0,
        };
        if qp.state == QpState::Err {
            if self.dev.cfg.quirks.drain_never {
                qp.swallowed.extend(wr.buf);
            } else {
                self.dev.complete_send(qp, &w, WcStatus::WrFlushErr);
            }
            return Ok(());
        }
        qp.req.sq.push_back(w);
        if qp.has_work() {
            self.dev.sched.mark_ready(qp);
        }
        Ok(())
    }

    fn post_recv_now(&mut self, qpn: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        self.alive()?;
        let qp = self.qps.get_mut(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if qp.srq.is_some() {
            return Err(VerbsError::UsesSrq(qpn));
        }
        if qp.state == QpState::Reset {
            return Err(VerbsError::InvalidState {
                qp: qpn,
                state: qp.state,
            });
        }
        if qp.rq.len() >= qp.max_recv_wr.max(1) as usize {
            return Err(VerbsError::QueueFull);
        }
        self.dev.objects.pools.lend(buf)?;
        let wqe = RecvWqe { wr_id, buf };
        if qp.state == QpState::Err {
            if self.dev.cfg.quirks.drain_never {
                qp.swallowed.push(buf);
            } else {
                self.dev
                    .complete_recv(qp, wqe, WcStatus::WrFlushErr, RecvInfo::default());
            }
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }
}
