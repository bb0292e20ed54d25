//! Per-QP state of the software provider: the QP with its attributes, its requester and
//! responder halves, and its receive queue; and the moves to ERR that flush it.
//!
//! The structure follows rxe (`rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`): the *requester*
//! ([`super::requester`]) turns send WQEs into packets, the *completer*
//! ([`super::completer`]) consumes ACK/NAK/RNR-NAK and retires WQEs or rewinds the requester
//! (go-back-N), and the *responder* ([`super::responder`]) checks PSNs, fills receive WQEs and
//! schedules ACKs and NAKs.

use std::collections::VecDeque;

use super::objects::RecvInfo;
use super::requester::Requester;
use super::responder::{Responder, Response};
use super::Device;
use crate::verbs::{
    AddressVector, AsyncEvent, BufId, CqId, PathMtu, PdId, QKey, QpAttr, QpInit, QpNum, QpState,
    QpType, SrqId, WcStatus, WrId,
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
    pub(super) fn retransmit_interval(&self) -> Option<std::time::Duration> {
        crate::wire::cm::LocalAckTimeout::saturating(self.attrs.timeout).retransmit_interval()
    }
}

impl Device {
    /// Moves `qp` to ERR: flushes both work queues and raises Last WQE Reached for an
    /// SRQ-attached QP. Idempotent.
    pub(super) fn enter_error(&mut self, qp: &mut Qp) {
        qp.state = QpState::Err;
        qp.sqd_notify = false;
        qp.req.retransmit_at = None;
        qp.req.rnr_at = None;
        qp.resp
            .responses
            .retain(|r| matches!(r, Response::NakInvalid(_)));
        while let Some(w) = qp.req.sq.pop_front() {
            self.complete_send(qp, &w, WcStatus::WrFlushErr);
        }
        qp.req.send_idx = 0;
        qp.req.send_pkt = 0;
        if let Some(f) = qp.resp.filling.take() {
            self.complete_recv(qp, f.wqe, WcStatus::WrFlushErr, RecvInfo::default());
        }
        while let Some(w) = qp.rq.pop_front() {
            self.complete_recv(qp, w, WcStatus::WrFlushErr, RecvInfo::default());
        }
        if qp.srq.is_some() && !qp.last_wqe_raised {
            qp.last_wqe_raised = true;
            let q = self.cfg.quirks;
            if !q.no_last_wqe {
                self.events.push_back(AsyncEvent::QpLastWqeReached(qp.num));
                if q.dup_last_wqe {
                    self.events.push_back(AsyncEvent::QpLastWqeReached(qp.num));
                }
            }
        }
    }

    /// Raises the `SqDrained` owed by a move to SQD once nothing begun is outstanding.
    pub(super) fn check_sq_drained(&mut self, qp: &mut Qp) {
        if qp.sqd_notify && qp.sq_drained() {
            qp.sqd_notify = false;
            self.events.push_back(AsyncEvent::SqDrained(qp.num));
        }
    }
}
