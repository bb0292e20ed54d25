//! Passive (RX) connections: accepted within the QP budget, receiving into the SRQ (or their
//! own rings), handing what arrives to the TUN queue, and always recycled by the
//! [`reaper`](self::reaper).

mod reaper;
mod table;

use std::time::{Duration, Instant};

pub use table::InterfaceRxCounts;
pub(super) use table::{Phase, Preparing, RxConn, RxTable};

use super::event::{Event, RxReapReason, RxRejectReason};
use super::restart::Incarnation;
use super::{
    wr, wr_kind, Endpoint, Owner, QpEnd, Timer, CQ_BATCH, MAX_CONN_QP_PER_SOURCE, WR_DRAIN, WR_RECV,
};
use crate::cm::{AcceptParams, CommId, QpMoves};
use crate::verbs::setup::{rc_init_attr_at, RcConnection, RNR_RETRY_FOREVER};
use crate::verbs::{
    BufId, Gid, Moves, Path, Psn, QpInit, QpNum, QpType, Verbs, VerbsError, WcOpcode, WcStatus,
};
use crate::wire::cm::RejReason;
use crate::wire::cma::{CmaHdr, KERNEL_REFUSAL};
use crate::wire::ipoib::{IpoibHeader, ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// State of a passive connection (the kernel's `ipoib_cm_state` plus the end of the road);
/// `ipoib-cm status` shows it by [`RxState::as_str`], in JSON as the same lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RxState {
    /// Receiving; the stale timer runs.
    Live,
    /// QP moved to ERR; waiting for Last WQE Reached (SRQ) or the flushed receives.
    Error,
    /// Last WQE Reached seen; waiting for the drain WR's flush completion.
    Flush,
    /// Fully drained; destroyed at once (only visible transiently).
    Drained,
}

impl RxState {
    /// The status name: `live`, `error`, `flush` or `drained`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Error => "error",
            Self::Flush => "flush",
            Self::Drained => "drained",
        }
    }
}

/// Why an RX connection is being torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// Idle for `rx_timeout`.
    Stale,
    /// The peer disconnected or rejected, or the CM gave up.
    Remote,
    /// Evicted to make room for a connection just established.
    Evicted,
    /// Established beyond `max_conn_qp` under the reject policy.
    OverBudget,
    /// Half-open, and the oldest when a REQ found `max_pending_rx` half-open connections.
    HalfOpenEvicted,
    /// Half-open until the CM gave up resending the REP (it sent the REJ).
    HalfOpenTimeout,
    /// Interface shutting down.
    Shutdown,
    /// The QP hit an error.
    Error,
    /// The peer restarted; this connection was its previous incarnation's.
    Restarted,
    /// The path MTU changed: the peer connects again at one both ends carry.
    PathMtuChanged,
}

impl From<Why> for RxReapReason {
    fn from(w: Why) -> Self {
        match w {
            Why::Stale => Self::Stale,
            Why::Remote => Self::Remote,
            Why::Evicted => Self::Evicted,
            Why::Shutdown => Self::Shutdown,
            Why::Error => Self::Error,
            Why::Restarted => Self::Restarted,
            Why::OverBudget => Self::OverBudget,
            Why::HalfOpenEvicted => Self::HalfOpenEvicted,
            Why::HalfOpenTimeout => Self::HalfOpenTimeout,
            Why::PathMtuChanged => Self::PathMtuChanged,
        }
    }
}

impl Why {
    /// Whether the peer may still hold its end, so the CM should tell it (DREQ, or REJ while
    /// connecting): not when the peer or the CM ended it.
    fn tell_peer(self) -> bool {
        !matches!(self, Self::Remote | Self::HalfOpenTimeout)
    }
}

