//! The software RoCEv2 provider: RC and UD queue pairs over UDP, real on the wire.
//!
//! [`SoftVerbs`] is a sans-IO engine implementing [`Verbs`]. It never touches a socket or the
//! clock: the caller feeds it datagrams with [`SoftVerbs::handle_datagram`], pulls datagrams to
//! send with [`SoftVerbs::poll_transmit`], and fires timers with [`SoftVerbs::handle_timeout`]
//! at [`SoftVerbs::poll_timeout`]. Every call that depends on time takes `now`. That makes the
//! same code run over real UDP ([`provider::SoftProvider`]) and over the deterministic
//! in-memory fabric of the tests.
//!
//! On the wire it is RoCEv2 as rxe speaks it (`shared/reference/rocev2.md`): BTH/AETH/DETH,
//! ICRC over the masked IP/UDP pseudo-header, P_Key 0xFFFF, TVer 0, FIRST/MIDDLE packets of
//! exactly the path MTU, pad to 4 bytes, AckReq on the last packet (and every 64 packets), ACK
//! coalescing, PSN-sequence NAKs with go-back-N, RNR NAKs with the IBTA timer table, the
//! retransmit timer `4.096 µs · 2^timeout` with `retry_cnt` (backing off 1×, 2×, 4×, 8× while
//! timeouts follow each other without progress), `rnr_retry` 7 = infinite.
//!
//! Everything received is validated before it can touch a QP: unknown QPN, bad ICRC, wrong
//! P_Key or TVer, wrong Q_Key, a source address (for RC also a source port) that is not the
//! QP's peer, a packet the QP's state does not accept, or anything malformed is dropped and
//! counted in [`SoftStats`]. QPNs follow a permutation of the 24-bit space keyed by
//! [`SoftConfig::qpn_seed`], so a restarted process does not reuse its predecessor's QPNs.
//!
//! # Layout
//!
//! The engine is split as rxe is (`drivers/infiniband/sw/rxe`), each file owning its state:
//!
//! - this file: [`SoftVerbs`], the QP table beside a `Device` that owns the rest, and the
//!   [`Verbs`] implementation;
//! - `objects`: PDs, CQs, SRQs, buffer pools and the QP table (`rxe_pool.c`), and completions;
//! - `qp`: one QP with its attributes, and its moves to ERR (`rxe_qp.c`);
//! - `requester`: the send side of a QP and the packets it builds (`rxe_req.c`);
//! - `completer`: ACKs and NAKs retiring send WQEs, go-back-N, retries (`rxe_comp.c`);
//! - `responder`: the receive side of a QP, its ACKs and NAKs, UD delivery (`rxe_resp.c`);
//! - `sched`: which QP sends next, and the QP timers;
//! - `rx`, `tx`: datagram dispatch in and out; `mcast`: multicast groups, their IP multicast
//!   addresses and the unicast fan-out;
//! - [`fault`], [`transport`] and [`provider`]: fault injection, the UDP socket, and the
//!   provider that joins the engine to the socket.

mod completer;
pub mod fault;
mod mcast;
mod objects;
pub mod provider;
mod qp;
mod requester;
mod responder;
mod rx;
mod sched;
pub mod transport;
mod tx;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use crate::verbs::{
    check_modify, AsyncEvent, BufId, BufPools, Completion, CqId, Gid, PathMtu, PdId, PoolId,
    PortAttr, QpAttr, QpInit, QpNum, QpState, QpType, SendWr, SrqId, SrqInit, Verbs, VerbsError,
    WcStatus, WrId,
};
use crate::wire::icrc::{IpHeaderInfo, Ipv4IdShiftCache};
use crate::wire::ROCEV2_UDP_PORT;

pub use crate::wire::grh::{grh_source_gid, GRH_LEN};
pub use fault::{FaultConfig, FaultInjector, FaultStats, Quirks};
use mcast::Multicast;
pub use mcast::{group_addr as multicast_group_addr, DUPLICATE_WINDOW};
use objects::{Objects, QpTable, RecvInfo};
use qp::{Qp, RecvWqe};
use requester::SendWqe;
use sched::Scheduler;

/// The QPN of multicast packets.
pub const MULTICAST_QPN: QpNum = QpNum::new(0x00FF_FFFF);

