//! The UD QP: its set-up and multicast group memberships, datagram sends (IP in datagram mode
//! and multicast, ARP and ND), and what arrives on it, handed to resolution or the TUN queue.
//!
//! The UD QP is attached to the groups that address resolution reaches it through
//! ([`ud_groups`]): the broadcast group (ARP) and, with an IPv6 address, the all-nodes group
//! and the solicited-node group of each IPv6 address (ND), as Linux ipoib joins the groups
//! the IPv6 stack asks for. On an underlay that carries each MGID as its own IP multicast
//! group (IPv6), a node not attached to a solicited-node group never hears the Neighbor
//! Solicitations sent to it.

use std::net::IpAddr;
use std::time::Instant;

use super::path_wait::Held;
use super::{fill_ipoib, wr, wr_kind, Endpoint, EndpointConfig, CQ_BATCH, WR_RECV, WR_SEND};
use crate::verbs::setup::open_ud_qp;
use crate::verbs::{
    BufId, Completion, CqId, Gid, Lid, PathMtu, PdId, QpNum, QpType, SendWr, UdDest, Verbs,
    VerbsError, WcOpcode, WcStatus,
};
use crate::wire::grh::{grh_source_gid, GRH_LEN};
use crate::wire::ipoib::{
    broadcast_mgid, mgid_for_ipv6, solicited_node_multicast, HwAddr, IpoibHeader, NdMessage,
    ALL_NODES_MULTICAST, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6,
};

/// Where a UD message came from, as far as the provider can tell: the source GID of its GRH
/// (the underlay address on RoCE) or, without a GRH (IB unicast), the GID whose path names
/// the completion's SLID; the sender's QPN; and the UDP source port (where the provider
/// reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UdSource {
    /// `None`: no GRH, and no path names the SLID (a port not talked to yet).
    pub(super) gid: Option<Gid>,
    /// The sender's QPN, checked only where there is no GRH (the LID names a port, the QPN
    /// its UD QP).
    pub(super) qpn: Option<QpNum>,
    /// The completion's `src_qp` whatever the GRH (where the provider reports it): the QP
    /// the message came from, which an IP packet's source is checked against (`guard.rs`).
    pub(super) sender_qp: Option<QpNum>,
    pub(super) port: Option<u16>,
}

impl UdSource {
    /// A source known by the GID of its GRH.
    pub(super) const fn by_gid(gid: Gid, port: Option<u16>) -> Self {
        Self {
            gid: Some(gid),
            qpn: None,
            sender_qp: None,
            port,
        }
    }

    /// Whether the message came from `hw`'s endpoint: its GID (known), and its QPN where the
    /// provider reports the sender's QP.
    pub(super) fn is(&self, hw: HwAddr) -> bool {
        self.gid == Some(hw.gid) && self.sender_qp.is_none_or(|q| q == hw.qpn)
    }

    /// The sender's own address, to answer it (flags unknown: none), where the provider
    /// names both its GID and its QP.
    pub(super) fn hwaddr(&self) -> Option<HwAddr> {
        Some(HwAddr::new(0, self.sender_qp?, self.gid?))
    }

    /// Whether a message from here may speak for `hw` (an ARP or ND sender's hardware
    /// address): its GID is the source's where that is known, and without a GRH its QPN is
    /// the completion's `src_qp`. A GRH-less message from a LID no path names is taken at
    /// its word, as kernel ipoib takes every ARP (its path is looked up when it is used).
    pub(super) fn vouches_for(&self, hw: HwAddr) -> bool {
        self.gid.is_none_or(|g| g == hw.gid) && self.qpn.is_none_or(|q| q == hw.qpn)
    }
}

/// What a UD receive completion says about its message, beside the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UdRecv {
    pub(super) len: usize,
    /// The first 40 bytes are a GRH (`IBV_WC_GRH`).
    pub(super) grh: bool,
    pub(super) slid: Option<Lid>,
    pub(super) src_qp: Option<QpNum>,
    pub(super) src_port: Option<u16>,
}

