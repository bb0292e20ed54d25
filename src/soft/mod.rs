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
//! P_Key or TVer, wrong Q_Key, a source address that is not the QP's peer, a packet the QP's
//! state does not accept, or anything malformed is dropped and counted in [`SoftStats`].
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod fault;
pub mod provider;
mod qp;
pub mod transport;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crate::verbs::{
    check_modify, AsyncEvent, BufId, BufPools, Completion, CqId, Gid, PKey, PathMtu, PdId, PoolId,
    PortAttr, Psn, QpAttr, QpInit, QpNum, QpState, QpType, SendWr, SrqId, SrqInit, Verbs,
    VerbsError, WcOpcode, WcStatus, WrId,
};
use crate::wire::bth::{Bth, Opcode};
use crate::wire::ext::{rnr_timer_duration, Aeth, Deth, ImmDt, NakCode, Syndrome};
use crate::wire::icrc::{self, IpHeaderInfo, Ipv4IdShiftCache};
use crate::wire::roce::{RocePacket, RoceRepr};
use crate::wire::{ICRC_LEN, ROCEV2_UDP_PORT};

pub use fault::{FaultConfig, FaultInjector, FaultStats, Quirks};
use qp::{Filling, Qp, RecvWqe, Response, SendWqe, MAX_PKTS_PER_ACK};

/// The QPN of multicast packets.
pub const MULTICAST_QPN: QpNum = QpNum::new(0x00FF_FFFF);

/// Size of the GRH area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// Largest RC message, in bytes (IBTA allows 2^31).
pub const MAX_RC_MSG: usize = 1 << 31;

/// Request packets that may leave ahead of a QP waiting with only responses to send (see
/// `Shared::ready_responses`).
const REQUESTS_PER_RESPONSE: u32 = 16;

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
    /// Transmit-side fault injection.
    pub faults: FaultConfig,
    /// Deliberate contract violations for tests.
    pub quirks: Quirks,
}

