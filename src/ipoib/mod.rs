//! The IPoIB-CM endpoint: the sans-IO core of the interface daemon.
//!
//! One [`Endpoint`] is one IPoIB interface on one [`Verbs`] provider. It owns the UD QP (ARP,
//! ND, multicast and datagram-mode traffic), the CM, the shared receive queue, the one-way RC
//! connections in both directions, the neighbour table and one timer wheel. The CM's MADs
//! travel over a transport the driver owns (see [`crate::mad`]).
//!
//! # Calling protocol
//!
//! The driver owns the clock, the TUN device and the provider's I/O. On every turn it reads
//! the clock once and then, in any order:
//!
//! - [`Endpoint::handle_tun_packet`] for each IP packet read from the TUN device;
//! - [`Endpoint::handle_mad`] for each CM MAD its transport received, then
//!   [`Endpoint::handle_verbs`] after the provider did I/O (completions, async events);
//! - [`Endpoint::handle_timeout`] when [`Endpoint::poll_timeout`] has passed (spurious calls
//!   are harmless);
//!
//! after each of `handle_verbs`, `handle_timeout` and [`Endpoint::begin_shutdown`] it sends
//! the MADs of [`Endpoint::poll_mad`] while its transport has room; and finally it writes
//! every packet from [`Endpoint::drain_tun`] (or [`Endpoint::poll_tun`]) to
//! the TUN device, which also gives their receive buffers back. `now` must
//! never go backwards. The endpoint never reads the clock and does no I/O of its own: it acts
//! through the verbs it is handed, so the same code runs over the deterministic simulated
//! fabric of the tests.
//!
//! # Receive QPs are always recycled
//!
//! Every passive (RX) connection carries an activity stamp, refreshed by each receive at the
//! cost of one store, and one timer on the wheel. When the timer fires and the stamp is older
//! than `rx_timeout`, the connection is stale. Stale, DREQ'd, rejected, evicted and shut-down
//! connections all take the same path (the `rx` module): DREQ where the peer may be alive, QP to ERR;
//! with an SRQ, wait for Last WQE Reached, then post one drain WR (at most one outstanding; it
//! covers every QP that reached Last WQE by then), and destroy on its flush completion;
//! without an SRQ, count the flushed receives down to zero. A watchdog of `drain_timeout`
//! destroys the QP anyway if a provider never delivers the event or the completion.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod neigh;
mod rx;
mod tx;
mod ud;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cm::{Cm, CmConfig, CmEvent, CommId};
use crate::timer::{TimerId, TimerWheel};
use crate::verbs::{
    AsyncEvent, BufId, Completion, CqId, PathMtu, PdId, PoolId, QKey, QpNum, SrqId, SrqInit, Verbs,
    VerbsError,
};
use crate::wire::cm::{ipoib_service_id, IpoibCmData, MAD_LEN};
use crate::wire::ipoib::{HwAddr, IpoibHeader, IPOIB_CM_BUF_SIZE};

pub use neigh::NeighState;
use neigh::Neighbours;
pub use rx::RxState;
use rx::RxTable;
pub use tx::TxState;
use tx::TxTable;

/// Connected or datagram mode (Linux's `/sys/class/net/ib0/mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Unicast IP to CM-capable peers over RC connections; MTU 65520.
    Connected,
    /// Everything over the UD QP; MTU = UD MTU.
    Datagram,
}

impl Mode {
    /// `connected` or `datagram`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Datagram => "datagram",
        }
    }
}

/// What a REQ does when `max_conn_qp` RX connections are live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpBudgetPolicy {
    /// Evict the least recently active RX connection, so the node stays reachable.
    Evict,
    /// Reject the REQ with `NO_QP`, as Linux does in non-SRQ mode.
    Reject,
}

