//! The provider's [`Device`]: everything but the QP table, with what the engine parts share:
//! building packets, pushing completions, taking receive WQEs, and moving a QP to ERR.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use super::config::SoftConfig;
use super::config::SoftLink;
use super::ib::{mlid_group, IbLink};
use super::mcast::Multicast;
use super::objects::{Objects, RecvInfo};
use super::qp::roce_dgid;
use super::qp::{Qp, RecvWqe, Response, SendWqe};
use super::reorder::HoldBudget;
use super::sched::Scheduler;
use super::stats::SoftStats;
use crate::verbs::{
    AddressVector, AsyncEvent, Completion, CqId, Gid, Psn, QpNum, QpState, Sl, WcOpcode, WcStatus,
};
use crate::wire::bth::{Bth, Opcode};
use crate::wire::ib::{emit_ib_append, IbAddressing, IbGrh};
use crate::wire::icrc::IpHeaderInfo;
use crate::wire::roce::RoceRepr;

/// The provider's device: everything it owns apart from its QPs (configuration, object
/// tables, async events, counters, scheduler and timers, multicast). The QP table is kept
/// beside it in [`SoftVerbs`](super::engine::SoftVerbs), so that the requester, completer
/// and responder code, methods of `Device`, can work on one `&mut Qp` and the device at once.
#[derive(Debug)]
pub(super) struct Device {
    pub(super) cfg: SoftConfig,
    /// PDs, CQs, SRQs and buffer pools.
    pub(super) objects: Objects,
    /// Async events not yet taken by `poll_async_event`.
    pub(super) events: VecDeque<AsyncEvent>,
    /// Counters (the fault injector's are added by
    /// [`SoftVerbs::stats`](super::engine::SoftVerbs::stats)).
    pub(super) stats: SoftStats,
    /// QPs waiting to send, and the QP timers.
    pub(super) sched: Scheduler,
    pub(super) mcast: Multicast,
    /// Room for the requests responders hold out of sequence.
    pub(super) hold_budget: HoldBudget,
    /// The held request being delivered.
    pub(super) held_scratch: Vec<u8>,
    /// The InfiniBand link's port and routes ([`SoftLink::Infiniband`]); `None` on RoCEv2.
    pub(super) ib: Option<IbLink>,
}

impl Device {
    /// A device with the configuration `cfg` and no objects.
    pub(super) fn new(cfg: SoftConfig) -> Self {
        Self {
            cfg,
            objects: Objects::new(),
            events: VecDeque::new(),
            stats: SoftStats::default(),
            sched: Scheduler::new(),
            mcast: Multicast::default(),
            hold_budget: HoldBudget::new(cfg.reorder_hold_packets),
            held_scratch: Vec::new(),
            ib: (cfg.link == SoftLink::Infiniband).then(|| IbLink::new(Gid::default())),
        }
    }

    /// Appends the packet `repr` with `payload` to the destination of `av` to `out`;
    /// returns where it goes on the underlay. RoCEv2: the IP address of the GRH's DGID.
    /// InfiniBand: the port of the DLID's route, or the MLID's group. The caller counts a
    /// packet that goes nowhere ([`Device::routed`]).
    pub(super) fn emit_av(
        &self,
        repr: &RoceRepr,
        payload: &[u8],
        av: &AddressVector,
        out: &mut Vec<u8>,
    ) -> Result<SocketAddr, Unroutable> {
        let Some(ib) = &self.ib else {
            return self
                .emit(repr, payload, roce_dgid(av).to_ip(), out)
                .ok_or(Unroutable::OtherIpVersion);
        };
        if !ib.port.active {
            return Err(Unroutable::PortDown);
        }
        let dst = if av.dlid.is_multicast() {
            SocketAddr::new(mlid_group(av.dlid.0, self.cfg.local_ip), self.cfg.dst_port)
        } else {
            ib.routes.lookup(av.dlid.0).ok_or(Unroutable::NoRoute)?
        };
        let addr = IbAddressing {
            sl: av.sl.get(),
            dlid: av.dlid.0,
            slid: ib.port.lid.0 | u16::from(av.src_path_bits),
            grh: av.grh.map(|g| IbGrh {
                tclass: g.traffic_class,
                flow_label: g.flow_label,
                payload_len: 0,
                next_header: 0,
                hop_limit: g.hop_limit,
                sgid: ib.port.gid,
                dgid: g.dgid,
            }),
        };
        emit_ib_append(repr, payload, &addr, out);
        Ok(dst)
    }

    /// The destination of an [`emit_av`](Self::emit_av), a packet that goes nowhere counted.
    pub(super) fn routed(&mut self, r: Result<SocketAddr, Unroutable>) -> Option<SocketAddr> {
        match r {
            Ok(to) => Some(to),
            Err(Unroutable::PortDown) => {
                self.stats.tx_port_down += 1;
                None
            }
            Err(Unroutable::NoRoute) => {
                self.stats.tx_no_route += 1;
                None
            }
            Err(Unroutable::OtherIpVersion) => None,
        }
    }

