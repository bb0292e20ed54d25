//! Per-QP state of the software provider: the RC requester, completer and responder, and UD.
//!
//! The structure follows rxe (`rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`): the *requester* turns
//! send WQEs into packets (segmentation by path MTU, PSN assignment, AckReq), the *completer*
//! consumes ACK/NAK/RNR-NAK and retires WQEs or rewinds the requester (go-back-N), and the
//! *responder* checks PSNs, fills receive WQEs and schedules ACKs and NAKs.

use std::collections::VecDeque;
use std::time::Instant;

use crate::verbs::{
    AddressVector, BufId, CqId, PathMtu, Psn, QKey, QpNum, QpState, QpType, SendWr, SrqId, WrId,
};

/// The requester's send window (PSNs past the oldest unacknowledged one) never shrinks below
/// this, and starts here: rxe's fixed `RXE_MAX_UNACKED_PSNS`.
pub(crate) const WINDOW_MIN_PSNS: u32 = 128;
/// The send window grows up to this while nothing is lost: 4 MiB at path MTU 4096. At 128
/// PSNs a busy receiver's ACKs (sent once it has delivered a batch) came back too late and
/// the requester sat idle: one TCP stream through the tunnel went from 12.2 to 13.2-13.8
/// Gbit/s with 1024 (4096 gave no more).
pub(crate) const WINDOW_MAX_PSNS: u32 = 1024;
/// Messages sent and not yet acknowledged never exceed this (what the PSN window of 128 meant
/// for one-packet messages before it could grow): a receiver posts a few hundred receives
/// (the IPoIB-CM SRQ 256), and a requester with 1,024 one-packet messages in flight would
/// only collect RNR NAKs past them.
pub(crate) const MAX_UNACKED_MESSAGES: usize = 128;
/// Acknowledged PSNs per window increment while growing.
const WINDOW_GROWTH_PSNS: u32 = 4;
/// rxe `RXE_MAX_PKT_PER_ACK`: AckReq at least this often within a long message.
pub(crate) const MAX_PKTS_PER_ACK: u32 = 64;

/// A send WQE on the send queue, from post until retired.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    /// First PSN, assigned when its first packet is sent.
    pub(crate) first_psn: Psn,
    /// Packets it takes (at least one).
    pub(crate) npkts: u32,
}

impl SendWqe {
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }
}

/// A posted receive WQE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: WrId,
    pub(crate) buf: BufId,
}

/// A receive WQE being filled by a multi-packet message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filling {
    pub(crate) wqe: RecvWqe,
    pub(crate) filled: usize,
}

/// A response the responder owes the requester, sent on the next `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Response {
    /// ACK up to and including this PSN.
    Ack(Psn),
    /// PSN sequence error: the responder expects this PSN.
    NakSeq(Psn),
    /// Receiver not ready for the packet with this PSN.
    RnrNak(Psn),
    /// Invalid request (length, opcode sequence); the QP is going to ERR.
    NakInvalid(Psn),
}

/// Requester + completer state of an RC QP.
#[derive(Debug)]
pub(crate) struct Requester {
    /// WQEs not yet retired, oldest first.
    pub(crate) sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE whose packets are being sent.
    pub(crate) send_idx: usize,
    /// Packets of that WQE already sent.
    pub(crate) send_pkt: u32,
    /// Next PSN to send.
    pub(crate) psn: Psn,
    /// Oldest unacknowledged PSN.
    pub(crate) comp_psn: Psn,
    /// One past the highest PSN ever sent: packets below it and at or above `comp_psn` are
    /// in flight (or lost).
    pub(crate) high_psn: Psn,
    pub(crate) retry_left: u8,
    /// Retransmit timeouts since the last progress (drives the back-off).
    pub(crate) timeouts_in_row: u8,
    pub(crate) rnr_retry_left: u8,
    /// Packets sent since the last AckReq.
    pub(crate) noack_pkts: u32,
    /// Retransmit deadline while packets are outstanding.
    pub(crate) retransmit_at: Option<Instant>,
    /// Sending is paused until this RNR deadline.
    pub(crate) rnr_at: Option<Instant>,
    /// The instant of the retransmit timer's live entry in the provider's timer heap.
    pub(crate) retransmit_queued: Option<Instant>,
    /// The instant of the RNR timer's live entry in the provider's timer heap.
    pub(crate) rnr_queued: Option<Instant>,
    /// A go-back-N from this PSN is in progress (a second NAK for it starts nothing).
    pub(crate) retrying_from: Option<Psn>,
    /// Send window in PSNs, between [`WINDOW_MIN_PSNS`] and [`WINDOW_MAX_PSNS`]: grows by one
    /// for every [`WINDOW_GROWTH_PSNS`] acknowledged, halves when a loss makes the requester go
    /// back (go-back-N resends everything after a loss, so a wide window on a lossy path
    /// costs much more than it gains).
    pub(crate) window: u32,
    /// Acknowledged PSNs not yet counted into a window increment.
    pub(crate) window_credit: u32,
}

