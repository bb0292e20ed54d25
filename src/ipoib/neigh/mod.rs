//! The neighbour table: IP address → IPoIB hardware address, as Linux's ARP/ND caches plus
//! IPoIB's per-neighbour queue.
//!
//! A packet for an unknown address creates an `Incomplete` entry, queues the packet (up to
//! `tx_queue_len`, the rest are dropped), and makes the caller send an ARP request or a
//! Neighbor Solicitation; retries follow a timer. A reply makes the entry `Reachable` and
//! hands the queued packets back in order. Entries not used for `neigh_timeout` are removed
//! (and with them the TX connection), as Linux ties TX connection lifetime to neighbour
//! ageing. Static entries never age.
//!
//! A learned mapping is never silently replaced by a different hardware address: a conflicting
//! ARP/ND message for a `Reachable` entry is counted and ignored, so a forged reply cannot
//! redirect traffic that already flows. The entry is re-learned only after it ages out or its
//! connection fails. The one exception is a restart of the same node (same GID, new UD QPN),
//! and only from the UDP source port the mapping was learned from, where the provider reports
//! ports: a message from the peer's address but another port is not from the peer's UD QP.
//!
//! # Bounds
//!
//! What a peer can make the table hold is bounded (see also `docs/bounds.md`):
//!
//! - the endpoint creates entries from ARP/ND only for senders inside the interface's prefixes
//!   or link-local IPv6 (the rest are counted in `neigh_out_of_prefix`);
//! - at most `neigh_max` learned (non-static) entries, `Incomplete` ones included: a new entry
//!   beyond it evicts the least recently used entry that is not in use (no open TX connection
//!   to its hardware address), counted in `neigh_table_full` and `neigh_evicted`; with none
//!   to evict within [`EVICT_SCAN`] steps the new entry is refused;
//! - at most `neigh_max_per_source` resolved learned entries per sender GID: one more evicts
//!   that source's least recently used entry not in use (`neigh_source_full`), or is refused;
//! - static entries are neither counted nor evicted.
//!
//! Every operation is O(1) in the size of the table, or O(`neigh_max_per_source`) where it
//! looks at one source's entries (ageing out, forgetting a failed peer, evicting within a
//! source): no operation scans the table.

mod bounds;
mod slots;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

pub(super) use slots::SlotId;
use slots::Slots;

use super::Counters;
use crate::timer::TimerId;
use crate::verbs::{Gid, QpNum};
use crate::wire::ipoib::HwAddr;
use crate::wire::PeerMap;

/// Most least-recently-used entries an eviction looks at (skipping those in use, which it
/// moves to the most recently used end) before it refuses the new entry.
pub(super) const EVICT_SCAN: usize = 16;

/// Unanswered unicast probes after which a contested binding has failed.
pub(super) const PROBES: u8 = 3;

/// At most one probe of a binding per this long, however many claims contest it (Linux's
/// `locktime` is 1 s), and the time a probe has to be answered.
pub(super) const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Most packets waiting for resolution on all entries together (each entry holds at most
/// `tx_queue_len`): with the table full of resolving entries, the copies held stay within
/// this many packets rather than `neigh_max` times `tx_queue_len`.
pub(super) const QUEUED_MAX: usize = 256;

/// Resolution state of a neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighState {
    /// Waiting for an ARP reply / Neighbor Advertisement.
    Incomplete {
        /// Requests still to send before giving up.
        retries_left: u8,
    },
    /// Address known.
    Reachable,
    /// Configured statically; never ages, never replaced.
    Static,
}

impl NeighState {
    /// Lowercase name for status output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Incomplete { .. } => "incomplete",
            Self::Reachable => "reachable",
            Self::Static => "permanent",
        }
    }
}