    /// Appends the packet `repr` with `payload`, from this device to `dst_ip`, to `out`;
    /// returns its destination (`None`: `dst_ip` is of the other IP version).
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

    /// A BTH from this device with the defaults (its P_Key, TVer 0, no AckReq).
    pub(super) fn bth(&self, opcode: Opcode, dest_qp: QpNum, psn: Psn) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: self.cfg.pkey.0,
            fecn: false,
            becn: false,
            dest_qp: dest_qp.get(),
            ack_req: false,
            psn: psn.get(),
        }
    }

    fn push_completion(&mut self, cq: CqId, c: Completion) {
        if self.objects.push_completion(cq, c) {
            self.stats.cq_overflows += 1;
        }
    }

    pub(super) fn complete_send(&mut self, qp: &Qp, w: &SendWqe, status: WcStatus) {
        let signaled = w.wr.signaled || qp.sq_sig_all || status != WcStatus::Success;
        if signaled {
            self.push_completion(
                qp.send_cq,
                Completion {
                    wr_id: w.wr.wr_id,
                    status,
                    opcode: WcOpcode::Send,
                    byte_len: 0,
                    qp: qp.num,
                    buf: w.wr.buf,
                    imm: None,
                    src_qp: None,
                    src_port: None,
                    grh: false,
                    slid: None,
                    sl: Sl::ZERO,
                    dlid_path_bits: 0,
                },
            );
        } else if let Some(b) = w.wr.buf {
            // Nobody will be told this WR finished, so its buffer goes back to the pool.
            self.objects.pools.release(b);
        }
    }

    pub(super) fn complete_recv(
        &mut self,
        qp: &Qp,
        wqe: RecvWqe,
        status: WcStatus,
        extra: RecvInfo,
    ) {
        self.push_completion(
            qp.recv_cq,
            Completion {
                wr_id: wqe.wr_id,
                status,
                opcode: WcOpcode::Recv,
                byte_len: extra.byte_len,
                qp: qp.num,
                buf: Some(wqe.buf),
                imm: extra.imm,
                src_qp: extra.src_qp,
                src_port: extra.src_port,
                grh: extra.grh,
                slid: extra.slid,
                sl: extra.sl,
                dlid_path_bits: 0,
            },
        );
    }

    /// Takes the next receive WQE for `qp`, from its SRQ or its own queue.
    pub(super) fn take_recv(&mut self, qp: &mut Qp) -> Option<RecvWqe> {
        match qp.srq {
            None => qp.rq.pop_front(),
            Some(id) => {
                let (w, limit_reached) = self.objects.take_srq_recv(id)?;
                if limit_reached {
                    self.events.push_back(AsyncEvent::SrqLimitReached(id));
                }
                Some(w)
            }
        }
    }

    /// Moves `qp` to ERR: flushes both work queues and raises Last WQE Reached for an
    /// SRQ-attached QP. Idempotent (but for the `last_wqe_again` quirk).
    pub(super) fn enter_error(&mut self, qp: &mut Qp) {
        qp.state = QpState::Err;
        qp.sqd_notify = false;
        qp.req.retransmit_at = None;
        qp.req.rnr_at = None;
        self.drop_held(qp);
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
        let q = self.cfg.quirks;
        if qp.srq.is_some() && (!qp.last_wqe_raised || q.last_wqe_again) {
            qp.last_wqe_raised = true;
            if !q.no_last_wqe {
                self.events.push_back(AsyncEvent::QpLastWqeReached(qp.num));
                if q.dup_last_wqe {
                    self.events.push_back(AsyncEvent::QpLastWqeReached(qp.num));
                }
            }
        }
    }

    /// Gives back the requests `qp` holds out of sequence and forgets the gap (it stops
    /// receiving, or is reset or destroyed).
    pub(super) fn drop_held(&mut self, qp: &mut Qp) {
        qp.resp.held.clear(&mut self.hold_budget);
        qp.resp.gap_since = None;
        qp.resp.naked_at = None;
        qp.resp.nak_at = None;
    }

    /// Raises the `SqDrained` owed by a move to SQD once nothing begun is outstanding.
    pub(super) fn check_sq_drained(&mut self, qp: &mut Qp) {
        if qp.sqd_notify && qp.sq_drained() {
            qp.sqd_notify = false;
            self.events.push_back(AsyncEvent::SqDrained(qp.num));
        }
    }
}

/// Why a packet goes nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unroutable {
    /// RoCEv2: the destination is of the other IP version.
    OtherIpVersion,
    /// InfiniBand: the port is not active.
    PortDown,
    /// InfiniBand: no port beacons the DLID.
    NoRoute,
}

/// IP header facts covered by the ICRC, for a packet from `src` to `dst`.
pub(super) fn ip_info(src: IpAddr, dst: IpAddr) -> Option<IpHeaderInfo> {
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => Some(IpHeaderInfo::V4 {
            src,
            dst,
            identification: 0,
            dont_fragment: true,
        }),
        (IpAddr::V6(src), IpAddr::V6(dst)) => Some(IpHeaderInfo::V6 { src, dst }),
        _ => None,
    }
}
