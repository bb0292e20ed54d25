//! Address resolution on the UD QP: ARP (IPv4) and IPv6 Neighbor Discovery, answered and
//! learned into the neighbour cache, with the resolution retries and the ageing of entries.
//!
//! A message creates an entry only for a sender inside one of the interface's prefixes or
//! with a link-local IPv6 address ([`Endpoint::on_link`]); the others are counted in
//! `neigh_out_of_prefix`. An answer to our own resolution (an `Incomplete` entry, created by
//! a packet the host routed to the interface) is learned wherever the address is. The caps of
//! the table are the neighbour module's.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

use super::event::{Event, TxCloseReason};
use super::neigh::{Ageing, Evicted, Learned, NeighState, Retry, Started};
use super::restart::Incarnation;
use super::ud::UdSource;
use super::{Endpoint, Timer, RESOLVE_INTERVAL, RESOLVE_RETRIES};
use crate::timer::TimerId;
use crate::verbs::Verbs;
use crate::wire::ipoib::{
    mgid_for_ipv6, ArpOp, HwAddr, IpoibArp, NdType, NeighborAdvertisement, NeighborSolicitation,
    ALL_NODES_MULTICAST, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
};

impl Endpoint {
    pub(super) fn on_arp<V: Verbs>(&mut self, now: Instant, v: &mut V, src: UdSource, p: &[u8]) {
        let Ok(arp) = IpoibArp::parse(p) else {
            self.counters.rx_bad_packets += 1;
            return;
        };
        // The sender's hardware address must be the one it sent from.
        if !src.vouches_for(arp.sender_hw) {
            self.counters.rx_bad_packets += 1;
            return;
        }
        let for_us = self.is_ours(IpAddr::V4(arp.target_ip));
        let sender = IpAddr::V4(arp.sender_ip);
        if !arp.sender_ip.is_unspecified() && !self.is_ours(sender) {
            self.learn(now, v, sender, arp.sender_hw, src.port, for_us);
        }
        if arp.op == ArpOp::Request && for_us {
            let reply = arp.reply_to(self.hwaddr);
            let mut bytes = [0u8; IpoibArp::LEN];
            reply.emit(&mut bytes);
            self.send_ud(v, arp.sender_hw, ETHERTYPE_ARP, &bytes);
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
                if let Some(hw) = ns.source_hw {
                    if src.vouches_for(hw) && !ns.src.is_unspecified() {
                        self.learn(now, v, IpAddr::V6(ns.src), hw, src.port, for_us);
                    }
                }
                if for_us {
                    let na = NeighborAdvertisement::answer(&ns, self.hwaddr).to_packet();
                    let to = ns.source_hw.unwrap_or(HwAddr::multicast(mgid_for_ipv6(
                        na_dst(&ns),
                        self.cfg.mgid_pkey(),
                    )));
                    self.send_ud(v, to, ETHERTYPE_IPV6, &na);
                }
            }
            NdType::NeighborAdvertisement => {
                let Ok(na) = NeighborAdvertisement::parse(packet) else {
                    self.counters.rx_bad_packets += 1;
                    return;
                };
                if let Some(hw) = na.target_hw {
                    if src.vouches_for(hw) {
                        self.learn(now, v, IpAddr::V6(na.target), hw, src.port, na.solicited);
                    }
                }
            }
            // Router discovery and redirects have no meaning on this point-to-point fabric.
            _ => {}
        }
    }

    /// Learns a mapping and sends what waited for it; a restart of the node (a new UD QPN
    /// from its own address and port) closes its old incarnation's connections.
    fn learn<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        hw: HwAddr,
        src_port: Option<u16>,
        for_us: bool,
    ) {
        if for_us && !self.neigh.contains(&ip) && !self.on_link(ip) {
            self.counters.neigh_out_of_prefix += 1;
            return;
        }
        let was_resolved = self.neigh.get(&ip).is_some_and(|n| n.resolved().is_some());
        let tx = &self.tx;
        let in_use = |h: HwAddr| tx.to_peer(h).is_some();
        match self
            .neigh
            .learn(ip, hw, src_port, now, for_us, in_use, &mut self.counters)
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
            Learned::Conflict => self.counters.neigh_conflicts += 1,
            Learned::ForeignPort => self.counters.neigh_foreign_port += 1,
            Learned::Ignored | Learned::Refused => {}
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

/// Where a Neighbor Advertisement answering `ns` goes when the solicitation carried no source
/// link-layer address: all-nodes.
fn na_dst(ns: &NeighborSolicitation) -> Ipv6Addr {
    if ns.src.is_unspecified() {
        ALL_NODES_MULTICAST
    } else {
        ns.src
    }
}
