//! The responder (rxe `rxe_resp.c`): RC requests are checked against the expected PSN and
//! fill receive WQEs; UD sends are delivered behind their GRH area; ACKs and NAKs are built
//! here from the responses the QP owes.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::verbs::{Lid, Sl};
use crate::wire::ib::IbGrh;

use super::device::Device;
use super::objects::RecvInfo;
use super::qp::{Filling, Qp, Response};
use super::reorder::{FilledGap, Hold, Resent};
use super::sched::TimerKind;
use crate::verbs::{AsyncEvent, Psn, QpNum, QpState, WcStatus};
use crate::wire::bth::Opcode;
use crate::wire::ext::{Aeth, NakCode, Syndrome};
use crate::wire::grh::{GrhRepr, GRH_LEN};
use crate::wire::roce::{RocePacket, RoceRepr};

/// Where a received packet came from, as its link layer tells.
#[derive(Debug, Clone, Copy)]
pub(super) enum Origin {
    /// RoCEv2: the sender's UDP address, and the IP address the datagram was sent to.
    Ip {
        /// The sender.
        src: SocketAddr,
        /// Where it was sent.
        dst: IpAddr,
    },
    /// InfiniBand: the LRH's source LID and SL, and the GRH where the packet had one.
    Lid {
        /// Source LID.
        slid: Lid,
        /// Service level.
        sl: Sl,
        /// The GRH (multicast, global paths).
        grh: Option<IbGrh>,
    },
}

