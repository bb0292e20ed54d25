//! One communication id: its state, what we know of the peer, its retransmit timer, and the
//! MADs it sends (filled in as Linux `cm_format_*` fills them for RoCE).

use std::time::Duration;

use crate::verbs::{Gid, Lid, Path, QpNum};
use crate::wire::cm::{
    CmMad, CmMessage, CmPath, Dreq, Rej, RejReason, Rep, Req, Rtu, TargetMsg, MAD_LEN,
};

use super::admission::passive_retx;
use super::types::{
    cm_ack_timeout, own_tid, AcceptParams, CmConfig, CmState, CommId, ConnectParams, CA_ACK_DELAY,
};

/// The primary path of a REQ of ours along `path` (Linux `cm_format_req`): the path's LIDs
/// when its hop limit is at most 1 (Subnet Local set), else permissive LIDs; its flow label,
/// rate, traffic class, hop limit and SL. The GIDs are ours and the peer's.
pub(super) fn req_path(cfg: &CmConfig, peer: Gid, path: &Path, local_ack_timeout: u8) -> CmPath {
    let subnet_local = !path.is_global();
    let (local_lid, remote_lid) = if subnet_local {
        (path.slid.0, path.dlid.0)
    } else {
        (Lid::PERMISSIVE.0, Lid::PERMISSIVE.0)
    };
    CmPath {
        local_lid,
        remote_lid,
        local_gid: cfg.local_gid,
        remote_gid: peer,
        flow_label: path.flow_label & 0x000F_FFFF,
        packet_rate: path.rate.0 & 0x3F,
        traffic_class: path.traffic_class,
        hop_limit: path.hop_limit,
        sl: path.sl.get(),
        subnet_local,
        local_ack_timeout,
    }
}

/// An outstanding MAD, resent until answered.
#[derive(Debug, Clone)]
pub(super) struct Retx {
    /// The identical MAD to resend (boxed: only ids being set up or torn down have one, so
    /// an idle id does not carry its 256 bytes).
    pub(super) mad: Box<[u8; MAD_LEN]>,
    /// Resends left.
    pub(super) retries_left: u8,
    /// Time between sends (an MRA lengthens it).
    pub(super) interval: Duration,
}

/// A communication id.
#[derive(Debug, Clone)]
pub(super) struct Conn {
    pub(super) state: CmState,
    /// We sent the REQ.
    pub(super) active: bool,
    /// The peer port (where our MADs go; the only GID whose MADs we accept for this id).
    pub(super) peer: Gid,
    /// TID of this connection's REQ (ours, or the peer's); REP, RTU and REJ echo it.
    pub(super) tid: u64,
    pub(super) local_qpn: QpNum,
    /// The peer's comm id; `None` until known (active side before REP).
    pub(super) remote_comm_id: Option<u32>,
    pub(super) remote_ca_guid: u64,
    /// The peer's QP; `None` until known.
    pub(super) remote_qpn: Option<QpNum>,
    /// Retransmit interval of our REQ, REP and DREQ.
    pub(super) timeout: Duration,
    /// How often they are resent.
    pub(super) max_retries: u8,
    /// The path's ACK timeout exponent (Linux `av.timeout`), used to extend on MRA.
    pub(super) av_timeout: u8,
    /// The outstanding MAD, if any.
    pub(super) retx: Option<Retx>,
    /// The reply to resend on a duplicate: our REP (passive, while RepSent/MraRepRcvd; dropped
    /// once Established, when a duplicate REQ no longer gets it), our RTU (active,
    /// Established). Boxed, so an id without one is small.
    pub(super) reply: Option<Box<[u8; MAD_LEN]>>,
    /// Where this id sits in `Cm::timers`.
    pub(super) deadline: Option<std::time::Instant>,
    /// The wheel entry of `deadline`.
    pub(super) timer: Option<crate::timer::TimerId>,
}

impl Conn {
    /// A new active id for `p`, in ReqSent.
    pub(super) fn new_active(cfg: &CmConfig, tid: u64, p: &ConnectParams) -> Self {
        Self {
            state: CmState::ReqSent,
            active: true,
            peer: p.peer,
            tid,
            local_qpn: p.local_qpn,
            remote_comm_id: None,
            remote_ca_guid: 0,
            remote_qpn: None,
            timeout: cfg.req_timeout(),
            max_retries: cfg.max_cm_retries,
            av_timeout: cfg.packet_life_time.saturating_add(1).min(31),
            retx: None,
            reply: None,
            deadline: None,
            timer: None,
        }
    }

    /// A new passive id for `req` from `peer`, in ReqRcvd (Linux `cm_req_handler`: REP
    /// timeout from the REQ's Local CM Response Timeout, retries from its Max CM Retries, both
    /// clamped by [`passive_retx`] as for a `confirmed` source or not); and whether they were
    /// clamped.
    pub(super) fn new_passive(peer: Gid, tid: u64, req: &Req, confirmed: bool) -> (Self, bool) {
        let (timeout, max_retries, clamped) =
            passive_retx(req.local_cm_response_timeout, req.max_cm_retries, confirmed);
        let conn = Self {
            state: CmState::ReqRcvd,
            active: false,
            peer,
            tid,
            local_qpn: QpNum::new(0),
            remote_comm_id: Some(req.local_comm_id),
            remote_ca_guid: req.local_ca_guid,
            remote_qpn: Some(req.local_qpn),
            timeout,
            max_retries,
            av_timeout: req.primary_path.local_ack_timeout,
            retx: None,
            reply: None,
            deadline: None,
            timer: None,
        };
        (conn, clamped)
    }

