//! The datagram side: the UD QP, packets from the TUN device, ARP and IPv6 ND, multicast,
//! neighbour resolution and ageing, and the ICMP "too big" messages written back to the TUN.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Instant;

use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Type, Icmpv6Type, PacketBuilder};

use super::neigh::{Learned, NeighState};
use super::{
    fill_ipoib, wr, wr_kind, Endpoint, EndpointConfig, Mode, Timer, TunPacket, UdQp, CQ_BATCH,
    RESOLVE_INTERVAL, RESOLVE_RETRIES, WR_RECV, WR_SEND,
};
use crate::soft::{grh_source_gid, GRH_LEN};
use crate::timer::TimerId;
use crate::verbs::setup::open_ud_qp;
use crate::verbs::{
    AddressVector, BufId, PdId, QpType, SendWr, UdDest, Verbs, VerbsError, WcOpcode, WcStatus,
};
use crate::wire::ipoib::{
    broadcast_mgid, classify, mgid_for_ipv6, ArpOp, HwAddr, IpoibArp, IpoibHeader, NdMessage,
    NdType, NeighborAdvertisement, NeighborSolicitation, ETHERTYPE_ARP, ETHERTYPE_IPV4,
    ETHERTYPE_IPV6,
};

/// Creates the UD QP, brings it to RTS, posts its receives and attaches it to the broadcast
/// group.
pub(super) fn open_ud<V: Verbs>(
    v: &mut V,
    pd: PdId,
    cfg: &EndpointConfig,
) -> Result<UdQp, VerbsError> {
    let depth = cfg.ud_depth;
    let cq = v.create_cq(depth * 2 + 8)?;
    let pool = v.create_pool(pd, GRH_LEN + cfg.path_mtu.bytes(), depth as usize * 2)?;
    let setup = open_ud_qp(
        v,
        pd,
        QpType::Ud,
        cq,
        pool,
        cfg.qkey,
        depth,
        depth,
        wr(WR_RECV),
    )?;
    let (qp, free_send) = (setup.qp, setup.send_bufs);
    v.attach_mcast(qp, broadcast_mgid(cfg.pkey))?;
    Ok(UdQp { qp, cq, free_send })
}

impl Endpoint {
    /// Handles one IP packet read from the TUN device.
    pub fn handle_tun_packet<V: Verbs>(&mut self, now: Instant, v: &mut V, packet: &[u8]) {
        if self.stopping {
            return;
        }
        let Ok(info) = classify(packet) else {
            self.counters.tx_dropped += 1;
            return;
        };
        let ethertype = info.version.ethertype();
        if info.is_multicast_or_broadcast() {
            let mgid = match info.dst {
                IpAddr::V6(d) => mgid_for_ipv6(d, self.cfg.pkey),
                IpAddr::V4(_) => broadcast_mgid(self.cfg.pkey),
            };
            self.send_ud_ip(now, v, HwAddr::multicast(mgid), ethertype, packet);
            return;
        }
        let dst = info.dst;
        let hw = match self.neigh.get_mut(&dst) {
            Some(n) => {
                n.last_used = now;
                match (n.state, n.hw) {
                    (NeighState::Incomplete { .. }, _) | (_, None) => {
                        if n.queue.len() < self.cfg.tx_queue_len {
                            n.queue.push_back(packet.to_vec());
                        } else {
                            self.counters.tx_queue_drops += 1;
                        }
                        return;
                    }
                    (_, Some(hw)) => hw,
                }
            }
            None => {
                self.neigh.start(dst, now, RESOLVE_RETRIES);
                if let Some(n) = self.neigh.get_mut(&dst) {
                    n.queue.push_back(packet.to_vec());
                }
                self.resolve(now, v, dst);
                return;
            }
        };
        self.send_ip(now, v, dst, hw, ethertype, packet);
    }

