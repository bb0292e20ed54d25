//! The requester (rxe `rxe_req.c`): send WQEs become packets (segmentation by path MTU, PSN
//! assignment, AckReq), within a send window that widens while nothing is lost; UD sends,
//! multicast ones fanned out to every underlay peer.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::qp::Qp;
use super::sched::TimerKind;
use super::{ip_info, mcast, Device};
use crate::verbs::{PKey, Psn, QpNum, QpType, SendWr, WcStatus};
use crate::wire::bth::{Bth, Opcode};
use crate::wire::ext::{Deth, ImmDt};
use crate::wire::roce::RoceRepr;

/// The requester's send window (PSNs past the oldest unacknowledged one) never shrinks below
/// this, and starts here: rxe's fixed `RXE_MAX_UNACKED_PSNS`.
pub(super) const WINDOW_MIN_PSNS: u32 = 128;
/// The send window grows up to this while nothing is lost: 4 MiB at path MTU 4096, so that a
/// stream keeps sending while a busy receiver delivers a batch before it ACKs.
pub(super) const WINDOW_MAX_PSNS: u32 = 1024;
/// Messages sent and not yet acknowledged never exceed this, however wide the PSN window: a
/// receiver posts a few hundred receives (the IPoIB-CM SRQ 256), and one-packet messages in
/// flight beyond them would only collect RNR NAKs.
pub(super) const MAX_UNACKED_MESSAGES: usize = 128;
/// Acknowledged PSNs per window increment while growing.
const WINDOW_GROWTH_PSNS: u32 = 4;
/// rxe `RXE_MAX_PKT_PER_ACK`: AckReq at least this often within a long message.
pub(super) const MAX_PKTS_PER_ACK: u32 = 64;

/// A send WQE on the send queue, from post until retired.
#[derive(Debug, Clone)]
pub(super) struct SendWqe {
    pub(super) wr: SendWr,
    /// First PSN, assigned when its first packet is sent.
    pub(super) first_psn: Psn,
    /// Packets it takes (at least one).
    pub(super) npkts: u32,
}

impl SendWqe {
    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }
}

/// Requester + completer state of an RC QP.
#[derive(Debug)]
pub(super) struct Requester {
    /// WQEs not yet retired, oldest first.
    pub(super) sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE whose packets are being sent.
    pub(super) send_idx: usize,
    /// Packets of that WQE already sent.
    pub(super) send_pkt: u32,
    /// Next PSN to send.
    pub(super) psn: Psn,
    /// Oldest unacknowledged PSN.
    pub(super) comp_psn: Psn,
    /// One past the highest PSN ever sent: packets below it and at or above `comp_psn` are
    /// in flight (or lost).
    pub(super) high_psn: Psn,
    pub(super) retry_left: u8,
    /// Retransmit timeouts since the last progress (drives the back-off).
    pub(super) timeouts_in_row: u8,
    pub(super) rnr_retry_left: u8,
    /// Packets sent since the last AckReq.
    pub(super) noack_pkts: u32,
    /// Retransmit deadline while packets are outstanding.
    pub(super) retransmit_at: Option<Instant>,
    /// Sending is paused until this RNR deadline.
    pub(super) rnr_at: Option<Instant>,
    /// The instant of the retransmit timer's live entry in the provider's timer heap.
    pub(super) retransmit_queued: Option<Instant>,
    /// The instant of the RNR timer's live entry in the provider's timer heap.
    pub(super) rnr_queued: Option<Instant>,
    /// A go-back-N from this PSN is in progress (a second NAK for it starts nothing).
    pub(super) retrying_from: Option<Psn>,
    /// Send window in PSNs, between [`WINDOW_MIN_PSNS`] and [`WINDOW_MAX_PSNS`]: grows by one
    /// for every [`WINDOW_GROWTH_PSNS`] acknowledged, halves when a loss makes the requester go
    /// back (go-back-N resends everything after a loss, so a wide window on a lossy path
    /// costs much more than it gains).
    pub(super) window: u32,
    /// Acknowledged PSNs not yet counted into a window increment.
    pub(super) window_credit: u32,
}

impl Requester {
    pub(super) fn new() -> Self {
        Self {
            sq: VecDeque::new(),
            send_idx: 0,
            send_pkt: 0,
            psn: Psn::new(0),
            comp_psn: Psn::new(0),
            high_psn: Psn::new(0),
            retry_left: 0,
            timeouts_in_row: 0,
            rnr_retry_left: 0,
            noack_pkts: 0,
            retransmit_at: None,
            rnr_at: None,
            retransmit_queued: None,
            rnr_queued: None,
            retrying_from: None,
            window: WINDOW_MIN_PSNS,
            window_credit: 0,
        }
    }

    /// `acked` more PSNs were acknowledged without a loss: widen the window.
    pub(super) fn window_grow(&mut self, acked: u32) {
        if self.window >= WINDOW_MAX_PSNS {
            return;
        }
        self.window_credit = self.window_credit.saturating_add(acked);
        let steps = self.window_credit / WINDOW_GROWTH_PSNS;
        self.window_credit %= WINDOW_GROWTH_PSNS;
        self.window = self.window.saturating_add(steps).min(WINDOW_MAX_PSNS);
    }

