//! Per-QP state of the software provider: the QP with its attributes, its receive queue, the
//! requester's send queue and sequence state, and the responder's sequence state and the
//! responses it owes.
//!
//! These are the types the engine parts build on: the requester ([`super::requester`])
//! turns send WQEs into packets, the completer ([`super::completer`]) consumes
//! ACK/NAK/RNR-NAK and retires WQEs or rewinds the requester (go-back-N), and the responder
//! ([`super::responder`]) checks PSNs, fills receive WQEs and queues ACKs and NAKs, each on
//! the state kept here (rxe `rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`). Nothing here depends on
//! another part of the engine.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::reorder::{Held, ReorderWindow};
use super::rtt::RttEstimator;

use crate::verbs::{
    AddressVector, BufId, CqId, PathMtu, PdId, Psn, QKey, QpAttr, QpInit, QpNum, QpState, QpType,
    SendWr, SrqId, WrId,
};

/// A posted receive WQE.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecvWqe {
    pub(super) wr_id: WrId,
    pub(super) buf: BufId,
}

/// Attributes set by `modify_qp`.
#[derive(Debug, Clone, Copy)]
pub(super) struct QpAttrs {
    pub(super) qkey: QKey,
    pub(super) av: Option<AddressVector>,
    pub(super) path_mtu: PathMtu,
    pub(super) dest_qpn: QpNum,
    pub(super) min_rnr_timer: u8,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
}

/// One QP of the software provider.
#[derive(Debug)]
pub(super) struct Qp {
    pub(super) num: QpNum,
    pub(super) pd: PdId,
    pub(super) qp_type: QpType,
    pub(super) state: QpState,
    pub(super) send_cq: CqId,
    pub(super) recv_cq: CqId,
    pub(super) srq: Option<SrqId>,
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    pub(super) sq_sig_all: bool,
    pub(super) attrs: QpAttrs,
    pub(super) req: Requester,
    pub(super) resp: Responder,
    /// Private receive queue (QPs without an SRQ).
    pub(super) rq: VecDeque<RecvWqe>,
    /// WRs posted in ERR that a `drain_never` quirk swallowed: kept so destroy frees buffers.
    pub(super) swallowed: Vec<BufId>,
    /// `QpLastWqeReached` was raised.
    pub(super) last_wqe_raised: bool,
    /// In SQD with `en_sqd_async_notify`: `SqDrained` is owed once the drain completes.
    pub(super) sqd_notify: bool,
    /// Queued on the provider's ready list.
    pub(super) ready_queued: bool,
    /// RC: the UDP source port of the peer's QP, pinned by the first packet from the peer's
    /// address that moved this QP's sequence state (an ACK retiring a send, or a request in
    /// sequence). RoCEv2 makes the port an entropy field, but every sender keeps it fixed per
    /// QP (rxe derives it from the QP number, hardware from the QP's flow label, this
    /// provider sends everything from its one socket), so a packet from another port is not
    /// from the peer's QP. A new address vector or a reset unpins it.
    pub(super) peer_port: Option<u16>,
}