    /// A send buffer for the driver to read the next TUN packet into, at
    /// [`TUN_BUFFER_OFFSET`](super::TUN_BUFFER_OFFSET) (room for the IPoIB header before it), so
    /// that a packet for an established connection is posted from where it was read. Give it
    /// back with [`handle_tun_buffer`](Self::handle_tun_buffer) or
    /// [`return_tun_buffer`](Self::return_tun_buffer). `None` while none is free (read into a
    /// buffer of your own and use [`handle_tun_packet`](Self::handle_tun_packet)).
    pub fn tun_buffer(&mut self) -> Option<BufId> {
        if self.stopping {
            return None;
        }
        self.tx.take_buf()
    }

    /// Gives back a buffer from [`tun_buffer`](Self::tun_buffer) that received nothing.
    pub fn return_tun_buffer(&mut self, b: BufId) {
        self.tx.put_buf(b);
    }

    /// Handles an IP packet of `len` bytes that the driver read into the buffer `b` from
    /// [`tun_buffer`](Self::tun_buffer), at [`TUN_BUFFER_OFFSET`](super::TUN_BUFFER_OFFSET):
    /// as [`handle_tun_packet`](Self::handle_tun_packet), but a packet for an established RC
    /// connection is sent from that buffer without a copy.
    pub fn handle_tun_buffer<V: Verbs>(&mut self, now: Instant, v: &mut V, b: BufId, len: usize) {
        // A packet longer than the buffer was cut short by the read (an interface MTU raised
        // past what IPoIB-CM carries): never send the stump.
        let info = super::ip_packet_in(v, b, len).and_then(|p| classify(p).ok());
        if info.is_some_and(|info| info.total_len > len) {
            self.counters.tx_dropped += 1;
            self.tx.put_buf(b);
            return;
        }
        let fast = info.and_then(|info| {
            if info.is_multicast_or_broadcast() || self.cfg.mode != Mode::Connected {
                return None;
            }
            let hw = self.neigh.resolved(&info.dst)?;
            if !hw.connected_mode() {
                return None;
            }
            let qpn = self.established_tx(hw, len)?;
            Some((info.dst, info.version.ethertype(), qpn))
        });
        if let Some((dst, ethertype, qpn)) = fast {
            if let Some(n) = self.neigh.get_mut(&dst) {
                n.last_used = now;
            }
            let header = IpoibHeader::new(ethertype).to_bytes();
            let written = v
                .pools_mut()
                .get_mut(b)
                .ok()
                .and_then(|buf| buf.get_mut(..IpoibHeader::LEN))
                .map(|h| h.copy_from_slice(&header))
                .is_some();
            if written {
                self.post_rc_buf(now, v, qpn, b, IpoibHeader::LEN + len);
                return;
            }
        }
        // Anything else: the general path, from a copy.
        let mut packet = std::mem::take(&mut self.tun_scratch);
        packet.clear();
        if let Some(bytes) = super::ip_packet_in(v, b, len) {
            packet.extend_from_slice(bytes);
        }
        self.tx.put_buf(b);
        self.handle_tun_packet(now, v, &packet);
        self.tun_scratch = packet;
    }