impl UdRecv {
    pub(super) fn of(wc: &Completion) -> Self {
        Self {
            len: wc.byte_len as usize,
            grh: wc.grh,
            slid: wc.slid,
            src_qp: wc.src_qp,
            src_port: wc.src_port,
        }
    }
}

/// The UD QP and its resources.
#[derive(Debug)]
pub(super) struct UdQp {
    pub(super) qp: QpNum,
    pub(super) cq: CqId,
    pub(super) free_send: Vec<BufId>,
    /// The multicast groups the QP is attached to ([`ud_groups`]; empty once
    /// [`Endpoint::leave_groups`] detached them).
    pub(super) groups: Vec<Gid>,
}

/// The multicast groups of an interface with `cfg`'s addresses and P_Key, once each:
/// broadcast first, then, if it has an IPv6 address, all-nodes and the solicited-node group
/// of each IPv6 address. As many as the configured addresses plus two.
pub(super) fn ud_groups(cfg: &EndpointConfig) -> Vec<Gid> {
    let mut groups = vec![broadcast_mgid(cfg.mgid_pkey())];
    let v6 = cfg.addrs.iter().filter_map(|(ip, _)| match ip {
        IpAddr::V6(a) => Some(*a),
        IpAddr::V4(_) => None,
    });
    for (i, a) in v6.enumerate() {
        if i == 0 {
            groups.push(mgid_for_ipv6(ALL_NODES_MULTICAST, cfg.mgid_pkey()));
        }
        let g = mgid_for_ipv6(solicited_node_multicast(a), cfg.mgid_pkey());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups
}

impl EndpointConfig {
    /// Buffers of the UD QP's pool: its receives and its sends.
    pub fn ud_pool_buffers(&self) -> usize {
        self.ud_depth as usize * 2
    }

    /// The multicast groups the UD QP is attached to (`ud_groups`): the broadcast group, and
    /// with IPv6 addresses all-nodes and each address's solicited-node group.
    pub fn ud_groups(&self) -> Vec<Gid> {
        ud_groups(self)
    }
}

/// Bytes of a UD buffer on a port whose largest MTU is `port_max` (kernel ipoib's
/// `IPOIB_UD_BUF_SIZE(max_ib_mtu)`): the GRH area and the largest datagram the port can
/// deliver, whatever the path MTU, so that a peer whose path MTU is larger than ours (a kernel
/// peer in datagram mode sends 2044 or 4092 bytes of IP on a 2K or 4K fabric) is received,
/// not refused with a local length error.
pub(super) const fn ud_buf_len(port_max: PathMtu) -> usize {
    GRH_LEN + port_max.bytes()
}

/// Creates the UD QP, brings it to RTS, posts its receives and attaches it to its multicast
/// groups ([`ud_groups`]); `pkey_index` is [`EndpointConfig::pkey`]'s in the port's table.
/// Its buffers hold [`ud_buf_len`] of the port's largest MTU (or of the path MTU, if larger).
pub(super) fn open_ud<V: Verbs>(
    v: &mut V,
    pd: PdId,
    cfg: &EndpointConfig,
    pkey_index: u16,
) -> Result<UdQp, VerbsError> {
    let depth = cfg.ud_depth;
    let cq = v.create_cq(depth * 2 + 8)?;
    let port_max = v.port_attr().max_mtu.max(cfg.path_mtu);
    let pool = v.create_pool(pd, ud_buf_len(port_max), cfg.ud_pool_buffers())?;
    let setup = open_ud_qp(
        v,
        pd,
        QpType::Ud,
        cq,
        pool,
        cfg.qkey,
        pkey_index,
        depth,
        depth,
        wr(WR_RECV),
    )?;
    let (qp, free_send) = (setup.qp, setup.send_bufs);
    let groups = ud_groups(cfg);
    for g in &groups {
        v.attach_mcast(qp, *g, 0)?;
    }
    Ok(UdQp {
        qp,
        cq,
        free_send,
        groups,
    })
}

impl Endpoint {
    /// The UD QP: control's; a follower has none.
    pub(super) fn ud_qp(&self) -> Option<QpNum> {
        self.ud.as_ref().map(|ud| ud.qp)
    }

    /// The groups the UD QP joins at set-up (none on a follower).
    pub(super) fn ud_groups(&self) -> &[Gid] {
        self.ud.as_ref().map_or(&[], |ud| ud.groups.as_slice())
    }

    fn give_back_ud_send(&mut self, b: BufId) {
        if let Some(ud) = self.ud.as_mut() {
            ud.free_send.push(b);
        }
    }

    /// Detaches the UD QP from its multicast groups, at the end of a shutdown: the provider
    /// leaves them (on an IP multicast underlay, its group sockets close). Nothing arrives
    /// by multicast afterwards; calling it again does nothing.
    pub fn leave_groups<V: Verbs>(&mut self, v: &mut V) {
        if self.uses_sa_groups() {
            // Attached only once joined; each group's leave goes to the SA client.
            self.leave_sa_groups(v);
            if let Some(ud) = self.ud.as_mut() {
                ud.groups.clear();
            }
            return;
        }
        let Some(ud) = self.ud.as_mut() else {
            return;
        };
        for g in std::mem::take(&mut ud.groups) {
            if let Err(e) = v.detach_mcast(ud.qp, g) {
                tracing::debug!(group = %g, error = %e, "detach_mcast failed");
            }
        }
    }

    /// Sends an IP packet over UD, or an ICMP "too big" back if it exceeds the UD MTU.
    pub(super) fn send_ud_ip<V: Verbs>(
        &mut self,
        v: &mut V,
        hw: HwAddr,
        ethertype: u16,
        packet: &[u8],
    ) {
        let ud_mtu = self.ud_mtu();
        if packet.len() > ud_mtu as usize {
            if !hw.is_multicast() {
                self.too_big(packet, ud_mtu);
            } else {
                self.counters.tx_dropped += 1;
            }
            return;
        }
        if !hw.is_multicast() && self.ud_send_ready(None) && self.must_wait_for_path(hw.gid) {
            self.hold_for_path(hw, Held::Ip, ethertype, packet);
            return;
        }
        if self.send_ud(v, hw, ethertype, packet) {
            self.counters.tx_packets += 1;
            self.counters.tx_bytes += packet.len() as u64;
        }
    }

    /// Posts one UD send of `payload` behind an IPoIB header; false if it could not be posted
    /// now. A unicast one with no path yet where an SA holds the paths (an ARP or ND reply;
    /// IP packets wait before they get here) is held for the path (`path_wait.rs`).
    pub(super) fn send_ud<V: Verbs>(
        &mut self,
        v: &mut V,
        hw: HwAddr,
        ethertype: u16,
        payload: &[u8],
    ) -> bool {
        if !self.ud_send_ready(hw.is_multicast().then_some(hw.gid)) {
            // Before the broadcast join, or the group's (send-only) join, was answered.
            self.counters.tx_dropped += 1;
            return false;
        }
        if !hw.is_multicast() && self.must_wait_for_path(hw.gid) {
            self.hold_for_path(hw, Held::Reply, ethertype, payload);
            return false;
        }
        // A follower has no UD QP: it hands datagram sends to control.
        let Some((qp, b)) = self
            .ud
            .as_mut()
            .and_then(|ud| Some((ud.qp, ud.free_send.pop()?)))
        else {
            self.counters.tx_dropped += 1;
            return false;
        };
        let Some(len) = fill_ipoib(v, b, ethertype, payload) else {
            self.give_back_ud_send(b);
            self.counters.tx_dropped += 1;
            return false;
        };
        let mut w = SendWr::send(wr(WR_SEND), b, len);
        w.ud = Some(UdDest {
            av: self.av_to(hw.gid),
            remote_qpn: hw.qpn,
            remote_qkey: self.cfg.qkey,
        });
        match v.post_send(qp, &w) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "UD post_send failed");
                self.give_back_ud_send(b);
                self.counters.tx_dropped += 1;
                false
            }
        }
    }

    /// Reaps the UD CQ: send buffers come back, received packets are handled and the receive
    /// posted again.
    pub(super) fn poll_ud<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        let Some((qp, cq)) = self.ud.as_ref().map(|ud| (ud.qp, ud.cq)) else {
            return;
        };
        for _ in 0..64 {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let n = v.poll_cq(cq, &mut wcs, CQ_BATCH);
            for wc in &wcs {
                let Some(b) = wc.buf else { continue };
                match wc.opcode {
                    WcOpcode::Send => self.give_back_ud_send(b),
                    WcOpcode::Recv => {
                        if wc.status == WcStatus::Success && wr_kind(wc.wr_id) == WR_RECV {
                            self.on_ud_recv(now, v, b, UdRecv::of(wc));
                        }
                        if v.post_recv(qp, wr(WR_RECV), b).is_err() {
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

    fn on_ud_recv<V: Verbs>(&mut self, now: Instant, v: &mut V, b: BufId, r: UdRecv) {
        let Ok(buf) = v.pools().get(b) else { return };
        let Some(frame) = buf.get(..r.len) else {
            return;
        };
        if let Some((src, ethertype, payload)) = self.classify_ud(frame, r) {
            self.dispatch_ud(now, v, src, ethertype, &payload);
        }
    }

    /// One UD message: `frame` is the receive buffer's first `r.len` bytes, the 40-byte GRH
    /// area first (the tests' way in, with a synthetic completion).
    #[cfg(test)]
    pub(super) fn on_ud_frame<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        frame: &[u8],
        r: UdRecv,
    ) {
        if let Some((src, ethertype, payload)) = self.classify_ud(frame, r) {
            self.dispatch_ud(now, v, src, ethertype, &payload);
        }
    }

    /// The source, ethertype and payload of a UD message. With a GRH the source is its
    /// SGID; without one (IB unicast: the 40-byte area holds nothing meaningful) it is
    /// (`slid`, `src_qp`), the GID the one whose path names the LID.
    fn classify_ud(&mut self, frame: &[u8], r: UdRecv) -> Option<(UdSource, u16, Vec<u8>)> {
        let data = frame.get(GRH_LEN..);
        let src = if r.grh {
            grh_source_gid(frame).map(|g| UdSource {
                sender_qp: r.src_qp,
                ..UdSource::by_gid(g, r.src_port)
            })
        } else {
            r.src_qp.map(|qpn| UdSource {
                gid: r.slid.and_then(|l| self.paths.gid_of(l)),
                qpn: Some(qpn),
                sender_qp: Some(qpn),
                port: r.src_port,
            })
        };
        let parsed = data.zip(src).and_then(|(d, src)| {
            let hdr = IpoibHeader::parse(d).ok()?;
            let payload = d.get(IpoibHeader::LEN..).unwrap_or(&[]).to_vec();
            Some((src, hdr.ethertype, payload))
        });
        if parsed.is_none() {
            self.counters.rx_bad_packets += 1;
        }
        parsed
    }

    fn dispatch_ud<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        src: UdSource,
        ethertype: u16,
        payload: &[u8],
    ) {
        match ethertype {
            ETHERTYPE_ARP => self.on_arp(now, v, src, payload),
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => {
                if let Ok(nd) = NdMessage::parse(payload) {
                    self.on_nd(now, v, src, nd.kind, payload);
                    return;
                }
                if self.ud_source_ok(src, payload) {
                    self.deliver(payload);
                }
            }
            _ => self.counters.rx_bad_packets += 1,
        }
    }
}