impl Qp {
    pub(super) fn new(num: QpNum, qp_type: QpType, init: &QpInit, default_mtu: PathMtu) -> Self {
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
            peer_port: None,
        }
    }

    /// Back to RESET: queues and sequence state cleared (the caller frees posted buffers).
    pub(super) fn reset(&mut self) {
        self.state = QpState::Reset;
        self.req = Requester::new();
        self.resp = Responder::new();
        self.rq.clear();
        self.last_wqe_raised = false;
        self.sqd_notify = false;
        self.peer_port = None;
    }

    /// Applies the attributes `attr` sets (not the state: the caller moves the QP). A new
    /// retry count or SQ PSN also resets what the requester derived from it.
    pub(super) fn apply_attrs(&mut self, attr: &QpAttr) {
        let a = &mut self.attrs;
        if let Some(v) = attr.qkey {
            a.qkey = v;
        }
        if let Some(v) = attr.av {
            a.av = Some(v);
            self.peer_port = None;
        }
        if let Some(v) = attr.path_mtu {
            a.path_mtu = v;
        }
        if let Some(v) = attr.dest_qpn {
            a.dest_qpn = v;
        }
        if let Some(v) = attr.min_rnr_timer {
            a.min_rnr_timer = v;
        }
        if let Some(v) = attr.timeout {
            a.timeout = v;
        }
        if let Some(v) = attr.retry_cnt {
            a.retry_cnt = v;
            self.req.retry_left = v;
        }
        if let Some(v) = attr.rnr_retry {
            a.rnr_retry = v;
            self.req.rnr_retry_left = v;
        }
        if let Some(v) = attr.rq_psn {
            self.resp.psn = v;
        }
        if let Some(v) = attr.sq_psn {
            self.req.psn = v;
            self.req.comp_psn = v;
            self.req.high_psn = v;
        }
    }

    /// True when the QP has something for `poll_transmit`.
    pub(super) fn has_work(&self) -> bool {
        !self.resp.responses.is_empty() || self.may_send()
    }

    /// True when the requester may send its next packet now. RTS sends everything; SQD
    /// finishes the messages it has begun, retransmissions included (so that packets lost
    /// around a move to SQD are recovered), and starts no new one (IBTA 10.3.1: SQD drains
    /// in-progress WQEs).
    pub(super) fn may_send(&self) -> bool {
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
    pub(super) fn sq_drained(&self) -> bool {
        self.state == QpState::Sqd && self.req.sq.front().is_none_or(|w| w.npkts == 0)
    }

    /// Packets a message of `len` bytes takes at this QP's path MTU.
    pub(super) fn npkts(&self, len: usize) -> u32 {
        let mtu = self.attrs.path_mtu.bytes();
        u32::try_from(len.div_ceil(mtu).max(1)).unwrap_or(u32::MAX)
    }

    /// The retransmit interval of the QP's local ACK timeout; `None` when it is 0 (infinite).
    pub(super) fn retransmit_interval(&self) -> Option<Duration> {
        crate::wire::cm::LocalAckTimeout::saturating(self.attrs.timeout).retransmit_interval()
    }

    /// When the retransmit timer armed at `now` fires: after the timeout of the measured
    /// round trip ([`RttEstimator::timeout`]), never sooner than the local ACK timeout, times
    /// the back-off (1, 2, 4, then 8 while timeouts follow each other with no RTT measured
    /// since). `None` when the local ACK timeout is 0 (infinite).
    pub(super) fn retransmit_deadline(&self, now: Instant) -> Option<Instant> {
        let local = self.retransmit_interval()?;
        let base = self.req.rtt.timeout().map_or(local, |t| t.max(local));
        Some(now + base * (1u32 << self.req.timeouts_in_row.min(3)))
    }

    /// The time within which a NAK cannot answer a packet resent by the go-back-N in
    /// progress: the smoothed RTT (zero before one was measured: every NAK then counts).
    pub(super) fn resend_guard(&self) -> Duration {
        self.req.rtt.srtt().unwrap_or_default()
    }
}

/// The requester's send window (PSNs past the oldest unacknowledged one) starts here: rxe's
/// fixed `RXE_MAX_UNACKED_PSNS`.
pub(super) const WINDOW_START_PSNS: u32 = 128;
/// Repeated losses shrink the send window down to this. Two, not one: with one packet in
/// flight only a timeout recovers its loss (a PSN-sequence NAK needs a later packet to
/// arrive), and its ACK is the round's only one, so random loss alone would spend the retry
/// budget round after round.
pub(super) const WINDOW_MIN_PSNS: u32 = 2;
/// The send window grows up to this while nothing is lost: 4 MiB at path MTU 4096, so that a
/// stream keeps sending while a busy receiver delivers a batch before it ACKs.
pub(super) const WINDOW_MAX_PSNS: u32 = 1024;
/// Messages sent and not yet acknowledged never exceed this, however wide the PSN window: a
/// receiver posts a few hundred receives (the IPoIB-CM SRQ 256), and one-packet messages in
/// flight beyond them would only collect RNR NAKs.
pub(super) const MAX_UNACKED_MESSAGES: usize = 128;
/// Acknowledged PSNs per window increment while growing.
const WINDOW_GROWTH_PSNS: u32 = 4;

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
    /// Retransmit timeouts since the last RTT was measured (drives the back-off). Karn's
    /// rule: an acknowledgement of resent packets measures nothing, so it keeps the back-off;
    /// the first one of a packet sent once ends it.
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
    /// The go-back-N (after a NAK or a timeout) not yet acknowledged in full.
    pub(super) recovery: Option<Recovery>,
    /// Send window in PSNs, between [`WINDOW_MIN_PSNS`] and [`WINDOW_MAX_PSNS`], starting at
    /// [`WINDOW_START_PSNS`]: grows by one for every [`WINDOW_GROWTH_PSNS`] acknowledged
    /// outside a recovery, halves when a loss makes the requester go back (once per
    /// recovery: go-back-N resends everything after a loss, so a wide window on a lossy
    /// path costs much more than it gains).
    pub(super) window: u32,
    /// Acknowledged PSNs not yet counted into a window increment.
    pub(super) window_credit: u32,
    /// When a sequence NAK last halved the window: another within a round trip of it answers
    /// the same window of packets (a path that reorders NAKs several PSNs of one window) and
    /// halves nothing, as TCP reduces its window once per round trip.
    pub(super) shrunk_at: Option<Instant>,
    /// The round-trip time measured so far.
    pub(super) rtt: RttEstimator,
    /// The PSN being timed, sent once, and when (Karn's rule: a go-back-N over it cancels).
    pub(super) rtt_probe: Option<(Psn, Instant)>,
}

