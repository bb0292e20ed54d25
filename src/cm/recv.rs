//! What the CM does with each received MAD (Linux `cm_*_handler`, and the duplicate and
//! stale-connection rules of `shared/reference/rocev2.md` §4.6).

use std::time::Instant;

use crate::verbs::Gid;
use crate::wire::cm::{
    cm_timeout_ms, CmMad, CmMessage, Drep, Dreq, Mra, Rej, RejReason, Rep, Req, Rtu, TargetMsg,
};

use super::admission::MAX_MRA_TIMEOUT_EXP;
use super::conn::{drep_mad, issue_rej, Conn};
use super::types::{ms, passive_path, CmEvent, CmState, CommId, MadRoute};
use super::Cm;

impl Cm {
    /// A MAD arrived on QP1 from `from` (the source GID of its GRH / IP header). Malformed,
    /// unknown, unexpected and spoofed MADs are dropped and counted; nothing here panics.
    pub fn handle_mad(&mut self, now: Instant, from: Gid, mad: &[u8]) {
        self.handle_routed_mad(now, from, None, mad);
    }

    /// [`Cm::handle_mad`] for a MAD that came with LID fields (`route`: a port with LIDs),
    /// which a routed REQ's passive path takes its LIDs from ([`passive_path`]).
    pub fn handle_routed_mad(
        &mut self,
        now: Instant,
        from: Gid,
        route: Option<MadRoute>,
        mad: &[u8],
    ) {
        self.start_clock(now);
        self.stats.mads_received += 1;
        let Ok(m) = CmMad::parse(mad) else {
            self.stats.dropped_malformed += 1;
            return;
        };
        let tid = m.header.transaction_id;
        match m.msg {
            CmMessage::Req(r) => self.on_req(now, from, route, tid, &r),
            CmMessage::Mra(r) => self.on_mra(now, from, &r),
            CmMessage::Rej(r) => self.on_rej(now, from, &r),
            CmMessage::Rep(r) => self.on_rep(now, from, &r),
            CmMessage::Rtu(r) => self.on_rtu(now, from, &r),
            CmMessage::Dreq(r) => self.on_dreq(now, from, tid, &r),
            CmMessage::Drep(r) => self.on_drep(now, from, &r),
        }
    }

    /// The live id a MAD names (`our_id`, its Remote Comm ID), if it really comes from that
    /// id's peer: from its GID, and with its comm id (`their_id`) once we know it. Counts
    /// unknown and spoofed MADs. A MAD that passes confirms its source GID to the REQ
    /// admission (it named our id, which only a receiver of our MADs knows).
    fn lookup(
        &mut self,
        now: Instant,
        from: Gid,
        our_id: u32,
        their_id: Option<u32>,
    ) -> Option<CommId> {
        let Some(c) = self.conns.get(&our_id) else {
            self.stats.dropped_unknown += 1;
            return None;
        };
        let id_ok = match (c.remote_comm_id, their_id) {
            (Some(known), Some(got)) => known == got,
            _ => true,
        };
        if c.peer != from || !id_ok {
            self.stats.dropped_spoofed += 1;
            return None;
        }
        if self.limiter.confirm(self.cfg.req_rate_limit, now, from) {
            self.stats.req_sources_evicted += 1;
        }
        Some(CommId(our_id))
    }

    /// Counts a MAD that has no use in the state its id is in.
    fn unexpected(&mut self) {
        self.stats.dropped_unexpected += 1;
    }

