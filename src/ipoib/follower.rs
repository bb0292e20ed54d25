//! An endpoint as one of several workers of an interface (`--workers N`).
//!
//! Worker 0 is the control side's endpoint: whole, as with one worker (the UD QP, ARP and ND,
//! multicast, the neighbour table, datagram sends), and it also carries what the others hand
//! it. Every other worker's endpoint is a *follower*: it has its own provider, CQs, SRQ,
//! connections in both directions, reaper and timers, its CM's comm ids tagged with its index
//! ([`crate::wire::WorkerId`]) and its QPNs too (the provider's), and it speaks with the
//! interface's hardware address (control's UD QPN). What it does not own it asks control for:
//!
//! - it reads control's resolved neighbours from a [`NeighView`] that control publishes when
//!   they change ([`Endpoint::neighbour_view`], [`Endpoint::set_neighbour_view`]);
//! - a packet for a neighbour not in the view waits on the worker (at most
//!   [`FOLLOWER_WAIT_MAX`] packets, each at most [`FOLLOWER_WAIT`]) while control resolves it
//!   ([`FollowerRequest::Resolve`]); it leaves, in order, when the view names the neighbour, so a
//!   flow's packets never take two connections;
//! - multicast and broadcast packets, packets for a peer reached by datagrams, and packets
//!   for a peer that takes one connection from us ([`HwAddr::takes_conn_per_worker`] clear: Linux
//!   `ipoib_cm`, older daemons of ours) go to control to send ([`FollowerRequest::Packet`]): one
//!   connection carries all of that peer's packets, in the order each worker handed them;
//! - the neighbours it sent to are reported to control for their ageing
//!   ([`Endpoint::take_used_neighbours`], [`Endpoint::neighbours_used`]), and a connection of
//!   its that failed (a restarted or vanished peer) for control to resolve its neighbours
//!   again ([`FollowerRequest::Failed`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event::TxCloseReason;
use super::restart::Incarnation;
use super::{Endpoint, Mode, TxState};
use crate::verbs::{Gid, Path, QpNum, Verbs};
use crate::wire::ipoib::classify;
use crate::wire::ipoib::HwAddr;
use crate::wire::WorkerId;

/// Most packets a follower holds for neighbours control is resolving.
pub const FOLLOWER_WAIT_MAX: usize = 256;

/// How long a packet waits for its neighbour's resolution on a follower before it is dropped
/// (counted in `tx_dropped`): longer than control's resolution takes to give up.
pub const FOLLOWER_WAIT: Duration = Duration::from_secs(4);

/// How often a follower asks control again to resolve a neighbour its packets wait for.
const RESOLVE_AGAIN: Duration = Duration::from_millis(500);

/// Most requests a follower holds for its driver to take ([`Endpoint::poll_to_control`]);
/// more are dropped (packets counted in `tx_dropped`).
pub const TO_CONTROL_MAX: usize = 1024;

/// Control's resolved neighbours, as the workers see them: IP address → hardware address,
/// and, where an SA holds the paths (a native InfiniBand port), control's path to each of
/// their GIDs that has one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NeighView {
    entries: HashMap<IpAddr, HwAddr>,
    /// `None` without an SA: every GID has its RoCE path at once.
    paths: Option<HashMap<Gid, Path>>,
}

impl FromIterator<(IpAddr, HwAddr)> for NeighView {
    fn from_iter<I: IntoIterator<Item = (IpAddr, HwAddr)>>(entries: I) -> Self {
        Self {
            entries: entries.into_iter().collect(),
            paths: None,
        }
    }
}

impl NeighView {
    /// The hardware address of `ip`, if control has it resolved.
    pub fn get(&self, ip: &IpAddr) -> Option<HwAddr> {
        self.entries.get(ip).copied()
    }

    /// How many neighbours it names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it names none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The view with control's paths, as an SA gave them (see [`NeighView::holds_paths`]).
    #[must_use]
    pub fn with_paths(mut self, paths: impl IntoIterator<Item = (Gid, Path)>) -> Self {
        self.paths = Some(paths.into_iter().collect());
        self
    }

    /// Whether control's paths come from an SA: a connection a follower opens waits for
    /// its GID's path in the view.
    pub fn holds_paths(&self) -> bool {
        self.paths.is_some()
    }
}