/// A go-back-N in progress: the requester resends from `from`; `to` is one past the highest
/// PSN sent when it began, at `at`. A NAK for a PSN in `from..to` within an RTT of `at`
/// answers a packet sent before the go-back-N, which is resending it already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovery {
    pub(super) from: Psn,
    pub(super) to: Psn,
    pub(super) at: Instant,
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
            recovery: None,
            window: WINDOW_START_PSNS,
            window_credit: 0,
            shrunk_at: None,
            rtt: RttEstimator::default(),
            rtt_probe: None,
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

    /// True when `psn` is being resent by a go-back-N begun less than `guard` before `now`:
    /// a NAK for it then answers the packet sent before the go-back-N.
    pub(super) fn resending(&self, psn: Psn, now: Instant, guard: Duration) -> bool {
        self.recovery.is_some_and(|r| {
            psn.diff(r.from) >= 0
                && r.to.diff(psn) > 0
                && now.saturating_duration_since(r.at) < guard
        })
    }

    /// Goes back to resend from `from` (go-back-N after a NAK or a timeout): the timed PSN,
    /// if any, will be resent, so its measurement is void.
    pub(super) fn go_back(&mut self, from: Psn, now: Instant) {
        self.rewind(from);
        self.rtt_probe = None;
        self.recovery = Some(Recovery {
            from,
            to: self.high_psn,
            at: now,
        });
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

/// A receive WQE being filled by a multi-packet message.
#[derive(Debug, Clone, Copy)]
pub(super) struct Filling {
    pub(super) wqe: RecvWqe,
    pub(super) filled: usize,
}

/// A response the responder owes the requester, sent on the next `poll_transmit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Response {
    /// ACK up to and including this PSN.
    Ack(Psn),
    /// PSN sequence error: the responder expects this PSN.
    NakSeq(Psn),
    /// Receiver not ready for the packet with this PSN.
    RnrNak(Psn),
    /// Invalid request (length, opcode sequence); the QP is going to ERR.
    NakInvalid(Psn),
}

/// Responder state of an RC QP.
#[derive(Debug)]
pub(super) struct Responder {
    /// Next PSN expected.
    pub(super) psn: Psn,
    /// Messages completed (AETH MSN).
    pub(super) msn: u32,
    /// The receive WQE a multi-packet message is filling.
    pub(super) filling: Option<Filling>,
    /// A PSN-sequence NAK (or an RNR NAK) was sent for the current gap (rxe `sent_psn_nak`).
    pub(super) sent_psn_nak: bool,
    /// An RNR NAK was sent for the expected PSN: until it arrives, nothing is held.
    pub(super) rnr_naked: bool,
    /// Requests that arrived ahead of the expected PSN, held until it arrives.
    pub(super) held: Held,
    /// When the gap before the held requests opened (the earliest of them arrived).
    pub(super) gap_since: Option<Instant>,
    /// How long a gap may stay open before its NAK.
    pub(super) reorder: ReorderWindow,
    /// When the open gap's PSN-sequence NAK went out, if it did.
    pub(super) naked_at: Option<Instant>,
    /// When the open gap is NAKed unless it fills first.
    pub(super) nak_at: Option<Instant>,
    /// The instant of the NAK timer's live entry in the provider's timer heap.
    pub(super) nak_queued: Option<Instant>,
    /// Responses to send, coalesced: at most one ACK is kept.
    pub(super) responses: VecDeque<Response>,
    /// `CommEst` was raised.
    pub(super) comm_est_raised: bool,
}

impl Responder {
    pub(super) fn new() -> Self {
        Self {
            psn: Psn::new(0),
            msn: 0,
            filling: None,
            sent_psn_nak: false,
            rnr_naked: false,
            held: Held::default(),
            gap_since: None,
            reorder: ReorderWindow::default(),
            naked_at: None,
            nak_at: None,
            nak_queued: None,
            responses: VecDeque::new(),
            comm_est_raised: false,
        }
    }

    /// Queues an ACK, coalescing: of the ACKs queued one after the other, the first and the
    /// latest are kept (two, so that one lost on the wire does not leave every request of a
    /// burst unanswered until the requester's timer runs out).
    pub(super) fn queue_ack(&mut self, psn: Psn) {
        let n = self.responses.len();
        let two_acks = n >= 2
            && matches!(self.responses.get(n - 2), Some(Response::Ack(_)))
            && matches!(self.responses.get(n - 1), Some(Response::Ack(_)));
        match self.responses.back_mut() {
            Some(Response::Ack(p)) if two_acks => *p = psn,
            _ => self.responses.push_back(Response::Ack(psn)),
        }
    }
}

/// The destination GID of a RoCEv2 address vector: its GRH's. `modify_qp` and `post_send`
/// refuse an address vector without a GRH, so every one stored or posted has it.
pub(super) fn roce_dgid(av: &AddressVector) -> crate::verbs::Gid {
    av.dgid().unwrap_or_default()
}