impl SoftConfig {
    /// Defaults for a provider on `local_ip`: port 4791 both ways, MTU 1024, ICRC checked.
    pub fn new(local_ip: IpAddr) -> Self {
        Self {
            local_ip,
            src_port: ROCEV2_UDP_PORT,
            dst_port: ROCEV2_UDP_PORT,
            port_mtu: PathMtu::Mtu1024,
            verify_icrc_v4: true,
            max_qps: 1 << 16,
            faults: FaultConfig::default(),
            quirks: Quirks::default(),
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
    /// Dropped: Q_Key mismatch on a UD QP.
    pub rx_bad_qkey: u64,
    /// Dropped: the QP's state or type does not accept the packet.
    pub rx_bad_state: u64,
    /// Dropped: a UD message that did not fit the receive buffer, or found no receive WQE.
    pub rx_ud_dropped: u64,
    /// Duplicate requests (re-ACKed and dropped).
    pub rx_duplicate: u64,
    /// Out-of-sequence requests (NAKed once, then dropped).
    pub rx_out_of_sequence: u64,
    /// IPv4 datagrams whose ICRC is right for an IP ID of 1..64 rather than 0: segments of a
    /// UDP GSO train, which the kernel numbers 0, 1, 2, ... (accepted; see [`Ipv4IdShift`](icrc::Ipv4IdShift)).
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

#[derive(Debug)]
struct Cq {
    depth: usize,
    entries: VecDeque<Completion>,
}

#[derive(Debug)]
struct Srq {
    pd: PdId,
    max_wr: u32,
    limit: u32,
    wqes: VecDeque<RecvWqe>,
    attached: usize,
}

/// Which timer of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    /// Requester retransmit timer.
    Retransmit,
    /// Requester RNR back-off.
    Rnr,
}

/// Everything except the QP table, so QP code can borrow both at once.
#[derive(Debug)]
struct Shared {
    cfg: SoftConfig,
    pools: BufPools,
    pds: HashMap<u32, usize>,
    next_pd: u32,
    cqs: HashMap<CqId, Cq>,
    next_cq: u32,
    srqs: HashMap<SrqId, Srq>,
    next_srq: u32,
    events: VecDeque<AsyncEvent>,
    stats: SoftStats,
    /// QPs with requests to transmit (and perhaps responses), in turn.
    ready: VecDeque<QpNum>,
    /// QPs that had only responses (ACKs, NAKs) to send when queued, served after
    /// [`Self::ready`]: in one flush the ACK of a request then leaves after the reply to it,
    /// so the peer wakes to both at once instead of to the ACK first (ping over the tunnel:
    /// p50 62 -> 56 us). At most [`REQUESTS_PER_RESPONSE`] request packets go ahead of a
    /// waiting response, so that a stream one way does not hold back the ACKs of the other.
    ready_responses: VecDeque<QpNum>,
    /// Request packets sent since a response QP was last served.
    requests_since_response: u32,
    /// Multicast group memberships of UD QPs (`attach_mcast`).
    mcast: HashMap<Gid, Vec<QpNum>>,
    /// Underlay addresses a multicast UD send is fanned out to.
    mcast_peers: Vec<IpAddr>,
    /// Fanned-out copies of a multicast send waiting for `poll_transmit`.
    fanout: VecDeque<(SocketAddr, Vec<u8>)>,
    /// Lazily cancelled timers: an entry is acted on only if the QP's deadline still matches.
    timers: BinaryHeap<Reverse<(Instant, QpNum, TimerKind)>>,
}

/// The software RC/UD provider engine. See the [module docs](self).
#[derive(Debug)]
pub struct SoftVerbs {
    /// The QPs, boxed: a `Qp` is some 360 bytes, and a map holds up to about twice as many
    /// slots as entries, so inline values would double an idle QP's footprint.
    qps: HashMap<QpNum, Box<Qp>>,
    next_qpn: u32,
    sh: Shared,
    faults: FaultInjector,
    scratch: Vec<u8>,
    /// ICRC shifts of IPv4 GSO segments, by datagram length (see [`Ipv4IdShift`](icrc::Ipv4IdShift)).
    id_shifts: Ipv4IdShiftCache,
}

impl SoftVerbs {
    /// A provider with the given configuration. No QP exists yet (not even QP1).
    pub fn new(cfg: SoftConfig) -> Self {
        Self {
            qps: HashMap::new(),
            next_qpn: 0x11,
            faults: FaultInjector::new(cfg.faults),
            sh: Shared {
                cfg,
                pools: BufPools::new(),
                pds: HashMap::new(),
                next_pd: 1,
                cqs: HashMap::new(),
                next_cq: 1,
                srqs: HashMap::new(),
                next_srq: 1,
                events: VecDeque::new(),
                stats: SoftStats::default(),
                ready: VecDeque::new(),
                ready_responses: VecDeque::new(),
                requests_since_response: 0,
                mcast: HashMap::new(),
                mcast_peers: Vec::new(),
                fanout: VecDeque::new(),
                timers: BinaryHeap::new(),
            },
            scratch: Vec::with_capacity(8192),
            id_shifts: Ipv4IdShiftCache::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SoftConfig {
        &self.sh.cfg
    }

    /// Sets the underlay addresses that multicast UD sends (a destination GID starting with
    /// `ff`, the IPoIB broadcast group among them) are fanned out to, one unicast copy each.
    /// This is how the software provider carries IB multicast over an underlay without IP
    /// multicast: receivers deliver a packet for QPN 0xFFFFFF to every UD QP attached to a
    /// group.
    pub fn set_mcast_peers(&mut self, peers: Vec<IpAddr>) {
        let local = self.sh.cfg.local_ip;
        self.sh.mcast_peers = peers.into_iter().filter(|p| *p != local).collect();
    }

    /// Counters.
    pub fn stats(&self) -> SoftStats {
        let mut s = self.sh.stats;
        s.faults = self.faults.stats();
        s
    }

    /// The UDP address packets for `gid` are sent to.
    pub fn peer_addr(&self, gid: Gid) -> SocketAddr {
        SocketAddr::new(gid.to_ip(), self.sh.cfg.dst_port)
    }

    fn ip_info(&self, src: IpAddr, dst: IpAddr) -> Option<IpHeaderInfo> {
        ip_info(src, dst)
    }

    // ---------------------------------------------------------------------------------------
    // Receive path
    // ---------------------------------------------------------------------------------------

    /// Processes one received UDP datagram (the UDP payload). `src` is the sender's address and
    /// port, `dst` the IP address it was sent to.
    pub fn handle_datagram(&mut self, now: Instant, src: SocketAddr, dst: IpAddr, datagram: &[u8]) {
        self.sh.stats.rx_datagrams += 1;
        let check_icrc = match src.ip() {
            IpAddr::V4(_) => self.sh.cfg.verify_icrc_v4,
            IpAddr::V6(_) => true,
        };
        // The ICRC covers every byte of the datagram (but the masked BTH byte) and needs no
        // parsing, so it is checked first: a corrupted frame counts as a bad ICRC even when
        // the flipped bit also made it unparseable (an opcode or pad count), rather than as
        // malformed, and the parser only ever sees verified bytes. Anything too short to
        // hold a BTH and an ICRC is malformed.
        if check_icrc && datagram.len() >= Bth::HEADER_LEN + ICRC_LEN {
            let diff = self.ip_info(src.ip(), dst).and_then(|ip| {
                icrc::icrc_difference(&ip, src.port(), self.sh.cfg.dst_port, datagram)
            });
            match diff {
                Some(0) => {}
                // Off by exactly what a nonzero IPv4 ID changes: a later segment of a UDP GSO
                // train (IPv6 has no ID, so any difference there is an error).
                Some(d)
                    if src.is_ipv4() && self.id_shifts.segment_for(datagram.len(), d).is_some() =>
                {
                    self.sh.stats.rx_gso_segments += 1;
                }
                _ => {
                    self.sh.stats.rx_bad_icrc += 1;
                    return;
                }
            }
        }
        let Ok(pkt) = RocePacket::parse(datagram) else {
            self.sh.stats.rx_malformed += 1;
            return;
        };
        if pkt.bth.tver != 0 {
            self.sh.stats.rx_bad_tver += 1;
            return;
        }
        if !PKey(pkt.bth.pkey).matches(PKey::DEFAULT) {
            self.sh.stats.rx_bad_pkey += 1;
            return;
        }
        let qpn = QpNum::new(pkt.bth.dest_qp);
        if qpn == MULTICAST_QPN {
            // Every UD QP attached to a group gets a copy (the fan-out underlay does not tell
            // which group a packet was for).
            let mut members: Vec<QpNum> = self.sh.mcast.values().flatten().copied().collect();
            members.sort_unstable();
            members.dedup();
            if members.is_empty() {
                self.sh.stats.rx_unknown_qpn += 1;
            }
            for m in members {
                if let Some(qp) = self.qps.get_mut(&m) {
                    self.sh.on_ud(qp, src.ip(), dst, &pkt);
                }
            }
            return;
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            self.sh.stats.rx_unknown_qpn += 1;
            return;
        };
        let sh = &mut self.sh;
        match qp.qp_type {
            QpType::Rc => {
                let peer_ok = qp.attrs.av.is_some_and(|av| av.dgid.to_ip() == src.ip());
                if !peer_ok {
                    sh.stats.rx_bad_src += 1;
                    return;
                }
                if pkt.bth.opcode == Opcode::RC_ACKNOWLEDGE {
                    sh.on_ack(qp, now, &pkt);
                    sh.check_sq_drained(qp);
                } else if pkt.bth.opcode.transport() == crate::wire::bth::Transport::Rc
                    && pkt.bth.opcode.is_send()
                {
                    sh.on_request(qp, &pkt);
                } else {
                    // RDMA, atomics and UC/UD opcodes are not accepted by these QPs.
                    sh.stats.rx_bad_state += 1;
                }
            }
            QpType::Ud | QpType::Gsi => sh.on_ud(qp, src.ip(), dst, &pkt),
        }
        if qp.has_work() {
            sh.mark_ready(qp);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Transmit path
    // ---------------------------------------------------------------------------------------

    /// Writes the next datagram to send into `buf` (replacing its contents) and returns where
    /// it goes, or `None` when there is nothing to send.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        buf.clear();
        self.poll_transmit_append(now, buf)
    }

    /// As [`poll_transmit`](Self::poll_transmit), but appends the datagram to `buf` (which
    /// keeps its contents; unchanged when `None`), so that a transport can build a train of
    /// datagrams in place.
    pub fn poll_transmit_append(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<SocketAddr> {
        let start = buf.len();
        loop {
            if let Some((dst, d)) = self.sh.fanout.pop_front() {
                self.sh.stats.tx_packets += 1;
                if self.faults.config().is_clean() {
                    buf.extend_from_slice(&d);
                    return Some(dst);
                }
                self.faults.push(dst, d);
                continue;
            }
            if let Some((dst, d)) = self.faults.pop() {
                buf.extend_from_slice(&d);
                return Some(dst);
            }
            let Some(qpn) = self.sh.next_ready() else {
                self.faults.flush_held();
                let (dst, d) = self.faults.pop()?;
                buf.extend_from_slice(&d);
                return Some(dst);
            };
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.ready_queued = false;
            if self.faults.config().is_clean() {
                // Straight into the caller's buffer.
                let dst = self.sh.next_packet(qp, now, buf);
                if qp.has_work() {
                    self.sh.mark_ready(qp);
                }
                match dst {
                    Some(dst) => {
                        self.sh.stats.tx_packets += 1;
                        return Some(dst);
                    }
                    None => {
                        buf.truncate(start);
                        continue;
                    }
                }
            }
            let mut out = std::mem::take(&mut self.scratch);
            out.clear();
            let dst = self.sh.next_packet(qp, now, &mut out);
            if qp.has_work() {
                self.sh.mark_ready(qp);
            }
            if let Some(dst) = dst {
                self.sh.stats.tx_packets += 1;
                self.faults.push(dst, out.clone());
            }
            self.scratch = out;
        }
    }

    // ---------------------------------------------------------------------------------------
    // Timers
    // ---------------------------------------------------------------------------------------

    /// The earliest instant [`SoftVerbs::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.sh.timers.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Fires every timer due at `now`. Idempotent; spurious calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse((at, qpn, kind))) = self.sh.timers.peek().copied() {
            if at > now {
                break;
            }
            self.sh.timers.pop();
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let (deadline, queued) = timer_slots(qp, kind);
            if *queued != Some(at) {
                // Stale: an earlier deadline superseded this entry, or the QP was reset.
                continue;
            }
            *queued = None;
            match *deadline {
                Some(d) if d <= now => match kind {
                    TimerKind::Retransmit => self.sh.on_retransmit_timeout(qp, now),
                    TimerKind::Rnr => {
                        qp.req.rnr_at = None;
                        let to = qp.req.comp_psn;
                        qp.req.rewind(to);
                    }
                },
                // Re-armed later: this entry moves to the new deadline.
                Some(d) => {
                    *queued = Some(d);
                    self.sh.timers.push(Reverse((d, qpn, kind)));
                }
                None => {}
            }
            if qp.has_work() {
                self.sh.mark_ready(qp);
            }
        }
    }

    fn alloc_qpn(&mut self) -> Option<QpNum> {
        for _ in 0..(1u32 << 24) {
            let n = QpNum::new(self.next_qpn);
            self.next_qpn = (self.next_qpn + 1) & 0x00FF_FFFF;
            if n.get() > 1 && !self.qps.contains_key(&n) {
                return Some(n);
            }
        }
        None
    }

    fn qp(&self, qpn: QpNum) -> Result<&Qp, VerbsError> {
        self.qps
            .get(&qpn)
            .map(Box::as_ref)
            .ok_or(VerbsError::NoSuchQp(qpn))
    }
}

/// The deadline of one of `qp`'s timers, and the instant of its live timer-heap entry.
fn timer_slots(qp: &mut Qp, kind: TimerKind) -> (&mut Option<Instant>, &mut Option<Instant>) {
    let r = &mut qp.req;
    match kind {
        TimerKind::Retransmit => (&mut r.retransmit_at, &mut r.retransmit_queued),
        TimerKind::Rnr => (&mut r.rnr_at, &mut r.rnr_queued),
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

impl Shared {
    /// The next QP to serve: requests first, but a waiting response QP after at most
    /// [`REQUESTS_PER_RESPONSE`] of them.
    fn next_ready(&mut self) -> Option<QpNum> {
        if self.requests_since_response < REQUESTS_PER_RESPONSE {
            if let Some(q) = self.ready.pop_front() {
                self.requests_since_response += 1;
                return Some(q);
            }
        }
        self.requests_since_response = 0;
        self.ready_responses
            .pop_front()
            .or_else(|| self.ready.pop_front())
    }

    fn mark_ready(&mut self, qp: &mut Qp) {
        if !qp.ready_queued {
            qp.ready_queued = true;
            if qp.may_send() {
                self.ready.push_back(qp.num);
            } else {
                self.ready_responses.push_back(qp.num);
            }
        }
    }

    fn arm(&mut self, qp: &mut Qp, kind: TimerKind, at: Instant) {
        let (slot, queued) = timer_slots(qp, kind);
        *slot = Some(at);
        // Each QP timer has at most one live heap entry, whose instant `queued` records. It
        // stays valid while the deadline moves later (it re-queues itself for the new one
        // when it pops) and even while the timer is cancelled; only an earlier deadline
        // needs a new entry, and the superseded one is dropped when it pops. Deciding this
        // from the deadline alone pushed a new entry on every cancel and re-arm (the window
        // emptied, then a send) while the old one lived on re-queueing itself: the heap grew
        // by one entry per message on a busy QP, without bound.
        if !matches!(*queued, Some(q) if q <= at) {
            *queued = Some(at);
            self.timers.push(Reverse((at, qp.num, kind)));
        }
    }

    fn push_completion(&mut self, cq: CqId, c: Completion) {
        if let Some(b) = c.buf {
            self.pools.reclaim(b);
        }
        if let Some(q) = self.cqs.get_mut(&cq) {
            if q.entries.len() >= q.depth {
                self.stats.cq_overflows += 1;
            }
            q.entries.push_back(c);
        }
    }

    fn complete_send(&mut self, qp: &Qp, w: &SendWqe, status: WcStatus) {
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
                    grh: false,
                },
            );
        } else if let Some(b) = w.wr.buf {
            // Nobody will be told this WR finished, so its buffer goes back to the pool.
            self.pools.release(b);
        }
    }

    fn complete_recv(&mut self, qp: &Qp, wqe: RecvWqe, status: WcStatus, extra: RecvInfo) {
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
                grh: extra.grh,
            },
        );
    }

    /// Takes the next receive WQE for `qp`, from its SRQ or its own queue.
    fn take_recv(&mut self, qp: &mut Qp) -> Option<RecvWqe> {
        match qp.srq {
            None => qp.rq.pop_front(),
            Some(id) => {
                let srq = self.srqs.get_mut(&id)?;
                let w = srq.wqes.pop_front()?;
                if srq.limit > 0 && (srq.wqes.len() as u32) < srq.limit {
                    srq.limit = 0;
                    self.events.push_back(AsyncEvent::SrqLimitReached(id));
                }
                Some(w)
            }
        }
    }

    /// Moves `qp` to ERR: flushes both work queues and raises Last WQE Reached for an
    /// SRQ-attached QP. Idempotent.
    fn enter_error(&mut self, qp: &mut Qp) {
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
    fn check_sq_drained(&mut self, qp: &mut Qp) {
        if qp.sqd_notify && qp.sq_drained() {
            qp.sqd_notify = false;
            self.events.push_back(AsyncEvent::SqDrained(qp.num));
        }
    }

    /// A transport error on the send side: the head WQE completes with `status`, then ERR.
    fn fail_requester(&mut self, qp: &mut Qp, status: WcStatus) {
        if let Some(w) = qp.req.sq.pop_front() {
            self.complete_send(qp, &w, status);
        }
        self.enter_error(qp);
    }

    // ----- completer -----

    /// Retires every WQE whose last PSN is at or before `psn`.
    fn retire_through(&mut self, qp: &mut Qp, psn: Psn) {
        while let Some(w) = qp.req.sq.front() {
            // `psn` is below `high_psn`, so a WQE ending at or before it was sent entirely.
            if w.npkts == 0 || w.last_psn().diff(psn) > 0 {
                break;
            }
            if let Some(w) = qp.req.sq.pop_front() {
                if qp.req.send_idx > 0 {
                    qp.req.send_idx -= 1;
                } else {
                    qp.req.send_pkt = 0;
                }
                self.complete_send(qp, &w, WcStatus::Success);
            }
        }
    }

    fn on_ack(&mut self, qp: &mut Qp, now: Instant, pkt: &RocePacket<'_>) {
        if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            self.stats.rx_bad_state += 1;
            return;
        }
        let Some(aeth) = pkt.aeth else {
            self.stats.rx_malformed += 1;
            return;
        };
        let psn = Psn::new(pkt.bth.psn);
        let req = &qp.req;
        // An ACK may cover PSNs in [comp_psn - 1, psn - 1]; a NAK names a PSN in
        // [comp_psn, psn]. Anything else is stale or bogus.
        let last_sent = req.high_psn.sub(1);
        let lo = req.comp_psn.sub(1);
        let in_window = psn.diff(lo) >= 0 && last_sent.diff(psn) >= 0;
        match aeth.syndrome {
            Syndrome::Ack { .. } => {
                if !in_window || psn.diff(req.comp_psn) < 0 {
                    // Duplicate ACK of what is already retired, or beyond what was sent.
                    if !in_window {
                        self.stats.rx_bad_ack += 1;
                    }
                    return;
                }
                self.retire_through(qp, psn);
                let acked = psn.add(1).diff(qp.req.comp_psn);
                qp.req.comp_psn = psn.add(1);
                if qp.req.retrying_from.is_none() {
                    qp.req.window_grow(u32::try_from(acked).unwrap_or(0));
                }
                self.catch_up(qp);
                self.progress(qp, now);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                let nak_ok = psn.diff(req.comp_psn) >= 0 && req.high_psn.diff(psn) >= 0;
                if !nak_ok {
                    self.stats.rx_bad_ack += 1;
                    return;
                }
                self.stats.rx_seq_naks += 1;
                if qp.req.rnr_at.is_some() {
                    return;
                }
                self.retire_through(qp, psn.sub(1));
                let advanced = psn != qp.req.comp_psn;
                qp.req.comp_psn = psn;
                if advanced {
                    self.progress(qp, now);
                }
                if qp.req.retrying_from == Some(psn) && !advanced {
                    return;
                }
                if qp.req.retry_left == 0 {
                    self.fail_requester(qp, WcStatus::RetryExcErr);
                    return;
                }
                qp.req.retry_left -= 1;
                qp.req.retrying_from = Some(psn);
                qp.req.window_shrink();
                qp.req.rewind(psn);
            }
            Syndrome::RnrNak { timer } => {
                let nak_ok = psn.diff(req.comp_psn) >= 0 && req.high_psn.diff(psn) > 0;
                if !nak_ok {
                    self.stats.rx_bad_ack += 1;
                    return;
                }
                self.stats.rx_rnr_naks += 1;
                // A second RNR NAK for the PSN whose back-off is still running (the wire
                // duplicated it) reports no new attempt: nothing was resent since the first.
                // Counting it spent an RNR retry per copy and failed a QP with rnr_retry 1
                // after a single real RNR episode.
                if qp.req.rnr_at.is_some() && qp.req.retrying_from == Some(psn) {
                    return;
                }
                self.retire_through(qp, psn.sub(1));
                qp.req.comp_psn = psn;
                if qp.req.rnr_retry_left == 0 {
                    self.fail_requester(qp, WcStatus::RnrRetryExcErr);
                    return;
                }
                if qp.req.rnr_retry_left != 7 {
                    qp.req.rnr_retry_left -= 1;
                }
                qp.req.rewind(psn);
                qp.req.retrying_from = Some(psn);
                qp.req.retransmit_at = None;
                self.arm(qp, TimerKind::Rnr, now + rnr_timer_duration(timer));
            }
            Syndrome::Nak(code) => {
                if !in_window {
                    self.stats.rx_bad_ack += 1;
                    return;
                }
                self.retire_through(qp, psn.sub(1));
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_requester(qp, status);
            }
        }
    }

    /// After an acknowledgement moved `comp_psn` past the resend position (a go-back-N that
    /// turned out unnecessary), skip ahead instead of resending acknowledged packets.
    fn catch_up(&mut self, qp: &mut Qp) {
        if qp.req.psn.diff(qp.req.comp_psn) < 0 {
            let to = qp.req.comp_psn;
            qp.req.rewind(to);
        }
    }

    /// The peer acknowledged something: reset the retry budgets, re-arm or stop the timer.
    fn progress(&mut self, qp: &mut Qp, now: Instant) {
        qp.req.retry_left = qp.attrs.retry_cnt;
        // Both budgets are per episode: rxe's `reset_retry_counters` restores `rnr_retry`
        // with `retry_cnt` on every ACK. Without this, RNR NAKs over the QP's whole life
        // added up, and a QP with `rnr_retry` 1 failed on its second ever RNR NAK.
        qp.req.rnr_retry_left = qp.attrs.rnr_retry;
        qp.req.retrying_from = None;
        qp.req.timeouts_in_row = 0;
        if qp.req.unacked() == 0 {
            qp.req.retransmit_at = None;
        } else if let Some(iv) = qp.retransmit_interval() {
            self.arm(qp, TimerKind::Retransmit, now + iv);
        }
    }

    fn on_retransmit_timeout(&mut self, qp: &mut Qp, now: Instant) {
        qp.req.retransmit_at = None;
        // SQD still completes what it has begun, so its losses are recovered too.
        if qp.req.unacked() == 0 || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        self.stats.retransmit_timeouts += 1;
        if qp.req.retry_left == 0 {
            self.fail_requester(qp, WcStatus::RetryExcErr);
            return;
        }
        qp.req.retry_left -= 1;
        // Back off while timeouts follow each other without progress: 1, 2, 4, then 8 times
        // the interval (ConnectX's adaptive retransmission does likewise). A peer that is
        // merely slow, or a CPU that did not run us for a while, then costs retries over ~47
        // intervals instead of 8, while a dead peer still fails after `retry_cnt` timeouts.
        qp.req.timeouts_in_row = qp.req.timeouts_in_row.saturating_add(1);
        qp.req.window_shrink();
        let from = qp.req.comp_psn;
        qp.req.rewind(from);
        if let Some(iv) = qp.retransmit_interval() {
            let backoff = 1u32 << qp.req.timeouts_in_row.min(3);
            self.arm(qp, TimerKind::Retransmit, now + iv * backoff);
        }
    }

    // ----- responder -----

    fn on_request(&mut self, qp: &mut Qp, pkt: &RocePacket<'_>) {
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
            self.class_error(qp, psn, WcStatus::RemInvReqErr);
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
        let buf_len = self.pools.bytes(filling.wqe.buf).map_or(0, <[u8]>::len);
        let end = filling.filled + len;
        if end > buf_len {
            self.complete_recv(qp, filling.wqe, WcStatus::LocLenErr, RecvInfo::default());
            self.class_error(qp, psn, WcStatus::LocLenErr);
            return;
        }
        if let Some(dst) = self
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
    fn class_error(&mut self, qp: &mut Qp, psn: Psn, _why: WcStatus) {
        qp.resp.responses.push_back(Response::NakInvalid(psn));
        self.events.push_back(AsyncEvent::QpReqErr(qp.num));
        self.enter_error(qp);
    }

    fn on_ud(&mut self, qp: &mut Qp, src: IpAddr, dst: IpAddr, pkt: &RocePacket<'_>) {
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
        let Some(buf) = self.pools.bytes_mut(wqe.buf).filter(|b| b.len() >= total) else {
            // Too big for the buffer: UD drops it; the WQE goes back to the front.
            self.stats.rx_ud_dropped += 1;
            match qp.srq.and_then(|s| self.srqs.get_mut(&s)) {
                Some(srq) => srq.wqes.push_front(wqe),
                None => qp.rq.push_front(wqe),
            }
            return;
        };
        write_grh(buf, src, dst, pkt.payload.len());
        if let Some(d) = buf.get_mut(GRH_LEN..total) {
            d.copy_from_slice(pkt.payload);
        }
        let info = RecvInfo {
            byte_len: u32::try_from(total).unwrap_or(u32::MAX),
            imm: pkt.imm.map(|i| i.0),
            src_qp: Some(QpNum::new(deth.src_qp)),
            grh: true,
        };
        self.complete_recv(qp, wqe, WcStatus::Success, info);
    }

    // ----- requester / packet builder -----

    /// Builds the next packet of `qp` into `out`; returns its destination.
    fn next_packet(&mut self, qp: &mut Qp, now: Instant, out: &mut Vec<u8>) -> Option<SocketAddr> {
        if let Some(r) = qp.resp.responses.pop_front() {
            return self.emit_response(qp, r, out);
        }
        if !qp.may_send() {
            return None;
        }
        match qp.qp_type {
            QpType::Rc => self.emit_rc_request(qp, now, out),
            QpType::Ud | QpType::Gsi => self.emit_ud(qp, out),
        }
    }

    fn emit(
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

    fn bth(&self, opcode: Opcode, dest_qp: QpNum, psn: Psn) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: PKey::DEFAULT.0,
            fecn: false,
            becn: false,
            dest_qp: dest_qp.get(),
            ack_req: false,
            psn: psn.get(),
        }
    }

    fn emit_response(&mut self, qp: &Qp, r: Response, out: &mut Vec<u8>) -> Option<SocketAddr> {
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
        self.emit(&repr, &[], av.dgid.to_ip(), out)
    }

    fn emit_rc_request(
        &mut self,
        qp: &mut Qp,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Option<SocketAddr> {
        let av = qp.attrs.av?;
        let mtu = qp.attrs.path_mtu.bytes();
        let idx = qp.req.send_idx;
        let pkt_no = qp.req.send_pkt;
        let psn = qp.req.psn;
        let npkts = qp.npkts(qp.req.sq.get(idx)?.wr.len);
        let w = qp.req.sq.get_mut(idx)?;
        if pkt_no == 0 {
            w.first_psn = psn;
            w.npkts = npkts;
        }
        let wr = w.wr;
        let total = wr.len;
        let off = pkt_no as usize * mtu;
        let len = total.saturating_sub(off).min(mtu);
        let last = pkt_no + 1 >= npkts;
        let opcode = match (npkts == 1, pkt_no == 0, last, wr.imm.is_some()) {
            (true, _, _, false) => Opcode::RC_SEND_ONLY,
            (true, _, _, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
            (false, true, _, _) => Opcode::RC_SEND_FIRST,
            (false, false, false, _) => Opcode::RC_SEND_MIDDLE,
            (false, false, true, false) => Opcode::RC_SEND_LAST,
            (false, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        };
        qp.req.noack_pkts += 1;
        let window_closing = qp.req.outstanding() + 1 >= qp.req.window;
        let ack_req = last || qp.req.noack_pkts >= MAX_PKTS_PER_ACK || window_closing;
        if ack_req {
            qp.req.noack_pkts = 0;
        }
        let mut bth = self.bth(opcode, qp.attrs.dest_qpn, psn);
        bth.ack_req = ack_req;
        bth.solicited = wr.solicited && last;
        let repr = RoceRepr {
            bth,
            reth: None,
            aeth: None,
            deth: None,
            imm: if last { wr.imm.map(ImmDt) } else { None },
        };
        let payload = match wr.buf {
            Some(b) => self
                .pools
                .bytes(b)
                .and_then(|d| d.get(off..off + len))
                .unwrap_or(&[]),
            None => &[],
        };
        let dst = self.emit(&repr, payload, av.dgid.to_ip(), out);
        if psn.diff(qp.req.high_psn) < 0 {
            self.stats.tx_retransmits += 1;
        } else {
            qp.req.high_psn = psn.add(1);
        }
        qp.req.psn = psn.add(1);
        if last {
            qp.req.send_idx += 1;
            qp.req.send_pkt = 0;
        } else {
            qp.req.send_pkt += 1;
        }
        if qp.req.retransmit_at.is_none() {
            if let Some(iv) = qp.retransmit_interval() {
                self.arm(qp, TimerKind::Retransmit, now + iv);
            }
        }
        dst
    }

    fn emit_ud(&mut self, qp: &mut Qp, out: &mut Vec<u8>) -> Option<SocketAddr> {
        let w = qp.req.sq.pop_front()?;
        let psn = qp.req.psn;
        qp.req.psn = psn.add(1);
        qp.req.comp_psn = qp.req.psn;
        // post_send refuses UD sends without a destination.
        let Some(ud) = w.wr.ud else {
            self.complete_send(qp, &w, WcStatus::LocQpOpErr);
            return None;
        };
        // IBTA: a Q_Key with the high bit set means "use the QP's own Q_Key".
        let qkey = if ud.remote_qkey.0 & 0x8000_0000 != 0 && qp.qp_type != QpType::Gsi {
            qp.attrs.qkey
        } else {
            ud.remote_qkey
        };
        let opcode = if w.wr.imm.is_some() {
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UD_SEND_ONLY
        };
        let mut bth = self.bth(opcode, ud.remote_qpn, psn);
        bth.solicited = w.wr.solicited;
        let repr = RoceRepr {
            bth,
            reth: None,
            aeth: None,
            deth: Some(Deth {
                qkey: qkey.0,
                src_qp: qp.num.get(),
            }),
            imm: w.wr.imm.map(ImmDt),
        };
        let payload = match w.wr.buf {
            Some(b) => self
                .pools
                .bytes(b)
                .and_then(|d| d.get(..w.wr.len))
                .unwrap_or(&[]),
            None => &[],
        };
        let (dst, status) = if ud.av.dgid.0[0] == 0xFF {
            // Multicast: one unicast copy per underlay peer; the first goes out now, the rest
            // wait in `fanout`. A group with no peers swallows the send, as an empty IB
            // multicast group does.
            let mut first = None;
            for peer in &self.mcast_peers {
                let mut d = Vec::new();
                if let Some(to) = self.emit(&repr, payload, *peer, &mut d) {
                    if first.is_none() {
                        out.extend_from_slice(&d);
                        first = Some(to);
                    } else {
                        self.fanout.push_back((to, d));
                    }
                }
            }
            (first, WcStatus::Success)
        } else {
            match self.emit(&repr, payload, ud.av.dgid.to_ip(), out) {
                Some(to) => (Some(to), WcStatus::Success),
                None => (None, WcStatus::LocQpOpErr),
            }
        };
        self.complete_send(qp, &w, status);
        dst
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct RecvInfo {
    byte_len: u32,
    imm: Option<u32>,
    src_qp: Option<QpNum>,
    grh: bool,
}

/// Writes the 40-byte GRH area of a UD receive: for IPv6 the IPv6 header, for IPv4 20 zero
/// bytes then the IPv4 header (as RoCEv2 HCAs and rxe do).
fn write_grh(buf: &mut [u8], src: IpAddr, dst: IpAddr, payload_len: usize) {
    let Some(grh) = buf.get_mut(..GRH_LEN) else {
        return;
    };
    grh.fill(0);
    // UDP header + BTH + DETH + payload + ICRC, approximately what the sender put on the wire.
    let udp_len = 8 + 12 + 8 + payload_len + 4;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut grh[20..];
            h[0] = 0x45;
            let total = u16::try_from(20 + udp_len).unwrap_or(u16::MAX);
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40;
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
        }
        (s, d) => {
            grh[0] = 0x60;
            let plen = u16::try_from(udp_len).unwrap_or(u16::MAX);
            grh[4..6].copy_from_slice(&plen.to_be_bytes());
            grh[6] = 17;
            grh[7] = 64;
            grh[8..24].copy_from_slice(&Gid::from_ip(s).0);
            grh[24..40].copy_from_slice(&Gid::from_ip(d).0);
        }
    }
}

/// The source GID of a UD receive, read from its GRH area.
pub fn grh_source_gid(grh: &[u8]) -> Option<Gid> {
    let grh = grh.get(..GRH_LEN)?;
    if grh.get(20) == Some(&0x45) && grh[..20].iter().all(|b| *b == 0) {
        let ip: [u8; 4] = grh.get(32..36)?.try_into().ok()?;
        return Some(Gid::from(std::net::Ipv4Addr::from(ip)));
    }
    let raw: [u8; 16] = grh.get(8..24)?.try_into().ok()?;
    Some(Gid(raw))
}

impl Verbs for SoftVerbs {
    fn port_attr(&self) -> PortAttr {
        PortAttr {
            gid: Gid::from_ip(self.sh.cfg.local_ip),
            active_mtu: self.sh.cfg.port_mtu,
            max_mtu: PathMtu::Mtu4096,
            max_msg_size: MAX_RC_MSG,
            active: true,
        }
    }

    fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        let id = self.sh.next_pd;
        self.sh.next_pd = self.sh.next_pd.wrapping_add(1);
        self.sh.pds.insert(id, 0);
        Ok(PdId(id))
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        match self.sh.pds.get(&pd.0) {
            None => Err(VerbsError::NoSuchObject("PD")),
            Some(0) => {
                self.sh.pds.remove(&pd.0);
                Ok(())
            }
            Some(_) => Err(VerbsError::Busy("PD")),
        }
    }

    fn create_pool(
        &mut self,
        pd: PdId,
        buf_len: usize,
        count: usize,
    ) -> Result<PoolId, VerbsError> {
        let users = self
            .sh
            .pds
            .get_mut(&pd.0)
            .ok_or(VerbsError::NoSuchObject("PD"))?;
        let id = self.sh.pools.create(buf_len, count)?;
        *users += 1;
        Ok(id)
    }

    fn pools(&self) -> &BufPools {
        &self.sh.pools
    }

    fn pools_mut(&mut self) -> &mut BufPools {
        &mut self.sh.pools
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError> {
        let id = CqId(self.sh.next_cq);
        self.sh.next_cq = self.sh.next_cq.wrapping_add(1);
        self.sh.cqs.insert(
            id,
            Cq {
                depth: depth.max(1) as usize,
                entries: VecDeque::new(),
            },
        );
        Ok(id)
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        if !self.sh.cqs.contains_key(&cq) {
            return Err(VerbsError::NoSuchObject("CQ"));
        }
        if self
            .qps
            .values()
            .any(|q| q.send_cq == cq || q.recv_cq == cq)
        {
            return Err(VerbsError::Busy("CQ"));
        }
        if let Some(q) = self.sh.cqs.remove(&cq) {
            for c in q.entries {
                if let Some(b) = c.buf {
                    let _ = self.sh.pools.free(b);
                }
            }
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(q) = self.sh.cqs.get_mut(&cq) else {
            return 0;
        };
        let n = max.min(q.entries.len());
        out.extend(q.entries.drain(..n));
        n
    }

    fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError> {
        let users = self
            .sh
            .pds
            .get_mut(&init.pd.0)
            .ok_or(VerbsError::NoSuchObject("PD"))?;
        *users += 1;
        let id = SrqId(self.sh.next_srq);
        self.sh.next_srq = self.sh.next_srq.wrapping_add(1);
        self.sh.srqs.insert(
            id,
            Srq {
                pd: init.pd,
                max_wr: init.max_wr.max(1),
                limit: init.limit,
                wqes: VecDeque::new(),
                attached: 0,
            },
        );
        Ok(id)
    }

    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        let s = self
            .sh
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        s.limit = limit;
        Ok(())
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        let s = self
            .sh
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        if s.wqes.len() >= s.max_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        self.sh.pools.lend(buf)?;
        s.wqes.push_back(RecvWqe { wr_id, buf });
        Ok(())
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        let s = self
            .sh
            .srqs
            .get(&srq)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        if s.attached > 0 {
            return Err(VerbsError::Busy("SRQ"));
        }
        if let Some(s) = self.sh.srqs.remove(&srq) {
            for w in s.wqes {
                self.sh.pools.release(w.buf);
            }
            if let Some(u) = self.sh.pds.get_mut(&s.pd.0) {
                *u = u.saturating_sub(1);
            }
        }
        Ok(())
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpNum, VerbsError> {
        if !self.sh.pds.contains_key(&init.pd.0) {
            return Err(VerbsError::NoSuchObject("PD"));
        }
        if !self.sh.cqs.contains_key(&init.send_cq) || !self.sh.cqs.contains_key(&init.recv_cq) {
            return Err(VerbsError::NoSuchObject("CQ"));
        }
        if let Some(s) = init.srq {
            if !self.sh.srqs.contains_key(&s) {
                return Err(VerbsError::NoSuchObject("SRQ"));
            }
        }
        if self.qps.len() >= self.sh.cfg.max_qps {
            return Err(VerbsError::OutOfResources("QPs"));
        }
        let num = if init.qp_type == QpType::Gsi {
            if self.qps.contains_key(&QpNum::GSI) {
                return Err(VerbsError::OutOfResources("QP1 exists"));
            }
            QpNum::GSI
        } else {
            self.alloc_qpn().ok_or(VerbsError::OutOfResources("QPNs"))?
        };
        if let Some(s) = init.srq.and_then(|s| self.sh.srqs.get_mut(&s)) {
            s.attached += 1;
        }
        if let Some(u) = self.sh.pds.get_mut(&init.pd.0) {
            *u += 1;
        }
        let default_mtu = self.sh.cfg.port_mtu;
        self.qps
            .insert(num, Box::new(Qp::new(num, init.qp_type, init, default_mtu)));
        Ok(num)
    }

    fn modify_qp(&mut self, qpn: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
        let port_mtu = self.sh.cfg.port_mtu;
        let local_v4 = self.sh.cfg.local_ip.is_ipv4();
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
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
        let a = &mut qp.attrs;
        if let Some(v) = attr.qkey {
            a.qkey = v;
        }
        if let Some(v) = attr.av {
            a.av = Some(v);
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
            qp.req.retry_left = v;
        }
        if let Some(v) = attr.rnr_retry {
            a.rnr_retry = v;
            qp.req.rnr_retry_left = v;
        }
        if let Some(v) = attr.rq_psn {
            qp.resp.psn = v;
        }
        if let Some(v) = attr.sq_psn {
            qp.req.psn = v;
            qp.req.comp_psn = v;
            qp.req.high_psn = v;
        }
        match to {
            QpState::Err => self.sh.enter_error(qp),
            QpState::Reset => {
                // Reset drains the queues without completions (rxe_qp_reset).
                for w in qp.req.sq.drain(..) {
                    if let Some(b) = w.wr.buf {
                        self.sh.pools.release(b);
                    }
                }
                for w in qp.rq.drain(..) {
                    self.sh.pools.release(w.buf);
                }
                if let Some(f) = qp.resp.filling.take() {
                    self.sh.pools.release(f.wqe.buf);
                }
                qp.reset();
            }
            QpState::Sqd => {
                // `SqDrained` is raised when the WQEs already begun have completed, which
                // may be now or after their ACKs arrive (it used to be raised at once, with
                // messages still in flight).
                qp.state = QpState::Sqd;
                qp.sqd_notify |= attr.en_sqd_async_notify == Some(true);
                self.sh.check_sq_drained(qp);
            }
            s => {
                qp.state = s;
                qp.sqd_notify = false;
            }
        }
        if qp.has_work() {
            self.sh.mark_ready(qp);
        }
        Ok(())
    }

    fn query_qp_state(&self, qp: QpNum) -> Result<QpState, VerbsError> {
        Ok(self.qp(qp)?.state)
    }

    fn post_send(&mut self, qpn: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
        let port_mtu = self.sh.cfg.port_mtu.bytes();
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
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
            Some(b) => self.sh.pools.buf_len(b.pool)?,
            None => 0,
        };
        if wr.len > limit.min(buf_len) {
            return Err(VerbsError::TooLong {
                len: wr.len,
                limit: limit.min(buf_len),
            });
        }
        if let Some(b) = wr.buf {
            self.sh.pools.lend(b)?;
        }
        let w = SendWqe {
            wr: *wr,
            first_psn: qp.req.psn,
            npkts: 0,
        };
        if qp.state == QpState::Err {
            if self.sh.cfg.quirks.drain_never {
                qp.swallowed.extend(wr.buf);
            } else {
                self.sh.complete_send(qp, &w, WcStatus::WrFlushErr);
            }
            return Ok(());
        }
        qp.req.sq.push_back(w);
        if qp.has_work() {
            self.sh.mark_ready(qp);
        }
        Ok(())
    }

    fn post_recv(&mut self, qpn: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
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
        self.sh.pools.lend(buf)?;
        let wqe = RecvWqe { wr_id, buf };
        if qp.state == QpState::Err {
            if self.sh.cfg.quirks.drain_never {
                qp.swallowed.push(buf);
            } else {
                self.sh
                    .complete_recv(qp, wqe, WcStatus::WrFlushErr, RecvInfo::default());
            }
            return Ok(());
        }
        qp.rq.push_back(wqe);
        Ok(())
    }

    fn destroy_qp(&mut self, qpn: QpNum) -> Result<(), VerbsError> {
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        let pools = &mut self.sh.pools;
        qp.req
            .sq
            .iter()
            .filter_map(|w| w.wr.buf)
            .chain(qp.rq.iter().map(|w| w.buf))
            .chain(qp.resp.filling.map(|f| f.wqe.buf))
            .chain(qp.swallowed.iter().copied())
            .for_each(|b| pools.release(b));
        if let Some(s) = qp.srq.and_then(|s| self.sh.srqs.get_mut(&s)) {
            s.attached = s.attached.saturating_sub(1);
        }
        if let Some(u) = self.sh.pds.get_mut(&qp.pd.0) {
            *u = u.saturating_sub(1);
        }
        self.sh.mcast.retain(|_, members| {
            members.retain(|q| *q != qpn);
            !members.is_empty()
        });
        Ok(())
    }

    fn qp_count(&self) -> usize {
        self.qps.len()
    }

    fn attach_mcast(&mut self, qpn: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        if qp.qp_type != QpType::Ud || mgid.0[0] != 0xFF {
            return Err(VerbsError::InvalidWr(
                "multicast needs a UD QP and an ff00::/8 MGID",
            ));
        }
        let members = self.sh.mcast.entry(mgid).or_default();
        if !members.contains(&qpn) {
            members.push(qpn);
        }
        Ok(())
    }

    fn detach_mcast(&mut self, qpn: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        let members = self
            .sh
            .mcast
            .get_mut(&mgid)
            .ok_or(VerbsError::NoSuchObject("multicast group"))?;
        let before = members.len();
        members.retain(|q| *q != qpn);
        if members.len() == before {
            return Err(VerbsError::NoSuchObject("multicast attachment"));
        }
        if members.is_empty() {
            self.sh.mcast.remove(&mgid);
        }
        Ok(())
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.sh.events.pop_front()
    }
}

#[cfg(test)]
mod tests;
