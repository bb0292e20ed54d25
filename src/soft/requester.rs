//! The requester (rxe `rxe_req.c`): send WQEs become packets (segmentation by path MTU, PSN
//! assignment, AckReq) within the QP's send window; UD sends, multicast ones fanned out to
//! every underlay peer.

use std::net::SocketAddr;
use std::time::Instant;

use super::device::Device;
use super::mcast;
use super::qp::{roce_dgid, Qp};
use super::sched::TimerKind;
use crate::verbs::{QpType, WcStatus};
use crate::wire::bth::Opcode;
use crate::wire::ext::{Deth, ImmDt};
use crate::wire::roce::RoceRepr;

/// rxe `RXE_MAX_PKT_PER_ACK`: AckReq at least this often within a long message.
const MAX_PKTS_PER_ACK: u32 = 64;

impl Device {
    /// Builds the next request packet of RC `qp` into `out`; returns its destination.
    pub(super) fn emit_rc_request(
        &mut self,
        qp: &mut Qp,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Option<SocketAddr> {
        let av = qp.attrs.av?;
        let mtu = qp.attrs.path_mtu.bytes();
        let idx = qp.req.send_idx;
        let pkt_no = qp.req.send_pkt;
        let psn = qp.req.psn;
        let npkts = qp.npkts(qp.req.sq.get(idx)?.wr.len);
        let w = qp.req.sq.get_mut(idx)?;
        if pkt_no == 0 {
            w.first_psn = psn;
            w.npkts = npkts;
        }
        let wr = w.wr;
        let total = wr.len;
        let off = pkt_no as usize * mtu;
        let len = total.saturating_sub(off).min(mtu);
        let last = pkt_no + 1 >= npkts;
        let opcode = match (npkts == 1, pkt_no == 0, last, wr.imm.is_some()) {
            (true, _, _, false) => Opcode::RC_SEND_ONLY,
            (true, _, _, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
            (false, true, _, _) => Opcode::RC_SEND_FIRST,
            (false, false, false, _) => Opcode::RC_SEND_MIDDLE,
            (false, false, true, false) => Opcode::RC_SEND_LAST,
            (false, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        };
        qp.req.noack_pkts += 1;
        let window_closing = qp.req.outstanding() + 1 >= qp.req.window;
        // At least two AckReqs per window: were the window's only one lost, nothing would
        // answer the packets before it, and the requester would wait for its timer.
        let ack_every = (qp.req.window / 2).clamp(1, MAX_PKTS_PER_ACK);
        let ack_req = last || qp.req.noack_pkts >= ack_every || window_closing;
        if ack_req {
            qp.req.noack_pkts = 0;
        }
        let mut bth = self.bth(opcode, qp.attrs.dest_qpn, psn);
        bth.ack_req = ack_req;
        bth.solicited = wr.solicited && last;
        let repr = RoceRepr {
            bth,
            reth: None,
            aeth: None,
            deth: None,
            imm: if last { wr.imm.map(ImmDt) } else { None },
        };
        let payload = match wr.buf {
            Some(b) => self
                .objects
                .pools
                .bytes(b)
                .and_then(|d| d.get(off..off + len))
                .unwrap_or(&[]),
            None => &[],
        };
        let sent = self.emit_av(&repr, payload, &av, out);
        let dst = self.routed(sent);
        if psn.diff(qp.req.high_psn) < 0 {
            self.stats.tx_retransmits += 1;
        } else {
            qp.req.high_psn = psn.add(1);
            if qp.req.rtt_probe.is_none() {
                qp.req.rtt_probe = Some((psn, now));
            }
        }
        qp.req.psn = psn.add(1);
        if last {
            qp.req.send_idx += 1;
            qp.req.send_pkt = 0;
        } else {
            qp.req.send_pkt += 1;
        }
        if qp.req.retransmit_at.is_none() {
            if let Some(at) = qp.retransmit_deadline(now) {
                self.sched.arm(qp, TimerKind::Retransmit, at);
            }
        }
        dst
    }

    /// Builds the oldest UD send of `qp` into `out` and completes it; returns its
    /// destination.
    pub(super) fn emit_ud(&mut self, qp: &mut Qp, out: &mut Vec<u8>) -> Option<SocketAddr> {
        let w = qp.req.sq.pop_front()?;
        let psn = qp.req.psn;
        qp.req.psn = psn.add(1);
        qp.req.comp_psn = qp.req.psn;
        // post_send refuses UD sends without a destination.
        let Some(ud) = w.wr.ud else {
            self.complete_send(qp, &w, WcStatus::LocQpOpErr);
            return None;
        };
        // IBTA: a Q_Key with the high bit set means "use the QP's own Q_Key".
        let qkey = if ud.remote_qkey.0 & 0x8000_0000 != 0 && qp.qp_type != QpType::Gsi {
            qp.attrs.qkey
        } else {
            ud.remote_qkey
        };
        let opcode = if w.wr.imm.is_some() {
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UD_SEND_ONLY
        };
        let mut bth = self.bth(opcode, ud.remote_qpn, psn);
        bth.solicited = w.wr.solicited;
        let repr = RoceRepr {
            bth,
            reth: None,
            aeth: None,
            deth: Some(Deth {
                qkey: qkey.0,
                src_qp: qp.num.get(),
            }),
            imm: w.wr.imm.map(ImmDt),
        };
        let payload = match w.wr.buf {
            Some(b) => self
                .objects
                .pools
                .bytes(b)
                .and_then(|d| d.get(..w.wr.len))
                .unwrap_or(&[]),
            None => &[],
        };
        let (dst, status) = if self.ib.is_some() {
            // InfiniBand: to the DLID's port, or the MLID's group; a packet the fabric drops
            // (no route, the port down) is counted, and the send still succeeds, as on an
            // HCA.
            let sent = self.emit_av(&repr, payload, &ud.av, out);
            (self.routed(sent), WcStatus::Success)
        } else if roce_dgid(&ud.av).0[0] == 0xFF {
            // Multicast: one IP multicast datagram to the group (when on), and one unicast
            // copy per underlay peer; the first goes out now, the rest wait in `fanout`. A
            // group with neither swallows the send, as an empty IB multicast group does.
            let group = self
                .cfg
                .multicast
                .then(|| mcast::group_addr(roce_dgid(&ud.av), self.cfg.local_ip))
                .flatten();
            let mut first = None;
            for peer in group.iter().chain(&self.mcast.peers) {
                let mut d = Vec::new();
                if let Some(to) = self.emit(&repr, payload, *peer, &mut d) {
                    if first.is_none() {
                        out.extend_from_slice(&d);
                        first = Some(to);
                    } else {
                        self.mcast.fanout.push_back((to, d));
                    }
                }
            }
            (first, WcStatus::Success)
        } else {
            match self.emit(&repr, payload, roce_dgid(&ud.av).to_ip(), out) {
                Some(to) => (Some(to), WcStatus::Success),
                None => (None, WcStatus::LocQpOpErr),
            }
        };
        self.complete_send(qp, &w, status);
        dst
    }
}