/// One neighbour. Its hardware address and state change only through [`Neighbours`], which
/// indexes them.
#[derive(Debug)]
pub(super) struct Neigh {
    /// Its hardware address, once known.
    hw: Option<HwAddr>,
    /// Resolution state.
    state: NeighState,
    /// Packets waiting for resolution (through [`Neighbours::enqueue`], which counts them).
    queue: VecDeque<Vec<u8>>,
    /// Last time a packet was sent to it.
    pub(super) last_used: Instant,
    /// Resolution retry or ageing timer.
    pub(super) timer: Option<TimerId>,
    /// The UDP source port of the message the mapping was learned from (where the provider
    /// reports it): a restart may replace the mapping only from this port.
    pub(super) src_port: Option<u16>,
    /// While it is resolved again after its binding failed (its TX connection failed, or it
    /// did not answer a probe): the GID that failed, which may not bind it in this resolution.
    failed_gid: Option<Gid>,
    /// While it is resolved again after a binding to a pinned source failed: only a pinned
    /// source may bind it.
    pinned_only: bool,
    /// Its binding answered us (it was learned from an answer to our resolution or to a
    /// probe): a binding learned from a claim is probed on its first use ([`Neighbours::verify`]).
    confirmed: bool,
    /// Probes sent since its binding last answered one (or was learned).
    unanswered: u8,
    /// When the last probe was sent: at most one per [`PROBE_INTERVAL`].
    probed_at: Option<Instant>,
}

impl Neigh {
    fn new(hw: Option<HwAddr>, state: NeighState, now: Instant) -> Self {
        Self {
            hw,
            state,
            queue: VecDeque::new(),
            last_used: now,
            timer: None,
            src_port: None,
            failed_gid: None,
            pinned_only: false,
            confirmed: false,
            unanswered: 0,
            probed_at: None,
        }
    }

    /// Its hardware address, if known (also while still resolving).
    pub(super) fn hw(&self) -> Option<HwAddr> {
        self.hw
    }

    /// Its resolution state.
    pub(super) fn state(&self) -> NeighState {
        self.state
    }

    /// Packets waiting for its resolution.
    pub(super) fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The packets that waited for its resolution, in order (the entry is gone).
    pub(super) fn into_queue(self) -> VecDeque<Vec<u8>> {
        self.queue
    }

    /// Its hardware address when it is resolved (not still being resolved).
    pub(super) fn resolved(&self) -> Option<HwAddr> {
        match self.state {
            NeighState::Incomplete { .. } => None,
            _ => self.hw,
        }
    }

    /// A probe of its binding to `hw`, if one is due: at most one per [`PROBE_INTERVAL`];
    /// failed after [`PROBES`] unanswered ones.
    fn probe_due(&mut self, hw: HwAddr, now: Instant) -> Contest {
        let due = self
            .probed_at
            .is_none_or(|at| now.saturating_duration_since(at) >= PROBE_INTERVAL);
        if !due {
            return Contest::Wait;
        }
        if self.unanswered >= PROBES {
            return Contest::Failed;
        }
        self.unanswered += 1;
        self.probed_at = Some(now);
        Contest::Probe(hw)
    }

    /// A learned entry with a hardware address: one its source GID is charged for.
    fn charged(&self) -> Option<Gid> {
        (self.state == NeighState::Reachable)
            .then_some(self.hw)
            .flatten()
            .map(|h| h.gid)
    }
}

/// An entry removed to make room for another: its timer is to be cancelled and its queued
/// packets are dropped.
#[derive(Debug)]
pub(super) struct Evicted(pub(super) Neigh);

/// What learning a mapping did.
#[derive(Debug)]
pub(super) enum Learned {
    /// New or unchanged mapping; these queued packets can now go out. `evicted` made room.
    Resolved {
        /// Packets queued while resolving, in order.
        queued: Vec<Vec<u8>>,
        /// The entry evicted for this one, if any.
        evicted: Option<Evicted>,
    },
    /// The same node (GID) came back with a new UD QPN (it restarted): the mapping was
    /// updated; connections to the old address must go.
    Replaced {
        /// The previous hardware address.
        old: HwAddr,
    },
    /// The mapping conflicts with an established one and was ignored.
    Conflict,
    /// A restart of the same node, but not from the UDP source port the mapping was learned
    /// from: ignored.
    ForeignPort,
    /// An answer (ARP reply, Neighbor Advertisement) for an address that has no entry: we
    /// did not ask, so it is discarded (RFC 4861 §7.2.5; Linux's `arp_accept=0`).
    Unsolicited,
    /// Nothing to learn (not a neighbour we asked about, and not addressed to us).
    Ignored,
    /// A cap was reached and no entry could be evicted: not learned.
    Refused,
}