    /// Sends an IP packet to a resolved neighbour: over its RC connection in connected mode
    /// when the peer supports it, otherwise over UD.
    pub(super) fn send_ip<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        dst: IpAddr,
        hw: HwAddr,
        ethertype: u16,
        packet: &[u8],
    ) {
        if self.cfg.mode == Mode::Connected && hw.connected_mode() {
            self.send_rc(now, v, dst, hw, ethertype, packet);
        } else {
            self.send_ud_ip(now, v, hw, ethertype, packet);
        }
    }

    /// Sends an IP packet over UD, or an ICMP "too big" back if it exceeds the UD MTU.
    fn send_ud_ip<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        hw: HwAddr,
        ethertype: u16,
        packet: &[u8],
    ) {
        let ud_mtu = self.cfg.ud_mtu();
        if packet.len() > ud_mtu as usize {
            if !hw.is_multicast() {
                self.too_big(packet, ud_mtu);
            } else {
                self.counters.tx_dropped += 1;
            }
            return;
        }
        if self.send_ud(v, hw, ethertype, packet) {
            self.counters.tx_packets += 1;
        }
        let _ = now;
    }

    /// Posts one UD send of `payload` behind an IPoIB header; false if it could not be posted.
    pub(super) fn send_ud<V: Verbs>(
        &mut self,
        v: &mut V,
        hw: HwAddr,
        ethertype: u16,
        payload: &[u8],
    ) -> bool {
        let Some(b) = self.ud.free_send.pop() else {
            self.counters.tx_dropped += 1;
            return false;
        };
        let Some(len) = fill_ipoib(v, b, ethertype, payload) else {
            self.ud.free_send.push(b);
            self.counters.tx_dropped += 1;
            return false;
        };
        let mut w = SendWr::send(wr(WR_SEND), b, len);
        w.ud = Some(UdDest {
            av: AddressVector::to_gid(hw.gid),
            remote_qpn: hw.qpn,
            remote_qkey: self.cfg.qkey,
        });
        match v.post_send(self.ud.qp, &w) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "UD post_send failed");
                self.ud.free_send.push(b);
                self.counters.tx_dropped += 1;
                false
            }
        }
    }

    /// Reaps the UD CQ: send buffers come back, received packets are handled and the receive
    /// posted again.
    pub(super) fn poll_ud<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        for _ in 0..64 {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let n = v.poll_cq(self.ud.cq, &mut wcs, CQ_BATCH);
            for wc in &wcs {
                let Some(b) = wc.buf else { continue };
                match wc.opcode {
                    WcOpcode::Send => self.ud.free_send.push(b),
                    WcOpcode::Recv => {
                        if wc.status == WcStatus::Success && wr_kind(wc.wr_id) == WR_RECV {
                            self.on_ud_recv(now, v, b, wc.byte_len as usize);
                        }
                        if v.post_recv(self.ud.qp, wr(WR_RECV), b).is_err() {
                            let _ = v.pools_mut().free(b);
                        }
                    }
                }
            }
            self.wcs = wcs;
            if n < CQ_BATCH {
                break;
            }
        }
    }

    fn on_ud_recv<V: Verbs>(&mut self, now: Instant, v: &mut V, b: BufId, len: usize) {
        let Ok(buf) = v.pools().get(b) else { return };
        let Some(frame) = buf.get(..len) else { return };
        let (Some(src_gid), Some(data)) = (grh_source_gid(frame), frame.get(GRH_LEN..)) else {
            self.counters.rx_bad_packets += 1;
            return;
        };
        let Ok(hdr) = IpoibHeader::parse(data) else {
            self.counters.rx_bad_packets += 1;
            return;
        };
        let payload = data.get(IpoibHeader::LEN..).unwrap_or(&[]).to_vec();
        match hdr.ethertype {
            ETHERTYPE_ARP => self.on_arp(now, v, src_gid, &payload),
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => {
                if let Ok(nd) = NdMessage::parse(&payload) {
                    self.on_nd(now, v, src_gid, nd.kind, &payload);
                    return;
                }
                self.deliver(&payload);
            }
            _ => self.counters.rx_bad_packets += 1,
        }
    }

    /// Queues an IP packet received from a peer for the TUN device (a copy), if it is
    /// well-formed and addressed to us (or multicast).
    pub(super) fn deliver(&mut self, packet: &[u8]) {
        if let Some(len) = self.accept_for_tun(packet) {
            let mut out = self.tun_spare.pop().unwrap_or_default();
            out.clear();
            out.extend_from_slice(packet.get(..len).unwrap_or(packet));
            self.tun_out.push_back(TunPacket::Owned(out));
        }
    }

    /// Whether an IP packet from a peer may go to the TUN device (well-formed, addressed to
    /// us or multicast), counted either way; its length without trailing bytes if so.
    pub(super) fn accept_for_tun(&mut self, packet: &[u8]) -> Option<usize> {
        match classify(packet) {
            Ok(info)
                if info.total_len <= packet.len()
                    && (info.is_multicast_or_broadcast() || self.is_ours(info.dst)) =>
            {
                self.counters.rx_packets += 1;
                Some(info.total_len)
            }
            _ => {
                self.counters.rx_bad_packets += 1;
                None
            }
        }
    }

    fn on_arp<V: Verbs>(&mut self, now: Instant, v: &mut V, src_gid: crate::verbs::Gid, p: &[u8]) {
        let Ok(arp) = IpoibArp::parse(p) else {
            self.counters.rx_bad_packets += 1;
            return;
        };
        // The sender's hardware address must be the one it sent from.
        if arp.sender_hw.gid != src_gid {
            self.counters.rx_bad_packets += 1;
            return;
        }
        let for_us = self.is_ours(IpAddr::V4(arp.target_ip));
        let sender = IpAddr::V4(arp.sender_ip);
        if !arp.sender_ip.is_unspecified() && !self.is_ours(sender) {
            self.learn(now, v, sender, arp.sender_hw, for_us);
        }
        if arp.op == ArpOp::Request && for_us {
            let reply = arp.reply_to(self.hwaddr);
            let mut bytes = [0u8; IpoibArp::LEN];
            reply.emit(&mut bytes);
            self.send_ud(v, arp.sender_hw, ETHERTYPE_ARP, &bytes);
        }
    }

    fn on_nd<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        src_gid: crate::verbs::Gid,
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
                    if hw.gid == src_gid && !ns.src.is_unspecified() {
                        self.learn(now, v, IpAddr::V6(ns.src), hw, for_us);
                    }
                }
                if for_us {
                    let na = NeighborAdvertisement::answer(&ns, self.hwaddr).to_packet();
                    let to = ns
                        .source_hw
                        .unwrap_or(HwAddr::multicast(mgid_for_ipv6(na_dst(&ns), self.cfg.pkey)));
                    self.send_ud(v, to, ETHERTYPE_IPV6, &na);
                }
            }
            NdType::NeighborAdvertisement => {
                let Ok(na) = NeighborAdvertisement::parse(packet) else {
                    self.counters.rx_bad_packets += 1;
                    return;
                };
                if let Some(hw) = na.target_hw {
                    if hw.gid == src_gid {
                        self.learn(now, v, IpAddr::V6(na.target), hw, na.solicited);
                    }
                }
            }
            // Router discovery and redirects have no meaning on this point-to-point fabric.
            _ => {}
        }
    }

    /// Learns a mapping and sends what waited for it.
    fn learn<V: Verbs>(&mut self, now: Instant, v: &mut V, ip: IpAddr, hw: HwAddr, for_us: bool) {
        match self.neigh.learn(ip, hw, now, for_us) {
            Learned::Resolved(queued) => {
                if let Some(n) = self.neigh.get_mut(&ip) {
                    if let Some(t) = n.timer.take() {
                        self.wheel.cancel(t);
                    }
                }
                if self
                    .neigh
                    .get(&ip)
                    .is_some_and(|n| n.state == NeighState::Reachable)
                {
                    let t = self.arm(now + self.cfg.neigh_timeout, Timer::NeighAge(ip));
                    if let Some(n) = self.neigh.get_mut(&ip) {
                        n.timer = Some(t);
                    }
                }
                for p in queued {
                    let ethertype = if ip.is_ipv4() {
                        ETHERTYPE_IPV4
                    } else {
                        ETHERTYPE_IPV6
                    };
                    self.send_ip(now, v, ip, hw, ethertype, &p);
                }
            }
            Learned::Replaced { old } => self.peer_restarted(now, v, old),
            Learned::Conflict => self.counters.neigh_conflicts += 1,
            Learned::Ignored => {}
        }
    }

    /// Sends an ARP request or a Neighbor Solicitation for `ip` and arms the retry timer.
    fn resolve<V: Verbs>(&mut self, now: Instant, v: &mut V, ip: IpAddr) {
        match ip {
            IpAddr::V4(t) => {
                let Some(IpAddr::V4(src)) = self.our_addr_for(ip) else {
                    self.give_up(ip);
                    return;
                };
                let req = IpoibArp::request(self.hwaddr, src, t);
                let mut bytes = [0u8; IpoibArp::LEN];
                req.emit(&mut bytes);
                let bcast = HwAddr::multicast(broadcast_mgid(self.cfg.pkey));
                self.send_ud(v, bcast, ETHERTYPE_ARP, &bytes);
            }
            IpAddr::V6(t) => {
                let Some(IpAddr::V6(src)) = self.our_addr_for(ip) else {
                    self.give_up(ip);
                    return;
                };
                let ns = NeighborSolicitation::new(src, self.hwaddr, t);
                let to = HwAddr::multicast(mgid_for_ipv6(ns.dst, self.cfg.pkey));
                let packet = ns.to_packet();
                self.send_ud(v, to, ETHERTYPE_IPV6, &packet);
            }
        }
        let t = self.arm(now + RESOLVE_INTERVAL, Timer::NeighResolve(ip));
        if let Some(n) = self.neigh.get_mut(&ip) {
            n.timer = Some(t);
        }
    }

    fn give_up(&mut self, ip: IpAddr) {
        if let Some(n) = self.neigh.remove(&ip) {
            self.counters.neigh_failed += 1;
            self.counters.tx_dropped += n.queue.len() as u64;
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
        let Some(n) = self.neigh.get_mut(&ip) else {
            return;
        };
        if n.timer != Some(id) {
            return;
        }
        n.timer = None;
        match n.state {
            NeighState::Incomplete { retries_left } if retries_left > 1 => {
                n.state = NeighState::Incomplete {
                    retries_left: retries_left - 1,
                };
                self.resolve(now, v, ip);
            }
            NeighState::Incomplete { .. } => self.give_up(ip),
            _ => {}
        }
    }

    pub(super) fn on_neigh_age_timer<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        ip: IpAddr,
        id: TimerId,
    ) {
        let Some(n) = self.neigh.get_mut(&ip) else {
            return;
        };
        if n.timer != Some(id) || n.state != NeighState::Reachable {
            return;
        }
        n.timer = None;
        let idle_until = n.last_used + self.cfg.neigh_timeout;
        if idle_until > now {
            let t = self.arm(idle_until, Timer::NeighAge(ip));
            if let Some(n) = self.neigh.get_mut(&ip) {
                n.timer = Some(t);
            }
            return;
        }
        // Aged out: drop the entry and, if no other neighbour uses it, its TX connection.
        if let Some(n) = self.neigh.remove(&ip) {
            if let Some(hw) = n.hw {
                let still_used = self
                    .neigh
                    .iter()
                    .any(|(_, m)| m.hw.is_some_and(|h| super::neigh::same_endpoint(&h, &hw)));
                if !still_used {
                    if let Some(qpn) = self.tx.to_peer(hw) {
                        self.close_tx(now, v, qpn, true);
                    }
                }
            }
        }
    }

    /// Writes an ICMP "fragmentation needed" / "packet too big" for `packet` into the TUN
    /// device, carrying `mtu`, as the local stack would get from a router.
    pub(super) fn too_big(&mut self, packet: &[u8], mtu: u32) {
        let Ok(info) = classify(packet) else { return };
        let mut out = Vec::new();
        let built = match (info.src, info.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let quote = packet.get(..packet.len().min(548)).unwrap_or(packet);
                // From the destination, as a router on the way would: the kernel drops
                // packets arriving with one of its own addresses as the source.
                PacketBuilder::ipv4(dst.octets(), src.octets(), 64)
                    .icmpv4(Icmpv4Type::DestinationUnreachable(
                        DestUnreachableHeader::FragmentationNeeded {
                            next_hop_mtu: u16::try_from(mtu).unwrap_or(u16::MAX),
                        },
                    ))
                    .write(&mut out, quote)
                    .is_ok()
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let quote = packet.get(..packet.len().min(1232)).unwrap_or(packet);
                PacketBuilder::ipv6(dst.octets(), src.octets(), 64)
                    .icmpv6(Icmpv6Type::PacketTooBig { mtu })
                    .write(&mut out, quote)
                    .is_ok()
            }
            _ => false,
        };
        if built {
            self.counters.icmp_too_big_sent += 1;
            self.tun_out.push_back(TunPacket::Owned(out));
        }
        self.counters.tx_dropped += 1;
    }
}

/// Where a Neighbor Advertisement answering `ns` goes when the solicitation carried no source
/// link-layer address: all-nodes.
fn na_dst(ns: &NeighborSolicitation) -> Ipv6Addr {
    if ns.src.is_unspecified() {
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1)
    } else {
        ns.src
    }
}