impl Requester {
    fn new() -> Self {
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
    pub(crate) fn window_grow(&mut self, acked: u32) {
        if self.window >= WINDOW_MAX_PSNS {
            return;
        }
        self.window_credit = self.window_credit.saturating_add(acked);
        let steps = self.window_credit / WINDOW_GROWTH_PSNS;
        self.window_credit %= WINDOW_GROWTH_PSNS;
        self.window = self.window.saturating_add(steps).min(WINDOW_MAX_PSNS);
    }

    /// A packet was lost (sequence NAK or retransmit timeout): halve the window.
    pub(crate) fn window_shrink(&mut self) {
        self.window = (self.window / 2).max(WINDOW_MIN_PSNS);
        self.window_credit = 0;
    }

    /// PSNs between the oldest unacknowledged one and the send position (the send window).
    pub(crate) fn outstanding(&self) -> u32 {
        u32::try_from(self.psn.diff(self.comp_psn)).unwrap_or(0)
    }

    /// Packets ever sent and not yet acknowledged.
    pub(crate) fn unacked(&self) -> u32 {
        u32::try_from(self.high_psn.diff(self.comp_psn)).unwrap_or(0)
    }

    /// True when the requester has a packet it may send now.
    pub(crate) fn can_send(&self) -> bool {
        self.rnr_at.is_none()
            && self.send_idx < self.sq.len()
            && self.outstanding() < self.window
            && self.send_idx < MAX_UNACKED_MESSAGES
    }

    /// Moves the send position so the next packet sent has PSN `to`: backwards for go-back-N,
    /// forwards past packets an ACK covered. WQEs keep the PSNs they were first sent with.
    pub(crate) fn rewind(&mut self, to: Psn) {
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

/// Responder state of an RC QP.
#[derive(Debug)]
pub(crate) struct Responder {
    /// Next PSN expected.
    pub(crate) psn: Psn,
    /// Messages completed (AETH MSN).
    pub(crate) msn: u32,
    /// The receive WQE a multi-packet message is filling.
    pub(crate) filling: Option<Filling>,
    /// A PSN-sequence NAK was sent for the current gap (rxe `sent_psn_nak`).
    pub(crate) sent_psn_nak: bool,
    /// Responses to send, coalesced: at most one ACK is kept.
    pub(crate) responses: VecDeque<Response>,
    /// `CommEst` was raised.
    pub(crate) comm_est_raised: bool,
}

impl Responder {
    fn new() -> Self {
        Self {
            psn: Psn::new(0),
            msn: 0,
            filling: None,
            sent_psn_nak: false,
            responses: VecDeque::new(),
            comm_est_raised: false,
        }
    }

    /// Queues an ACK, replacing an older queued ACK (ACK coalescing).
    pub(crate) fn queue_ack(&mut self, psn: Psn) {
        if let Some(Response::Ack(p)) = self.responses.back_mut() {
            *p = psn;
        } else {
            self.responses.push_back(Response::Ack(psn));
        }
    }
}

/// Attributes set by `modify_qp`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpAttrs {
    pub(crate) qkey: QKey,
    pub(crate) av: Option<AddressVector>,
    pub(crate) path_mtu: PathMtu,
    pub(crate) dest_qpn: QpNum,
    pub(crate) min_rnr_timer: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
}

/// One QP of the software provider.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) num: QpNum,
    pub(crate) pd: crate::verbs::PdId,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) send_cq: CqId,
    pub(crate) recv_cq: CqId,
    pub(crate) srq: Option<SrqId>,
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) sq_sig_all: bool,
    pub(crate) attrs: QpAttrs,
    pub(crate) req: Requester,
    pub(crate) resp: Responder,
    /// Private receive queue (QPs without an SRQ).
    pub(crate) rq: VecDeque<RecvWqe>,
    /// WRs posted in ERR that a `drain_never` quirk swallowed: kept so destroy frees buffers.
    pub(crate) swallowed: Vec<BufId>,
    /// `QpLastWqeReached` was raised.
    pub(crate) last_wqe_raised: bool,
    /// In SQD with `en_sqd_async_notify`: `SqDrained` is owed once the drain completes.
    pub(crate) sqd_notify: bool,
    /// Queued on the provider's ready list.
    pub(crate) ready_queued: bool,
}