/// Configuration of an [`Endpoint`].
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    /// Connected or datagram mode.
    pub mode: Mode,
    /// Share one receive queue among all RX connections.
    pub srq: bool,
    /// An RX connection idle this long is stale and reaped.
    pub rx_timeout: Duration,
    /// Bound on every teardown wait (Last WQE, drain completion, flush).
    pub drain_timeout: Duration,
    /// A TX connection with sends in flight and none completed for this long fails (and gives
    /// its send buffers back), whatever the provider's retry budget: the bound on how long a
    /// vanished or stuck peer can hold the send buffers that every other peer needs too.
    pub tx_stall_timeout: Duration,
    /// Most live RX connections.
    pub max_conn_qp: usize,
    /// What a REQ beyond `max_conn_qp` does.
    pub budget_policy: QpBudgetPolicy,
    /// Packets held per neighbour while its address or connection is being set up.
    pub tx_queue_len: usize,
    /// Unused neighbours (and their TX connections) are removed after this long.
    pub neigh_timeout: Duration,
    /// Interface addresses with prefix lengths.
    pub addrs: Vec<(IpAddr, u8)>,
    /// Static neighbours.
    pub static_neighbours: Vec<(IpAddr, HwAddr)>,
    /// Path MTU of connections and of the UD QP.
    pub path_mtu: PathMtu,
    /// Partition key (with the full-member bit).
    pub pkey: u16,
    /// Q_Key of the UD QP and the broadcast group.
    pub qkey: QKey,
    /// Receive WRs on the SRQ (SRQ mode).
    pub srq_depth: u32,
    /// Receive WRs per RX QP (non-SRQ mode).
    pub nonsrq_ring: u32,
    /// Send buffers shared by all TX connections.
    pub tx_depth: u32,
    /// Receive and send buffers of the UD QP, each.
    pub ud_depth: u32,
    /// Local ACK timeout exponent of RC QPs (4.096 µs · 2^n).
    pub qp_timeout: u8,
    /// Seed for PSNs and CM ids (the daemon passes entropy; tests a constant).
    pub seed: u64,
    /// CM response timeout exponent.
    pub cm_response_timeout: u8,
}

impl EndpointConfig {
    /// Defaults as Linux uses them where that makes sense, with a 60 s RX timeout.
    pub fn new(addrs: Vec<(IpAddr, u8)>) -> Self {
        Self {
            mode: Mode::Connected,
            srq: true,
            rx_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(5),
            tx_stall_timeout: Duration::from_secs(1),
            max_conn_qp: 128,
            budget_policy: QpBudgetPolicy::Evict,
            tx_queue_len: 3,
            neigh_timeout: Duration::from_secs(300),
            addrs,
            static_neighbours: Vec::new(),
            path_mtu: PathMtu::Mtu1024,
            pkey: 0xFFFF,
            qkey: QKey(0x0B1B),
            srq_depth: 256,
            nonsrq_ring: 16,
            tx_depth: 128,
            ud_depth: 64,
            qp_timeout: 14,
            seed: 0,
            cm_response_timeout: 17,
        }
    }

    /// The interface MTU: 65520 in connected mode, the UD MTU (path MTU − 4) in datagram mode.
    pub fn interface_mtu(&self) -> u32 {
        match self.mode {
            Mode::Connected => IPOIB_CM_BUF_SIZE - 4,
            Mode::Datagram => self.ud_mtu(),
        }
    }

    /// Largest IP packet over UD.
    pub fn ud_mtu(&self) -> u32 {
        u32::try_from(self.path_mtu.bytes()).unwrap_or(4096) - 4
    }
}

