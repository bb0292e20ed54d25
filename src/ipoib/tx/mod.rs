//! Active (TX) connections: one-way RC connections to peers, set up by the first packet.
//!
//! The first packet to a CM-capable neighbour creates an RC QP and sends a REQ whose private
//! data carries our UD QPN and receive size; up to `tx_queue_len` packets wait, the rest are
//! dropped and counted. On the REP the QP, in RESET until then, moves to INIT, RTR and RTS
//! ([`Verbs::begin_moves`]: perhaps on the provider's command thread, the packets still
//! queued meanwhile); once it is in RTS the RTU goes out and the queue is flushed in order.
//! The peer's advertised receive size is the connection MTU: a bigger packet gets an ICMP
//! "too big" written back to the TUN device. A send error, a REJ, a CM
//! timeout or a DREQ tears the connection down; the next packet builds a new one.
//!
//! The REQ goes to the peer's standard service ID, or, for a peer reached at the rdma_cm
//! service (flag `0x20` in its hardware address, or a REJ 8 from its standard service ID
//! remembered by the neighbour table), to `RDMA_PS_IB`'s service ID of `rdma_cm_port` with
//! rdma_cm's `cma_hdr` in front of the same private data. A REJ 8 of a REQ to the standard
//! service ID draws one such REQ at once from the same QP (`docs/kernel-cm.md`).
//!
//! Connections are opened only by our own packets to a resolved neighbour, so there are at
//! most as many open ones as endpoints in the (bounded) neighbour table, plus closing ones,
//! each for at most `drain_timeout`; closing one unmaps it from the peer index by one lookup.

mod table;

use std::collections::VecDeque;
use std::time::Instant;

pub(super) use table::{TxConn, TxTable};

use super::event::{Event, TxCloseReason, TxFailure};
use super::path_wait::Held;
use super::{wr, wr_kind, Endpoint, Owner, QpEnd, Timer, CQ_BATCH, WR_SEND};
use crate::cm::{CommId, ConnectParams};
use crate::timer::TimerId;
use crate::verbs::setup::{rc_init_attr_at, RcConnection};
use crate::verbs::{
    BufId, Moves, PathMtu, Psn, QpInit, QpNum, QpType, SendWr, Verbs, VerbsError, WcOpcode,
    WcStatus,
};
use crate::wire::cm::{ipoib_service_id, IpoibCmData, RejReason};
use crate::wire::cma::{ephemeral_port, CmaHdr};
use crate::wire::ipoib::{HwAddr, IpoibHeader};

/// State of an active connection; `ipoib-cm status` shows it by [`TxState::as_str`], in
/// JSON as the same name (`connecting`, `live`, `closing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TxState {
    /// REQ sent, waiting for the REP.
    Connecting,
    /// Usable: packets flow (shown as `live`).
    #[serde(rename = "live")]
    Established,
    /// Being torn down (QP in ERR, waiting for outstanding sends to flush).
    Closing,
}

impl TxState {
    /// The status name: `connecting`, `live` or `closing`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Connecting => "connecting",
            Self::Established => "live",
            Self::Closing => "closing",
        }
    }
}