impl Qp {
    pub(crate) fn new(
        num: QpNum,
        qp_type: QpType,
        init: &crate::verbs::QpInit,
        default_mtu: PathMtu,
    ) -> Self {
        Self {
            num,
            pd: init.pd,
            qp_type,
            state: QpState::Reset,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr,
            sq_sig_all: init.sq_sig_all,
            attrs: QpAttrs {
                qkey: if qp_type == QpType::Gsi {
                    QKey::GSI
                } else {
                    QKey(0)
                },
                av: None,
                path_mtu: default_mtu,
                dest_qpn: QpNum::new(0),
                min_rnr_timer: 0,
                timeout: 0,
                retry_cnt: 0,
                rnr_retry: 0,
            },
            req: Requester::new(),
            resp: Responder::new(),
            rq: VecDeque::new(),
            swallowed: Vec::new(),
            last_wqe_raised: false,
            sqd_notify: false,
            ready_queued: false,
        }
    }

    /// Back to RESET: queues and sequence state cleared (the caller frees posted buffers).
    pub(crate) fn reset(&mut self) {
        self.state = QpState::Reset;
        self.req = Requester::new();
        self.resp = Responder::new();
        self.rq.clear();
        self.last_wqe_raised = false;
        self.sqd_notify = false;
    }

    /// True when the QP has something for `poll_transmit`.
    pub(crate) fn has_work(&self) -> bool {
        !self.resp.responses.is_empty() || self.may_send()
    }

    /// True when the requester may send its next packet now. RTS sends everything; SQD
    /// finishes the messages it has begun, retransmissions included, and starts no new one
    /// (IBTA 10.3.1: SQD drains in-progress WQEs). Before SQD was allowed to resend, packets
    /// lost around a move to SQD were never recovered: their timeout was ignored outside RTS,
    /// and the WQE never completed even after SQD -> RTS.
    pub(crate) fn may_send(&self) -> bool {
        match self.state {
            QpState::Rts => self.req.can_send(),
            QpState::Sqd => {
                self.req.can_send()
                    && self
                        .req
                        .sq
                        .get(self.req.send_idx)
                        .is_some_and(|w| w.npkts > 0)
            }
            _ => false,
        }
    }

    /// In SQD, no WQE that was begun is still outstanding (WQEs begin in order, so only the
    /// oldest needs looking at).
    pub(crate) fn sq_drained(&self) -> bool {
        self.state == QpState::Sqd && self.req.sq.front().is_none_or(|w| w.npkts == 0)
    }

    /// Packets a message of `len` bytes takes at this QP's path MTU.
    pub(crate) fn npkts(&self, len: usize) -> u32 {
        let mtu = self.attrs.path_mtu.bytes();
        u32::try_from(len.div_ceil(mtu).max(1)).unwrap_or(u32::MAX)
    }

    /// The retransmit interval, `4.096 µs · 2^timeout`; `None` when timeout is 0 (infinite).
    pub(crate) fn retransmit_interval(&self) -> Option<std::time::Duration> {
        (self.attrs.timeout != 0)
            .then(|| std::time::Duration::from_nanos(4096u64 << self.attrs.timeout))
    }
}
