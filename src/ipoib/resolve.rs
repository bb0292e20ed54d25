//! Address resolution on the UD QP: ARP (IPv4) and IPv6 Neighbor Discovery, answered and
//! learned into the neighbour cache, with the resolution retries and the ageing of entries.
//!
//! A message creates an entry only for a sender inside one of the interface's prefixes or
//! with a link-local IPv6 address ([`Endpoint::on_link`]); the others are counted in
//! `neigh_out_of_prefix`. An answer to our own resolution (an `Incomplete` entry, created by
//! a packet the host routed to the interface) is learned wherever the address is. The caps of
//! the table are the neighbour module's.

use std::net::IpAddr;
use std::time::Instant;

use super::event::{Event, TxCloseReason};
use super::neigh::{Ageing, Claim, Contest, Evicted, Learned, NeighState, Retry, Started};
use super::restart::Incarnation;
use super::ud::UdSource;
use super::{Endpoint, Timer, RESOLVE_INTERVAL, RESOLVE_RETRIES};
use crate::timer::TimerId;
use crate::verbs::Verbs;
use crate::wire::ipoib::{
    mgid_for_ipv6, ArpOp, HwAddr, IpoibArp, NdType, NeighborAdvertisement, NeighborSolicitation,
    ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
};

impl Endpoint {
    pub(super) fn on_arp<V: Verbs>(&mut self, now: Instant, v: &mut V, src: UdSource, p: &[u8]) {
        let Ok(arp) = IpoibArp::parse(p) else {
            self.counters.rx_bad_packets += 1;
            return;
        };
        // The sender's hardware address must be the one it sent from.
        if !src.vouches_for(arp.sender_hw) {
            self.counters.neigh_unvouched_drops += 1;
            return;
        }
        let for_us = self.is_ours(IpAddr::V4(arp.target_ip));
        let sender = IpAddr::V4(arp.sender_ip);
        if !arp.sender_ip.is_unspecified() && !self.is_ours(sender) {
            let claim = match (arp.op, for_us) {
                (ArpOp::Request, true) => Claim::Request,
                (ArpOp::Reply, true) => Claim::Answer,
                _ => Claim::Other,
            };
            self.learn(now, v, sender, arp.sender_hw, src, claim);
        }
        if arp.op == ArpOp::Request && for_us {
            let reply = arp.reply_to(self.hwaddr);
            let mut bytes = [0u8; IpoibArp::LEN];
            reply.emit(&mut bytes);
            self.answer(now, v, src, arp.sender_hw, ETHERTYPE_ARP, &bytes);
        }
    }