/// TTL / hop limit of IP multicast datagrams unless configured: link-local, as the IPoIB
/// groups are.
pub const DEFAULT_MULTICAST_TTL: u8 = 1;

/// Largest RC message, in bytes (IBTA allows 2^31).
pub const MAX_RC_MSG: usize = 1 << 31;

/// Configuration of a software provider instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftConfig {
    /// The local IP address; the port's GID is derived from it.
    pub local_ip: IpAddr,
    /// UDP source port of everything sent (the bound port). It is covered by the ICRC.
    pub src_port: u16,
    /// UDP destination port of everything sent (4791 on a real network).
    pub dst_port: u16,
    /// Active MTU of the port (the largest path MTU accepted).
    pub port_mtu: PathMtu,
    /// Verify the ICRC of IPv4 packets assuming the sender used IP ID 0 (as any unconnected DF
    /// sender does), or 1..64 for the later segments of a UDP GSO train (as this provider
    /// sends). rxe picks random IDs, so interop with it turns this off.
    /// IPv6 ICRCs are always verified.
    pub verify_icrc_v4: bool,
    /// Most QPs that may exist at once.
    pub max_qps: usize,
    /// Carry multicast UD sends as IP multicast: one datagram to the group the MGID maps to
    /// ([`multicast_group_addr`]), besides the unicast copies to the fan-out peers; and, in
    /// [`provider::SoftProvider`], join the groups of the attached MGIDs on the bind
    /// interface. Off, multicast reaches the fan-out peers only.
    pub multicast: bool,
    /// TTL (IPv4) or hop limit (IPv6) of those multicast datagrams: 1 keeps them on the
    /// link.
    pub multicast_ttl: u8,
    /// Transmit-side fault injection.
    pub faults: FaultConfig,
    /// Deliberate contract violations for tests.
    pub quirks: Quirks,
    /// Picks the order QPNs are handed out in (a permutation of the 24-bit space). Fixed by
    /// [`SoftConfig::new`], so that simulations repeat; a daemon draws one per process
    /// (from [`os_seed`](crate::verbs::setup::os_seed)), so that a restarted process
    /// never receives packets meant for its previous incarnation's QPs.
    pub qpn_seed: u64,
}

impl SoftConfig {
    /// Defaults for a provider on `local_ip`: port 4791 both ways, MTU 1024, ICRC checked, no
    /// IP multicast (the daemon turns it on: see its `multicast` setting).
    pub fn new(local_ip: IpAddr) -> Self {
        Self {
            local_ip,
            src_port: ROCEV2_UDP_PORT,
            dst_port: ROCEV2_UDP_PORT,
            port_mtu: PathMtu::Mtu1024,
            verify_icrc_v4: true,
            max_qps: 1 << 16,
            multicast: false,
            multicast_ttl: DEFAULT_MULTICAST_TTL,
            faults: FaultConfig::default(),
            quirks: Quirks::default(),
            qpn_seed: 0,
        }
    }
}