    /// Learns the peer from its REP (Linux `cm_rep_handler`).
    pub(super) fn learn_rep(&mut self, cfg: &CmConfig, rep: &Rep) {
        self.remote_comm_id = Some(rep.local_comm_id);
        self.remote_ca_guid = rep.local_ca_guid;
        self.remote_qpn = Some(rep.local_qpn);
        self.av_timeout = cm_ack_timeout(rep.target_ack_delay, cfg.packet_life_time);
    }

    /// The peer's comm id, or 0 while unknown.
    pub(super) fn remote_id(&self) -> u32 {
        self.remote_comm_id.unwrap_or(0)
    }

    /// Our REQ.
    pub(super) fn req_mad(
        &self,
        cfg: &CmConfig,
        id: CommId,
        p: &ConnectParams,
        private_data: [u8; 92],
    ) -> [u8; MAD_LEN] {
        let req = Req {
            local_comm_id: id.0,
            service_id: p.service_id,
            local_ca_guid: cfg.local_ca_guid,
            local_qpn: p.local_qpn,
            remote_cm_response_timeout: cfg.cm_response_timeout,
            transport_service_type: Req::TRANSPORT_RC,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: cfg.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: cfg.pkey,
            path_mtu: Some(p.path_mtu),
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: cfg.max_cm_retries,
            srq: p.srq,
            primary_path: req_path(
                cfg,
                p.peer,
                &p.path
                    .unwrap_or_else(|| Path::roce(cfg.local_gid, p.peer, p.path_mtu)),
                p.local_ack_timeout,
            ),
            private_data,
            ..Req::default()
        };
        CmMad::new(self.tid, CmMessage::Req(req)).emit()
    }

    /// Our REP to the peer's REQ.
    pub(super) fn rep_mad(
        &self,
        cfg: &CmConfig,
        id: CommId,
        p: &AcceptParams,
        private_data: [u8; 196],
    ) -> [u8; MAD_LEN] {
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: self.remote_id(),
            local_qpn: p.local_qpn,
            starting_psn: p.starting_psn,
            target_ack_delay: CA_ACK_DELAY,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: cfg.local_ca_guid,
            private_data,
            ..Rep::default()
        };
        CmMad::new(self.tid, CmMessage::Rep(rep)).emit()
    }

    /// Our RTU to the peer's REP.
    pub(super) fn rtu_mad(&self, id: CommId) -> [u8; MAD_LEN] {
        let rtu = Rtu {
            local_comm_id: id.0,
            remote_comm_id: self.remote_id(),
            ..Rtu::default()
        };
        CmMad::new(self.tid, CmMessage::Rtu(rtu)).emit()
    }

    /// Our DREQ (a new transaction: Linux `cm_form_tid`).
    pub(super) fn dreq_mad(&self, id: CommId) -> [u8; MAD_LEN] {
        let dreq = Dreq {
            local_comm_id: id.0,
            remote_comm_id: self.remote_id(),
            remote_qpn: self.remote_qpn.unwrap_or(QpNum::new(0)),
            ..Dreq::default()
        };
        CmMad::new(own_tid(id), CmMessage::Dreq(dreq)).emit()
    }

    /// Our REJ, formatted as Linux `cm_format_rej` does for the current state.
    pub(super) fn rej_mad(&self, id: CommId, reason: RejReason, ari: &[u8]) -> [u8; MAD_LEN] {
        let (local_comm_id, msg_rejected) = match self.state {
            CmState::ReqRcvd => (0, TargetMsg::Req),
            CmState::MraReqSent => (id.0, TargetMsg::Req),
            CmState::RepRcvd | CmState::MraRepSent => (id.0, TargetMsg::Rep),
            _ => (id.0, TargetMsg::Other),
        };
        let mut rej = Rej {
            local_comm_id,
            remote_comm_id: self.remote_id(),
            msg_rejected,
            reason,
            ..Rej::default()
        };
        let n = ari.len().min(Rej::ARI_LEN);
        if let (Some(dst), Some(src)) = (rej.ari.get_mut(..n), ari.get(..n)) {
            dst.copy_from_slice(src);
            rej.reject_info_len = n as u8;
        }
        CmMad::new(self.tid, CmMessage::Rej(rej)).emit()
    }
}

/// A REJ that answers a MAD without an id of ours (Linux `cm_issue_rej`): the ids are the
/// received message's, swapped; the TID is echoed.
pub(super) fn issue_rej(
    tid: u64,
    rcvd_local_comm_id: u32,
    rcvd_remote_comm_id: u32,
    msg_rejected: TargetMsg,
    reason: RejReason,
) -> [u8; MAD_LEN] {
    let rej = Rej {
        local_comm_id: rcvd_remote_comm_id,
        remote_comm_id: rcvd_local_comm_id,
        msg_rejected,
        reason,
        ..Rej::default()
    };
    CmMad::new(tid, CmMessage::Rej(rej)).emit()
}

/// A DREP to a DREQ (Linux `cm_issue_drep` and `cm_format_drep`): ids swapped, TID echoed.
pub(super) fn drep_mad(tid: u64, dreq: &Dreq) -> [u8; MAD_LEN] {
    let drep = crate::wire::cm::Drep {
        local_comm_id: dreq.remote_comm_id,
        remote_comm_id: dreq.local_comm_id,
        ..crate::wire::cm::Drep::default()
    };
    CmMad::new(tid, CmMessage::Drep(drep)).emit()
}