impl Endpoint {
    /// A REQ for our service: admit it, build the receive QP up to RTS, and accept.
    ///
    /// At the rdma_cm service ([`EndpointConfig::rdma_cm_service_id`](super::EndpointConfig))
    /// the private data must start with a `cma_hdr` rdma_cm would accept, naming our GID's
    /// address; `ipoib_cm_data` follows it at byte 36. A REQ without one is refused as the
    /// kernel refuses it (REJ ConsumerDefined, no ARI, no private data) and counted in
    /// `rx_bad_cma_hdr`; one with it goes on as every other REQ. The REP's private data is
    /// `ipoib_cm_data` at byte 0 at either service (rdma_cm puts no header in a REP).
    ///
    /// Admission: under the reject policy a REQ finding `max_conn_qp` established connections
    /// is rejected (`NO_QP`). Otherwise it gets a receive QP, which is half-open until the RTU
    /// (or data) arrives: at most `max_pending_rx` are, the oldest is torn down to admit a new
    /// one, and the CM reaps each at its (clamped) REP timeout. The QP budget is charged when
    /// the connection is established ([`charge_rx_budget`](Self::charge_rx_budget)), so a REQ
    /// that never completes can neither hold a budget slot nor evict an established
    /// connection.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_req<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        id: CommId,
        peer: Gid,
        remote_ca_guid: u64,
        remote_qpn: QpNum,
        remote_psn: Psn,
        path: Path,
        rnr_retry_count: u8,
        service_id: u64,
        private: &[u8],
    ) {
        // At the rdma_cm service, `ipoib_cm_data` follows a `cma_hdr` that rdma_cm would take;
        // a REQ it would refuse gets its REJ before anything is allocated.
        // The kernel's CM checked and stripped the header itself.
        let private = if service_id == self.cfg.rdma_cm_service_id() && !self.cm.is_kernel() {
            match CmaHdr::accept_req(private, self.hwaddr.gid.to_ip()) {
                Ok((_, user)) => user,
                Err(why) => {
                    tracing::debug!(%peer, error = %why, "REQ at the rdma_cm service refused");
                    self.counters.rx_bad_cma_hdr += 1;
                    self.push_event(Event::RxRejected {
                        peer: self.event_peer(peer, remote_qpn),
                        reason: RxRejectReason::BadCmaHdr,
                    });
                    let _ = self.cm.reject(now, id, KERNEL_REFUSAL);
                    return;
                }
            }
        } else {
            private
        };
        let remote_ud_qpn = crate::wire::cm::IpoibCmData::decode(private)
            .ok()
            .map(|d| d.qpn);
        // A REQ from another incarnation of a node we hold connections for: the peer
        // restarted, which its connection's establishment confirms (`restart.rs`).
        let announces_restart = remote_ud_qpn.is_some_and(|ud_qpn| {
            let inc = Incarnation {
                ud_qpn,
                ca_guid: Some(remote_ca_guid),
            };
            self.holds_other_incarnation(peer, inc)
        });
        if self.stopping {
            self.push_event(Event::RxRejected {
                peer: self.event_peer(peer, remote_qpn),
                reason: RxRejectReason::ShuttingDown,
            });
            let _ = self.cm.reject(now, id, RejReason::NoQp);
            return;
        }
        // Its packets would be cut to the REQ's path MTU, and a larger one than ours may not
        // cross our link: REJ 26 names ours, and the peer asks again at it. The kernel's CM
        // can neither send one (ours on it) nor act on its ARI (a peer on it, whose REQs come
        // to the rdma_cm service): those REQs are taken with the QP at the smaller MTU.
        let acceptable = self.path_mtu_to(peer);
        let kernel_cm = self.cm.is_kernel() || service_id == self.cfg.rdma_cm_service_id();
        if path.mtu > acceptable && !kernel_cm {
            self.counters.rx_mtu_rejected += 1;
            self.push_event(Event::RxRejected {
                peer: self.event_peer(peer, remote_qpn),
                reason: RxRejectReason::PathMtu,
            });
            let _ = self.cm.reject_mtu(now, id, acceptable);
            return;
        }
        let path = Path {
            mtu: path.mtu.min(acceptable),
            ..path
        };
        let source_full = self.rx.established_from(peer) >= MAX_CONN_QP_PER_SOURCE;
        if self.cfg.budget_policy == super::QpBudgetPolicy::Reject
            && (self.rx.established_total() >= self.cfg.max_conn_qp || source_full)
        {
            self.counters.rx_rejected += 1;
            self.counters.rx_source_full += u64::from(source_full);
            self.push_event(Event::RxRejected {
                peer: self.event_peer(peer, remote_qpn),
                reason: RxRejectReason::QpBudget,
            });
            let _ = self.cm.reject(now, id, RejReason::NoQp);
            return;
        }
        if self.rx.half_open_total() >= self.cfg.max_pending_rx {
            // Room is made among this worker's own. One that holds none takes the REQ all the
            // same (so that a flood held by other workers locks no peer out of this one): the
            // interface then holds at most one more per such worker.
            if let Some(q) = self.rx.oldest_half_open() {
                self.start_rx_teardown(now, v, q, Why::HalfOpenEvicted);
            }
        }
        let moves = self.cm.qp_moves(id);
        let started = self.start_rx_qp(
            v,
            peer,
            remote_qpn,
            remote_psn,
            &path,
            rnr_retry_count,
            moves,
        );
        let Some((qpn, our_psn, moves)) = started else {
            self.reject_rx(now, id, peer, remote_qpn);
            return;
        };
        let ev_peer = self.event_peer(peer, qpn);
        let stale = self.arm(now + self.cfg.rx_timeout, Timer::RxStale(qpn));
        self.owners.insert(id, Owner::Rx(qpn));
        self.rx.insert(
            qpn,
            RxConn {
                id,
                peer,
                peer_ip: ev_peer.ip,
                remote_ca_guid,
                remote_ud_qpn,
                announces_restart,
                last_rx: now,
                path_mtu: path.mtu,
                established: false,
                ring_posted: 0,
                preparing: Some(Preparing {
                    our_psn,
                    rnr_retry_count,
                }),
                phase: Phase::Live {
                    stale_timer: Some(stale),
                },
            },
        );
        if moves == Moves::Done {
            self.on_rx_qp_moved(now, v, qpn, Ok(()));
        }
    }

    /// The REQ on `id` gets no QP (`NoResources`).
    fn reject_rx(&mut self, now: Instant, id: CommId, peer: Gid, remote_qpn: QpNum) {
        self.counters.rx_rejected += 1;
        self.push_event(Event::RxRejected {
            peer: self.event_peer(peer, remote_qpn),
            reason: RxRejectReason::NoResources,
        });
        let _ = self.cm.reject(now, id, RejReason::NoResources);
    }

    /// The moves of a preparing RX connection's QP to RTS are done (or failed): its own
    /// receives are posted (non-SRQ mode) and the REP goes out; on failure the REQ is
    /// rejected (`NoResources`) and the QP destroyed. A connection torn down meanwhile is the
    /// reaper's, and this changes nothing.
    pub(super) fn on_rx_qp_moved<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        result: Result<(), VerbsError>,
    ) {
        let Some(mut r) = self.rx.get_mut(&qpn) else {
            return;
        };
        if !r.is_live() {
            return;
        }
        let Some(p) = r.preparing.take() else {
            return;
        };
        let (id, peer) = (r.id, r.peer);
        drop(r);
        let ready = match result {
            Ok(()) => self.post_ring(v, qpn),
            Err(e) => {
                tracing::warn!(qp = %qpn, error = %e, "moving an RX QP to RTS failed");
                false
            }
        };
        if !ready {
            // The event names our QP: the REQ's is not kept.
            self.reject_rx(now, id, peer, qpn);
            // The QP holds no receive but those of its own ring, which its destroy frees; the
            // id is forgotten with it when the CM is done with it.
            self.destroy_rx(v, qpn, QpEnd::Forced);
            return;
        }
        let params = AcceptParams {
            local_qpn: qpn,
            starting_psn: p.our_psn,
            srq: self.srq.is_some(),
            rnr_retry_count: p.rnr_retry_count,
            private_data: self.cm_private_data(),
        };
        if self.cm.accept(now, id, params).is_err() {
            self.destroy_rx(v, qpn, QpEnd::Forced);
            return;
        }
        self.counters.rx_accepted += 1;
        let ev_peer = self.event_peer(peer, qpn);
        self.push_event(Event::RxAccepted { peer: ev_peer });
    }

    /// Non-SRQ mode: fills the ring of `qpn` (in RTS, the REP not sent yet) with
    /// `nonsrq_ring` receives; false when the pool or the QP refused one.
    fn post_ring<V: Verbs>(&mut self, v: &mut V, qpn: QpNum) -> bool {
        if self.srq.is_some() {
            return true;
        }
        let mut posted = 0;
        let mut full = true;
        for _ in 0..self.cfg.nonsrq_ring {
            let Some(b) = v.pools_mut().alloc(self.rx_pool) else {
                full = false;
                break;
            };
            if v.post_recv(qpn, wr(WR_RECV), b).is_err() {
                let _ = v.pools_mut().free(b);
                full = false;
                break;
            }
            posted += 1;
        }
        if let Some(mut r) = self.rx.get_mut(&qpn) {
            r.ring_posted = posted;
        }
        full
    }

    /// The RX connection on `qpn` is established: charge it to the QP budget and to its
    /// peer's share of it. Beyond [`MAX_CONN_QP_PER_SOURCE`] from its peer, the evict policy
    /// tears down that peer's least recently active other connection; beyond `max_conn_qp`,
    /// the least recently active other one of any peer. The reject policy tears down this
    /// one instead (counted in `rx_rejected`). Each call adds one connection, so one
    /// teardown brings both counts back within their bounds.
    pub(super) fn charge_rx_budget<V: Verbs>(&mut self, now: Instant, v: &mut V, qpn: QpNum) {
        let source_full = self
            .rx
            .get(&qpn)
            .map(|r| r.peer)
            .filter(|p| self.rx.established_from(*p) > MAX_CONN_QP_PER_SOURCE);
        if source_full.is_some() {
            self.counters.rx_source_full += 1;
        } else if self.rx.established_total() <= self.cfg.max_conn_qp {
            return;
        }
        match self.cfg.budget_policy {
            super::QpBudgetPolicy::Evict => {
                // Among this worker's own; one that holds no other keeps the new one (the
                // newest peer stays reachable), the interface then one over per such worker.
                if let Some(q) = self.rx.least_recently_active_except(qpn, source_full) {
                    self.start_rx_teardown(now, v, q, Why::Evicted);
                }
            }
            super::QpBudgetPolicy::Reject => {
                self.counters.rx_rejected += 1;
                self.start_rx_teardown(now, v, qpn, Why::OverBudget);
            }
        }
    }

    /// Creates a receive QP and starts moving it to RTS ([`Verbs::begin_moves`]: INIT, RTR,
    /// RTS). RTS, although the QP never sends data, so the drain WR can be posted on it later
    /// (the kernel does the same for Mellanox firmware). With the kernel's CM, `moves` are its
    /// attributes (its PSNs); else the REQ's fields. Returns the QP, our starting PSN, and
    /// whether the moves are done.
    #[allow(clippy::too_many_arguments)]
    fn start_rx_qp<V: Verbs>(
        &mut self,
        v: &mut V,
        peer: Gid,
        remote_qpn: QpNum,
        remote_psn: Psn,
        path: &Path,
        rnr_retry_count: u8,
        moves: Option<QpMoves>,
    ) -> Option<(QpNum, Psn, Moves)> {
        let qpn = v
            .create_qp(&QpInit {
                pd: self.pd,
                qp_type: QpType::Rc,
                send_cq: self.rx_cq,
                recv_cq: self.rx_cq,
                srq: self.srq,
                max_send_wr: 2,
                max_recv_wr: self.cfg.nonsrq_ring,
                sq_sig_all: true,
            })
            .map_err(|e| tracing::warn!(error = %e, "creating an RX QP failed"))
            .ok()?;
        self.counters.qp_created += 1;
        let our_psn = match moves.and_then(|m| m.rtr.rq_psn) {
            Some(psn) => psn,
            None => self.random_psn(),
        };
        let init = rc_init_attr_at(self.pkey_index);
        let attrs = match moves {
            Some(m) => [init, m.rtr, m.rts],
            None => {
                // The RX QP's address vector is the REQ's primary path back to the peer
                // (`cm_process_routed_req`, `cm_format_paths_from_req`).
                let conn = RcConnection {
                    av: path.av(),
                    timeout: self.cfg.qp_timeout,
                    rnr_retry: rnr_retry_count.min(RNR_RETRY_FOREVER),
                    ..RcConnection::new((peer, remote_qpn), path.mtu, our_psn, remote_psn)
                };
                [init, conn.rtr_attr(), conn.rts_attr()]
            }
        };
        match v.begin_moves(qpn, &attrs) {
            Ok(m) => Some((qpn, our_psn, m)),
            Err(e) => {
                tracing::warn!(qp = %qpn, error = %e, "moving an RX QP to RTS failed");
                self.destroy_qp(v, qpn, QpEnd::Forced);
                None
            }
        }
    }

    /// Reaps the RX CQ: data goes to the TUN device and the buffer is posted again; flush
    /// completions count a non-SRQ ring down; the drain WR's completion reaps the drain list.
    pub(super) fn poll_rx_cq<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        for _ in 0..64 {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let n = v.poll_cq(self.rx_cq, &mut wcs, CQ_BATCH);
            for wc in &wcs {
                if wc.opcode == WcOpcode::Send {
                    if wr_kind(wc.wr_id) == WR_DRAIN {
                        self.on_drain_complete(v, wc.qp);
                    }
                    if let Some(b) = wc.buf {
                        let _ = v.pools_mut().free(b);
                    }
                    continue;
                }
                let Some(b) = wc.buf else { continue };
                if wc.status == WcStatus::Success {
                    self.on_rc_recv(now, v, wc.qp, b, wc.byte_len as usize);
                } else {
                    self.on_rc_recv_flushed(v, wc.qp, b);
                }
            }
            self.wcs = wcs;
            self.send_rx_up(v);
            if n < CQ_BATCH {
                break;
            }
        }
    }

    fn on_rc_recv<V: Verbs>(&mut self, now: Instant, v: &mut V, qpn: QpNum, b: BufId, len: usize) {
        let live = match self.rx.get_mut(&qpn) {
            Some(mut r) if r.is_live() => {
                r.last_rx = now;
                true
            }
            _ => false,
        };
        // The IP packet stays in the receive buffer until the driver writes it to the TUN
        // device (`drain_tun`), which then gives the buffer back to the pool: a spare took
        // its place on the SRQ or the connection's ring first.
        let payload = v.pools().get(b).ok().and_then(|buf| {
            let frame = buf.get(..len)?;
            let h = IpoibHeader::parse(frame).ok()?;
            matches!(h.ethertype, ETHERTYPE_IPV4 | ETHERTYPE_IPV6)
                .then(|| frame.get(IpoibHeader::LEN..))
                .flatten()
        });
        let accepted = match payload {
            Some(p) if live => self.accept_for_tun(p),
            Some(_) => {
                self.counters.rx_closing_drops += 1;
                None
            }
            None => {
                self.counters.rx_bad_packets += 1;
                None
            }
        };
        match accepted {
            // With an SRQ, the packet waits for the TUN device only once a spare buffer took
            // its place (`send_rx_up`, after the batch): the SRQ holds `srq_depth` receives
            // whatever the TUN device does.
            Some(len) if self.srq.is_some() => self.rx_up.push((b, len)),
            Some(len) => self.send_up_from_ring(v, qpn, b, len),
            None => self.repost_rx(v, qpn, b, live),
        }
    }

    /// Non-SRQ mode: sends a packet of a live connection to the TUN queue once a spare buffer
    /// of the pool took its place on the connection's ring, so that the ring holds
    /// `nonsrq_ring` receives whatever the TUN device does; with no spare free the packet is
    /// dropped (`rx_buffer_drops`) and its own buffer posted again. A ring that refuses the
    /// spare (its QP went to ERR meanwhile) is one receive down.
    fn send_up_from_ring<V: Verbs>(&mut self, v: &mut V, qpn: QpNum, b: BufId, len: usize) {
        let Some(spare) = v.pools_mut().alloc(self.rx_pool) else {
            self.counters.rx_buffer_drops += 1;
            self.repost_rx(v, qpn, b, true);
            return;
        };
        if v.post_recv(qpn, wr(WR_RECV), spare).is_err() {
            let _ = v.pools_mut().free(spare);
            self.ring_down(v, qpn);
        }
        self.tun.push_received(b, len);
    }

    /// Sends the packets of [`rx_up`](Endpoint::rx_up) to the TUN queue, each once a free
    /// buffer of the pool took its place on the SRQ (the spares posted as one chain); those
    /// left without one are dropped (`rx_buffer_drops`) and their own buffers posted again.
    fn send_rx_up<V: Verbs>(&mut self, v: &mut V) {
        let Some(srq) = self.srq else { return };
        if self.rx_up.is_empty() {
            return;
        }
        let mut chain = std::mem::take(&mut self.rx_chain);
        chain.clear();
        for _ in 0..self.rx_up.len() {
            let Some(spare) = v.pools_mut().alloc(self.rx_pool) else {
                break;
            };
            chain.push((wr(WR_RECV), spare));
        }
        let posted = if chain.is_empty() {
            0
        } else {
            v.post_srq_recvs(srq, &chain).unwrap_or(0)
        };
        for &(_, spare) in chain.get(posted..).unwrap_or(&[]) {
            let _ = v.pools_mut().free(spare);
        }
        // Refused for want of room: the SRQ is full already (a refill came first), so those
        // packets need no replacement.
        let full = posted < chain.len()
            && v.srq_posted(srq)
                .is_ok_and(|p| p >= self.cfg.srq_depth as usize);
        let up = if full { self.rx_up.len() } else { posted };
        for (i, (b, len)) in self.rx_up.drain(..).enumerate() {
            if i < up {
                self.tun.push_received(b, len);
            } else {
                self.counters.rx_buffer_drops += 1;
                if v.post_srq_recv(srq, wr(WR_RECV), b).is_err() {
                    let _ = v.pools_mut().free(b);
                }
            }
        }
        chain.clear();
        self.rx_chain = chain;
    }

    /// The SRQ fell below its limit ([`srq_limit`](super::srq_limit)): fills it back to
    /// `srq_depth` from the free buffers of the pool (at most `srq_depth` posts) and arms the
    /// limit again. Counted: `srq_limit_events`, and each buffer posted in `srq_refills`.
    pub(super) fn on_srq_limit<V: Verbs>(&mut self, v: &mut V) {
        let Some(srq) = self.srq else { return };
        self.counters.srq_limit_events += 1;
        let depth = self.cfg.srq_depth as usize;
        let mut missing = depth.saturating_sub(v.srq_posted(srq).unwrap_or(depth));
        let mut chain = std::mem::take(&mut self.rx_chain);
        while missing > 0 {
            chain.clear();
            for _ in 0..missing.min(CQ_BATCH) {
                let Some(b) = v.pools_mut().alloc(self.rx_pool) else {
                    break;
                };
                chain.push((wr(WR_RECV), b));
            }
            let posted = v.post_srq_recvs(srq, &chain).unwrap_or(0);
            for &(_, b) in chain.get(posted..).unwrap_or(&[]) {
                let _ = v.pools_mut().free(b);
            }
            self.counters.srq_refills += posted as u64;
            if posted < CQ_BATCH.min(missing) {
                break;
            }
            missing -= posted;
        }
        chain.clear();
        self.rx_chain = chain;
        if let Err(e) = v.modify_srq(srq, super::srq_limit(self.cfg.srq_depth)) {
            tracing::warn!(error = %e, "arming the SRQ limit failed");
        }
    }

    /// Gives back a receive buffer whose packet went to the TUN device, to the pool (a spare
    /// took its place on the SRQ or the ring when the packet was queued).
    pub(super) fn release_rx_buf<V: Verbs>(&mut self, v: &mut V, b: BufId) {
        let _ = v.pools_mut().free(b);
    }

    /// Puts a receive buffer back: on the SRQ, or on a live QP's ring; otherwise frees it.
    fn repost_rx<V: Verbs>(&mut self, v: &mut V, qpn: QpNum, b: BufId, live: bool) {
        if let Some(srq) = self.srq {
            if v.post_srq_recv(srq, wr(WR_RECV), b).is_err() {
                let _ = v.pools_mut().free(b);
            }
            return;
        }
        if live && v.post_recv(qpn, wr(WR_RECV), b).is_ok() {
            return;
        }
        let _ = v.pools_mut().free(b);
        self.ring_down(v, qpn);
    }

    fn on_rc_recv_flushed<V: Verbs>(&mut self, v: &mut V, qpn: QpNum, b: BufId) {
        if let Some(srq) = self.srq {
            // A receive the QP had taken from the SRQ: it belongs to the SRQ again.
            if v.post_srq_recv(srq, wr(WR_RECV), b).is_err() {
                let _ = v.pools_mut().free(b);
            }
            return;
        }
        let _ = v.pools_mut().free(b);
        self.ring_down(v, qpn);
    }

    /// How long the RX connection on `qpn` has been idle.
    pub fn rx_idle(&self, now: Instant, qpn: QpNum) -> Option<Duration> {
        self.rx
            .get(&qpn)
            .map(|r| now.saturating_duration_since(r.last_rx))
    }
}
