//! The TUN side: the queue of packets for the TUN device (and the buffers it reuses), and
//! packets from the TUN device on their way to a neighbour.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::Instant;

use super::{ip_packet_in, Endpoint, Mode};
use crate::verbs::{BufId, Verbs};
use crate::wire::ipoib::{broadcast_mgid, classify, mgid_for_ipv6, HwAddr, IpoibHeader};

/// A packet waiting for the TUN device.
#[derive(Debug)]
pub(super) enum TunPacket {
    /// Built or copied by the endpoint (ARP/ND-delivered, UD, ICMP errors).
    Owned(Vec<u8>),
    /// An IP packet of `len` bytes still in the receive buffer `buf` of an RC connection,
    /// after the IPoIB header; the buffer goes back to the receive pool once written (a
    /// spare took its place on the receive queue).
    Received {
        /// The receive buffer.
        buf: BufId,
        /// Bytes of the IP packet.
        len: usize,
    },
}

/// Where the driver reads a TUN packet into a buffer from [`Endpoint::tun_buffer`]: after
/// room for the IPoIB header.
pub const TUN_BUFFER_OFFSET: usize = IpoibHeader::LEN;

/// Most spare TUN buffers kept for reuse (each up to an MTU, 64 KiB).
const TUN_SPARE_MAX: usize = 32;

/// Packets for the TUN device, in order, and the buffers reused to carry them.
#[derive(Debug, Default)]
pub(super) struct TunQueue {
    out: VecDeque<TunPacket>,
    /// Emptied [`Endpoint::poll_tun`] buffers given back by the driver
    /// ([`Endpoint::recycle_tun`]), reused so that delivering a packet allocates nothing (at
    /// most [`TUN_SPARE_MAX`] kept).
    spare: Vec<Vec<u8>>,
    /// Where [`Endpoint::handle_tun_buffer`] copies a packet that takes the general path.
    scratch: Vec<u8>,
}

impl TunQueue {
    /// Queues a copy of `packet`, in a spare buffer if there is one.
    pub(super) fn push_copy(&mut self, packet: &[u8]) {
        let mut out = self.spare();
        out.extend_from_slice(packet);
        self.out.push_back(TunPacket::Owned(out));
    }

    /// Queues a packet the endpoint built.
    pub(super) fn push_owned(&mut self, packet: Vec<u8>) {
        self.out.push_back(TunPacket::Owned(packet));
    }

    /// Queues an IP packet of `len` bytes still in the receive buffer `buf`.
    pub(super) fn push_received(&mut self, buf: BufId, len: usize) {
        self.out.push_back(TunPacket::Received { buf, len });
    }

    fn pop(&mut self) -> Option<TunPacket> {
        self.out.pop_front()
    }

    /// An empty buffer: a spare one, or a new one.
    fn spare(&mut self) -> Vec<u8> {
        let mut out = self.spare.pop().unwrap_or_default();
        out.clear();
        out
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < TUN_SPARE_MAX {
            self.spare.push(buf);
        }
    }
}

impl Endpoint {
    /// The next packet for the TUN device, as an owned buffer (a packet still in a receive
    /// buffer is copied out, and the receive buffer given back to `v`). See
    /// [`drain_tun`](Self::drain_tun), which writes without the copy.
    pub fn poll_tun<V: Verbs>(&mut self, v: &mut V) -> Option<Vec<u8>> {
        match self.tun.pop()? {
            TunPacket::Owned(p) => Some(p),
            TunPacket::Received { buf, len } => {
                let mut out = self.tun.spare();
                if let Some(bytes) = ip_packet_in(v, buf, len) {
                    out.extend_from_slice(bytes);
                }
                self.release_rx_buf(v, buf);
                Some(out)
            }
        }
    }

    /// Hands every packet waiting for the TUN device to `write`, in order, straight from the
    /// receive buffers it arrived in, then gives those buffers back to `v` (to the SRQ or the
    /// connection's ring, or frees them if the connection went away meanwhile). Call it on
    /// every turn after [`handle_verbs`](Self::handle_verbs) and
    /// [`handle_timeout`](Self::handle_timeout): until then the buffers stay out of the
    /// receive queue.
    pub fn drain_tun<V: Verbs>(&mut self, v: &mut V, write: impl FnMut(&[u8])) {
        self.drain_tun_at_most(v, usize::MAX, write);
    }