/// What makes the endpoints of several workers one interface to its peers: control's
/// hardware address (its UD QPN and GID, which the CM's service IDs name) and its CA GUID
/// (in every REQ and REP: a peer takes a new one for a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interface {
    /// Control's hardware address.
    pub hwaddr: HwAddr,
    /// Control's CA GUID.
    pub ca_guid: u64,
}

/// What a follower asks of control ([`Endpoint::poll_to_control`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerRequest {
    /// An IP packet only control sends (multicast, broadcast, datagram mode, a peer that takes
    /// one connection from us): control handles it as one read from its own TUN queue.
    Packet(Vec<u8>),
    /// Packets for this neighbour wait on the worker: control resolves it.
    Resolve(IpAddr),
    /// The worker's connection to this peer failed (REJ, timeout, stall, send error): control
    /// resolves the neighbours bound to it again, that peer barred, as for a connection of its
    /// own ([`Endpoint::binding_failed_at`]).
    Failed(HwAddr),
    /// A connection of the node at `gid` established on the worker comes from a new
    /// incarnation of it (another UD QPN or CA GUID than connections held for it, the same
    /// proof as on control, `restart.rs`): control closes the old one's connections and
    /// forgets its neighbours ([`Endpoint::peer_restarted`]).
    Restarted {
        /// The node.
        gid: Gid,
        /// Its new incarnation's UD QPN.
        ud_qpn: QpNum,
        /// Its new incarnation's CA GUID.
        ca_guid: Option<u64>,
    },
}

/// The follower part of a worker's endpoint.
#[derive(Debug)]
pub(super) struct Follower {
    view: Arc<NeighView>,
    /// Packets waiting for their neighbours, oldest first: when they arrived, where to.
    waiting: VecDeque<(Instant, IpAddr, Vec<u8>)>,
    /// When control was last asked to resolve each neighbour packets wait for.
    asked: BTreeMap<IpAddr, Instant>,
    to_control: VecDeque<FollowerRequest>,
    /// Neighbours sent to since control last heard (at most the neighbour table's size).
    used: BTreeSet<IpAddr>,
    used_max: usize,
    /// The UD QPN each GID of the view had when last named (see
    /// [`Endpoint::follow_view_changes`]).
    last_named: HashMap<Gid, QpNum>,
}

impl Follower {
    pub(super) fn new(used_max: usize) -> Self {
        Self {
            view: Arc::default(),
            waiting: VecDeque::new(),
            asked: BTreeMap::new(),
            to_control: VecDeque::new(),
            used: BTreeSet::new(),
            used_max,
            last_named: HashMap::new(),
        }
    }

    pub(super) fn lookup(&self, ip: &IpAddr) -> Option<HwAddr> {
        self.view.get(ip)
    }

    pub(super) fn note_used(&mut self, ip: IpAddr) {
        if self.used.len() < self.used_max {
            self.used.insert(ip);
        }
    }

    /// Queues `m` for control; false (dropped) at [`TO_CONTROL_MAX`].
    fn ask(&mut self, m: FollowerRequest) -> bool {
        if self.to_control.len() >= TO_CONTROL_MAX {
            return false;
        }
        self.to_control.push_back(m);
        true
    }

    /// When the oldest waiting packet expires.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.waiting.front().map(|(at, _, _)| *at + FOLLOWER_WAIT)
    }
}

impl Endpoint {
    /// Whether this endpoint is a follower (a worker other than 0 of a multi-worker
    /// interface).
    pub fn is_follower(&self) -> bool {
        self.follower.is_some()
    }

    /// What the followers of this (control's) endpoint take from it.
    pub fn interface(&self) -> Interface {
        Interface {
            hwaddr: self.hwaddr,
            ca_guid: self.ca_guid,
        }
    }

    /// The worker this endpoint is ([`WorkerId::SINGLE`] for a whole interface).
    pub fn worker_slot(&self) -> WorkerId {
        self.cfg.worker
    }

