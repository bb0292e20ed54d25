//! The responder (rxe `rxe_resp.c`): RC requests are checked against the expected PSN and
//! fill receive WQEs; UD sends are delivered behind their GRH area; ACKs and NAKs are built
//! here from the responses the QP owes.

use std::net::{IpAddr, SocketAddr};

use super::device::Device;
use super::objects::RecvInfo;
use super::qp::{roce_dgid, Filling, Qp, Response};
use crate::verbs::{AsyncEvent, Psn, QpNum, QpState, WcStatus};
use crate::wire::bth::Opcode;
use crate::wire::ext::{Aeth, NakCode, Syndrome};
use crate::wire::grh::{GrhRepr, GRH_LEN};
use crate::wire::roce::{RocePacket, RoceRepr};

impl Device {
    pub(super) fn on_request(&mut self, qp: &mut Qp, pkt: &RocePacket<'_>) {
        if !matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            self.stats.rx_bad_state += 1;
            return;
        }
        let psn = Psn::new(pkt.bth.psn);
        let d = psn.diff(qp.resp.psn);
        if d > 0 {
            self.stats.rx_out_of_sequence += 1;
            if !qp.resp.sent_psn_nak {
                qp.resp.sent_psn_nak = true;
                qp.resp.responses.push_back(Response::NakSeq(qp.resp.psn));
            }
            return;
        }
        if d < 0 {
            // C9-105: re-ACK the last PSN received in order so the requester moves on.
            self.stats.rx_duplicate += 1;
            qp.resp.queue_ack(qp.resp.psn.sub(1));
            return;
        }
        qp.resp.sent_psn_nak = false;
        if qp.state == QpState::Rtr && !qp.resp.comm_est_raised {
            qp.resp.comm_est_raised = true;
            self.events.push_back(AsyncEvent::CommEst(qp.num));
        }
        let op = pkt.bth.opcode;
        let mtu = qp.attrs.path_mtu.bytes();
        let len = pkt.payload.len();
        let starts = op.is_first() || op.is_only();
        let ends = op.is_last() || op.is_only();
        let in_message = qp.resp.filling.is_some();
        let length_ok = if op.is_first() || op.is_middle() {
            len == mtu
        } else if op.is_last() {
            len > 0 && len <= mtu
        } else {
            len <= mtu
        };
        if starts == in_message || !length_ok {
            self.class_error(qp, psn);
            return;
        }
        let mut filling = match qp.resp.filling.take() {
            Some(f) => f,
            None => match self.take_recv(qp) {
                Some(wqe) => Filling { wqe, filled: 0 },
                None => {
                    self.stats.tx_rnr_naks += 1;
                    qp.resp.sent_psn_nak = true;
                    qp.resp.responses.push_back(Response::RnrNak(psn));
                    return;
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
            return;
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
    }

    /// A class B/C responder error: NAK invalid request and move the QP to ERR.
    fn class_error(&mut self, qp: &mut Qp, psn: Psn) {
        qp.resp.responses.push_back(Response::NakInvalid(psn));
        self.events.push_back(AsyncEvent::QpReqErr(qp.num));
        self.enter_error(qp);
    }

    pub(super) fn on_ud(
        &mut self,
        qp: &mut Qp,
        src: SocketAddr,
        dst: IpAddr,
        pkt: &RocePacket<'_>,
    ) {
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
        GrhRepr::rocev2_ud(src.ip(), dst, pkt.payload.len()).emit(buf);
        if let Some(d) = buf.get_mut(GRH_LEN..total) {
            d.copy_from_slice(pkt.payload);
        }
        let info = RecvInfo {
            byte_len: u32::try_from(total).unwrap_or(u32::MAX),
            imm: pkt.imm.map(|i| i.0),
            src_qp: Some(QpNum::new(deth.src_qp)),
            src_port: Some(src.port()),
            grh: true,
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
        self.emit(&repr, &[], roce_dgid(&av).to_ip(), out)
    }
}