/// Counters of everything the provider did and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SoftStats {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Dropped: not parseable as RoCEv2.
    pub rx_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub rx_bad_icrc: u64,
    /// Dropped: TVer not 0.
    pub rx_bad_tver: u64,
    /// Dropped: P_Key does not match.
    pub rx_bad_pkey: u64,
    /// Dropped: no QP with the destination QPN.
    pub rx_unknown_qpn: u64,
    /// Dropped: source address is not the QP's peer.
    pub rx_bad_src: u64,
    /// Dropped: an RC packet from the peer's address but not from the UDP source port its
    /// QP sends from (pinned by the first packet the QP accepted).
    pub rx_bad_src_port: u64,
    /// Dropped: Q_Key mismatch on a UD QP.
    pub rx_bad_qkey: u64,
    /// Dropped: the QP's state or type does not accept the packet.
    pub rx_bad_state: u64,
    /// Dropped: a UD message that did not fit the receive buffer, or found no receive WQE.
    pub rx_ud_dropped: u64,
    /// Dropped: the second copy of a multicast packet, which arrived both as IP multicast and
    /// as a unicast fan-out copy.
    pub rx_mcast_duplicates: u64,
    /// Duplicate requests (re-ACKed and dropped).
    pub rx_duplicate: u64,
    /// Out-of-sequence requests (NAKed once, then dropped).
    pub rx_out_of_sequence: u64,
    /// IPv4 datagrams whose ICRC is right for an IP ID of 1..64 rather than 0: segments of a
    /// UDP GSO train, which the kernel numbers 0, 1, 2, ... (accepted; see [`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)).
    pub rx_gso_segments: u64,
    /// ACKs with a PSN outside the outstanding window (ignored).
    pub rx_bad_ack: u64,
    /// Packets sent (all kinds).
    pub tx_packets: u64,
    /// Request packets sent again by go-back-N.
    pub tx_retransmits: u64,
    /// ACKs sent.
    pub tx_acks: u64,
    /// PSN-sequence NAKs sent.
    pub tx_seq_naks: u64,
    /// RNR NAKs sent.
    pub tx_rnr_naks: u64,
    /// Other NAKs sent.
    pub tx_other_naks: u64,
    /// RNR NAKs received.
    pub rx_rnr_naks: u64,
    /// PSN-sequence NAKs received.
    pub rx_seq_naks: u64,
    /// Retransmit timer expiries.
    pub retransmit_timeouts: u64,
    /// Completions pushed onto a CQ already at its depth.
    pub cq_overflows: u64,
    /// Injected faults.
    pub faults: FaultStats,
}

/// The provider's device: everything it owns apart from its QPs (configuration, object
/// tables, async events, counters, scheduler and timers, multicast). The QP table is kept
/// beside it in [`SoftVerbs`], so that the requester, completer and responder code, methods
/// of `Device`, can work on one `&mut Qp` and the device at once.
#[derive(Debug)]
struct Device {
    cfg: SoftConfig,
    /// PDs, CQs, SRQs and buffer pools.
    objects: Objects,
    /// Async events not yet taken by `poll_async_event`.
    events: VecDeque<AsyncEvent>,
    /// Counters (the fault injector's are added by [`SoftVerbs::stats`]).
    stats: SoftStats,
    /// QPs waiting to send, and the QP timers.
    sched: Scheduler,
    mcast: Multicast,
}

/// The software RC/UD provider engine. See the [module docs](self).
#[derive(Debug)]
pub struct SoftVerbs {
    qps: QpTable,
    dev: Device,
    /// Transmit-side faults; bypassed while its configuration is clean.
    faults: FaultInjector,
    /// The packet being built while faults are injected (they take an owned copy).
    scratch: Vec<u8>,
    /// ICRC shifts of IPv4 GSO segments, by datagram length (see [`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)).
    id_shifts: Ipv4IdShiftCache,
}