    /// [`drain_tun`](Self::drain_tun) for at most `max` packets; the rest wait, in their
    /// receive buffers, for a later call. Returns how many it handed to `write`.
    pub fn drain_tun_at_most<V: Verbs>(
        &mut self,
        v: &mut V,
        max: usize,
        mut write: impl FnMut(&[u8]),
    ) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.tun.pop() else { break };
            n += 1;
            match item {
                TunPacket::Owned(p) => {
                    write(&p);
                    self.tun.recycle(p);
                }
                TunPacket::Received { buf, len } => {
                    if let Some(bytes) = ip_packet_in(v, buf, len) {
                        write(bytes);
                    }
                    self.release_rx_buf(v, buf);
                }
            }
        }
        n
    }

    /// True while packets wait for the TUN device.
    #[must_use]
    pub fn has_tun_packets(&self) -> bool {
        !self.tun.out.is_empty()
    }

    /// Gives a buffer from [`poll_tun`](Self::poll_tun) back once written, for the next
    /// packet to reuse (optional; dropping it is fine).
    pub fn recycle_tun(&mut self, buf: Vec<u8>) {
        self.tun.recycle(buf);
    }

    /// Handles one IP packet read from the TUN device.
    pub fn handle_tun_packet<V: Verbs>(&mut self, now: Instant, v: &mut V, packet: &[u8]) {
        if self.stopping {
            return;
        }
        if self.follower.is_some() {
            self.follow_packet(now, v, packet);
            return;
        }
        let Ok(info) = classify(packet) else {
            self.counters.tx_dropped += 1;
            return;
        };
        let ethertype = info.version.ethertype();
        if info.is_multicast_or_broadcast() {
            let mgid = match info.dst {
                IpAddr::V6(d) => mgid_for_ipv6(d, self.cfg.mgid_pkey()),
                IpAddr::V4(_) => broadcast_mgid(self.cfg.mgid_pkey()),
            };
            self.send_ud_ip(v, HwAddr::multicast(mgid), ethertype, packet);
            return;
        }
        let dst = info.dst;
        let hw = match self.neigh.use_entry(&dst, now).map(|n| n.resolved()) {
            Some(Some(hw)) => hw,
            // Still resolving.
            Some(None) => {
                if !self.neigh.enqueue(&dst, packet, self.cfg.tx_queue_len) {
                    self.counters.tx_queue_drops += 1;
                }
                return;
            }
            None => {
                if !self.start_resolving(now, dst) {
                    self.counters.tx_dropped += 1;
                    return;
                }
                if !self.neigh.enqueue(&dst, packet, self.cfg.tx_queue_len) {
                    self.counters.tx_queue_drops += 1;
                }
                self.resolve(now, v, dst);
                return;
            }
        };
        if !self.verify_binding(now, v, dst) {
            // It failed: resolved again, the packet waits for that.
            if !self.neigh.enqueue(&dst, packet, self.cfg.tx_queue_len) {
                self.counters.tx_queue_drops += 1;
            }
            return;
        }
        self.send_ip(now, v, hw, ethertype, packet);
    }

    /// A send buffer for the driver to read the next TUN packet into, at
    /// [`TUN_BUFFER_OFFSET`](TUN_BUFFER_OFFSET) (room for the IPoIB header before it), so
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
    /// [`tun_buffer`](Self::tun_buffer), at [`TUN_BUFFER_OFFSET`](TUN_BUFFER_OFFSET):
    /// as [`handle_tun_packet`](Self::handle_tun_packet), but a packet for an established RC
    /// connection is sent from that buffer without a copy.
    pub fn handle_tun_buffer<V: Verbs>(&mut self, now: Instant, v: &mut V, b: BufId, len: usize) {
        // A packet longer than the buffer was cut short by the read (an interface MTU raised
        // past what IPoIB-CM carries): never send the stump.
        let info = ip_packet_in(v, b, len).and_then(|p| classify(p).ok());
        if info.is_some_and(|info| info.total_len > len) {
            self.counters.tx_dropped += 1;
            self.tx.put_buf(b);
            return;
        }
        // One lookup of the neighbour: it is marked used only when the packet takes this path
        // (the general path marks it itself).
        let fast = info.and_then(|info| {
            if info.is_multicast_or_broadcast() || self.cfg.mode != Mode::Connected {
                return None;
            }
            if let Some(f) = self.follower.as_mut() {
                let hw = f
                    .lookup(&info.dst)
                    .filter(|hw| hw.connectable() && hw.takes_conn_per_worker())?;
                let qpn = self.tx.established_to(hw, len)?;
                f.note_used(info.dst);
                return Some((info.version.ethertype(), qpn));
            }
            let id = self.neigh.find(&info.dst)?;
            let hw = self
                .neigh
                .entry(id)?
                .resolved()
                .filter(|hw| hw.connectable())?;
            let qpn = self.tx.established_to(hw, len)?;
            self.neigh.touch(id, now);
            Some((info.version.ethertype(), qpn))
        });
        if let Some((ethertype, qpn)) = fast {
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
        let mut packet = std::mem::take(&mut self.tun.scratch);
        packet.clear();
        if let Some(bytes) = ip_packet_in(v, b, len) {
            packet.extend_from_slice(bytes);
        }
        self.tx.put_buf(b);
        self.handle_tun_packet(now, v, &packet);
        self.tun.scratch = packet;
    }

    /// Sends an IP packet to a resolved neighbour: over its RC connection in connected mode
    /// when the peer takes connections ([`HwAddr::connectable`]), otherwise over UD.
    pub(super) fn send_ip<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        hw: HwAddr,
        ethertype: u16,
        packet: &[u8],
    ) {
        if self.cfg.mode == Mode::Connected && hw.connectable() {
            self.send_rc(now, v, hw, ethertype, packet);
        } else {
            self.send_ud_ip(v, hw, ethertype, packet);
        }
    }

    /// Queues an IP packet received from a peer for the TUN device (a copy), if it is
    /// well-formed and addressed to us (or multicast).
    pub(super) fn deliver(&mut self, packet: &[u8]) {
        if let Some(len) = self.accept_for_tun(packet) {
            self.tun.push_copy(packet.get(..len).unwrap_or(packet));
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
                self.counters.rx_bytes += info.total_len as u64;
                Some(info.total_len)
            }
            _ => {
                self.counters.rx_bad_packets += 1;
                None
            }
        }
    }
}