/// Counters, named as in `ipoib-cm status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// QPs created by the endpoint (UD, QP1 and RC).
    pub qp_created: u64,
    /// QPs destroyed by the endpoint.
    pub qp_destroyed: u64,
    /// Passive connections accepted.
    pub rx_accepted: u64,
    /// RX connections reaped because they were idle for `rx_timeout`.
    pub rx_stale_reaped: u64,
    /// RX connections reaped after the peer's DREQ (or REJ, or a CM timeout).
    pub rx_dreq_reaped: u64,
    /// RX connections evicted to admit a new one at `max_conn_qp`.
    pub rx_evicted: u64,
    /// Teardowns finished by the watchdog, not by the provider.
    pub drain_timeouts: u64,
    /// Last WQE Reached events received.
    pub last_wqe_events: u64,
    /// REQs rejected for lack of QP budget.
    pub rx_rejected: u64,
    /// Active connections established.
    pub tx_established: u64,
    /// Active connections that failed (REJ, timeout, send error, stall).
    pub tx_failed: u64,
    /// Of `tx_failed`: connections whose sends made no progress for `tx_stall_timeout`.
    pub tx_stalled: u64,
    /// Packets dropped because a neighbour's queue was full.
    pub tx_queue_drops: u64,
    /// Packets dropped for other reasons (no buffer, no route, resolution failed).
    pub tx_dropped: u64,
    /// ICMP Fragmentation Needed / Packet Too Big written to the TUN device.
    pub icmp_too_big_sent: u64,
    /// Received packets that were malformed or not for us.
    pub rx_bad_packets: u64,
    /// IP packets delivered to the TUN device.
    pub rx_packets: u64,
    /// IP packets sent (RC and UD).
    pub tx_packets: u64,
    /// ARP/ND messages that tried to change an established mapping.
    pub neigh_conflicts: u64,
    /// Neighbour resolutions that got no answer.
    pub neigh_failed: u64,
}

/// One TX connection in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct TxSnapshot {
    /// The peer's hardware address.
    pub peer: HwAddr,
    /// Our QP number.
    pub qpn: QpNum,
    /// Connection state.
    pub state: TxState,
    /// Largest IP packet.
    pub mtu: u32,
    /// Packets waiting for the connection to come up.
    pub queued: usize,
    /// Sends posted and not completed: send buffers this connection holds.
    pub in_flight: u32,
}

/// A snapshot for status output.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Our hardware address.
    pub hwaddr: HwAddr,
    /// Interface MTU.
    pub mtu: u32,
    /// Mode.
    pub mode: Mode,
    /// `(ip, hwaddr, state)` per neighbour.
    pub neighbours: Vec<(IpAddr, Option<HwAddr>, NeighState)>,
    /// Per TX connection.
    pub tx: Vec<TxSnapshot>,
    /// `(peer, qpn, state, idle)` per RX connection.
    pub rx: Vec<(crate::verbs::Gid, QpNum, RxState, Duration)>,
    /// Counters.
    pub counters: Counters,
}

/// What a timer on the wheel is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// Check an RX connection's activity stamp.
    RxStale(QpNum),
    /// Bound an RX teardown.
    RxWatchdog(QpNum),
    /// Bound a TX teardown.
    TxWatchdog(QpNum),
    /// Check that a TX connection's sends make progress.
    TxStall(QpNum),
    /// Resend an ARP request / NS, or give up.
    NeighResolve(IpAddr),
    /// Check a neighbour's last use.
    NeighAge(IpAddr),
}

/// Which connection a CM id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Tx(QpNum),
    Rx(QpNum),
}

/// Work request id kinds, in the top byte of the 64-bit id.
const WR_KIND_SHIFT: u32 = 56;
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_DRAIN: u64 = 3;

fn wr(kind: u64) -> crate::verbs::WrId {
    crate::verbs::WrId(kind << WR_KIND_SHIFT)
}

fn wr_kind(id: crate::verbs::WrId) -> u64 {
    id.0 >> WR_KIND_SHIFT
}

/// The IP packet of `len` bytes after the IPoIB header in buffer `b` (a receive buffer, or a
/// send buffer the driver read a TUN packet into).
fn ip_packet_in<V: Verbs>(v: &V, b: BufId, len: usize) -> Option<&[u8]> {
    v.pools()
        .get(b)
        .ok()?
        .get(IpoibHeader::LEN..IpoibHeader::LEN + len)
}

/// Writes the IPoIB header and `payload` into the held buffer `b`; returns the message length,
/// or `None` when it does not fit.
fn fill_ipoib<V: Verbs>(v: &mut V, b: BufId, ethertype: u16, payload: &[u8]) -> Option<usize> {
    use crate::wire::ipoib::IpoibHeader;
    let len = IpoibHeader::LEN + payload.len();
    let buf = v.pools_mut().get_mut(b).ok()?;
    let (h, rest) = buf.get_mut(..len)?.split_at_mut(IpoibHeader::LEN);
    h.copy_from_slice(&IpoibHeader::new(ethertype).to_bytes());
    rest.copy_from_slice(payload);
    Some(len)
}