    pub(super) fn on_nd<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        src: UdSource,
        kind: NdType,
        packet: &[u8],
    ) {
        match kind {
            NdType::NeighborSolicitation => {
                let Ok(ns) = NeighborSolicitation::parse(packet) else {
                    self.counters.rx_bad_packets += 1;
                    return;
                };
                let for_us = self.is_ours(IpAddr::V6(ns.target));
                // The answer goes to the solicitation's sender: the address its source
                // link-layer option names, which must be the one it came from, or without
                // the option (duplicate address detection) the one it came from.
                let to = match ns.source_hw {
                    Some(hw) if !src.vouches_for(hw) => {
                        self.counters.neigh_unvouched_drops += 1;
                        return;
                    }
                    // RFC 4861 §7.1.1: no source link-layer option from the unspecified
                    // address.
                    Some(_) if ns.src.is_unspecified() => {
                        self.counters.rx_bad_packets += 1;
                        return;
                    }
                    Some(hw) => {
                        let claim = if for_us { Claim::Request } else { Claim::Other };
                        self.learn(now, v, IpAddr::V6(ns.src), hw, src, claim);
                        Some(hw)
                    }
                    None => src.hwaddr(),
                };
                if !for_us {
                    return;
                }
                let Some(to) = to else {
                    // A GRH-less message from a port no path names, without the option:
                    // there is no one to answer.
                    self.counters.rx_bad_packets += 1;
                    return;
                };
                let na = NeighborAdvertisement::answer(&ns, self.hwaddr).to_packet();
                self.answer(now, v, src, to, ETHERTYPE_IPV6, &na);
            }
            NdType::NeighborAdvertisement => {
                let Ok(na) = NeighborAdvertisement::parse(packet) else {
                    self.counters.rx_bad_packets += 1;
                    return;
                };
                if let Some(hw) = na.target_hw {
                    if !src.vouches_for(hw) {
                        self.counters.neigh_unvouched_drops += 1;
                        return;
                    }
                    self.learn(now, v, IpAddr::V6(na.target), hw, src, Claim::Answer);
                }
            }
            // Router discovery and redirects have no meaning on this point-to-point fabric.
            _ => {}
        }
    }

    /// Sends an ARP/ND answer to `to`, the asker `src`'s own address, if its budget allows
    /// (`guard.rs`).
    fn answer<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        src: UdSource,
        to: HwAddr,
        ethertype: u16,
        payload: &[u8],
    ) {
        if !self.answers.take(src.gid.unwrap_or(to.gid), now) {
            self.counters.neigh_answer_budget_drops += 1;
            return;
        }
        self.send_ud(v, to, ethertype, payload);
    }

    /// Learns a mapping from a message of kind `claim` and sends what waited for it; a
    /// restart of the node (a new UD QPN from its own address and port) closes its old
    /// incarnation's connections; another node's claim to a bound address contests it
    /// ([`Neighbours::contest`](super::neigh::Neighbours::contest)).
    fn learn<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        hw: HwAddr,
        src: UdSource,
        claim: Claim,
    ) {
        if claim == Claim::Request && !self.neigh.contains(&ip) && !self.on_link(ip) {
            self.counters.neigh_out_of_prefix += 1;
            return;
        }
        let was_resolved = self.neigh.get(&ip).is_some_and(|n| n.resolved().is_some());
        let tx = &self.tx;
        let in_use = |h: HwAddr| tx.to_peer(h).is_some();
        match self
            .neigh
            .learn(ip, hw, src.port, now, claim, in_use, &mut self.counters)
        {
            Learned::Resolved { queued, evicted } => {
                if let Some(e) = evicted {
                    self.drop_evicted(e);
                }
                // On InfiniBand the peer's LID, SL and rate come from its PathRecord.
                self.want_path(hw.gid);
                if !was_resolved {
                    self.push_event(Event::NeighResolved {
                        peer: self.neigh_peer(ip, hw),
                    });
                }
                if let Some(n) = self.neigh.get_mut(&ip) {
                    if let Some(t) = n.timer.take() {
                        self.wheel.cancel(t);
                    }
                }
                if self
                    .neigh
                    .get(&ip)
                    .is_some_and(|n| n.state() == NeighState::Reachable)
                {
                    let t = self.arm(now + self.cfg.neigh_timeout, Timer::NeighAge(ip));
                    self.neigh.set_timer(&ip, t);
                }
                for p in queued {
                    let ethertype = if ip.is_ipv4() {
                        ETHERTYPE_IPV4
                    } else {
                        ETHERTYPE_IPV6
                    };
                    self.send_ip(now, v, hw, ethertype, &p);
                }
            }
            Learned::Replaced { old } => {
                let inc = Incarnation {
                    ud_qpn: hw.qpn,
                    ca_guid: None,
                };
                self.retire_old_incarnations(now, v, old.gid, inc, None);
            }
            Learned::Conflict => {
                self.counters.neigh_conflicts += 1;
                match self.neigh.contest(&ip, hw.gid, now) {
                    Contest::Probe(bound) => self.probe(v, ip, bound),
                    Contest::Failed => {
                        self.binding_failed(now, v, ip, false);
                        // The claim that found the binding failed may take it now.
                        if self.neigh.get(&ip).is_some_and(|n| n.resolved().is_none()) {
                            self.learn(now, v, ip, hw, src, claim);
                            if self.neigh.get(&ip).is_some_and(|n| n.resolved().is_none()) {
                                self.give_up(ip);
                            }
                        }
                    }
                    Contest::Wait => {}
                }
            }
            Learned::Unsolicited => self.counters.neigh_unsolicited_drops += 1,
            Learned::ForeignPort => self.counters.neigh_foreign_port += 1,
            Learned::Ignored | Learned::Refused => {}
        }
    }

    /// A packet goes to `ip`, bound: a binding learned from a claim is probed until it
    /// answers ([`Neighbours::verify`](super::neigh::Neighbours::verify)); false when it
    /// failed (the address is being resolved again).
    pub(super) fn verify_binding<V: Verbs>(&mut self, now: Instant, v: &mut V, ip: IpAddr) -> bool {
        match self.neigh.verify(&ip, now) {
            Contest::Probe(hw) => self.probe(v, ip, hw),
            Contest::Failed => {
                self.binding_failed(now, v, ip, true);
                return false;
            }
            Contest::Wait => {}
        }
        true
    }

    /// Sends one unicast probe for `ip` to `hw`, the node it is bound to: an ARP request or a
    /// Neighbor Solicitation (to the address itself, as NUD's), not broadcast.
    fn probe<V: Verbs>(&mut self, v: &mut V, ip: IpAddr, hw: HwAddr) {
        self.counters.neigh_probes += 1;
        match (ip, self.our_addr_for(ip)) {
            (IpAddr::V4(t), Some(IpAddr::V4(src))) => {
                let req = IpoibArp::request(self.hwaddr, src, t);
                let mut bytes = [0u8; IpoibArp::LEN];
                req.emit(&mut bytes);
                self.send_ud(v, hw, ETHERTYPE_ARP, &bytes);
            }
            (IpAddr::V6(t), Some(IpAddr::V6(src))) => {
                let mut ns = NeighborSolicitation::new(src, self.hwaddr, t);
                ns.dst = t;
                let packet = ns.to_packet();
                self.send_ud(v, hw, ETHERTYPE_IPV6, &packet);
            }
            _ => {}
        }
    }

    /// The learned binding of `ip` failed (its TX connection failed, or it did not answer
    /// the probes of a contest): counted; the address is resolved again (at once when
    /// `resolve`), the node that failed barred from that resolution; the failed node's TX
    /// connection is closed if no entry maps to it any more.
    pub(super) fn binding_failed<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        resolve: bool,
    ) {
        let Some((hw, timer)) = self.neigh.fail_bound(&ip, now, RESOLVE_RETRIES) else {
            return;
        };
        self.counters.neigh_bindings_failed += 1;
        if let Some(t) = timer {
            self.wheel.cancel(t);
        }
        if !self.neigh.endpoint_used(&hw) {
            if let Some(qpn) = self.tx.to_peer(hw) {
                self.close_tx(now, v, qpn, TxCloseReason::AgedOut, Some(ip));
            }
        }
        if resolve {
            self.resolve(now, v, ip);
        }
    }

    /// Creates the `Incomplete` entry of a packet for `ip` (the caller queues the packet and
    /// resolves); false when the table is full of entries in use.
    pub(super) fn start_resolving(&mut self, now: Instant, ip: IpAddr) -> bool {
        let tx = &self.tx;
        let in_use = |h: HwAddr| tx.to_peer(h).is_some();
        match self
            .neigh
            .start(ip, now, RESOLVE_RETRIES, in_use, &mut self.counters)
        {
            Started::New(evicted) => {
                if let Some(e) = evicted {
                    self.drop_evicted(e);
                }
                true
            }
            Started::Exists => true,
            Started::Refused => false,
        }
    }

    /// An entry evicted to make room: its timer goes, its queued packets are dropped.
    fn drop_evicted(&mut self, Evicted(n): Evicted) {
        if let Some(t) = n.timer {
            self.wheel.cancel(t);
        }
        self.counters.tx_dropped += n.queued() as u64;
    }

    /// Whether an ARP/ND sender at `ip` may get an entry: inside one of the interface's
    /// prefixes, or link-local IPv6 (`fe80::/10`).
    pub(super) fn on_link(&self, ip: IpAddr) -> bool {
        if let IpAddr::V6(a) = ip {
            if a.segments()[0] & 0xffc0 == 0xfe80 {
                return true;
            }
        }
        self.cfg
            .addrs
            .iter()
            .any(|&(ours, prefix)| same_prefix(ours, ip, prefix))
    }

    /// Sends an ARP request or a Neighbor Solicitation for `ip` and arms the retry timer.
    pub(super) fn resolve<V: Verbs>(&mut self, now: Instant, v: &mut V, ip: IpAddr) {
        match ip {
            IpAddr::V4(t) => {
                let Some(IpAddr::V4(src)) = self.our_addr_for(ip) else {
                    self.give_up(ip);
                    return;
                };
                let req = IpoibArp::request(self.hwaddr, src, t);
                let mut bytes = [0u8; IpoibArp::LEN];
                req.emit(&mut bytes);
                let bcast = self.cfg.broadcast_hwaddr();
                self.send_ud(v, bcast, ETHERTYPE_ARP, &bytes);
            }
            IpAddr::V6(t) => {
                let Some(IpAddr::V6(src)) = self.our_addr_for(ip) else {
                    self.give_up(ip);
                    return;
                };
                let ns = NeighborSolicitation::new(src, self.hwaddr, t);
                let to = HwAddr::multicast(mgid_for_ipv6(ns.dst, self.cfg.mgid_pkey()));
                let packet = ns.to_packet();
                self.send_ud(v, to, ETHERTYPE_IPV6, &packet);
            }
        }
        let t = self.arm(now + RESOLVE_INTERVAL, Timer::NeighResolve(ip));
        self.neigh.set_timer(&ip, t);
    }

    fn give_up(&mut self, ip: IpAddr) {
        if let Some(n) = self.neigh.remove(&ip) {
            self.counters.neigh_failed += 1;
            self.counters.tx_dropped += n.queued() as u64;
            self.push_event(Event::NeighFailed {
                ip,
                dropped: n.queued() as u64,
            });
            if let Some(t) = n.timer {
                self.wheel.cancel(t);
            }
        }
    }

    pub(super) fn on_resolve_timer<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        id: TimerId,
    ) {
        match self.neigh.resolve_timer_fired(&ip, id) {
            Retry::Resend => self.resolve(now, v, ip),
            Retry::GiveUp => self.give_up(ip),
            Retry::Nothing => {}
        }
    }

    /// An entry's ageing timer: O(1) in the size of the table (the neighbour module looks only
    /// at the entry's source), and closing its TX connection is one lookup.
    pub(super) fn on_neigh_age_timer<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        id: TimerId,
    ) {
        match self
            .neigh
            .age_timer_fired(&ip, id, now, self.cfg.neigh_timeout)
        {
            Ageing::Recheck(at) => {
                let t = self.arm(at, Timer::NeighAge(ip));
                self.neigh.set_timer(&ip, t);
            }
            // Aged out, and no other neighbour uses its TX connection: close it.
            Ageing::Unused(hw) => {
                if let Some(qpn) = self.tx.to_peer(hw) {
                    self.close_tx(now, v, qpn, TxCloseReason::AgedOut, Some(ip));
                }
            }
            Ageing::Nothing => {}
        }
    }
}

/// `a` and `b` are of one family and agree in their first `prefix` bits.
pub(super) fn same_prefix(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    let (a, b, width) = match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let host_bits = width - u32::from(prefix).min(width);
    let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
    a & mask == b & mask
}