    /// Control's resolved neighbours, for the followers: every entry with a hardware
    /// address that is not still being resolved. O(neighbours); call it when
    /// [`Endpoint::neighbour_generation`] moved.
    pub fn neighbour_view(&self) -> NeighView {
        let entries: HashMap<IpAddr, HwAddr> = self
            .neigh
            .iter()
            .filter_map(|(ip, n)| n.resolved().map(|hw| (*ip, hw)))
            .collect();
        let view = NeighView {
            entries,
            paths: None,
        };
        if !self.uses_sa_groups() {
            return view;
        }
        let gids: HashSet<Gid> = view.entries.values().map(|hw| hw.gid).collect();
        let paths: Vec<(Gid, Path)> = self.paths.of(gids.into_iter()).collect();
        view.with_paths(paths)
    }

    /// A number that changes whenever a neighbour's resolved address, or a path, may have.
    pub fn neighbour_generation(&self) -> u64 {
        self.neigh
            .generation()
            .wrapping_add(self.paths.generation())
    }

    /// Control: a follower's packets wait for `ip`: resolve it unless it is known or being
    /// resolved already; where an SA holds the paths, ask for the path of a neighbour known
    /// without one (its packets wait for it on the follower).
    pub fn resolve_for_worker<V: Verbs>(&mut self, now: Instant, v: &mut V, ip: IpAddr) {
        if let Some(hw) = self.neigh.get(&ip).and_then(super::neigh::Neigh::resolved) {
            self.want_path(hw.gid);
            return;
        }
        if self.stopping || self.neigh.contains(&ip) || !self.on_link(ip) {
            return;
        }
        if self.start_resolving(now, ip) {
            self.resolve(now, v, ip);
        }
    }

    /// Control: a follower's connection to `hw` failed: the neighbours bound to that peer are
    /// resolved again, as when a connection of control's fails.
    pub fn binding_failed_at<V: Verbs>(&mut self, now: Instant, v: &mut V, hw: HwAddr) {
        for ip in self.neigh.bound_to(&hw) {
            self.binding_failed(now, v, ip, true);
        }
    }