/// What an ARP/ND message that names a sender's (or target's) hardware address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// A request to us (ARP request for our address, Neighbor Solicitation for one): its
    /// sender gets an entry if it has none (RFC 826's merge, RFC 4861 §7.2.3), so that the
    /// answer and the traffic that follows need no resolution of ours.
    Request,
    /// An answer (ARP reply to us, Neighbor Advertisement): it binds only an address we are
    /// resolving (or refreshes a binding to the same sender).
    Answer,
    /// Anything else (a request to another node): it binds only an address we are resolving.
    Other,
}

/// What another sender's claim to a bound address does ([`Neighbours::contest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Contest {
    /// Probe the binding: send a unicast request for the address to this hardware address.
    Probe(HwAddr),
    /// The binding did not answer [`PROBES`] probes: it failed ([`Neighbours::fail_bound`]).
    Failed,
    /// A probe is in flight, the binding is static or pinned, or the entry is not resolved.
    Wait,
}

/// What starting a resolution did.
#[derive(Debug)]
pub(super) enum Started {
    /// A new `Incomplete` entry; `Some` evicted entry made room for it.
    New(Option<Evicted>),
    /// The address has an entry already.
    Exists,
    /// The table is full of entries in use: no entry.
    Refused,
}

/// What a neighbour's resolution timer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// Send the request again (one retry fewer left).
    Resend,
    /// No answer after the last retry: give the neighbour up.
    GiveUp,
    /// A timer that is no longer the entry's, or an entry no longer resolving.
    Nothing,
}

/// What a neighbour's ageing timer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ageing {
    /// Used since: check again at this time (arm the timer and [`Neighbours::set_timer`]).
    Recheck(Instant),
    /// Removed; no other neighbour uses this hardware address, so neither does any packet.
    Unused(HwAddr),
    /// Removed (its hardware address, if any, is still some other neighbour's), or nothing
    /// to do.
    Nothing,
}

/// Entries per state, for the status summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NeighCounts {
    /// Being resolved.
    pub incomplete: usize,
    /// Resolved.
    pub reachable: usize,
    /// Static.
    pub permanent: usize,
}

/// The neighbour table. See the [module documentation](self).
///
/// Invariants: `index` maps each address to its live slot and back; `learned` counts the
/// non-static entries (all on the use-order list) and is at most `max`; `by_gid` lists, per
/// GID, the addresses of the `Reachable` entries with a hardware address of that GID (at most
/// `per_source` each); `statics` counts the static entries per endpoint; `rdma_cm` holds only
/// endpoints some entry maps to.
#[derive(Debug)]
pub(super) struct Neighbours {
    slots: Slots<Neigh>,
    index: PeerMap<IpAddr, SlotId>,
    by_gid: PeerMap<Gid, Vec<IpAddr>>,
    statics: PeerMap<(Gid, QpNum), usize>,
    /// The endpoints known to be reached at the rdma_cm service although their hardware
    /// address lacks [`HwAddr::FLAG_RDMA_CM`] (they rejected the standard service ID): kept
    /// while some entry maps to the endpoint, so at most one per entry.
    rdma_cm: PeerMap<(Gid, QpNum), ()>,
    learned: usize,
    /// Packets in the queues of all entries.
    queued: usize,
    max: usize,
    per_source: usize,
    /// The GIDs whose bindings are pinned (the `--peer`s, with `pin_peer_neighbours`): an
    /// address bound to one is bound again only to one of them. Set by configuration, at
    /// most `MAX_PEERS`.
    pinned: PeerMap<Gid, ()>,
    /// Moves on with every call that may change an entry's resolved address (or remove an
    /// entry): what [`Neighbours::generation`] reports.
    generation: u64,
}