    /// A packet was lost (sequence NAK or retransmit timeout): halve the window.
    pub(super) fn window_shrink(&mut self) {
        self.window = (self.window / 2).max(WINDOW_MIN_PSNS);
        self.window_credit = 0;
    }

    /// PSNs between the oldest unacknowledged one and the send position (the send window).
    pub(super) fn outstanding(&self) -> u32 {
        u32::try_from(self.psn.diff(self.comp_psn)).unwrap_or(0)
    }

    /// Packets ever sent and not yet acknowledged.
    pub(super) fn unacked(&self) -> u32 {
        u32::try_from(self.high_psn.diff(self.comp_psn)).unwrap_or(0)
    }

    /// True when the requester has a packet it may send now.
    pub(super) fn can_send(&self) -> bool {
        self.rnr_at.is_none()
            && self.send_idx < self.sq.len()
            && self.outstanding() < self.window
            && self.send_idx < MAX_UNACKED_MESSAGES
    }

    /// Moves the send position so the next packet sent has PSN `to`: backwards for go-back-N,
    /// forwards past packets an ACK covered. WQEs keep the PSNs they were first sent with.
    pub(super) fn rewind(&mut self, to: Psn) {
        self.psn = to;
        self.noack_pkts = 0;
        for (i, w) in self.sq.iter().enumerate() {
            if w.npkts == 0 {
                // Never sent: the send position is its first packet.
                self.send_idx = i;
                self.send_pkt = 0;
                return;
            }
            let off = to.diff(w.first_psn);
            if off >= 0 && (off as u32) < w.npkts {
                self.send_idx = i;
                self.send_pkt = off as u32;
                return;
            }
        }
        self.send_idx = self.sq.len();
        self.send_pkt = 0;
    }
}

impl Device {
    /// Builds the next packet of `qp` into `out`; returns its destination.
    pub(super) fn next_packet(
        &mut self,
        qp: &mut Qp,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Option<SocketAddr> {
        if let Some(r) = qp.resp.responses.pop_front() {
            return self.emit_response(qp, r, out);
        }
        if !qp.may_send() {
            return None;
        }
        match qp.qp_type {
            QpType::Rc => self.emit_rc_request(qp, now, out),
            QpType::Ud | QpType::Gsi => self.emit_ud(qp, out),
        }
    }

    pub(super) fn emit(
        &self,
        repr: &RoceRepr,
        payload: &[u8],
        dst_ip: IpAddr,
        out: &mut Vec<u8>,
    ) -> Option<SocketAddr> {
        let ip = ip_info(self.cfg.local_ip, dst_ip)?;
        repr.emit_append(payload, &ip, self.cfg.src_port, self.cfg.dst_port, out);
        Some(SocketAddr::new(dst_ip, self.cfg.dst_port))
    }

    pub(super) fn bth(&self, opcode: Opcode, dest_qp: QpNum, psn: Psn) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: PKey::DEFAULT.0,
            fecn: false,
            becn: false,
            dest_qp: dest_qp.get(),
            ack_req: false,
            psn: psn.get(),
        }
    }

    fn emit_rc_request(
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
        let ack_req = last || qp.req.noack_pkts >= MAX_PKTS_PER_ACK || window_closing;
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
        let dst = self.emit(&repr, payload, av.dgid.to_ip(), out);
        if psn.diff(qp.req.high_psn) < 0 {
            self.stats.tx_retransmits += 1;
        } else {
            qp.req.high_psn = psn.add(1);
        }
        qp.req.psn = psn.add(1);
        if last {
            qp.req.send_idx += 1;
            qp.req.send_pkt = 0;
        } else {
            qp.req.send_pkt += 1;
        }
        if qp.req.retransmit_at.is_none() {
            if let Some(iv) = qp.retransmit_interval() {
                self.sched.arm(qp, TimerKind::Retransmit, now + iv);
            }
        }
        dst
    }

    fn emit_ud(&mut self, qp: &mut Qp, out: &mut Vec<u8>) -> Option<SocketAddr> {
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
        let (dst, status) = if ud.av.dgid.0[0] == 0xFF {
            // Multicast: one IP multicast datagram to the group (when on), and one unicast
            // copy per underlay peer; the first goes out now, the rest wait in `fanout`. A
            // group with neither swallows the send, as an empty IB multicast group does.
            let group = self
                .cfg
                .multicast
                .then(|| mcast::group_addr(ud.av.dgid, self.cfg.local_ip))
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
            match self.emit(&repr, payload, ud.av.dgid.to_ip(), out) {
                Some(to) => (Some(to), WcStatus::Success),
                None => (None, WcStatus::LocQpOpErr),
            }
        };
        self.complete_send(qp, &w, status);
        dst
    }
}