    /// REQ: rate-limited per source, then a duplicate of a known one, a stale one, or a new
    /// passive id (Linux `cm_req_handler`, `cm_dup_req_handler`).
    fn on_req(&mut self, now: Instant, from: Gid, route: Option<MadRoute>, tid: u64, r: &Req) {
        let admission = self.limiter.admit(self.cfg.req_rate_limit, now, from);
        if admission.evicted_source {
            self.stats.req_sources_evicted += 1;
        }
        if !admission.admitted {
            self.stats.req_rate_limited += 1;
            return;
        }
        let dup = self
            .index
            .passive(r.local_ca_guid, r.local_comm_id)
            .and_then(|raw| self.conns.get(&raw))
            .map(|c| (c.state, c.peer, c.reply.as_deref().copied()));
        if let Some((state, peer, reply)) = dup {
            if peer != from {
                self.stats.dropped_spoofed += 1;
                return;
            }
            self.stats.duplicates += 1;
            match state {
                CmState::RepSent | CmState::MraRepRcvd => {
                    if let Some(rep) = reply {
                        self.send(peer, rep);
                    }
                }
                CmState::TimeWait => {
                    self.stats.stale_rejected += 1;
                    self.reject_req(from, tid, r, RejReason::StaleConn);
                }
                _ => {}
            }
            return;
        }
        // The peer's QP is still used by a connection here (or in TimeWait): its packets
        // might belong to the old connection. As Linux `cm_match_req`: REJ STALE_CONN, and
        // the old connection, if established, gets a DREQ.
        let stale: Vec<u32> = self.index.by_qpn(r.local_ca_guid, r.local_qpn).collect();
        if !stale.is_empty() {
            self.stats.stale_rejected += 1;
            self.reject_req(from, tid, r, RejReason::StaleConn);
            for raw in stale {
                if self.state(CommId(raw)) == Some(CmState::Established) {
                    let _ = self.disconnect(now, CommId(raw));
                }
            }
            return;
        }
        let listened = self
            .listeners
            .iter()
            .any(|&(sid, mask)| r.service_id & mask == sid);
        if !listened {
            self.reject_req(from, tid, r, RejReason::InvalidServiceId);
            return;
        }
        if r.transport_service_type != Req::TRANSPORT_RC {
            self.reject_req(from, tid, r, RejReason::InvalidTransportType);
            return;
        }
        let Some(path_mtu) = r.path_mtu else {
            self.reject_req(from, tid, r, RejReason::InvalidMtu);
            return;
        };
        if r.primary_path.remote_gid != self.cfg.local_gid {
            self.reject_req(from, tid, r, RejReason::InvalidGid);
            return;
        }
        let Some(id) = self.alloc_id() else {
            self.stats.ids_exhausted += 1;
            self.reject_req(from, tid, r, RejReason::NoResources);
            return;
        };
        let confirmed = self.limiter.confirmed(from);
        let (conn, clamped) = Conn::new_passive(from, tid, r, confirmed);
        if clamped {
            self.stats.req_retx_clamped += 1;
        }
        self.index
            .insert_passive(r.local_ca_guid, r.local_comm_id, id.0);
        self.index.insert_qpn(r.local_ca_guid, r.local_qpn, id.0);
        self.conns.insert(id.0, conn);
        self.events.push_back(CmEvent::ReqReceived {
            id,
            peer: from,
            remote_ca_guid: r.local_ca_guid,
            service_id: r.service_id,
            remote_qpn: r.local_qpn,
            remote_psn: r.starting_psn,
            path_mtu,
            path: passive_path(&r.primary_path, path_mtu, route),
            retry_count: r.retry_count,
            rnr_retry_count: r.rnr_retry_count,
            private_data: r.private_data,
        });
    }

    /// Answers a REQ without an id of ours with a REJ.
    fn reject_req(&mut self, from: Gid, tid: u64, r: &Req, reason: RejReason) {
        self.stats.rej_sent += 1;
        let mad = issue_rej(tid, r.local_comm_id, 0, TargetMsg::Req, reason);
        self.send(from, mad);
    }

    /// MRA: the peer needs more time; the outstanding REQ or REP waits
    /// `conv(service_timeout) + conv(av.timeout)` per try (Linux `cm_mra_handler`), each
    /// exponent at most [`MAX_MRA_TIMEOUT_EXP`].
    fn on_mra(&mut self, now: Instant, from: Gid, m: &Mra) {
        let Some(id) = self.lookup(now, from, m.remote_comm_id, Some(m.local_comm_id)) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        let next = match (c.state, m.msg_mraed) {
            (CmState::ReqSent | CmState::MraReqRcvd, TargetMsg::Req) => CmState::MraReqRcvd,
            (CmState::RepSent | CmState::MraRepRcvd, TargetMsg::Rep) => CmState::MraRepRcvd,
            _ => {
                self.unexpected();
                return;
            }
        };
        let interval = ms(cm_timeout_ms(m.service_timeout.min(MAX_MRA_TIMEOUT_EXP))
            .saturating_add(cm_timeout_ms(c.av_timeout.min(MAX_MRA_TIMEOUT_EXP))));
        c.state = next;
        if let Some(r) = c.retx.as_mut() {
            r.interval = interval;
        }
        self.stats.mra_received += 1;
        self.set_deadline(id, Some(now + interval));
    }

    /// REJ (Linux `cm_rej_handler`). A REJ of a REQ carries no id of the rejecter; a REJ
    /// Timeout may name us only by our CA GUID in its ARI.
    fn on_rej(&mut self, now: Instant, from: Gid, r: &Rej) {
        self.stats.rej_received += 1;
        let mut our_id = r.remote_comm_id;
        if !self.conns.contains_key(&our_id) && r.reason == RejReason::Timeout {
            // The rejecter gave up on a transaction of its own (e.g. its REQ): find our id
            // by (its CA GUID, its comm id).
            let guid = r.ari.first_chunk::<8>().map(|g| u64::from_be_bytes(*g));
            if let Some((&raw, _)) = self.conns.iter().find(|(_, c)| {
                Some(c.remote_ca_guid) == guid && c.remote_comm_id == Some(r.local_comm_id)
            }) {
                our_id = raw;
            }
        }
        let their_id = (r.msg_rejected != TargetMsg::Req).then_some(r.local_comm_id);
        let Some(id) = self.lookup(now, from, our_id, their_id) else {
            return;
        };
        let Some(state) = self.state(id) else {
            return;
        };
        match state {
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::ReqRcvd
            | CmState::MraReqSent
            | CmState::RepRcvd
            | CmState::MraRepSent => self.free(id),
            CmState::RepSent | CmState::MraRepRcvd | CmState::Established | CmState::DreqSent => {
                self.enter_timewait(now, id)
            }
            CmState::Idle | CmState::DreqRcvd | CmState::TimeWait => {
                self.unexpected();
                return;
            }
        }
        self.events.push_back(CmEvent::Rejected {
            id,
            reason: r.reason,
            acceptable_mtu: r.acceptable_mtu(),
        });
    }