impl Device {
    /// An RC request `pkt` (the whole `datagram`) for `qp` arrived at `now`.
    pub(super) fn on_request(
        &mut self,
        qp: &mut Qp,
        now: Instant,
        pkt: &RocePacket<'_>,
        datagram: &[u8],
    ) {
        if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.stats.rx_bad_state += 1;
            return;
        }
        let psn = Psn::new(pkt.bth.psn);
        let d = psn.diff(qp.resp.psn);
        if d > 0 {
            self.out_of_sequence(qp, now, u32::try_from(d).unwrap_or(u32::MAX), datagram);
            return;
        }
        if d < 0 {
            // C9-105: re-ACK the last PSN received in order so the requester moves on.
            self.stats.rx_duplicate += 1;
            match qp.resp.reorder.resent(psn, now) {
                Resent::Nothing => {}
                Resent::SpuriousNak => {
                    self.stats.naks_spurious += 1;
                    self.stats.nak_wait_us = micros(qp.resp.reorder.wait());
                }
                Resent::WaitTooLong => {
                    self.stats.nak_waits_too_long += 1;
                    self.stats.nak_wait_us = micros(qp.resp.reorder.wait());
                }
            }
            qp.resp.queue_ack(qp.resp.psn.sub(1));
            return;
        }
        let naked = qp.resp.naked_at.filter(|_| qp.resp.sent_psn_nak);
        if !self.accept(qp, pkt) {
            return;
        }
        let released = self.deliver_held(qp);
        if let Some(opened) = qp.resp.gap_since {
            // The gap before `psn` filled.
            let gap = FilledGap {
                psn,
                through: qp.resp.psn.sub(1),
                opened,
                naked,
            };
            qp.resp.reorder.filled(gap, now);
            qp.resp.naked_at = None;
            self.stats.nak_wait_us = micros(qp.resp.reorder.wait());
            // The next one, if any, opened when the earliest request still held arrived.
            qp.resp.gap_since = qp.resp.held.oldest_arrival();
            qp.resp.nak_at = None;
            self.wait_for_gap(qp, now);
        }
        if released > 0 {
            // Tell the requester at once how far it got: it may be going back already.
            qp.resp.queue_ack(qp.resp.psn.sub(1));
        }
    }

    /// A request `ahead` PSNs past the expected one: held while there is room and the gap
    /// NAKed once it has been open for the QP's NAK wait; else dropped and the gap NAKed at
    /// once (rxe: the first out-of-sequence request NAKs, the others are dropped silently).
    ///
    /// Only a QP whose path has been seen to reorder holds (a NAK proved spurious): until
    /// then it is rxe, and a blind sender's guess must hit the one expected PSN. The gap is
    /// still noted, so that a NAK it proves spurious can teach that.
    fn out_of_sequence(&mut self, qp: &mut Qp, now: Instant, ahead: u32, datagram: &[u8]) {
        self.stats.rx_out_of_sequence += 1;
        let reorders = qp.resp.reorder.reorders();
        if !reorders && qp.resp.gap_since.is_none() {
            qp.resp.gap_since = Some(now);
        }
        if reorders && !qp.resp.rnr_naked && self.cfg.reorder_hold_packets > 0 {
            match qp
                .resp
                .held
                .hold(ahead, datagram, now, &mut self.hold_budget)
            {
                Hold::Held => {
                    self.stats.rx_held += 1;
                    if qp.resp.gap_since.is_none() {
                        qp.resp.gap_since = Some(now);
                        self.wait_for_gap(qp, now);
                    }
                    return;
                }
                Hold::Duplicate => return,
                Hold::Conflict => {
                    self.stats.rx_hold_conflicts += 1;
                    return;
                }
                Hold::NoRoom => self.stats.rx_hold_full += 1,
            }
        }
        if !qp.resp.sent_psn_nak {
            self.nak_gap(qp, now);
        }
    }

    /// Arms the NAK of the open gap for when it has been open for the NAK wait (now, if it
    /// has been already).
    fn wait_for_gap(&mut self, qp: &mut Qp, now: Instant) {
        let Some(since) = qp.resp.gap_since else {
            return;
        };
        if qp.resp.sent_psn_nak {
            return;
        }
        let at = since + qp.resp.reorder.wait();
        if at <= now {
            self.nak_gap(qp, now);
        } else {
            self.sched.arm(qp, TimerKind::NakWait, at);
        }
    }

    /// The NAK wait of `qp`'s open gap ran out.
    pub(super) fn on_nak_wait(&mut self, qp: &mut Qp, now: Instant) {
        qp.resp.nak_at = None;
        let receiving = matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd);
        if receiving && qp.resp.gap_since.is_some() && !qp.resp.sent_psn_nak {
            self.nak_gap(qp, now);
        }
    }

    /// NAKs the gap before the expected PSN (once per gap), at `now`.
    fn nak_gap(&mut self, qp: &mut Qp, now: Instant) {
        qp.resp.sent_psn_nak = true;
        qp.resp.naked_at = Some(now);
        qp.resp.nak_at = None;
        qp.resp.responses.push_back(Response::NakSeq(qp.resp.psn));
    }

    /// Takes the held requests that follow the expected PSN, in order, until the next gap;
    /// returns how many were delivered.
    fn deliver_held(&mut self, qp: &mut Qp) -> usize {
        let mut delivered = 0;
        let mut b = std::mem::take(&mut self.held_scratch);
        // Each accepted request moves the expected PSN by one, and with it the held slots.
        while let Some(r) = qp.resp.held.advance() {
            self.hold_budget.release(r, &mut b);
            let accepted = match RocePacket::parse(&b) {
                // One that does not follow what was delivered before it is dropped, not an
                // invalid request: it came ahead of the expected PSN, so a blind sender may
                // have made it up, and its PSN is a gap again (the peer's own copy, if it
                // sent one, comes again).
                Ok(pkt) if self.follows(qp, &pkt) => self.accept(qp, &pkt),
                _ => {
                    self.stats.rx_held_invalid += 1;
                    false
                }
            };
            if !accepted {
                break;
            }
            self.stats.rx_held_delivered += 1;
            delivered += 1;
        }
        self.held_scratch = b;
        delivered
    }

    /// True when `pkt` may come next: it starts a message if and only if none is in progress,
    /// and its length fits its place in the message (FIRST and MIDDLE exactly the path MTU).
    fn follows(&self, qp: &Qp, pkt: &RocePacket<'_>) -> bool {
        let op = pkt.bth.opcode;
        let mtu = qp.attrs.path_mtu.bytes();
        let len = pkt.payload.len();
        let starts = op.is_first() || op.is_only();
        let length_ok = if op.is_first() || op.is_middle() {
            len == mtu
        } else if op.is_last() {
            len > 0 && len <= mtu
        } else {
            len <= mtu
        };
        starts != qp.resp.filling.is_some() && length_ok
    }

    /// Takes `pkt`, the request with the expected PSN: fills a receive WQE and owes its ACK.
    /// Returns false when it did not take it (no receive WQE: RNR NAK; or an invalid request:
    /// the QP goes to ERR).
    fn accept(&mut self, qp: &mut Qp, pkt: &RocePacket<'_>) -> bool {
        let psn = Psn::new(pkt.bth.psn);
        qp.resp.sent_psn_nak = false;
        qp.resp.rnr_naked = false;
        if qp.state == QpState::Rtr && !qp.resp.comm_est_raised {
            qp.resp.comm_est_raised = true;
            self.events.push_back(AsyncEvent::CommEst(qp.num));
        }
        let op = pkt.bth.opcode;
        let len = pkt.payload.len();
        let ends = op.is_last() || op.is_only();
        if !self.follows(qp, pkt) {
            self.class_error(qp, psn);
            return false;
        }
        let mut filling = match qp.resp.filling.take() {
            Some(f) => f,
            None => match self.take_recv(qp) {
                Some(wqe) => Filling { wqe, filled: 0 },
                None => {
                    self.stats.tx_rnr_naks += 1;
                    qp.resp.sent_psn_nak = true;
                    qp.resp.rnr_naked = true;
                    qp.resp.responses.push_back(Response::RnrNak(psn));
                    return false;
                }
            },
        };
        let buf_len = self
            .objects
            .pools
            .bytes(filling.wqe.buf)
            .map_or(0, <[u8]>::len);
        let end = filling.filled + len;
        if end > buf_len {
            self.complete_recv(qp, filling.wqe, WcStatus::LocLenErr, RecvInfo::default());
            self.class_error(qp, psn);
            return false;
        }
        if let Some(dst) = self
            .objects
            .pools
            .bytes_mut(filling.wqe.buf)
            .and_then(|b| b.get_mut(filling.filled..end))
        {
            dst.copy_from_slice(pkt.payload);
        }
        filling.filled = end;
        qp.resp.psn = psn.add(1);
        if ends {
            qp.resp.msn = (qp.resp.msn + 1) & 0x00FF_FFFF;
            let info = RecvInfo {
                byte_len: u32::try_from(end).unwrap_or(u32::MAX),
                imm: pkt.imm.map(|i| i.0),
                ..RecvInfo::default()
            };
            self.complete_recv(qp, filling.wqe, WcStatus::Success, info);
        } else {
            qp.resp.filling = Some(filling);
        }
        if pkt.bth.ack_req {
            qp.resp.queue_ack(psn);
        }
        true
    }

    /// A class B/C responder error: NAK invalid request and move the QP to ERR.
    fn class_error(&mut self, qp: &mut Qp, psn: Psn) {
        qp.resp.responses.push_back(Response::NakInvalid(psn));
        self.events.push_back(AsyncEvent::QpReqErr(qp.num));
        self.enter_error(qp);
    }

    pub(super) fn on_ud(&mut self, qp: &mut Qp, origin: &Origin, pkt: &RocePacket<'_>) {
        if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            || !matches!(
                pkt.bth.opcode,
                Opcode::UD_SEND_ONLY | Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
            )
        {
            self.stats.rx_bad_state += 1;
            return;
        }
        let Some(deth) = pkt.deth else {
            self.stats.rx_malformed += 1;
            return;
        };
        if deth.qkey != qp.attrs.qkey.0 {
            self.stats.rx_bad_qkey += 1;
            return;
        }
        let Some(wqe) = self.take_recv(qp) else {
            self.stats.rx_ud_dropped += 1;
            return;
        };
        let total = GRH_LEN + pkt.payload.len();
        let Some(buf) = self
            .objects
            .pools
            .bytes_mut(wqe.buf)
            .filter(|b| b.len() >= total)
        else {
            // Too big for the buffer: UD drops it; the WQE goes back to the front.
            self.stats.rx_ud_dropped += 1;
            self.objects.return_recv(qp, wqe);
            return;
        };
        // The GRH area: RoCEv2's made from the IP addresses; on InfiniBand the packet's GRH
        // where it had one (multicast), else nothing (the completion says so).
        let (grh, src_port, slid, sl) = match *origin {
            Origin::Ip { src, dst } => {
                GrhRepr::rocev2_ud(src.ip(), dst, pkt.payload.len()).emit(buf);
                (true, Some(src.port()), None, Sl::ZERO)
            }
            Origin::Lid { slid, sl, grh } => {
                let area = grh.map_or([0; GRH_LEN], |g| g.to_bytes());
                if let Some(d) = buf.get_mut(..GRH_LEN) {
                    d.copy_from_slice(&area);
                }
                (grh.is_some(), None, Some(slid), sl)
            }
        };
        if let Some(d) = buf.get_mut(GRH_LEN..total) {
            d.copy_from_slice(pkt.payload);
        }
        let info = RecvInfo {
            byte_len: u32::try_from(total).unwrap_or(u32::MAX),
            imm: pkt.imm.map(|i| i.0),
            src_qp: Some(QpNum::new(deth.src_qp)),
            src_port,
            grh,
            slid,
            sl,
        };
        self.complete_recv(qp, wqe, WcStatus::Success, info);
    }

    pub(super) fn emit_response(
        &mut self,
        qp: &Qp,
        r: Response,
        out: &mut Vec<u8>,
    ) -> Option<SocketAddr> {
        let av = qp.attrs.av?;
        let (psn, syndrome) = match r {
            Response::Ack(p) => {
                self.stats.tx_acks += 1;
                (p, Syndrome::Ack { credits: 0x1F })
            }
            Response::NakSeq(p) => {
                self.stats.tx_seq_naks += 1;
                (p, Syndrome::Nak(NakCode::PsnSequenceError))
            }
            Response::RnrNak(p) => (
                p,
                Syndrome::RnrNak {
                    timer: qp.attrs.min_rnr_timer,
                },
            ),
            Response::NakInvalid(p) => {
                self.stats.tx_other_naks += 1;
                (p, Syndrome::Nak(NakCode::InvalidRequest))
            }
        };
        let repr = RoceRepr {
            bth: self.bth(Opcode::RC_ACKNOWLEDGE, qp.attrs.dest_qpn, psn),
            reth: None,
            aeth: Some(Aeth {
                syndrome,
                msn: qp.resp.msn,
            }),
            deth: None,
            imm: None,
        };
        let sent = self.emit_av(&repr, &[], &av, out);
        self.routed(sent)
    }
}

/// `d` in whole microseconds, for a gauge.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
