//! The receive path: a datagram is checked (ICRC, header, P_Key, destination QP, source
//! address, and for RC the source port once pinned) and handed to the completer, the responder or the UD receive of its QP.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::icrc_peers::Noted;
use super::SoftVerbs;
use crate::soft::config::MULTICAST_QPN;
use crate::soft::device::ip_info;
use crate::soft::ib::{Beacon, Learnt};
use crate::soft::qp::roce_dgid;
use crate::soft::responder::Origin;
use crate::verbs::{Lid, PKey, QpNum, QpType, Sl};
use crate::wire::bth::{Bth, Opcode, Transport};
use crate::wire::ib::{parse_ib, IbPacketError};
use crate::wire::icrc;
use crate::wire::roce::RocePacket;
use crate::wire::ICRC_LEN;

impl SoftVerbs {
    /// Processes one received UDP datagram (the UDP payload). `src` is the sender's address and
    /// port, `dst` the IP address it was sent to.
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: IpAddr, datagram: &[u8]) {
        self.dev.stats.rx_datagrams += 1;
        self.later.tick(now);
        if self.lost {
            self.dev.stats.rx_device_lost += 1;
            return;
        }
        if self.dev.ib.is_some() {
            self.handle_ib_datagram(now, src, datagram);
            return;
        }
        let check_icrc = match src.ip() {
            IpAddr::V4(_) => self.dev.cfg.verify_icrc_v4,
            IpAddr::V6(_) => true,
        };
        // The ICRC covers every byte of the datagram (but the masked BTH byte) and needs no
        // parsing, so it is checked first: a corrupted frame counts as a bad ICRC even when
        // the flipped bit also made it unparseable (an opcode or pad count), rather than as
        // malformed, and the parser only ever sees verified bytes. Anything too short to
        // hold a BTH and an ICRC is malformed.
        if check_icrc && datagram.len() >= Bth::HEADER_LEN + ICRC_LEN {
            let diff = ip_info(src.ip(), dst).and_then(|ip| {
                icrc::icrc_difference(&ip, src.port(), self.dev.cfg.dst_port, datagram)
            });
            // The check with ID 0 is the fast path (our peers send ID 0 but on later GSO
            // segments); only when it fails is the ID solved for. IPv6 has no ID, so any
            // difference there is an error.
            let id = match diff {
                Some(0) => Some(0),
                Some(d) if src.is_ipv4() => self.id_shifts.solve(datagram.len(), d),
                _ => None,
            };
            match id.map(usize::from) {
                Some(0) => {}
                // A later segment of a UDP GSO train from one of our own peers.
                Some(k) if k < icrc::GSO_MAX_SEGMENTS => self.dev.stats.rx_gso_segments += 1,
                // A sender that picks its own IDs (rxe): accepted with a 2^-16 false-accept
                // chance per corrupted packet (see `Ipv4IdShift`).
                Some(_) => {
                    self.dev.stats.rx_icrc_id_solved += 1;
                    if self.id_solved_peers.note(src.ip()) == Noted::Untracked {
                        self.dev.stats.icrc_id_peers_untracked += 1;
                    }
                }
                None => {
                    self.dev.stats.rx_bad_icrc += 1;
                    return;
                }
            }
        }
        let Ok(pkt) = RocePacket::parse(datagram) else {
            self.dev.stats.rx_malformed += 1;
            return;
        };
        self.deliver(now, &pkt, &Origin::Ip { src, dst }, datagram);
    }

    /// A datagram of the InfiniBand link: a beacon, or a native IB packet checked as an
    /// HCA checks it (VCRC and ICRC, the port active, a DLID of the port's or an attached
    /// MLID, the P_Key against the port's table) before it goes on as a RoCEv2 one does.
    fn handle_ib_datagram(&mut self, now: Instant, src: SocketAddr, datagram: &[u8]) {
        let Some(ib) = self.dev.ib.as_mut() else {
            return;
        };
        if let Some(b) = Beacon::parse(datagram) {
            self.dev.stats.rx_beacons += 1;
            let before = ib.routes.generation();
            if ib.routes.learn(now, &b, src) == Learnt::Full {
                self.dev.stats.routes_full += 1;
            }
            // A port new to us (or moved) hears our beacon at once rather than at our next
            // period: its first packets to us find their route. Only on a change, so two
            // ports answer each other once.
            if b.active && ib.routes.generation() != before && ib.beacon_at.is_some() {
                ib.beacon_at = Some(now);
            }
            return;
        }
        let frame = match parse_ib(datagram) {
            Ok(f) => f,
            Err(IbPacketError::BadIcrc | IbPacketError::BadVcrc) => {
                self.dev.stats.rx_bad_icrc += 1;
                return;
            }
            Err(_) => {
                self.dev.stats.rx_malformed += 1;
                return;
            }
        };
        if !ib.port.active {
            self.dev.stats.rx_port_down += 1;
            return;
        }
        let dlid = Lid(frame.lrh.dlid);
        let ours = if dlid.is_multicast() {
            self.dev.mcast.has_mlid(dlid.0)
        } else {
            ib.port.owns_lid(dlid.0)
        };
        if !ours {
            self.dev.stats.rx_wrong_dlid += 1;
            return;
        }
        let Ok(pkt) = RocePacket::parse(frame.transport) else {
            self.dev.stats.rx_malformed += 1;
            return;
        };
        if !ib.port.admits(pkt.bth.pkey) {
            self.dev.stats.rx_pkey_violations += 1;
            return;
        }
        let origin = Origin::Lid {
            slid: Lid(frame.lrh.slid),
            sl: Sl::from_bits(frame.lrh.sl),
            grh: frame.grh,
        };
        self.deliver(now, &pkt, &origin, frame.transport);
    }

    /// Hands a checked packet (`transport`: its BTH through ICRC) to its QP, or to every QP
    /// attached to its group: the transport checks (TVer, the QPs' P_Key), the QP's, and for
    /// RC the peer's address.
    fn deliver(&mut self, now: Instant, pkt: &RocePacket<'_>, origin: &Origin, transport: &[u8]) {
        if pkt.bth.tver != 0 {
            self.dev.stats.rx_bad_tver += 1;
            return;
        }
        if !PKey(pkt.bth.pkey).matches(self.dev.cfg.pkey) {
            self.dev.stats.rx_bad_pkey += 1;
            return;
        }
        let qpn = QpNum::new(pkt.bth.dest_qp);
        if qpn == MULTICAST_QPN {
            let members = match *origin {
                Origin::Ip { src, dst } => {
                    // Every UD QP attached to a group the packet was sent to gets a copy,
                    // once: the same packet may also come the other way (IP multicast and
                    // unicast fan-out).
                    if let Some(deth) = pkt.deth {
                        if !self
                            .dev
                            .mcast
                            .first_copy(now, src.ip(), deth.src_qp, pkt.bth.psn)
                        {
                            self.dev.stats.rx_mcast_duplicates += 1;
                            return;
                        }
                    }
                    self.dev.mcast.members_for(dst, self.dev.cfg.local_ip)
                }
                // IB multicast names its group in the GRH.
                Origin::Lid { grh, .. } => grh
                    .map(|g| self.dev.mcast.members_of(g.dgid))
                    .unwrap_or_default(),
            };
            if members.is_empty() {
                self.dev.stats.rx_unknown_qpn += 1;
            }
            for m in members {
                if let Some(qp) = self.qps.get_mut(m) {
                    self.dev.on_ud(qp, origin, pkt);
                }
            }
            return;
        }
        let Some(qp) = self.qps.get_mut(qpn) else {
            self.dev.stats.rx_unknown_qpn += 1;
            return;
        };
        let dev = &mut self.dev;
        match qp.qp_type {
            QpType::Rc => {
                let peer_ok = qp.attrs.av.is_some_and(|av| match *origin {
                    Origin::Ip { src, .. } => roce_dgid(&av).to_ip() == src.ip(),
                    Origin::Lid { slid, .. } => av.dlid == slid,
                });
                if !peer_ok {
                    dev.stats.rx_bad_src += 1;
                    return;
                }
                let src_port = match *origin {
                    Origin::Ip { src, .. } => Some(src.port()),
                    Origin::Lid { .. } => None,
                };
                if qp.peer_port.is_some_and(|p| Some(p) != src_port) {
                    dev.stats.rx_bad_src_port += 1;
                    return;
                }
                let sequence = (qp.resp.psn, qp.req.comp_psn);
                if pkt.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                    dev.on_ack(qp, now, pkt);
                    dev.check_sq_drained(qp);
                } else if pkt.bth.opcode.transport() == Transport::Rc && pkt.bth.opcode.is_send() {
                    dev.on_request(qp, now, pkt, transport);
                } else {
                    // RDMA, atomics and UC/UD opcodes are not accepted by these QPs.
                    dev.stats.rx_bad_state += 1;
                }
                if qp.peer_port.is_none() && (qp.resp.psn, qp.req.comp_psn) != sequence {
                    qp.peer_port = src_port;
                }
            }
            QpType::Ud | QpType::Gsi => dev.on_ud(qp, origin, pkt),
        }
        if qp.has_work() {
            dev.sched.mark_ready(qp);
        }
    }
}