/// The UD QP and its resources.
#[derive(Debug)]
struct UdQp {
    qp: QpNum,
    cq: CqId,
    free_send: Vec<BufId>,
}

/// The IPoIB-CM endpoint. See the [module documentation](self).
#[derive(Debug)]
pub struct Endpoint {
    cfg: EndpointConfig,
    pd: PdId,
    ud: UdQp,
    cm: Cm,
    hwaddr: HwAddr,
    srq: Option<SrqId>,
    rx_cq: CqId,
    rx_pool: PoolId,
    tx_cq: CqId,
    tx_pool: PoolId,
    neigh: Neighbours,
    tx: TxTable,
    rx: RxTable,
    owners: HashMap<CommId, Owner>,
    wheel: TimerWheel<Timer>,
    tun_out: VecDeque<TunPacket>,
    /// Emptied [`poll_tun`](Self::poll_tun) buffers given back by the driver
    /// ([`recycle_tun`](Self::recycle_tun)), reused so that delivering a packet allocates
    /// nothing (at most [`TUN_SPARE_MAX`] kept).
    tun_spare: Vec<Vec<u8>>,
    /// Where [`Endpoint::handle_tun_buffer`] copies a packet that takes the general path.
    tun_scratch: Vec<u8>,
    counters: Counters,
    rng: ChaCha8Rng,
    stopping: bool,
    /// The latest `now` handed in (what `poll_timeout` answers when work is pending).
    last_now: Instant,
    wcs: Vec<Completion>,
    fired: Vec<(TimerId, Timer)>,
    /// Scratch for CM events, trimmed to [`crate::cm::QUEUE_KEEP`] after each batch.
    cm_events: Vec<CmEvent>,
}

/// Resolution requests before a neighbour is given up.
const RESOLVE_RETRIES: u8 = 3;
/// Interval between resolution requests.
const RESOLVE_INTERVAL: Duration = Duration::from_secs(1);
/// Completions taken from a CQ per poll.
const CQ_BATCH: usize = 64;
/// A packet waiting for the TUN device.
#[derive(Debug)]
enum TunPacket {
    /// Built or copied by the endpoint (ARP/ND-delivered, UD, ICMP errors).
    Owned(Vec<u8>),
    /// An IP packet of `len` bytes still in the receive buffer `buf` of RC connection `qpn`,
    /// after the IPoIB header; the buffer goes back to the receive queue once written.
    Received {
        /// The RX connection it arrived on.
        qpn: QpNum,
        /// The receive buffer.
        buf: BufId,
        /// Bytes of the IP packet.
        len: usize,
    },
}

/// Where the driver reads a TUN packet into a buffer from [`Endpoint::tun_buffer`]: after
/// room for the IPoIB header.
pub const TUN_BUFFER_OFFSET: usize = IpoibHeader::LEN;

/// Most spare TUN buffers kept for reuse (each up to an MTU, 64 KiB).
const TUN_SPARE_MAX: usize = 32;