    /// REP (Linux `cm_rep_handler`, `cm_dup_rep_handler`).
    fn on_rep(&mut self, now: Instant, from: Gid, r: &Rep) {
        let Some(id) = self.lookup(now, from, r.remote_comm_id, Some(r.local_comm_id)) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        match c.state {
            CmState::ReqSent | CmState::MraReqRcvd if c.active => {
                c.learn_rep(&self.cfg, r);
                self.index.insert_qpn(r.local_ca_guid, r.local_qpn, id.0);
                c.state = CmState::RepRcvd;
                c.retx = None;
                self.set_deadline(id, None);
                self.events.push_back(CmEvent::RepReceived {
                    id,
                    remote_ca_guid: r.local_ca_guid,
                    remote_qpn: r.local_qpn,
                    remote_psn: r.starting_psn,
                    rnr_retry_count: r.rnr_retry_count,
                    private_data: r.private_data,
                });
            }
            CmState::RepRcvd | CmState::MraRepSent | CmState::DreqSent | CmState::TimeWait
                if c.active =>
            {
                self.stats.duplicates += 1;
            }
            CmState::Established if c.active => {
                // Our RTU was lost: send it again.
                self.stats.duplicates += 1;
                let (peer, rtu) = (c.peer, c.reply.as_deref().copied());
                if let Some(rtu) = rtu {
                    self.send(peer, rtu);
                }
            }
            _ => self.unexpected(),
        }
    }

    /// RTU (Linux `cm_rtu_handler`): the passive side is Established.
    fn on_rtu(&mut self, now: Instant, from: Gid, r: &Rtu) {
        let Some(id) = self.lookup(now, from, r.remote_comm_id, Some(r.local_comm_id)) else {
            return;
        };
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        if matches!(c.state, CmState::RepSent | CmState::MraRepRcvd) && !c.active {
            c.state = CmState::Established;
            c.retx = None;
            // A duplicate REQ gets no REP once Established.
            c.reply = None;
            self.set_deadline(id, None);
            self.events.push_back(CmEvent::Established { id });
        } else {
            // Linux counts an RTU in any other state as a duplicate.
            self.stats.duplicates += 1;
        }
    }

    /// DREQ (Linux `cm_dreq_handler`): answered with a DREP at once, even for an id we do not
    /// know.
    fn on_dreq(&mut self, now: Instant, from: Gid, tid: u64, d: &Dreq) {
        if !self.conns.contains_key(&d.remote_comm_id) {
            self.stats.dropped_unknown += 1;
            self.stats.unknown_dreq_answered += 1;
            self.send(from, drep_mad(tid, d));
            return;
        }
        let Some(id) = self.lookup(now, from, d.remote_comm_id, Some(d.local_comm_id)) else {
            return;
        };
        let Some(c) = self.conns.get(&id.0) else {
            return;
        };
        if c.remote_comm_id.is_none() {
            self.unexpected();
            return;
        }
        if d.remote_qpn != c.local_qpn {
            self.stats.dropped_spoofed += 1;
            return;
        }
        let event = match c.state {
            CmState::Established | CmState::RepSent | CmState::MraRepRcvd => {
                CmEvent::DisconnectReceived { id }
            }
            // Crossing DREQs: ours is answered by theirs.
            CmState::DreqSent => CmEvent::Disconnected { id },
            CmState::TimeWait => {
                self.stats.duplicates += 1;
                self.send(from, drep_mad(tid, d));
                return;
            }
            _ => {
                self.unexpected();
                return;
            }
        };
        self.send(from, drep_mad(tid, d));
        self.enter_timewait(now, id);
        self.events.push_back(event);
    }

    /// DREP (Linux `cm_drep_handler`).
    fn on_drep(&mut self, now: Instant, from: Gid, d: &Drep) {
        let Some(id) = self.lookup(now, from, d.remote_comm_id, Some(d.local_comm_id)) else {
            return;
        };
        match self.state(id) {
            Some(CmState::DreqSent) => {
                self.enter_timewait(now, id);
                self.events.push_back(CmEvent::Disconnected { id });
            }
            Some(CmState::TimeWait) => self.stats.duplicates += 1,
            _ => self.unexpected(),
        }
    }
}