    /// Control: a follower saw the node at `gid` restart as (`ud_qpn`, `ca_guid`): its
    /// other incarnations' connections close and their neighbours are forgotten, as when
    /// control sees it itself.
    pub fn peer_restarted<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        gid: Gid,
        ud_qpn: QpNum,
        ca_guid: Option<u64>,
    ) {
        let inc = Incarnation { ud_qpn, ca_guid };
        self.retire_old_incarnations(now, v, gid, inc, None);
    }

    /// Follower: tells control that the node at `gid` restarted as `inc`.
    pub(super) fn tell_restarted(&mut self, gid: Gid, inc: Incarnation) {
        if let Some(f) = self.follower.as_mut() {
            let _ = f.ask(FollowerRequest::Restarted {
                gid,
                ud_qpn: inc.ud_qpn,
                ca_guid: inc.ca_guid,
            });
        }
    }

    /// Follower: tells control that its connection to `peer` failed.
    pub(super) fn tell_binding_failed(&mut self, peer: HwAddr) {
        if let Some(f) = self.follower.as_mut() {
            let _ = f.ask(FollowerRequest::Failed(peer));
        }
    }

    /// Control: the followers sent to these neighbours (their ageing counts it as use).
    pub fn neighbours_used(&mut self, now: Instant, ips: &[IpAddr]) {
        for ip in ips {
            if let Some(id) = self.neigh.find(ip) {
                self.neigh.touch(id, now);
            }
        }
    }

    /// Follower: control's neighbours (and paths) from now on. Packets that waited for one of
    /// them (and for its path, where an SA holds the paths) leave, in order.
    pub fn set_neighbour_view<V: Verbs>(&mut self, now: Instant, v: &mut V, view: Arc<NeighView>) {
        let Some(f) = self.follower.as_mut() else {
            return;
        };
        f.view = view;
        self.follow_view_paths(now, v);
        let waiting = self
            .follower
            .as_mut()
            .map(|f| std::mem::take(&mut f.waiting))
            .unwrap_or_default();
        let mut left = VecDeque::with_capacity(waiting.len());
        for (at, ip, packet) in waiting {
            if self.follower_may_send(&ip) {
                self.follow_packet(now, v, &packet);
            } else {
                left.push_back((at, ip, packet));
            }
        }
        let ready: HashSet<IpAddr> = self
            .follower
            .as_ref()
            .map(|f| {
                f.asked
                    .keys()
                    .copied()
                    .filter(|ip| self.follower_may_send(ip))
                    .collect()
            })
            .unwrap_or_default();
        if let Some(f) = self.follower.as_mut() {
            f.asked.retain(|ip, _| !ready.contains(ip));
            // Packets may have queued again while those left: keep the order.
            left.extend(f.waiting.drain(..));
            f.waiting = left;
        }
        self.follow_view_changes(now, v);
    }

    /// Follower: whether a packet for `ip` leaves now: the view names it, and a connection
    /// this worker would open to it has its path (where control's paths come from an SA: a
    /// REQ carries the path's LIDs) or is open already.
    fn follower_may_send(&self, ip: &IpAddr) -> bool {
        let Some(f) = self.follower.as_ref() else {
            return false;
        };
        f.lookup(ip)
            .is_some_and(|hw| !self.follower_waits_for_path(hw))
    }

    /// Follower: whether a packet to `hw` waits for its path: this worker sends it (over its
    /// own connection), control's paths come from an SA, and neither a path nor a connection
    /// to `hw` is here yet.
    fn follower_waits_for_path(&self, hw: HwAddr) -> bool {
        self.follower.as_ref().is_some_and(|f| f.view.holds_paths())
            && self.sends_itself(hw)
            && self.paths.get(&hw.gid).is_none()
            && self.tx.to_peer(hw).is_none()
    }

    /// Follower: whether packets to `hw` leave over this worker's own connection (else
    /// control sends them).
    fn sends_itself(&self, hw: HwAddr) -> bool {
        hw.connectable() && hw.takes_conn_per_worker() && self.cfg.mode == Mode::Connected
    }

    /// Follower: its paths become control's ([`NeighView::path`]), where an SA holds them. A
    /// connection whose peer's path moved to another LID closes (the next packet opens one
    /// on the new path), as control closes its own ([`Endpoint::set_sa_path`]); a path
    /// control forgot (a port event) is forgotten, and connections open stay until the
    /// view's neighbours or the port say otherwise.
    fn follow_view_paths<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        let Some(view) = self.follower.as_ref().map(|f| Arc::clone(&f.view)) else {
            return;
        };
        let Some(paths) = view.paths.as_ref() else {
            return;
        };
        let gone: Vec<Gid> = self
            .paths
            .gids()
            .filter(|g| !paths.contains_key(g))
            .collect();
        for gid in gone {
            self.clear_path(gid);
        }
        for (gid, path) in paths {
            if self.paths.get(gid) == Some(path) {
                continue;
            }
            self.set_path(*gid, *path);
            let moved: Vec<QpNum> = self
                .tx
                .to_node(*gid)
                .into_iter()
                .filter(|q| self.tx.get(q).is_some_and(|t| t.dlid != path.dlid))
                .collect();
            for q in moved {
                self.close_tx(now, v, q, TxCloseReason::PathMoved, None);
            }
        }
    }

    /// Follower: what control decided for its neighbours, done to this worker's connections
    /// (control does it to its own as it decides). A GID the view names with another UD QPN
    /// than the one it last named restarted (control replaced or re-resolved the mapping only
    /// on the peer's own word, `restart.rs`): every connection of its other incarnations
    /// goes. A TX connection to a hardware address the view no longer names was aged out (or
    /// its node restarted): it closes, as control's did with the entry. O(view +
    /// connections), once per view.
    fn follow_view_changes<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        let Some(f) = self.follower.as_mut() else {
            return;
        };
        let named: HashMap<Gid, QpNum> =
            f.view.entries.values().map(|hw| (hw.gid, hw.qpn)).collect();
        let restarted: Vec<(Gid, QpNum)> = named
            .iter()
            .filter(|(gid, qpn)| f.last_named.get(gid).is_some_and(|old| old != *qpn))
            .map(|(gid, qpn)| (*gid, *qpn))
            .collect();
        let reachable: HashSet<(Gid, QpNum)> =
            f.view.entries.values().map(|hw| (hw.gid, hw.qpn)).collect();
        for (gid, ud_qpn) in restarted {
            let inc = Incarnation {
                ud_qpn,
                ca_guid: None,
            };
            self.retire_old_incarnations(now, v, gid, inc, None);
        }
        let gone: Vec<QpNum> = self
            .tx
            .iter()
            .filter(|(_, t)| t.state != TxState::Closing)
            .filter(|(_, t)| !reachable.contains(&(t.peer.gid, t.peer.qpn)))
            .map(|(q, _)| *q)
            .collect();
        for q in gone {
            self.close_tx(now, v, q, TxCloseReason::AgedOut, None);
        }
        // A GID no longer named is remembered while we hold a connection of it (so that a
        // restart seen as forget, then resolve again, is one): at most view + connections.
        let held: HashSet<Gid> = self
            .rx
            .iter()
            .map(|(_, r)| r.peer)
            .chain(self.tx.iter().map(|(_, t)| t.peer.gid))
            .collect();
        if let Some(f) = self.follower.as_mut() {
            f.last_named
                .retain(|gid, _| held.contains(gid) && !named.contains_key(gid));
            f.last_named.extend(named);
        }
    }

    /// Counts `n` packets dropped by the driver (a request for control that found its queue
    /// full).
    pub fn count_tx_dropped(&mut self, n: u64) {
        self.counters.tx_dropped += n;
    }

    /// Follower: the next request for control, oldest first.
    pub fn poll_to_control(&mut self) -> Option<FollowerRequest> {
        self.follower.as_mut()?.to_control.pop_front()
    }

    /// Follower: the neighbours sent to since the last call (for control's
    /// [`Endpoint::neighbours_used`]).
    pub fn take_used_neighbours(&mut self, out: &mut Vec<IpAddr>) {
        if let Some(f) = self.follower.as_mut() {
            out.extend(std::mem::take(&mut f.used));
        }
    }

    /// Follower: an IP packet read from the worker's TUN queue.
    pub(super) fn follow_packet<V: Verbs>(&mut self, now: Instant, v: &mut V, packet: &[u8]) {
        let Ok(info) = classify(packet) else {
            self.counters.tx_dropped += 1;
            return;
        };
        let Some(f) = self.follower.as_mut() else {
            return;
        };
        if info.is_multicast_or_broadcast() {
            self.hand_to_control(packet);
            return;
        }
        let dst = info.dst;
        match f.lookup(&dst) {
            Some(hw) if self.follower_waits_for_path(hw) => {
                self.wait_for_neighbour(now, dst, packet);
            }
            Some(hw) if self.sends_itself(hw) => {
                if let Some(f) = self.follower.as_mut() {
                    f.note_used(dst);
                }
                self.send_rc(now, v, hw, info.version.ethertype(), packet);
            }
            Some(_) => self.hand_to_control(packet),
            None => self.wait_for_neighbour(now, dst, packet),
        }
    }

    /// The packet goes to control to send.
    fn hand_to_control(&mut self, packet: &[u8]) {
        let handed = self
            .follower
            .as_mut()
            .is_some_and(|f| f.ask(FollowerRequest::Packet(packet.to_vec())));
        if !handed {
            self.counters.tx_dropped += 1;
        }
    }

    /// The packet waits for control to resolve `dst` (asked at most every
    /// [`RESOLVE_AGAIN`]).
    fn wait_for_neighbour(&mut self, now: Instant, dst: IpAddr, packet: &[u8]) {
        let Some(f) = self.follower.as_mut() else {
            return;
        };
        if f.waiting.len() >= FOLLOWER_WAIT_MAX {
            self.counters.tx_queue_drops += 1;
            return;
        }
        f.waiting.push_back((now, dst, packet.to_vec()));
        let due = f
            .asked
            .get(&dst)
            .is_none_or(|at| now.saturating_duration_since(*at) >= RESOLVE_AGAIN);
        if due && f.ask(FollowerRequest::Resolve(dst)) {
            f.asked.insert(dst, now);
        }
    }

    /// Follower: drops packets that waited [`FOLLOWER_WAIT`] (their neighbour did not
    /// resolve).
    pub(super) fn expire_waiting(&mut self, now: Instant) {
        let Some(f) = self.follower.as_mut() else {
            return;
        };
        let mut dropped = 0;
        while f
            .waiting
            .front()
            .is_some_and(|(at, _, _)| now.saturating_duration_since(*at) >= FOLLOWER_WAIT)
        {
            f.waiting.pop_front();
            dropped += 1;
        }
        let waiting: BTreeSet<IpAddr> = f.waiting.iter().map(|(_, ip, _)| *ip).collect();
        f.asked.retain(|ip, _| waiting.contains(ip));
        self.counters.tx_dropped += dropped;
    }
}