impl Endpoint {
    /// Sets up the interface on `v`: UD QP attached to the broadcast group, the CM listening
    /// on both IPoIB-CM service IDs, the SRQ (or the pool for per-QP rings), and the send
    /// buffers.
    ///
    /// `cm_qp` is the QP the driver's CM MAD transport holds on `v`
    /// ([`MadTransport::provider_qp`](crate::mad::MadTransport::provider_qp): QP1, or `None`
    /// for a transport beside the provider); it counts in `qp_created` with the endpoint's
    /// own QPs, so that `qp_created - qp_destroyed` is every QP of the interface.
    ///
    /// # Errors
    /// Any verbs error of the set-up.
    pub fn new<V: Verbs>(
        now: Instant,
        v: &mut V,
        cfg: EndpointConfig,
        cm_qp: Option<QpNum>,
    ) -> Result<Self, VerbsError> {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let mut counters = Counters::default();
        let pd = v.alloc_pd()?;
        let ud = ud::open_ud(v, pd, &cfg)?;
        counters.qp_created += 1;
        if cm_qp.is_some() {
            counters.qp_created += 1;
        }
        let port = v.port_attr();
        let flags = if cfg.mode == Mode::Connected {
            HwAddr::FLAG_CONNECTED
        } else {
            0
        };
        let hwaddr = HwAddr::new(flags, ud.qp, port.gid);
        let mut cm_cfg = CmConfig::new(port.gid, rng.gen::<u64>() | 1);
        cm_cfg.comm_id_seed = rng.gen();
        cm_cfg.cm_response_timeout = cfg.cm_response_timeout;
        let mut cm = Cm::new(cm_cfg);
        // Linux uses 0x1000…|QPN; RFC 4755 says 0x0100…|QPN. Accept both.
        cm.listen(ipoib_service_id(ud.qp, true), u64::MAX);
        cm.listen(ipoib_service_id(ud.qp, false), u64::MAX);
        let buf_len = IPOIB_CM_BUF_SIZE as usize;
        let rx_cq = v.create_cq(cfg.srq_depth + cfg.nonsrq_ring * cfg.max_conn_qp as u32 + 16)?;
        let tx_cq = v.create_cq(cfg.tx_depth + 16)?;
        let (srq, rx_pool) = if cfg.srq {
            let pool = v.create_pool(pd, buf_len, cfg.srq_depth as usize)?;
            let srq = v.create_srq(&SrqInit {
                pd,
                max_wr: cfg.srq_depth,
                limit: 0,
            })?;
            for _ in 0..cfg.srq_depth {
                let b = v
                    .pools_mut()
                    .alloc(pool)
                    .ok_or(VerbsError::OutOfResources("SRQ buffers"))?;
                v.post_srq_recv(srq, wr(WR_RECV), b)?;
            }
            (Some(srq), pool)
        } else {
            // One ring per connection, plus one for a connection being evicted.
            let count = cfg.nonsrq_ring as usize * (cfg.max_conn_qp + 1);
            (None, v.create_pool(pd, buf_len, count)?)
        };
        let tx_pool = v.create_pool(pd, buf_len, cfg.tx_depth as usize)?;
        let mut tx_free = Vec::with_capacity(cfg.tx_depth as usize);
        for _ in 0..cfg.tx_depth {
            tx_free.push(
                v.pools_mut()
                    .alloc(tx_pool)
                    .ok_or(VerbsError::OutOfResources("TX buffers"))?,
            );
        }
        let mut neigh = Neighbours::default();
        for (ip, hw) in &cfg.static_neighbours {
            neigh.add_static(*ip, *hw, now);
        }
        Ok(Self {
            pd,
            ud,
            cm,
            hwaddr,
            srq,
            rx_cq,
            rx_pool,
            tx_cq,
            tx_pool,
            neigh,
            tx: TxTable::new(tx_free),
            rx: RxTable::default(),
            owners: HashMap::new(),
            wheel: TimerWheel::new(now, Duration::from_millis(1)),
            tun_out: VecDeque::new(),
            tun_spare: Vec::new(),
            tun_scratch: Vec::new(),
            counters,
            rng,
            stopping: false,
            last_now: now,
            wcs: Vec::with_capacity(CQ_BATCH),
            fired: Vec::new(),
            cm_events: Vec::new(),
            cfg,
        })
    }