impl Endpoint {
    /// Sends an IP packet over the RC connection to `hw`, creating it if needed.
    pub(super) fn send_rc<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        hw: HwAddr,
        ethertype: u16,
        packet: &[u8],
    ) {
        let qpn = match self.tx.to_peer(hw) {
            Some(q) => q,
            // Shutting down: no new connections (packets queued on a neighbour whose address
            // arrives now are dropped).
            None if self.stopping => {
                self.counters.tx_dropped += 1;
                return;
            }
            // On InfiniBand the REQ carries the path's LIDs: the connection waits for it.
            None if self.must_wait_for_path(hw.gid) => {
                self.hold_for_path(hw, Held::Ip, ethertype, packet);
                return;
            }
            None => match self.open_tx(now, v, hw) {
                Some(q) => q,
                None => {
                    self.counters.tx_dropped += 1;
                    return;
                }
            },
        };
        let Some(tx) = self.tx.get_mut(&qpn) else {
            return;
        };
        match tx.state {
            TxState::Connecting => {
                if tx.queue.len() < self.cfg.tx_queue_len {
                    tx.queue.push_back((ethertype, packet.to_vec()));
                } else {
                    self.counters.tx_queue_drops += 1;
                }
            }
            TxState::Closing => self.counters.tx_dropped += 1,
            TxState::Established => {
                let mtu = tx.mtu;
                if packet.len() > mtu as usize {
                    self.too_big(packet, mtu);
                    return;
                }
                self.post_rc(now, v, qpn, ethertype, packet);
            }
        }
    }

    /// Posts one RC send.
    fn post_rc<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        ethertype: u16,
        packet: &[u8],
    ) {
        let Some(b) = self.tx.take_buf() else {
            self.counters.tx_dropped += 1;
            return;
        };
        let Some(len) = super::fill_ipoib(v, b, ethertype, packet) else {
            self.tx.put_buf(b);
            self.counters.tx_dropped += 1;
            return;
        };
        self.post_rc_buf(now, v, qpn, b, len);
    }

    /// Posts the held send buffer `b` (an IPoIB message of `len` bytes) on `qpn`; on failure
    /// the buffer is free again and the packet counted as dropped.
    pub(super) fn post_rc_buf<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        b: BufId,
        len: usize,
    ) {
        match v.post_send(qpn, &SendWr::send(wr(WR_SEND), b, len)) {
            Ok(()) => {
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += len.saturating_sub(IpoibHeader::LEN) as u64;
                let Some(tx) = self.tx.get_mut(&qpn) else {
                    return;
                };
                tx.outstanding += 1;
                if tx.outstanding == 1 {
                    // Nothing was in flight: the wait for progress starts now.
                    tx.progress_at = now;
                }
                if tx.stall.is_none() {
                    let at = tx.progress_at + self.cfg.tx_stall_timeout;
                    let t = self.arm(at, Timer::TxStall(qpn));
                    if let Some(tx) = self.tx.get_mut(&qpn) {
                        tx.stall = Some(t);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(qp = %qpn, error = %e, "RC post_send failed");
                self.tx.put_buf(b);
                self.counters.tx_dropped += 1;
            }
        }
    }

    /// Creates the QP and sends the REQ.
    fn open_tx<V: Verbs>(&mut self, now: Instant, v: &mut V, hw: HwAddr) -> Option<QpNum> {
        let qpn = v
            .create_qp(&QpInit {
                pd: self.pd,
                qp_type: QpType::Rc,
                send_cq: self.tx_cq,
                recv_cq: self.tx_cq,
                srq: None,
                max_send_wr: self.cfg.tx_depth,
                max_recv_wr: 1,
                sq_sig_all: true,
            })
            .map_err(|e| tracing::warn!(error = %e, "creating a TX QP failed"))
            .ok()?;
        self.counters.qp_created += 1;
        // The QP stays in RESET until the REP: its moves (INIT, RTR, RTS) go together.
        let our_psn = self.random_psn();
        let rdma_cm = self.neigh.reached_by_rdma_cm(&hw);
        let path_mtu = self.path_mtu_to(hw.gid);
        let dlid = self.path_to(hw.gid).dlid;
        let Some(id) = self.send_req(now, hw, qpn, our_psn, rdma_cm, path_mtu) else {
            self.destroy_qp(v, qpn, QpEnd::Forced);
            return None;
        };
        self.owners.insert(id, Owner::Tx(qpn));
        self.tx.insert(
            qpn,
            TxConn {
                id,
                peer: hw,
                rdma_cm,
                state: TxState::Connecting,
                mtu: 0,
                path_mtu,
                dlid,
                our_psn,
                remote_ca_guid: None,
                moving: None,
                queue: VecDeque::new(),
                outstanding: 0,
                watchdog: None,
                progress_at: now,
                stall: None,
            },
        );
        Some(qpn)
    }

    /// Sends the REQ of the TX connection on `qpn` to `hw`, at path MTU `path_mtu`: at its
    /// standard service ID with
    /// `ipoib_cm_data` as the private data, or with `rdma_cm` at its rdma_cm service
    /// ([`EndpointConfig::rdma_cm_port`](super::EndpointConfig), the same on both ends) with
    /// a `cma_hdr` in front. The header carries the underlay addresses, the IP forms of the
    /// two GIDs (on RoCE a GID is the IPv4-mapped or IPv6 address of the port), and as the
    /// source port a random one of Linux's ephemeral range, as rdma_cm would pick one (the
    /// passive side only records it).
    fn send_req(
        &mut self,
        now: Instant,
        hw: HwAddr,
        qpn: QpNum,
        our_psn: Psn,
        rdma_cm: bool,
        path_mtu: PathMtu,
    ) -> Option<CommId> {
        let ipoib_data = self.cm_private_data();
        // The kernel's CM frames its REQs itself (and reaches the standard service ID through
        // `AF_IB` on InfiniBand, `cm::KcmTarget`).
        let (service_id, private_data) = if rdma_cm && self.cm.is_kernel() {
            (self.cfg.rdma_cm_service_id(), ipoib_data)
        } else if rdma_cm {
            let hdr = CmaHdr {
                src_port: ephemeral_port(self.rng_u64()),
                src: self.hwaddr.gid.to_ip(),
                dst: hw.gid.to_ip(),
            };
            // Two GIDs of different families have no header: rdma_cm could not connect them
            // either.
            let framed = hdr
                .req_private_data(&ipoib_data)
                .map_err(|e| tracing::warn!(peer = %hw.gid, error = %e, "no cma_hdr for the REQ"))
                .ok()?;
            (self.cfg.rdma_cm_service_id(), framed)
        } else {
            (ipoib_service_id(hw.qpn, true), ipoib_data)
        };
        let params = ConnectParams {
            peer: hw.gid,
            service_id,
            local_qpn: qpn,
            starting_psn: our_psn,
            path_mtu,
            path: Some(self.path_to(hw.gid)),
            retry_count: self.cfg.tx_retry_count,
            rnr_retry_count: self.cfg.tx_rnr_retry,
            srq: false,
            local_ack_timeout: self.cfg.qp_timeout,
            private_data,
        };
        self.cm
            .connect(now, params)
            .map_err(|e| tracing::warn!(error = %e, "CM connect failed"))
            .ok()
    }

    /// Whether a REJ 8 (invalid service ID) for `id` draws the retry at the rdma_cm service:
    /// the REQ of a TX connection still connecting that went to the standard service ID.
    pub(super) fn may_retry_at_rdma_cm(&self, id: CommId) -> bool {
        match self.owners.get(&id) {
            Some(Owner::Tx(qpn)) => self
                .tx
                .get(qpn)
                .is_some_and(|t| t.id == id && t.state == TxState::Connecting && !t.rdma_cm),
            _ => false,
        }
    }

    /// The peer has no listener at its standard service ID (REJ 8): a daemon on the kernel's
    /// CM whose flag [`HwAddr::FLAG_RDMA_CM`] we did not see. The same QP (still in RESET,
    /// same PSN) sends one REQ, at once, to its rdma_cm service with the framing; the
    /// neighbour table remembers the peer's kind, so later connections go there first. A REJ
    /// of that REQ, whatever its reason, fails the connection as any REJ does.
    pub(super) fn retry_at_rdma_cm<V: Verbs>(&mut self, now: Instant, v: &mut V, id: CommId) {
        let Some((qpn, peer)) = self.rejected_tx(id) else {
            return;
        };
        self.counters.tx_rdma_cm_retries += 1;
        self.neigh.remember_rdma_cm(&peer);
        let path_mtu = self.tx.get(&qpn).map_or(self.cfg.path_mtu, |t| t.path_mtu);
        self.resend_req(now, v, qpn, true, path_mtu);
    }

    /// Whether a REJ 26 (invalid path MTU) for `id` naming `acceptable` draws a REQ again at
    /// it: the REQ of a TX connection still connecting, and `acceptable` below its MTU (a
    /// peer naming the MTU it was asked at, or more, is refused: that connection fails).
    pub(super) fn may_retry_at_mtu(&self, id: CommId, acceptable: PathMtu) -> bool {
        match self.owners.get(&id) {
            Some(Owner::Tx(qpn)) => self.tx.get(qpn).is_some_and(|t| {
                t.id == id && t.state == TxState::Connecting && acceptable < t.path_mtu
            }),
            _ => false,
        }
    }

    /// The peer refused the REQ for its path MTU (REJ 26) and named `acceptable`: the peer's
    /// MTU is capped at it from now on ([`Endpoint::path_mtu_to`]), and the same QP (still in
    /// RESET) sends one REQ again at once at the capped MTU. Each retry lowers the MTU, so a
    /// connection asks at most four times.
    pub(super) fn retry_at_mtu<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        id: CommId,
        acceptable: PathMtu,
    ) {
        let Some((qpn, peer)) = self.rejected_tx(id) else {
            return;
        };
        self.paths.cap_mtu(peer.gid, acceptable);
        let path_mtu = self.path_mtu_to(peer.gid);
        self.counters.tx_mtu_retries += 1;
        self.push_event(Event::TxMtuLowered {
            peer: self.event_peer(peer.gid, qpn),
            path_mtu: u32::try_from(path_mtu.bytes()).unwrap_or(0),
        });
        let rdma_cm = self.tx.get(&qpn).is_some_and(|t| t.rdma_cm);
        self.resend_req(now, v, qpn, rdma_cm, path_mtu);
    }

    /// The TX connection whose REQ on `id` the peer rejected, and its peer; `id` is forgotten
    /// where the CM freed it (a REJ of a REQ: no TimeWaitExit follows).
    fn rejected_tx(&mut self, id: CommId) -> Option<(QpNum, HwAddr)> {
        let Some(Owner::Tx(qpn)) = self.owners.get(&id).copied() else {
            return None;
        };
        if self.cm.state(id).is_none() {
            self.owners.remove(&id);
        }
        self.tx.get(&qpn).map(|t| (qpn, t.peer))
    }

    /// Sends the REQ of the TX connection on `qpn` again from the same QP (still in RESET,
    /// same PSN), at its rdma_cm service or not and at `path_mtu`; a REQ that cannot be sent
    /// fails the connection.
    fn resend_req<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        rdma_cm: bool,
        path_mtu: PathMtu,
    ) {
        let Some((peer, our_psn)) = self.tx.get(&qpn).map(|t| (t.peer, t.our_psn)) else {
            return;
        };
        match self.send_req(now, peer, qpn, our_psn, rdma_cm, path_mtu) {
            Some(new) => {
                self.owners.insert(new, Owner::Tx(qpn));
                if let Some(tx) = self.tx.get_mut(&qpn) {
                    tx.id = new;
                    tx.rdma_cm = rdma_cm;
                    tx.path_mtu = path_mtu;
                }
            }
            None => self.fail_tx(now, v, qpn, TxFailure::Rejected),
        }
    }

    /// The REP arrived: start the QP's moves to RTS; the RTU and the queue follow them
    /// ([`Endpoint::on_tx_qp_moved`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_rep<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        id: CommId,
        remote_ca_guid: u64,
        remote_qpn: QpNum,
        remote_psn: Psn,
        private: &[u8],
    ) {
        let Some(Owner::Tx(qpn)) = self.owners.get(&id).copied() else {
            return;
        };
        let Some(tx) = self.tx.get(&qpn) else { return };
        let (peer, our_psn, path_mtu) = (tx.peer, tx.our_psn, tx.path_mtu);
        // The peer's receive size includes the 4-byte IPoIB header; ≤ 4 leaves no room.
        let mtu = match IpoibCmData::decode(private) {
            Ok(d) if d.mtu > IpoibHeader::LEN as u32 => d.mtu - IpoibHeader::LEN as u32,
            _ => {
                let _ = self.cm.reject(now, id, RejReason::ConsumerDefined);
                self.fail_tx(now, v, qpn, TxFailure::BadReply);
                return;
            }
        };
        let conn = RcConnection {
            av: self.av_to(peer.gid),
            timeout: self.cfg.qp_timeout,
            retry_cnt: self.cfg.tx_retry_count,
            rnr_retry: self.cfg.tx_rnr_retry,
            ..RcConnection::new((peer.gid, remote_qpn), path_mtu, our_psn, remote_psn)
        };
        let init = rc_init_attr_at(self.pkey_index);
        let attrs = match self.cm.qp_moves(id) {
            Some(m) => [init, m.rtr, m.rts],
            None => [init, conn.rtr_attr(), conn.rts_attr()],
        };
        if let Some(tx) = self.tx.get_mut(&qpn) {
            tx.remote_ca_guid = Some(remote_ca_guid);
            tx.moving = Some(mtu);
        }
        match v.begin_moves(qpn, &attrs) {
            Ok(Moves::Started) => {}
            Ok(Moves::Done) => self.on_tx_qp_moved(now, v, qpn, Ok(())),
            Err(e) => self.on_tx_qp_moved(now, v, qpn, Err(e)),
        }
    }

    /// The moves of a TX connection's QP to RTS after the REP are done (or failed): the RTU
    /// goes out and the queued packets follow, in order; on failure the REP is rejected and
    /// the connection fails. A connection closed meanwhile changes nothing.
    pub(super) fn on_tx_qp_moved<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        result: Result<(), VerbsError>,
    ) {
        let Some(tx) = self.tx.get_mut(&qpn) else {
            return;
        };
        if tx.state != TxState::Connecting {
            return;
        }
        let Some(mtu) = tx.moving.take() else {
            return;
        };
        let (id, peer) = (tx.id, tx.peer);
        if let Err(e) = result {
            tracing::debug!(qp = %qpn, error = %e, "moving a TX QP to RTS failed");
            let _ = self.cm.reject(now, id, RejReason::ConsumerDefined);
            self.fail_tx(now, v, qpn, TxFailure::BadReply);
            return;
        }
        if self.cm.rtu(now, id).is_err() {
            self.fail_tx(now, v, qpn, TxFailure::BadReply);
            return;
        }
        self.counters.tx_established += 1;
        self.push_event(Event::TxEstablished {
            peer: self.event_peer(peer.gid, qpn),
            mtu,
        });
        let queued = match self.tx.get_mut(&qpn) {
            Some(tx) => {
                tx.state = TxState::Established;
                tx.mtu = mtu;
                std::mem::take(&mut tx.queue)
            }
            None => return,
        };
        for (ethertype, p) in queued {
            if p.len() > mtu as usize {
                self.too_big(&p, mtu);
            } else {
                self.post_rc(now, v, qpn, ethertype, &p);
            }
        }
    }

    /// Reaps TX completions: buffers come back; a real error tears the connection down.
    pub(super) fn poll_tx_cq<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        for _ in 0..64 {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let n = v.poll_cq(self.tx_cq, &mut wcs, CQ_BATCH);
            for wc in &wcs {
                if wc.opcode != WcOpcode::Send || wr_kind(wc.wr_id) != WR_SEND {
                    if let Some(b) = wc.buf {
                        let _ = v.pools_mut().free(b);
                    }
                    continue;
                }
                if let Some(b) = wc.buf {
                    self.tx.put_buf(b);
                }
                let qpn = wc.qp;
                if let Some(tx) = self.tx.get_mut(&qpn) {
                    tx.outstanding = tx.outstanding.saturating_sub(1);
                    if wc.status == WcStatus::Success {
                        tx.progress_at = now;
                    }
                }
                match wc.status {
                    WcStatus::Success => {}
                    WcStatus::WrFlushErr => {}
                    status => {
                        tracing::debug!(qp = %qpn, status = status.as_str(), "TX send failed");
                        self.fail_tx(now, v, qpn, TxFailure::SendError);
                    }
                }
                if self
                    .tx
                    .get(&qpn)
                    .is_some_and(|t| t.state == TxState::Closing && t.outstanding == 0)
                {
                    self.destroy_tx(v, qpn, QpEnd::Drained);
                }
            }
            self.wcs = wcs;
            if n < CQ_BATCH {
                break;
            }
        }
    }

    /// A TX connection failed (REJ, CM timeout, DREQ, send error): count it, close it, and
    /// resolve the neighbours bound to its peer again, that peer barred from the resolution
    /// ([`Endpoint::binding_failed`]): a node that took an address it cannot serve loses it
    /// to the address's owner, however fast it claims it again.
    pub(super) fn fail_tx<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        why: TxFailure,
    ) {
        let Some(tx) = self.tx.get(&qpn) else { return };
        if tx.state == TxState::Closing {
            return;
        }
        self.counters.tx_failed += 1;
        let dropped = tx.queue.len() as u64;
        self.counters.tx_dropped += dropped;
        let peer = tx.peer;
        self.push_event(Event::TxFailed {
            peer: self.event_peer(peer.gid, qpn),
            reason: why,
        });
        let bound = self.neigh.bound_to(&peer);
        self.teardown_tx(now, v, qpn);
        for ip in bound {
            self.binding_failed(now, v, ip, true);
        }
        // A follower's bindings are control's.
        self.tell_binding_failed(peer);
    }

    /// Closes a TX connection for `why` (one [`Event::TxClosed`] naming the peer, at `ip`
    /// where the caller knows it and the neighbour table no longer does), then
    /// [`Endpoint::teardown_tx`]. A connection already closing is left as it is.
    pub(super) fn close_tx<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        why: TxCloseReason,
        ip: Option<std::net::IpAddr>,
    ) {
        let Some(tx) = self.tx.get(&qpn) else { return };
        if tx.state == TxState::Closing {
            return;
        }
        let mut peer = self.event_peer(tx.peer.gid, qpn);
        peer.ip = peer.ip.or(ip);
        self.push_event(Event::TxClosed { peer, reason: why });
        self.teardown_tx(now, v, qpn);
    }

    /// Tears a TX connection down: DREQ (or REJ while connecting) unless the peer already
    /// ended it, QP to ERR, destroy once the outstanding sends have flushed or the watchdog
    /// fires.
    fn teardown_tx<V: Verbs>(&mut self, now: Instant, v: &mut V, qpn: QpNum) {
        let Some(tx) = self.tx.get_mut(&qpn) else {
            return;
        };
        if tx.state == TxState::Closing {
            return;
        }
        tx.state = TxState::Closing;
        tx.moving = None;
        tx.queue.clear();
        let stall = tx.stall.take();
        let id = tx.id;
        let outstanding = tx.outstanding;
        if let Some(t) = stall {
            self.wheel.cancel(t);
        }
        self.tx.unmap_peer(qpn);
        // The CM ignores a disconnect of an id that is gone or already disconnecting.
        let _ = self.cm.disconnect(now, id);
        super::begin_error(v, qpn);
        if outstanding == 0 {
            self.destroy_tx(v, qpn, QpEnd::Drained);
            return;
        }
        let t = self.arm(now + self.cfg.drain_timeout, Timer::TxWatchdog(qpn));
        if let Some(tx) = self.tx.get_mut(&qpn) {
            tx.watchdog = Some(t);
        }
    }

    pub(super) fn on_tx_watchdog<V: Verbs>(
        &mut self,
        _now: Instant,
        v: &mut V,
        qpn: QpNum,
        id: TimerId,
    ) {
        if self.tx.get(&qpn).is_some_and(|t| t.watchdog == Some(id)) {
            self.counters.drain_timeouts += 1;
            self.destroy_tx(v, qpn, QpEnd::Forced);
        }
    }

    /// The stall check of `qpn`: sends in flight and none completed for `tx_stall_timeout`
    /// fail the connection (its flushed sends give the buffers back); with progress since,
    /// check again a timeout after it; with nothing in flight, the next send arms it again.
    pub(super) fn on_tx_stall_timer<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        id: TimerId,
    ) {
        let timeout = self.cfg.tx_stall_timeout;
        let Some(tx) = self.tx.get_mut(&qpn).filter(|t| t.stall == Some(id)) else {
            return;
        };
        tx.stall = None;
        if tx.outstanding == 0 || tx.state != TxState::Established {
            return;
        }
        let due = tx.progress_at + timeout;
        if now < due {
            let t = self.arm(due, Timer::TxStall(qpn));
            if let Some(tx) = self.tx.get_mut(&qpn) {
                tx.stall = Some(t);
            }
            return;
        }
        tracing::debug!(qp = %qpn, "TX connection stalled; failing it");
        self.counters.tx_stalled += 1;
        self.fail_tx(now, v, qpn, TxFailure::Stalled);
    }

    /// Destroys a TX QP. Its CM id stays with the CM until TimeWait ends.
    pub(super) fn destroy_tx<V: Verbs>(&mut self, v: &mut V, qpn: QpNum, end: QpEnd) {
        let Some(tx) = self.tx.remove(qpn) else {
            return;
        };
        for t in [tx.watchdog, tx.stall].into_iter().flatten() {
            self.wheel.cancel(t);
        }
        if self.cm.state(tx.id).is_none() {
            self.owners.remove(&tx.id);
        }
        // Sends still posted are freed by destroy_qp; their buffers go back to the pool's free
        // list, so take replacements for our own free list.
        self.destroy_qp(v, qpn, end);
        for _ in 0..tx.outstanding {
            if let Some(b) = v.pools_mut().alloc(self.tx_pool) {
                self.tx.put_buf(b);
            }
        }
    }
}