impl Neighbours {
    /// An empty table of at most `max` learned entries, `per_source` of them per GID.
    pub(super) fn new(max: usize, per_source: usize) -> Self {
        Self {
            slots: Slots::default(),
            index: PeerMap::default(),
            by_gid: PeerMap::default(),
            statics: PeerMap::default(),
            rdma_cm: PeerMap::default(),
            learned: 0,
            queued: 0,
            max: max.max(1),
            per_source: per_source.max(1),
            pinned: PeerMap::default(),
            generation: 0,
        }
    }

    /// A number that changes whenever an entry's resolved address may have changed (an
    /// entry learnt, rebound, failed, aged or removed); equal numbers mean the same resolved
    /// entries.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// The GIDs whose bindings are pinned from now on (none: no pinning).
    pub(super) fn set_pinned(&mut self, gids: &[Gid]) {
        self.pinned = gids.iter().map(|g| (*g, ())).collect();
    }

    /// Whether bindings to `gid` are pinned.
    pub(super) fn is_pinned(&self, gid: &Gid) -> bool {
        self.pinned.contains_key(gid)
    }

    /// Learned (non-static) entries.
    #[cfg(test)]
    pub(super) fn learned(&self) -> usize {
        self.learned
    }

    /// All entries.
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot of `ip`'s entry.
    pub(super) fn find(&self, ip: &IpAddr) -> Option<SlotId> {
        self.index.get(ip).copied()
    }

    /// The entry in `id`.
    pub(super) fn entry(&self, id: SlotId) -> Option<&Neigh> {
        self.slots.get(id)
    }

    /// The entry for `ip`.
    pub(super) fn get(&self, ip: &IpAddr) -> Option<&Neigh> {
        self.slots.get(self.find(ip)?)
    }

    /// The entry for `ip`, writable.
    pub(super) fn get_mut(&mut self, ip: &IpAddr) -> Option<&mut Neigh> {
        let id = self.find(ip)?;
        self.slots.get_mut(id)
    }

    /// True if `ip` has an entry.
    pub(super) fn contains(&self, ip: &IpAddr) -> bool {
        self.index.contains_key(ip)
    }

    /// A packet goes to the entry in `id` now: it becomes the most recently used.
    pub(super) fn touch(&mut self, id: SlotId, now: Instant) {
        if let Some(n) = self.slots.get_mut(id) {
            n.last_used = now;
            self.slots.touch(id);
        }
    }

    /// The entry for `ip`, marked used now ([`touch`](Self::touch)), writable.
    pub(super) fn use_entry(&mut self, ip: &IpAddr, now: Instant) -> Option<&mut Neigh> {
        let id = self.find(ip)?;
        self.touch(id, now);
        self.slots.get_mut(id)
    }

    /// Queues `packet` on `ip`'s entry until it resolves, if the entry holds fewer than
    /// `per_entry` and all entries together fewer than [`QUEUED_MAX`]; false if not queued.
    pub(super) fn enqueue(&mut self, ip: &IpAddr, packet: &[u8], per_entry: usize) -> bool {
        if self.queued >= QUEUED_MAX {
            return false;
        }
        let Some(n) = self.get_mut(ip).filter(|n| n.queue.len() < per_entry) else {
            return false;
        };
        n.queue.push_back(packet.to_vec());
        self.queued += 1;
        true
    }

    /// Adds a static entry (replacing any entry for `ip`).
    pub(super) fn add_static(&mut self, ip: IpAddr, hw: HwAddr, now: Instant) {
        self.generation = self.generation.wrapping_add(1);
        self.remove(&ip);
        *self.statics.entry((hw.gid, hw.qpn)).or_default() += 1;
        let id = self
            .slots
            .insert(ip, Neigh::new(Some(hw), NeighState::Static, now), false);
        self.index.insert(ip, id);
    }