    /// Our 20-byte hardware address (flags, UD QPN, GID).
    pub fn hwaddr(&self) -> HwAddr {
        self.hwaddr
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The CM's counters.
    pub fn cm_stats(&self) -> crate::cm::CmStats {
        self.cm.stats()
    }

    /// Hands the CM a MAD that the driver's transport received from `from`. Call it before
    /// [`handle_verbs`](Self::handle_verbs) on the same turn, which acts on what it brought.
    pub fn handle_mad(&mut self, now: Instant, from: crate::verbs::Gid, mad: &[u8; MAD_LEN]) {
        self.last_now = self.last_now.max(now);
        self.cm.handle_mad(now, from, mad);
    }

    /// The next CM MAD to send, with its destination. A MAD the transport has no room for
    /// stays here until the next turn ([`poll_timeout`](Self::poll_timeout) asks for one at
    /// once): taking it only to drop it would cost the peer a CM retransmission timeout.
    pub fn poll_mad(&mut self) -> Option<(crate::verbs::Gid, [u8; MAD_LEN])> {
        self.cm.poll_transmit()
    }

    /// Live RX connections (any state).
    pub fn rx_count(&self) -> usize {
        self.rx.len()
    }

    /// Live TX connections (any state).
    pub fn tx_count(&self) -> usize {
        self.tx.len()
    }

    /// The next packet for the TUN device, as an owned buffer (a packet still in a receive
    /// buffer is copied out, and the receive buffer given back to `v`). See
    /// [`drain_tun`](Self::drain_tun), which writes without the copy.
    pub fn poll_tun<V: Verbs>(&mut self, v: &mut V) -> Option<Vec<u8>> {
        match self.tun_out.pop_front()? {
            TunPacket::Owned(p) => Some(p),
            TunPacket::Received { qpn, buf, len } => {
                let mut out = self.tun_spare.pop().unwrap_or_default();
                out.clear();
                if let Some(bytes) = ip_packet_in(v, buf, len) {
                    out.extend_from_slice(bytes);
                }
                self.release_rx_buf(v, qpn, buf);
                Some(out)
            }
        }
    }

    /// Hands every packet waiting for the TUN device to `write`, in order, straight from the
    /// receive buffers it arrived in, then gives those buffers back to `v` (to the SRQ or the
    /// connection's ring, or frees them if the connection went away meanwhile). Call it on
    /// every turn after [`handle_verbs`](Self::handle_verbs) and
    /// [`handle_timeout`](Self::handle_timeout): until then the buffers stay out of the
    /// receive queue.
    pub fn drain_tun<V: Verbs>(&mut self, v: &mut V, mut write: impl FnMut(&[u8])) {
        while let Some(item) = self.tun_out.pop_front() {
            match item {
                TunPacket::Owned(p) => {
                    write(&p);
                    self.recycle_tun(p);
                }
                TunPacket::Received { qpn, buf, len } => {
                    if let Some(bytes) = ip_packet_in(v, buf, len) {
                        write(bytes);
                    }
                    self.release_rx_buf(v, qpn, buf);
                }
            }
        }
    }

    /// Gives a buffer from [`poll_tun`](Self::poll_tun) back once written, for the next
    /// packet to reuse (optional; dropping it is fine).
    pub fn recycle_tun(&mut self, buf: Vec<u8>) {
        if self.tun_spare.len() < TUN_SPARE_MAX {
            self.tun_spare.push(buf);
        }
    }

    /// When [`Endpoint::handle_timeout`] must next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // MADs waiting for room in the driver's transport: come back at once (QP1's send
        // buffers return with the completions the transport reaps on the next turn).
        let pending = self.cm.has_transmit().then_some(self.last_now);
        [self.wheel.poll_timeout(), self.cm.poll_timeout(), pending]
            .into_iter()
            .flatten()
            .min()
    }