impl SoftVerbs {
    /// A provider with the given configuration. No QP exists yet (not even QP1).
    pub fn new(cfg: SoftConfig) -> Self {
        Self {
            qps: QpTable::new(cfg.qpn_seed),
            faults: FaultInjector::new(cfg.faults),
            dev: Device {
                cfg,
                objects: Objects::new(),
                events: VecDeque::new(),
                stats: SoftStats::default(),
                sched: Scheduler::new(),
                mcast: Multicast::default(),
            },
            scratch: Vec::with_capacity(8192),
            id_shifts: Ipv4IdShiftCache::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SoftConfig {
        &self.dev.cfg
    }

    /// Sets the underlay addresses that multicast UD sends (a destination GID starting with
    /// `ff`, the IPoIB broadcast group among them) are fanned out to, one unicast copy each.
    /// This is how the software provider carries IB multicast over an underlay without IP
    /// multicast ([`SoftConfig::multicast`] off, or peers off the link): receivers deliver a
    /// packet for QPN 0xFFFFFF that came by unicast to every UD QP attached to a group.
    pub fn set_mcast_peers(&mut self, peers: Vec<IpAddr>) {
        self.dev.mcast.set_peers(self.dev.cfg.local_ip, peers);
    }

    /// The IP multicast groups the attached MGIDs map to (none with [`SoftConfig::multicast`]
    /// off), sorted: the groups the provider's sockets must have joined.
    pub fn ip_multicast_groups(&self) -> Vec<IpAddr> {
        if self.dev.cfg.multicast {
            self.dev.mcast.ip_groups(self.dev.cfg.local_ip)
        } else {
            Vec::new()
        }
    }

    /// Changes whenever a multicast group gains its first member or loses its last one (then
    /// [`ip_multicast_groups`](Self::ip_multicast_groups) may have changed).
    pub fn multicast_generation(&self) -> u64 {
        self.dev.mcast.generation()
    }

    /// Counters.
    pub fn stats(&self) -> SoftStats {
        let mut s = self.dev.stats;
        s.faults = self.faults.stats();
        s
    }

    /// The UDP address packets for `gid` are sent to.
    pub fn peer_addr(&self, gid: Gid) -> SocketAddr {
        SocketAddr::new(gid.to_ip(), self.dev.cfg.dst_port)
    }

    fn qp(&self, qpn: QpNum) -> Result<&Qp, VerbsError> {
        self.qps.get(qpn).ok_or(VerbsError::NoSuchQp(qpn))
    }
}

/// IP header facts covered by the ICRC, for a packet from `src` to `dst`.
fn ip_info(src: IpAddr, dst: IpAddr) -> Option<IpHeaderInfo> {
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

impl Verbs for SoftVerbs {
    fn port_attr(&self) -> PortAttr {
        PortAttr {
            gid: Gid::from_ip(self.dev.cfg.local_ip),
            active_mtu: self.dev.cfg.port_mtu,
            max_mtu: PathMtu::Mtu4096,
            max_msg_size: MAX_RC_MSG,
            active: true,
        }
    }

    fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        Ok(self.dev.objects.alloc_pd())
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        self.dev.objects.dealloc_pd(pd)
    }

    fn create_pool(
        &mut self,
        pd: PdId,
        buf_len: usize,
        count: usize,
    ) -> Result<PoolId, VerbsError> {
        self.dev.objects.create_pool(pd, buf_len, count)
    }

    fn pools(&self) -> &BufPools {
        &self.dev.objects.pools
    }

    fn pools_mut(&mut self) -> &mut BufPools {
        &mut self.dev.objects.pools
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError> {
        Ok(self.dev.objects.create_cq(depth))
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        let in_use = self.qps.uses_cq(cq);
        self.dev.objects.destroy_cq(cq, in_use)
    }

    fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        self.dev.objects.poll_cq(cq, out, max)
    }

    fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError> {
        self.dev.objects.create_srq(init)
    }

    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        self.dev.objects.modify_srq(srq, limit)
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        self.dev.objects.post_srq_recv(srq, wr_id, buf)
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        self.dev.objects.destroy_srq(srq)
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpNum, VerbsError> {
        self.dev.objects.check_qp_init(init)?;
        if self.qps.len() >= self.dev.cfg.max_qps {
            return Err(VerbsError::OutOfResources("QPs"));
        }
        let num = if init.qp_type == QpType::Gsi {
            if self.qps.contains(QpNum::GSI) {
                return Err(VerbsError::OutOfResources("QP1 exists"));
            }
            QpNum::GSI
        } else {
            self.qps
                .alloc_qpn()
                .ok_or(VerbsError::OutOfResources("QPNs"))?
        };
        self.dev.objects.add_qp_user(init);
        let default_mtu = self.dev.cfg.port_mtu;
        self.qps
            .insert(Qp::new(num, init.qp_type, init, default_mtu));
        Ok(num)
    }

    fn modify_qp(&mut self, qpn: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
        let port_mtu = self.dev.cfg.port_mtu;
        let local_v4 = self.dev.cfg.local_ip.is_ipv4();
        let qp = self.qps.get_mut(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        check_modify(qp.qp_type, qp.state, attr)?;
        if attr.path_mtu.is_some_and(|m| m > port_mtu) {
            return Err(VerbsError::InvalidAttribute("path_mtu"));
        }
        if attr
            .av
            .is_some_and(|av| av.dgid.to_ip().is_ipv4() != local_v4)
        {
            return Err(VerbsError::InvalidAttribute("av"));
        }
        let to = attr.state.unwrap_or(qp.state);
        qp.apply_attrs(attr);
        match to {
            QpState::Err => self.dev.enter_error(qp),
            QpState::Reset => {
                // Reset drains the queues without completions (rxe_qp_reset).
                for w in qp.req.sq.drain(..) {
                    if let Some(b) = w.wr.buf {
                        self.dev.objects.pools.release(b);
                    }
                }
                for w in qp.rq.drain(..) {
                    self.dev.objects.pools.release(w.buf);
                }
                if let Some(f) = qp.resp.filling.take() {
                    self.dev.objects.pools.release(f.wqe.buf);
                }
                qp.reset();
            }
            QpState::Sqd => {
                // `SqDrained` is raised when the WQEs already begun have completed, which
                // may be now or after their ACKs arrive.
                qp.state = QpState::Sqd;
                qp.sqd_notify |= attr.en_sqd_async_notify == Some(true);
                self.dev.check_sq_drained(qp);
            }
            s => {
                qp.state = s;
                qp.sqd_notify = false;
            }
        }
        if qp.has_work() {
            self.dev.sched.mark_ready(qp);
        }
        Ok(())
    }

    fn query_qp_state(&self, qp: QpNum) -> Result<QpState, VerbsError> {
        Ok(self.qp(qp)?.state)
    }

    fn post_send(&mut self, qpn: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
        let port_mtu = self.dev.cfg.port_mtu.bytes();
        let qp = self.qps.get_mut(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(VerbsError::InvalidState {
                qp: qpn,
                state: qp.state,
            });
        }
        if qp.req.sq.len() >= qp.max_send_wr.max(1) as usize {
            return Err(VerbsError::QueueFull);
        }
        let limit = match qp.qp_type {
            QpType::Rc => MAX_RC_MSG,
            QpType::Ud | QpType::Gsi => {
                if wr.ud.is_none() {
                    return Err(VerbsError::InvalidWr("UD send without a destination"));
                }
                port_mtu
            }
        };
        let buf_len = match wr.buf {
            Some(b) => self.dev.objects.pools.buf_len(b.pool)?,
            None => 0,
        };
        if wr.len > limit.min(buf_len) {
            return Err(VerbsError::TooLong {
                len: wr.len,
                limit: limit.min(buf_len),
            });
        }
        if let Some(b) = wr.buf {
            self.dev.objects.pools.lend(b)?;
        }
        let w = SendWqe {
            wr: *wr,
            first_psn: qp.req.psn,
            npkts: 0,
        };
        if qp.state == QpState::Err {
            if self.dev.cfg.quirks.drain_never {
                qp.swallowed.extend(wr.buf);
            } else {
                self.dev.complete_send(qp, &w, WcStatus::WrFlushErr);
            }
            return Ok(());
        }
        qp.req.sq.push_back(w);
        if qp.has_work() {
            self.dev.sched.mark_ready(qp);
        }
        Ok(())
    }

    fn post_recv(&mut self, qpn: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if qp.srq.is_some() {
            return Err(VerbsError::UsesSrq(qpn));
        }
        if qp.state == QpState::Reset {
            return Err(VerbsError::InvalidState {
                qp: qpn,
                state: qp.state,
            });
        }
        if qp.rq.len() >= qp.max_recv_wr.max(1) as usize {
            return Err(VerbsError::QueueFull);
        }
        self.dev.objects.pools.lend(buf)?;
        let wqe = RecvWqe { wr_id, buf };
        if qp.state == QpState::Err {
            if self.dev.cfg.quirks.drain_never {
                qp.swallowed.push(buf);
            } else {
                self.dev
                    .complete_recv(qp, wqe, WcStatus::WrFlushErr, RecvInfo::default());
            }
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }

    fn destroy_qp(&mut self, qpn: QpNum) -> Result<(), VerbsError> {
        let qp = self.qps.remove(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        self.dev.objects.release_qp(&qp);
        self.dev.mcast.forget(qpn);
        Ok(())
    }

    fn qp_count(&self) -> usize {
        self.qps.len()
    }

    fn attach_mcast(&mut self, qpn: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        let qp = self.qps.get(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if qp.qp_type != QpType::Ud || mgid.0[0] != 0xFF {
            return Err(VerbsError::InvalidWr(
                "multicast needs a UD QP and an ff00::/8 MGID",
            ));
        }
        self.dev.mcast.attach(qpn, mgid);
        Ok(())
    }

    fn detach_mcast(&mut self, qpn: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        self.dev.mcast.detach(qpn, mgid)
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.dev.events.pop_front()
    }
}

#[cfg(test)]
mod tests;