    /// Starts resolving `ip`, evicting an entry not in use (`in_use` says which hardware
    /// addresses have a connection) if the table is full; hitting the cap is counted.
    pub(super) fn start(
        &mut self,
        ip: IpAddr,
        now: Instant,
        retries: u8,
        in_use: impl Fn(HwAddr) -> bool,
        c: &mut Counters,
    ) -> Started {
        self.generation = self.generation.wrapping_add(1);
        if self.contains(&ip) {
            return Started::Exists;
        }
        let Some(evicted) = self.room(None, &in_use, c) else {
            return Started::Refused;
        };
        let n = Neigh::new(
            None,
            NeighState::Incomplete {
                retries_left: retries,
            },
            now,
        );
        self.insert_learned(ip, n);
        Started::New(evicted)
    }

    /// Learns `ip` → `hw` from a message of kind `claim` that came from UDP source port
    /// `src_port` (`None` where the provider does not say): only a [`Claim::Request`] creates
    /// an entry; an entry being resolved again after a failure refuses the GID that failed
    /// (and, if that was pinned, every GID not pinned); a resolved one is never rebound to
    /// another node. `in_use` and the counting as for [`start`](Self::start).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn learn(
        &mut self,
        ip: IpAddr,
        hw: HwAddr,
        src_port: Option<u16>,
        now: Instant,
        claim: Claim,
        in_use: impl Fn(HwAddr) -> bool,
        c: &mut Counters,
    ) -> Learned {
        self.generation = self.generation.wrapping_add(1);
        let Some(id) = self.find(&ip) else {
            match claim {
                Claim::Request => {}
                Claim::Answer => return Learned::Unsolicited,
                Claim::Other => return Learned::Ignored,
            }
            let Some(evicted) = self.room(Some(hw.gid), &in_use, c) else {
                return Learned::Refused;
            };
            let mut n = Neigh::new(Some(hw), NeighState::Reachable, now);
            n.src_port = src_port;
            self.insert_learned(ip, n);
            self.charge(hw.gid, ip);
            return Learned::Resolved {
                queued: Vec::new(),
                evicted,
            };
        };
        let Some(n) = self.slots.get(id) else {
            return Learned::Ignored;
        };
        match (n.state, n.hw) {
            (NeighState::Incomplete { .. }, _)
                if n.failed_gid == Some(hw.gid) || (n.pinned_only && !self.is_pinned(&hw.gid)) =>
            {
                Learned::Conflict
            }
            (NeighState::Incomplete { .. }, _) => {
                // Ours to resolve: its source is charged from now on.
                let evicted = if self.source_full(hw.gid) {
                    c.neigh_source_full += 1;
                    match self.evict_from_source(hw.gid, &in_use, c) {
                        Some(e) => Some(e),
                        None => return Learned::Refused,
                    }
                } else {
                    None
                };
                let Some(n) = self.slots.get_mut(id) else {
                    return Learned::Ignored;
                };
                n.hw = Some(hw);
                n.state = NeighState::Reachable;
                n.last_used = now;
                n.src_port = src_port;
                n.failed_gid = None;
                n.pinned_only = false;
                n.confirmed = claim == Claim::Answer;
                let queued: Vec<_> = n.queue.drain(..).collect();
                self.queued = self.queued.saturating_sub(queued.len());
                self.slots.touch(id);
                self.charge(hw.gid, ip);
                Learned::Resolved { queued, evicted }
            }
            (state, Some(h)) if same_endpoint(&h, &hw) => {
                if state == NeighState::Reachable {
                    // The peer may have switched CM support on or off; an answer answers
                    // the probes (its own claims do not).
                    if let Some(n) = self.slots.get_mut(id) {
                        n.hw = Some(hw);
                        n.src_port = n.src_port.or(src_port);
                        if claim == Claim::Answer {
                            n.unanswered = 0;
                            n.confirmed = true;
                        }
                    }
                }
                Learned::Resolved {
                    queued: Vec::new(),
                    evicted: None,
                }
            }
            // Same node, new UD QPN, but not from the peer's port.
            (NeighState::Reachable, Some(h))
                if h.gid == hw.gid
                    && matches!((n.src_port, src_port), (Some(a), Some(b)) if a != b) =>
            {
                Learned::ForeignPort
            }
            // Same node, new UD QPN: the peer restarted (its GID, so its charge, is the same).
            (NeighState::Reachable, Some(h)) if h.gid == hw.gid => {
                if let Some(n) = self.slots.get_mut(id) {
                    n.hw = Some(hw);
                    n.last_used = now;
                    n.src_port = src_port;
                }
                self.slots.touch(id);
                self.forget_kind_unless_used(&h);
                Learned::Replaced { old: h }
            }
            _ => Learned::Conflict,
        }
    }

    /// The learned binding of `ip` failed (its TX connection failed, or it did not answer
    /// a probe): the entry is resolved again, `retries` requests, and the GID that failed
    /// may not bind it in that resolution (if that GID was pinned, only pinned ones may).
    /// Returns the hardware address that failed and the entry's timer to cancel; `None`
    /// (nothing changed) for a static entry or one not resolved.
    pub(super) fn fail_bound(
        &mut self,
        ip: &IpAddr,
        now: Instant,
        retries: u8,
    ) -> Option<(HwAddr, Option<TimerId>)> {
        self.generation = self.generation.wrapping_add(1);
        let id = self.find(ip)?;
        let n = self.slots.get(id)?;
        let hw = n.resolved().filter(|_| n.state == NeighState::Reachable)?;
        self.uncharge(hw.gid, ip);
        let pinned_only = self.is_pinned(&hw.gid);
        let n = self.slots.get_mut(id)?;
        n.hw = None;
        n.state = NeighState::Incomplete {
            retries_left: retries,
        };
        n.last_used = now;
        n.failed_gid = Some(hw.gid);
        n.pinned_only = pinned_only;
        n.unanswered = 0;
        n.probed_at = None;
        let timer = n.timer.take();
        self.forget_kind_unless_used(&hw);
        Some((hw, timer))
    }

    /// The learned addresses bound to `hw`'s endpoint (static ones not among them).
    pub(super) fn bound_to(&self, hw: &HwAddr) -> Vec<IpAddr> {
        self.by_gid
            .get(&hw.gid)
            .into_iter()
            .flatten()
            .filter(|ip| {
                self.get(ip)
                    .and_then(|n| n.hw)
                    .is_some_and(|h| same_endpoint(&h, hw))
            })
            .copied()
            .collect()
    }

    /// A sender at `claimant`'s GID claims `ip`, bound to another node: the binding is probed
    /// (one unicast request, at most one per [`PROBE_INTERVAL`], each paid by a claim), and
    /// fails once [`PROBES`] probes went unanswered for a [`PROBE_INTERVAL`] each. Static
    /// bindings are never contested, nor pinned ones by a GID that is not pinned.
    pub(super) fn contest(&mut self, ip: &IpAddr, claimant: Gid, now: Instant) -> Contest {
        self.generation = self.generation.wrapping_add(1);
        let claimant_pinned = self.is_pinned(&claimant);
        let pinned = |g: &Gid| self.pinned.contains_key(g);
        let Some(id) = self.find(ip) else {
            return Contest::Wait;
        };
        let Some(n) = self.slots.get(id) else {
            return Contest::Wait;
        };
        let Some(hw) = n.hw.filter(|_| n.state == NeighState::Reachable) else {
            return Contest::Wait;
        };
        if pinned(&hw.gid) && !claimant_pinned {
            return Contest::Wait;
        }
        match self.slots.get_mut(id) {
            Some(n) => n.probe_due(hw, now),
            None => Contest::Wait,
        }
    }

    /// A packet goes to `ip` now: a binding learned from a claim, not yet confirmed by an
    /// answer, is probed as a contested one is ([`contest`](Self::contest)), so that a node
    /// that claimed an address without answering for it loses it within [`PROBES`] probe
    /// intervals of its first use.
    pub(super) fn verify(&mut self, ip: &IpAddr, now: Instant) -> Contest {
        self.generation = self.generation.wrapping_add(1);
        let Some(n) = self.get_mut(ip) else {
            return Contest::Wait;
        };
        match n.hw {
            Some(hw) if n.state == NeighState::Reachable && !n.confirmed => n.probe_due(hw, now),
            _ => Contest::Wait,
        }
    }

    /// Records `t` as `ip`'s resolution or ageing timer.
    pub(super) fn set_timer(&mut self, ip: &IpAddr, t: TimerId) {
        if let Some(n) = self.get_mut(ip) {
            n.timer = Some(t);
        }
    }

    /// `ip`'s resolution timer `id` fired: one retry fewer, or none left.
    pub(super) fn resolve_timer_fired(&mut self, ip: &IpAddr, id: TimerId) -> Retry {
        self.generation = self.generation.wrapping_add(1);
        let Some(n) = self.get_mut(ip).filter(|n| n.timer == Some(id)) else {
            return Retry::Nothing;
        };
        n.timer = None;
        match n.state {
            NeighState::Incomplete { retries_left } if retries_left > 1 => {
                n.state = NeighState::Incomplete {
                    retries_left: retries_left - 1,
                };
                Retry::Resend
            }
            NeighState::Incomplete { .. } => Retry::GiveUp,
            _ => Retry::Nothing,
        }
    }

    /// `ip`'s ageing timer `id` fired: an entry unused for `timeout` is removed.
    pub(super) fn age_timer_fired(
        &mut self,
        ip: &IpAddr,
        id: TimerId,
        now: Instant,
        timeout: Duration,
    ) -> Ageing {
        self.generation = self.generation.wrapping_add(1);
        let Some(n) = self
            .get_mut(ip)
            .filter(|n| n.timer == Some(id) && n.state == NeighState::Reachable)
        else {
            return Ageing::Nothing;
        };
        n.timer = None;
        let idle_until = n.last_used + timeout;
        if idle_until > now {
            return Ageing::Recheck(idle_until);
        }
        let Some(hw) = self.remove(ip).and_then(|n| n.hw) else {
            return Ageing::Nothing;
        };
        if self.endpoint_used(&hw) {
            Ageing::Nothing
        } else {
            Ageing::Unused(hw)
        }
    }

    /// Removes an entry; returns it.
    pub(super) fn remove(&mut self, ip: &IpAddr) -> Option<Neigh> {
        self.generation = self.generation.wrapping_add(1);
        let id = self.index.remove(ip)?;
        let (_, n) = self.slots.remove(id)?;
        self.queued = self.queued.saturating_sub(n.queue.len());
        match n.state {
            NeighState::Static => {
                if let Some(h) = n.hw {
                    let key = (h.gid, h.qpn);
                    match self.statics.get_mut(&key) {
                        Some(count) if *count > 1 => *count -= 1,
                        _ => {
                            self.statics.remove(&key);
                        }
                    }
                }
            }
            _ => {
                self.learned = self.learned.saturating_sub(1);
                if let Some(gid) = n.charged() {
                    self.uncharge(gid, ip);
                }
            }
        }
        if let Some(h) = n.hw {
            self.forget_kind_unless_used(&h);
        }
        Some(n)
    }

    /// Whether connections to `hw`'s endpoint go to its rdma_cm service with a `cma_hdr`:
    /// its address says so ([`HwAddr::rdma_cm`]), or it rejected the standard service ID
    /// once ([`remember_rdma_cm`](Self::remember_rdma_cm)) while an entry maps to it.
    pub(super) fn reached_by_rdma_cm(&self, hw: &HwAddr) -> bool {
        hw.rdma_cm() || self.rdma_cm.contains_key(&(hw.gid, hw.qpn))
    }

    /// `hw`'s endpoint is reached at its rdma_cm service: remembered for as long as an entry
    /// maps to it (not at all if none does).
    pub(super) fn remember_rdma_cm(&mut self, hw: &HwAddr) {
        if self.endpoint_used(hw) {
            self.rdma_cm.insert((hw.gid, hw.qpn), ());
        }
    }

    /// Drops what is remembered of `hw`'s endpoint once no entry maps to it.
    fn forget_kind_unless_used(&mut self, hw: &HwAddr) {
        if !self.rdma_cm.is_empty() && !self.endpoint_used(hw) {
            self.rdma_cm.remove(&(hw.gid, hw.qpn));
        }
    }

    /// An address whose learned entry has a hardware address at `gid` (O(1): the per-GID
    /// index); static entries are not indexed.
    pub(super) fn learned_ip_at(&self, gid: &Gid) -> Option<IpAddr> {
        self.by_gid.get(gid).and_then(|ips| ips.first().copied())
    }

    /// Forgets every learned (non-static) entry whose hardware address is `hw`'s endpoint;
    /// returns their addresses.
    pub(super) fn forget_hw(&mut self, hw: &HwAddr) -> Vec<IpAddr> {
        self.generation = self.generation.wrapping_add(1);
        let ips = self.bound_to(hw);
        for ip in &ips {
            self.remove(ip);
        }
        ips
    }

    /// All entries.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&IpAddr, &Neigh)> {
        self.index
            .iter()
            .filter_map(|(ip, id)| Some((ip, self.slots.get(*id)?)))
    }

    /// Entries per state.
    pub(super) fn counts(&self) -> NeighCounts {
        let mut c = NeighCounts {
            permanent: self.len() - self.learned,
            ..NeighCounts::default()
        };
        c.reachable = self.by_gid.values().map(Vec::len).sum();
        c.incomplete = self.learned.saturating_sub(c.reachable);
        c
    }

    /// True if some entry still maps to `hw`'s endpoint.
    pub(super) fn endpoint_used(&self, hw: &HwAddr) -> bool {
        self.statics.contains_key(&(hw.gid, hw.qpn))
            || self.by_gid.get(&hw.gid).is_some_and(|ips| {
                ips.iter().any(|ip| {
                    self.get(ip)
                        .and_then(|n| n.hw)
                        .is_some_and(|h| same_endpoint(&h, hw))
                })
            })
    }

    /// Checks every invariant (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        self.slots.check();
        assert_eq!(self.slots.linked_len(), self.learned);
        assert!(self.learned <= self.max, "{} > {}", self.learned, self.max);
        let mut learned = 0;
        let mut charged = 0;
        for (ip, id) in &self.index {
            assert_eq!(self.slots.ip(*id), Some(*ip));
            let n = self.slots.get(*id).expect("live");
            match n.state {
                NeighState::Static => {
                    let h = n.hw.expect("static has hw");
                    assert!(self.statics.contains_key(&(h.gid, h.qpn)));
                }
                NeighState::Incomplete { .. } => learned += 1,
                NeighState::Reachable => {
                    learned += 1;
                    if let Some(g) = n.charged() {
                        charged += 1;
                        assert!(self.by_gid[&g].contains(ip));
                    }
                }
            }
        }
        assert_eq!(learned, self.learned);
        let queued: usize = self.iter().map(|(_, n)| n.queue.len()).sum();
        assert_eq!(queued, self.queued);
        assert!(self.queued <= QUEUED_MAX);
        let listed: usize = self.by_gid.values().map(Vec::len).sum();
        assert_eq!(listed, charged);
        for ips in self.by_gid.values() {
            assert!(!ips.is_empty() && ips.len() <= self.per_source);
        }
        for (gid, qpn) in self.rdma_cm.keys() {
            assert!(self.endpoint_used(&HwAddr::new(0, *qpn, *gid)));
        }
    }
}

/// Two hardware addresses name the same endpoint (GID and QPN; the flags may differ).
pub(super) fn same_endpoint(a: &HwAddr, b: &HwAddr) -> bool {
    a.gid == b.gid && a.qpn == b.qpn
}