    /// Fires due timers: RX staleness, teardown watchdogs, neighbour retries and ageing, CM
    /// retransmissions.
    pub fn handle_timeout<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        self.last_now = self.last_now.max(now);
        let mut fired = std::mem::take(&mut self.fired);
        fired.clear();
        self.wheel.expire(now, &mut fired);
        for (id, t) in fired.drain(..) {
            match t {
                Timer::RxStale(qpn) => self.on_rx_stale_timer(now, v, qpn, id),
                Timer::RxWatchdog(qpn) => self.on_rx_watchdog(v, qpn, id),
                Timer::TxWatchdog(qpn) => self.on_tx_watchdog(now, v, qpn, id),
                Timer::TxStall(qpn) => self.on_tx_stall_timer(now, v, qpn, id),
                Timer::NeighResolve(ip) => self.on_resolve_timer(now, v, ip, id),
                Timer::NeighAge(ip) => self.on_neigh_age_timer(now, v, ip, id),
            }
        }
        self.fired = fired;
        self.cm.handle_timeout(now);
        self.pump_cm(now, v);
    }

    /// Reaps completions and async events and acts on the CM's events (of the MADs handed to
    /// [`handle_mad`](Self::handle_mad) too).
    pub fn handle_verbs<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        self.last_now = self.last_now.max(now);
        for _ in 0..1024 {
            let Some(ev) = v.poll_async_event() else {
                break;
            };
            self.on_async_event(now, v, ev);
        }
        self.poll_ud(now, v);
        self.poll_rx_cq(now, v);
        self.poll_tx_cq(now, v);
        self.pump_cm(now, v);
    }

    fn on_async_event<V: Verbs>(&mut self, now: Instant, v: &mut V, ev: AsyncEvent) {
        match ev {
            AsyncEvent::QpLastWqeReached(qpn) => self.on_last_wqe(v, qpn),
            AsyncEvent::CommEst(qpn) => {
                if let Some(id) = self.rx.get(&qpn).map(|r| r.id) {
                    self.cm.notify_comm_est(now, id);
                }
            }
            AsyncEvent::QpFatal(qpn) | AsyncEvent::QpReqErr(qpn) | AsyncEvent::QpAccessErr(qpn) => {
                if self.rx.contains(&qpn) {
                    self.start_rx_teardown(now, v, qpn, rx::Why::Error);
                } else if self.tx.contains(&qpn) {
                    self.fail_tx(now, v, qpn);
                }
            }
            _ => {}
        }
    }

    /// Acts on the CM's events; the MADs they make wait for [`poll_mad`](Self::poll_mad).
    fn pump_cm<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        for _ in 0..16 {
            let mut events = std::mem::take(&mut self.cm_events);
            events.clear();
            while let Some(e) = self.cm.poll_event() {
                events.push(e);
            }
            let had_events = !events.is_empty();
            for e in events.drain(..) {
                self.on_cm_event(now, v, e);
            }
            events.shrink_to(crate::cm::QUEUE_KEEP);
            self.cm_events = events;
            if !had_events {
                break;
            }
        }
    }

    fn on_cm_event<V: Verbs>(&mut self, now: Instant, v: &mut V, e: CmEvent) {
        match e {
            CmEvent::ReqReceived {
                id,
                peer,
                remote_qpn,
                remote_psn,
                path_mtu,
                rnr_retry_count,
                private_data,
                ..
            } => self.on_req(
                now,
                v,
                id,
                peer,
                remote_qpn,
                remote_psn,
                path_mtu,
                rnr_retry_count,
                &private_data,
            ),
            CmEvent::RepReceived {
                id,
                remote_qpn,
                remote_psn,
                private_data,
                ..
            } => self.on_rep(now, v, id, remote_qpn, remote_psn, &private_data),
            CmEvent::Established { id } => {
                if let Some(Owner::Rx(qpn)) = self.owners.get(&id).copied() {
                    if let Some(r) = self.rx.get_mut(&qpn) {
                        r.established = true;
                    }
                }
            }
            CmEvent::Rejected { id, .. } | CmEvent::TimedOut { id, .. } => {
                match self.owners.get(&id).copied() {
                    Some(Owner::Tx(qpn)) => self.fail_tx(now, v, qpn),
                    Some(Owner::Rx(qpn)) => self.start_rx_teardown(now, v, qpn, rx::Why::Remote),
                    None => {}
                }
            }
            CmEvent::DisconnectReceived { id } | CmEvent::Disconnected { id } => {
                match self.owners.get(&id).copied() {
                    Some(Owner::Tx(qpn)) => self.fail_tx(now, v, qpn),
                    Some(Owner::Rx(qpn)) => self.start_rx_teardown(now, v, qpn, rx::Why::Remote),
                    None => {}
                }
            }
            CmEvent::TimeWaitExit { id } => {
                self.owners.remove(&id);
            }
        }
    }

    /// Private data of our REQs and REPs: our UD QPN and receive size.
    fn cm_private_data(&self) -> Vec<u8> {
        IpoibCmData {
            qpn: self.ud.qp,
            mtu: IPOIB_CM_BUF_SIZE,
        }
        .to_bytes()
        .to_vec()
    }

    fn arm(&mut self, at: Instant, t: Timer) -> TimerId {
        self.wheel.insert(at, t)
    }

    /// Destroys a QP and counts it.
    fn destroy_qp<V: Verbs>(&mut self, v: &mut V, qpn: QpNum) {
        match v.destroy_qp(qpn) {
            Ok(()) => self.counters.qp_destroyed += 1,
            Err(e) => tracing::warn!(qp = %qpn, error = %e, "destroy_qp failed"),
        }
    }

    /// Begins an orderly stop: no new connections; DREQ and tear down everything. Call
    /// [`Endpoint::is_stopped`] to see when all RC QPs are gone (bounded by `drain_timeout`).
    pub fn begin_shutdown<V: Verbs>(&mut self, now: Instant, v: &mut V) {
        self.stopping = true;
        for qpn in self.tx.qpns() {
            self.close_tx(now, v, qpn, true);
        }
        for qpn in self.rx.qpns() {
            self.start_rx_teardown(now, v, qpn, rx::Why::Shutdown);
        }
        self.pump_cm(now, v);
    }

    /// True once every RC connection is destroyed after [`Endpoint::begin_shutdown`].
    pub fn is_stopped(&self) -> bool {
        self.stopping && self.rx.is_empty() && self.tx.is_empty()
    }

    /// Destroys whatever is left (the shutdown bound passed), counting drain timeouts.
    pub fn force_stop<V: Verbs>(&mut self, v: &mut V) {
        for qpn in self.rx.qpns() {
            self.counters.drain_timeouts += 1;
            self.destroy_rx(v, qpn);
        }
        for qpn in self.tx.qpns() {
            self.destroy_tx(v, qpn);
        }
    }

    /// A snapshot for status output.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let mut neighbours: Vec<_> = self
            .neigh
            .iter()
            .map(|(ip, n)| (*ip, n.hw, n.state))
            .collect();
        neighbours.sort_by_key(|(ip, ..)| *ip);
        let mut tx: Vec<_> = self
            .tx
            .iter()
            .map(|(q, t)| TxSnapshot {
                peer: t.peer,
                qpn: *q,
                state: t.state,
                mtu: t.mtu,
                queued: t.queue.len(),
                in_flight: t.outstanding,
            })
            .collect();
        tx.sort_by_key(|t| t.qpn);
        let mut rx: Vec<_> = self
            .rx
            .iter()
            .map(|(q, r)| {
                (
                    r.peer,
                    *q,
                    r.state(),
                    now.saturating_duration_since(r.last_rx),
                )
            })
            .collect();
        rx.sort_by_key(|(_, q, ..)| *q);
        Snapshot {
            hwaddr: self.hwaddr,
            mtu: self.cfg.interface_mtu(),
            mode: self.cfg.mode,
            neighbours,
            tx,
            rx,
            counters: self.counters,
        }
    }

    /// Our address of `dst`'s family in the same subnet as `dst`, or the first one of that
    /// family (the source of ARP requests and Neighbor Solicitations).
    fn our_addr_for(&self, dst: IpAddr) -> Option<IpAddr> {
        // Both families as 128-bit numbers; IPv4 prefixes count from bit 96.
        let bits = |ip: IpAddr| match ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        };
        let (d, width) = bits(dst);
        let mut first = None;
        for &(ip, prefix) in &self.cfg.addrs {
            if ip.is_ipv4() != dst.is_ipv4() {
                continue;
            }
            first.get_or_insert(ip);
            let (a, _) = bits(ip);
            let host_bits = width - u32::from(prefix).min(width);
            let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
            if a & mask == d & mask {
                return Some(ip);
            }
        }
        first
    }

    /// True if `ip` is one of the interface's addresses.
    fn is_ours(&self, ip: IpAddr) -> bool {
        self.cfg.addrs.iter().any(|(a, _)| *a == ip)
    }

    fn random_psn(&mut self) -> crate::verbs::Psn {
        crate::verbs::Psn::new(self.rng.gen())
    }
}

#[cfg(test)]
mod tests;
