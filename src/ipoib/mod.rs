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
//! # Two services
//!
//! The CM listens on the standard IPoIB-CM service IDs (`0x1000…|QPN`, `0x0100…|QPN`) and on
//! the rdma_cm service of [`EndpointConfig::rdma_cm_port`], where daemons on the kernel's CM
//! connect: there the REQ carries rdma_cm's `cma_hdr` before `ipoib_cm_data`, checked as the
//! kernel checks it (`docs/kernel-cm.md`).
//!
//! # What a REQ may cost
//!
//! A REQ gets a receive QP (its REP must name one) that is half-open until the RTU or data
//! arrives: at most `max_pending_rx` are, a REQ beyond them tears down the oldest, and the CM
//! reaps each when it gives up resending the REP (a few seconds at most, see
//! [`crate::cm::admission`]). The QP budget `max_conn_qp` is charged when a connection is
//! established, so REQs that never complete hold no budget and evict nothing established;
//! the CM rate-limits REQs per source GID before any of this.
//!
//! # Receive QPs are always recycled
//!
//! Every passive (RX) connection carries an activity stamp, refreshed by each receive at the
//! cost of one store, and one timer on the wheel. When the timer fires and the stamp is older
//! than `rx_timeout`, the connection is stale. Stale, DREQ'd, rejected, evicted and shut-down
//! connections all take the same path (the RX reaper): DREQ where the peer may be alive, QP
//! to ERR; with an SRQ, wait for Last WQE Reached, then post one drain WR (at most one outstanding; it
//! covers every QP that reached Last WQE by then), and destroy on its flush completion;
//! without an SRQ, count the flushed receives down to zero. A watchdog of `drain_timeout`
//! destroys the QP anyway if a provider never delivers the event or the completion.
//!
//! # Parts
//!
//! The [`Endpoint`] (`endpoint.rs`) is a coordinator over parts that own their state: the RX
//! table with each connection's reaper phase (`rx/`), the TX table with the send buffers its
//! connections share (`tx/`), the neighbour cache (`neigh.rs`), the TUN queue and ingress
//! (`tun.rs`), the UD QP (`ud.rs`), address resolution (`resolve.rs`) and ICMP errors
//! (`icmp.rs`); restarts of a peer close its old incarnation's connections (`restart.rs`).
//! The counters are one [`Counters`] that every part adds to.
//!
//! # Bounds
//!
//! Every table keyed by what arrives is bounded and hitting the bound is counted
//! (`docs/bounds.md` has the whole list): neighbour entries by `neigh_max` and
//! `neigh_max_per_source`, learned from ARP/ND only for on-link senders; packets waiting for
//! resolution by `tx_queue_len` each and 256 in all; TX connections by the neighbour table
//! (they are opened only by our own packets to a resolved neighbour), their queues by
//! `tx_queue_len`; RX connections by `max_conn_qp`; a [`Snapshot`] lists at most
//! [`SNAPSHOT_NEIGHBOURS`] neighbours.

mod endpoint;
mod event;
mod follower;
mod guard;
mod icmp;
mod mcast;
mod neigh;
mod path_wait;
mod paths;
mod qp_conns;
mod reconfig;
mod resolve;
mod restart;
mod rx;
mod tun;
mod tx;
mod ud;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cm::LinkLayer;
use crate::verbs::{BufId, PKey, PathMtu, QKey, QpAttr, QpNum, QpState, Verbs};
use crate::wire::ipoib::{broadcast_mgid, HwAddr, IpoibHeader, IPOIB_CM_BUF_SIZE};
use crate::wire::WorkerId;

pub use crate::choice::ParseChoiceError;
pub use endpoint::Endpoint;
pub use event::{
    Event, EventPeer, RxReapReason, RxRejectReason, TxCloseReason, TxFailure, EVENT_QUEUE_CAP,
};
pub use follower::{
    FollowerRequest, Interface, NeighView, FOLLOWER_WAIT, FOLLOWER_WAIT_MAX, TO_CONTROL_MAX,
};
pub use guard::{SourceCheck, ANSWER_BURST, ANSWER_RATE};
pub use mcast::{PortChange, SaRequest, MAX_SA_REQUESTS, MAX_SEND_ONLY};
pub use neigh::{NeighCounts, NeighState};
pub use path_wait::{PATH_QUEUE_LEN, PATH_WAIT_MAX};
pub use reconfig::{LiveSettings, LiveTimeouts, PathMtuChange};
pub use rx::{InterfaceRxCounts, RxState};
pub use tun::TUN_BUFFER_OFFSET;
pub use tx::TxState;

/// Connected or datagram mode (Linux's `/sys/class/net/ib0/mode`).
///
/// Its name (`connected`, `datagram`) is the same in flags, the config file and the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Unicast IP to CM-capable peers over RC connections; MTU 65520 (RFC 4755).
    #[default]
    Connected,
    /// Everything over the UD QP; MTU = UD MTU (RFC 4391).
    Datagram,
}

impl Mode {
    /// `connected` or `datagram`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Datagram => "datagram",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "connected" => Ok(Self::Connected),
            "datagram" => Ok(Self::Datagram),
            _ => Err(ParseChoiceError::new("\"connected\" or \"datagram\"", s)),
        }
    }
}

/// What happens when an RX connection is established beyond `max_conn_qp` (the budget is
/// charged on establishment, not on the REQ: half-open connections are bounded by
/// `max_pending_rx` instead).
///
/// Its name (`evict`, `reject`) is the same in flags and the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QpBudgetPolicy {
    /// Evict the least recently active other established RX connection, so the node stays
    /// reachable.
    #[default]
    Evict,
    /// Reject REQs with `NO_QP` while `max_conn_qp` connections are established, as Linux
    /// does in non-SRQ mode (and tear down one established beyond it in a race).
    Reject,
}

impl QpBudgetPolicy {
    /// `evict` or `reject`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Evict => "evict",
            Self::Reject => "reject",
        }
    }
}

impl fmt::Display for QpBudgetPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for QpBudgetPolicy {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "evict" => Ok(Self::Evict),
            "reject" => Ok(Self::Reject),
            _ => Err(ParseChoiceError::new("\"evict\" or \"reject\"", s)),
        }
    }
}

/// Starts moving `qpn` to ERR ([`Verbs::begin_moves`]): what follows (Last WQE Reached,
/// the flushes, the drain WR) waits for the move, wherever the provider makes it. A failure
/// now or in its result ([`Endpoint::on_moved`]) is logged; the teardown's watchdog bounds it.
fn begin_error<V: Verbs>(v: &mut V, qpn: QpNum) {
    if let Err(e) = v.begin_moves(qpn, &[QpAttr::to_state(QpState::Err)]) {
        tracing::warn!(qp = %qpn, error = %e, "moving a QP to ERR failed");
    }
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
    /// Most established RX connections (the QP budget, charged when a connection is
    /// established).
    pub max_conn_qp: usize,
    /// What a connection established beyond `max_conn_qp` does (and, under the reject
    /// policy, a REQ that finds `max_conn_qp` established).
    pub budget_policy: QpBudgetPolicy,
    /// Most half-open RX connections (REP sent, no RTU or data yet); a REQ beyond it tears
    /// down the oldest one.
    pub max_pending_rx: usize,
    /// Packets held per neighbour while its address or connection is being set up.
    pub tx_queue_len: usize,
    /// Unused neighbours (and their TX connections) are removed after this long.
    pub neigh_timeout: Duration,
    /// Most learned (non-static) neighbour entries, resolving ones included; one more evicts
    /// the least recently used entry without a connection (Linux's `gc_thresh3`).
    pub neigh_max: usize,
    /// Most resolved learned neighbour entries with the hardware address of one GID; one more
    /// evicts that GID's least recently used entry without a connection.
    pub neigh_max_per_source: usize,
    /// How the source of an IP packet arriving over UD is checked (`guard.rs`).
    pub ud_source_check: SourceCheck,
    /// The GIDs of the `--peer`s: senders the node knows (`guard.rs`); at most `MAX_PEERS`.
    pub peers: Vec<crate::verbs::Gid>,
    /// Pin bindings to `peers`: an address bound to a peer is bound again only to a peer.
    pub pin_peer_neighbours: bool,
    /// Interface addresses with prefix lengths.
    pub addrs: Vec<(IpAddr, u8)>,
    /// Static neighbours.
    pub static_neighbours: Vec<(IpAddr, HwAddr)>,
    /// Path MTU of connections (each at most its path's) and of UD sends; the UD receive
    /// buffers hold the port's largest MTU whatever this is.
    pub path_mtu: PathMtu,
    /// Partition key of the UD and RC QPs (looked up in the port's P_Key table); a limited
    /// member (bit 15 clear) talks to full members only. The MGIDs and the broadcast address
    /// carry it with the full-member bit ([`EndpointConfig::mgid_pkey`]).
    pub pkey: PKey,
    /// Q_Key of the UD QP and the broadcast group.
    pub qkey: QKey,
    /// Receive WRs on the SRQ (SRQ mode): a power of two in
    /// [`MIN_SRQ_DEPTH`]..=[`MAX_SRQ_DEPTH`], Linux's range.
    pub srq_depth: u32,
    /// Receive buffers beyond the SRQ's (or the rings', without an SRQ), at least 1: a packet
    /// goes to the TUN queue only once a spare buffer took its place on the SRQ or its
    /// connection's ring, so neither runs dry while packets wait for the TUN device; with no
    /// spare free the packet is dropped (`rx_buffer_drops`) and its buffer posted again, as
    /// Linux's `ipoib_cm_handle_rx_wc` drops a packet it has no replacement skb for. A peer
    /// is never RNR-NAKed for a slow TUN device.
    pub rx_spare: u32,
    /// Receive WRs per RX QP (non-SRQ mode).
    pub nonsrq_ring: u32,
    /// Send buffers shared by all TX connections.
    pub tx_depth: u32,
    /// Receive and send buffers of the UD QP, each.
    pub ud_depth: u32,
    /// Local ACK timeout exponent of RC QPs (4.096 µs · 2^n; 12 ≈ 17 ms).
    pub qp_timeout: u8,
    /// RNR retries of TX connections (7: for ever, the default). An RNR NAK says the peer is alive and its
    /// receive queue momentarily empty (an overloaded receiver), so a counted budget would fail
    /// and rebuild connections to a peer that is only busy, flushing what was in flight. A peer
    /// whose receive queue stays dry completes nothing, and the stall watchdog
    /// (`tx_stall_timeout`) fails that connection and gives its send buffers back, so it cannot
    /// lock the node out. Linux uses 0, as the IPoIB-CM draft warns against retries, and keeps
    /// its receive queue filled from interrupt context; a daemon on a busy CPU can be off it for
    /// longer than a few RNR timer periods.
    pub tx_rnr_retry: u8,
    /// Transport retries of TX connections (`retry_count` of the REQ; Linux: 0).
    pub tx_retry_count: u8,
    /// Seed for PSNs and CM ids (the daemon passes entropy; tests a constant).
    pub seed: u64,
    /// Which worker of the interface this endpoint is (`--workers`): its index is in the low
    /// bits of its CM comm ids (the provider tags its QPNs the same way). Worker 0 is whole;
    /// any other is a follower ([`Endpoint::new_follower`], module `worker`).
    /// Default [`WorkerId::SINGLE`].
    pub worker: WorkerId,
    /// CM response timeout exponent.
    pub cm_response_timeout: u8,
    /// The kernel's CM runs the connections (through the driver), not ours; `None`: ours.
    pub kernel_cm: Option<KernelCmConfig>,
    /// The port of the rdma_cm service in `RDMA_PS_IB` (service ID
    /// `0x0000_0000_013F_0000 | port`, REQs with a `cma_hdr`): where this endpoint listens
    /// beside the standard IPoIB-CM service IDs, and where it connects to a peer whose
    /// hardware address has [`HwAddr::FLAG_RDMA_CM`] (or that rejected the standard service
    /// ID). Both ends need the same value (setting `rdma_cm_port`, default
    /// [`DEFAULT_RDMA_CM_PORT`]).
    pub rdma_cm_port: u16,
    /// Advertise [`HwAddr::FLAG_RDMA_CM`] in our hardware address: set by a daemon whose CM
    /// is the kernel's (it can be reached only at the rdma_cm port). A daemon on our CM serves
    /// both services and leaves it clear (the default).
    pub advertise_rdma_cm: bool,
    /// Listen on the standard IPoIB-CM service IDs (`0x1000_0000_0000_0000 | QPN` and RFC
    /// 4755's `0x0100_0000_0000_0000 | QPN`). Always true in a daemon on our CM; false only
    /// where a test stands in for a daemon on the kernel's CM, which rdma_cm cannot make
    /// listen there (REQs to them then draw REJ 8, invalid service ID).
    pub listen_ipoib_service: bool,
}

/// The bytes of an endpoint's buffer pools ([`EndpointConfig::pool_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBytes {
    /// The RC receive pool ([`EndpointConfig::rx_pool_buffers`] buffers of
    /// [`IPOIB_CM_BUF_SIZE`]).
    pub rx: usize,
    /// The send buffers all TX connections share (`tx_depth` of [`IPOIB_CM_BUF_SIZE`]).
    pub tx: usize,
    /// The UD QP's receive and send buffers, each the GRH and the port's largest MTU.
    pub ud: usize,
}

/// How the endpoint uses the kernel's CM ([`EndpointConfig::kernel_cm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCmConfig {
    /// The most ids at a time (listener aside): the cap of the id map.
    pub max_ids: usize,
    /// The service ID of the rdma_cm port the driver listens on.
    pub service_id: u64,
    /// The port's link layer. On InfiniBand our hardware address drops
    /// [`HwAddr::FLAG_CONNECTED`] (kernel ipoib peers, which cannot reach the rdma_cm port,
    /// send us UD datagrams) and TX connections to peers without [`HwAddr::FLAG_RDMA_CM`] go
    /// to their standard service ID through `AF_IB` ([`crate::cm::KcmTarget`]).
    pub link: LinkLayer,
}

/// Smallest `srq_depth` (Linux's `ipoib_recvq_size` floor, `IPOIB_MIN_QUEUE_SIZE`).
pub const MIN_SRQ_DEPTH: u32 = 2;
/// Largest `srq_depth` (`IPOIB_MAX_QUEUE_SIZE`).
pub const MAX_SRQ_DEPTH: u32 = 8192;

/// The SRQ limit armed for an SRQ of `depth` receives: a quarter of it. Each packet's
/// buffer is replaced on the SRQ before the packet goes up, so the SRQ falls below this only
/// when completions wait unpolled or a post failed; the event refills it from the pool.
pub(crate) const fn srq_limit(depth: u32) -> u32 {
    if depth / 4 > 0 {
        depth / 4
    } else {
        1
    }
}

/// The default QP budget (`max_conn_qp`) with a shared receive queue (`srq`) and without.
///
/// With an SRQ an RX connection costs a QP and no receive buffers, and Linux caps nothing
/// (`ipoib_cm_req_handler` checks `ipoib_max_conn_qp` only without one): 8192 is room for
/// every peer of a 4,000-node cluster in two incarnations at once, with each peer's share
/// bounded apart ([`MAX_CONN_QP_PER_SOURCE`]). Without an SRQ each connection pins a ring
/// of receive buffers, and the default is Linux's `ipoib_max_conn_qp`, 128.
pub const fn default_max_conn_qp(srq: bool) -> usize {
    if srq {
        8192
    } else {
        128
    }
}

/// Most established RX connections from one peer GID (one port): a peer holds one per
/// incarnation of each of its interfaces on our partition, so this is never reached but by a
/// peer that opens connections to hold them; beyond it, that peer's own least recently
/// active connection is evicted (or, under the reject policy, the new one refused), so that
/// no single peer can spend the QP budget of a node's other peers.
pub const MAX_CONN_QP_PER_SOURCE: usize = 16;

/// The default `rdma_cm_port`: 4791 is RoCEv2's UDP port, 4792 the CM side channel's
/// (`mad_port`), 4793 the next one.
pub const DEFAULT_RDMA_CM_PORT: u16 = 4793;

impl EndpointConfig {
    /// Defaults as Linux uses them where that makes sense, with a 60 s RX timeout; the daemon's
    /// defaults are these (`ipoib-cm up` without flags runs with them).
    pub fn new(addrs: Vec<(IpAddr, u8)>) -> Self {
        Self {
            mode: Mode::Connected,
            srq: true,
            rx_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(5),
            tx_stall_timeout: Duration::from_secs(1),
            max_conn_qp: default_max_conn_qp(true),
            budget_policy: QpBudgetPolicy::Evict,
            max_pending_rx: 256,
            tx_queue_len: 3,
            neigh_timeout: Duration::from_secs(300),
            neigh_max: 16_384,
            neigh_max_per_source: 16,
            ud_source_check: SourceCheck::Strict,
            peers: Vec::new(),
            pin_peer_neighbours: false,
            addrs,
            static_neighbours: Vec::new(),
            path_mtu: PathMtu::Mtu1024,
            pkey: PKey::DEFAULT,
            qkey: QKey(0x0B1B),
            srq_depth: 256,
            rx_spare: 256,
            nonsrq_ring: 16,
            tx_depth: 128,
            ud_depth: 256,
            qp_timeout: 12,
            tx_rnr_retry: crate::verbs::setup::RNR_RETRY_FOREVER,
            tx_retry_count: crate::verbs::setup::RC_RETRY_CNT,
            seed: 0,
            worker: WorkerId::SINGLE,
            cm_response_timeout: 17,
            kernel_cm: None,
            rdma_cm_port: DEFAULT_RDMA_CM_PORT,
            advertise_rdma_cm: false,
            listen_ipoib_service: true,
        }
    }

    /// Buffers of the RC receive pool: with an SRQ its `srq_depth` and the `rx_spare`; without
    /// one a ring of `nonsrq_ring` per connection slot (`max_conn_qp` established,
    /// `max_pending_rx` half-open, one being evicted) and the `rx_spare`.
    pub fn rx_pool_buffers(&self) -> usize {
        let rings = if self.srq {
            self.srq_depth as usize
        } else {
            self.nonsrq_ring as usize * (self.max_conn_qp + self.max_pending_rx + 1)
        };
        rings + self.rx_spare as usize
    }

    /// The interface MTU: 65520 in connected mode, the UD MTU (path MTU − 4) in datagram mode.
    pub fn interface_mtu(&self) -> u32 {
        match self.mode {
            Mode::Connected => IPOIB_CM_BUF_SIZE - 4,
            Mode::Datagram => self.ud_mtu(),
        }
    }

    /// The P_Key of the partition's MGIDs and broadcast address: [`pkey`](Self::pkey) with
    /// the full-member bit, as ipoib's `priv->pkey | 0x8000`, so that limited and full members
    /// join the same groups.
    pub const fn mgid_pkey(&self) -> u16 {
        self.pkey.full().0
    }

    /// The broadcast hardware address of the partition:
    /// `00:ff:ff:ff:ff:12:40:1b:<P_Key>:00:00:00:00:00:00:ff:ff:ff:ff`.
    pub const fn broadcast_hwaddr(&self) -> HwAddr {
        HwAddr::multicast(broadcast_mgid(self.mgid_pkey()))
    }

    /// The flags byte of our hardware address: [`HwAddr::FLAG_CONNECTED`] in connected mode,
    /// except on the kernel's CM over InfiniBand, where kernel ipoib peers (which test only
    /// that bit) cannot reach our CM and must use UD datagrams; [`HwAddr::FLAG_RDMA_CM`] on
    /// the kernel's CM or where [`advertise_rdma_cm`](Self::advertise_rdma_cm) asks.
    pub const fn hwaddr_flags(&self) -> u8 {
        let on_kernel_cm_over_ib = matches!(
            self.kernel_cm,
            Some(KernelCmConfig {
                link: LinkLayer::InfiniBand,
                ..
            })
        );
        let mut flags = 0;
        if matches!(self.mode, Mode::Connected) && !on_kernel_cm_over_ib {
            flags |= HwAddr::FLAG_CONNECTED;
        }
        if self.advertise_rdma_cm || self.kernel_cm.is_some() {
            // Peers reach a kernel CM at the rdma_cm port, with `cma_hdr` (docs/kernel-cm.md).
            flags |= HwAddr::FLAG_RDMA_CM;
        }
        if flags != 0 {
            // Our passive side takes each REQ as a connection of its own, from any peer.
            flags |= HwAddr::FLAG_CONN_PER_WORKER;
        }
        flags
    }

    /// The service ID of the rdma_cm service: `RDMA_PS_IB`'s for
    /// [`rdma_cm_port`](Self::rdma_cm_port).
    pub const fn rdma_cm_service_id(&self) -> u64 {
        crate::wire::cma::PortSpace::Ib.service_id(self.rdma_cm_port)
    }

    /// Largest IP packet over UD.
    pub fn ud_mtu(&self) -> u32 {
        u32::try_from(self.path_mtu.bytes()).unwrap_or(4096) - 4
    }
}

/// Counters, named as in `ipoib-cm status` (its `counters`, the rest in its `provider` map).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
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
    /// RX connections evicted to make room for a new one established beyond `max_conn_qp`.
    pub rx_evicted: u64,
    /// Half-open RX connections torn down to admit a REQ at `max_pending_rx`.
    pub rx_half_open_evicted: u64,
    /// Half-open RX connections reaped when the CM gave up resending their REP.
    pub rx_half_open_reaped: u64,
    /// Teardowns finished by the watchdog, not by the provider.
    pub drain_timeouts: u64,
    /// Last WQE Reached events received.
    pub last_wqe_events: u64,
    /// REQs rejected for lack of QP budget (or of a QP), and connections established beyond
    /// it under the reject policy.
    pub rx_rejected: u64,
    /// RX connections established beyond [`MAX_CONN_QP_PER_SOURCE`] from one peer GID: that
    /// peer's least recently active other one was evicted (counted in `rx_evicted` too), or
    /// under the reject policy this one (and REQs while the peer holds that many: counted in
    /// `rx_rejected` too).
    pub rx_source_full: u64,
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
    /// IP packets over UD whose source address is bound to another sender than theirs
    /// (dropped).
    pub rx_ud_spoofed_drops: u64,
    /// IP packets over UD whose source address is bound to no one (dropped; in loose mode
    /// only on-link sources).
    pub rx_ud_unbound_drops: u64,
    /// IP packets over UD from a sender the node does not know: the unspecified source, and
    /// in loose mode off-link sources (dropped).
    pub rx_ud_unknown_sender_drops: u64,
    /// IP packets delivered to the TUN device.
    pub rx_packets: u64,
    /// Bytes of the IP packets counted in `rx_packets`.
    #[serde(rename = "rx_ip_bytes")]
    pub rx_bytes: u64,
    /// IP packets that arrived on an RX connection being torn down (dropped).
    pub rx_closing_drops: u64,
    /// RC packets dropped because no spare receive buffer was free to take their place on
    /// the SRQ (the TUN device is behind by `rx_spare` packets); the peer is not RNR-NAKed.
    pub rx_buffer_drops: u64,
    /// SRQ limit events answered (the SRQ fell below a quarter of `srq_depth`).
    pub srq_limit_events: u64,
    /// Receive buffers posted on the SRQ by those answers.
    pub srq_refills: u64,
    /// IP packets sent (RC and UD).
    #[serde(rename = "tx_ip_packets")]
    pub tx_packets: u64,
    /// Bytes of the IP packets counted in `tx_packets`.
    #[serde(rename = "tx_ip_bytes")]
    pub tx_bytes: u64,
    /// Connection events dropped because the driver did not take them in time.
    pub events_dropped: u64,
    /// ARP/ND messages that tried to change an established mapping.
    pub neigh_conflicts: u64,
    /// ARP/ND messages announcing a restart of a neighbour (its GID with a new UD QPN) but
    /// not from the UDP source port its mapping was learned from: ignored.
    pub neigh_foreign_port: u64,
    /// Restarts of a peer seen (a new incarnation from its own address: an established
    /// connection from a REQ with a new CA GUID or UD QPN, or an ARP/ND with a new UD QPN),
    /// each closing the old incarnation's TX and RX connections at once.
    pub peer_restarts: u64,
    /// Neighbour resolutions that got no answer.
    pub neigh_failed: u64,
    /// ARP/ND senders not learned: outside the interface's prefixes (and not link-local
    /// IPv6).
    pub neigh_out_of_prefix: u64,
    /// ARP/ND messages whose sender hardware address (source link-layer option) is not the
    /// address they came from: neither learned nor answered.
    pub neigh_unvouched_drops: u64,
    /// ARP replies and Neighbor Advertisements for addresses the node was not resolving:
    /// discarded (RFC 4861 §7.2.5).
    pub neigh_unsolicited_drops: u64,
    /// ARP/ND answers not sent: the asker's budget was spent.
    pub neigh_answer_budget_drops: u64,
    /// Unicast probes sent to a bound neighbour because another sender claimed its address.
    pub neigh_probes: u64,
    /// Bindings that failed: their TX connection failed, or they did not answer the probes
    /// of a contest. Each is resolved again, the node that failed barred from that
    /// resolution.
    pub neigh_bindings_failed: u64,
    /// New neighbour entries that found `neigh_max` entries (one was evicted, or the new one
    /// refused).
    pub neigh_table_full: u64,
    /// New resolved entries whose GID had `neigh_max_per_source` of them already (one of
    /// those was evicted, or the new one refused).
    pub neigh_source_full: u64,
    /// Neighbour entries evicted to make room for a new one.
    pub neigh_evicted: u64,
    /// REQs at the rdma_cm service whose `cma_hdr` was missing, malformed or named another
    /// address: rejected as the kernel's rdma_cm does (REJ ConsumerDefined), nothing
    /// allocated.
    pub rx_bad_cma_hdr: u64,
    /// TX REQs to a peer's standard service ID rejected with reason 8 (invalid service ID)
    /// and sent again, once, to its rdma_cm service (the peer's kind is then remembered).
    pub tx_rdma_cm_retries: u64,
    /// REQs refused because their path MTU is above ours (REJ 26, naming ours; the kernel's
    /// CM can only refuse them with REJ Consumer Defined).
    pub rx_mtu_rejected: u64,
    /// TX REQs refused by the peer with REJ 26 and sent again, once, at the path MTU its
    /// REJ named (remembered for that peer until it disconnects us or restarts).
    pub tx_mtu_retries: u64,
    /// Changes of the path MTU followed while running (the underlay link's MTU changed).
    pub path_mtu_changes: u64,
    /// Connections (TX and RX) closed by a path MTU change, to be set up again at the new
    /// one.
    pub mtu_reconnects: u64,
    /// Messages (IP packets, ARP/ND replies) held until their destination's PathRecord
    /// arrived (an SA in use: InfiniBand).
    pub path_wait_held: u64,
    /// Messages not held for a PathRecord: [`PATH_QUEUE_LEN`] of their kind waited for the
    /// path already, or [`PATH_WAIT_MAX`] in all (also in `tx_queue_drops`).
    pub path_wait_drops: u64,
    /// Held messages dropped because their path query failed, could not be asked, or was
    /// voided by a port event (also in `tx_dropped`).
    pub path_failed_drops: u64,
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
    /// The peer's path from the SA (an InfiniBand port), where one is known.
    pub path: Option<crate::verbs::Path>,
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
    /// `(ip, hwaddr, state)` of the first [`SNAPSHOT_NEIGHBOURS`] neighbours by address.
    pub neighbours: Vec<(IpAddr, Option<HwAddr>, NeighState)>,
    /// Every neighbour entry by state (`neighbours` may hold fewer).
    pub neigh_counts: NeighCounts,
    /// The cap on learned neighbour entries (`neigh_max`).
    pub neigh_max: usize,
    /// Per TX connection.
    pub tx: Vec<TxSnapshot>,
    /// `(peer, qpn, state, idle)` per RX connection.
    pub rx: Vec<(crate::verbs::Gid, QpNum, RxState, Duration)>,
    /// Counters.
    pub counters: Counters,
}

/// Most neighbours a [`Snapshot`] lists, so that a status stays small with a full table.
pub const SNAPSHOT_NEIGHBOURS: usize = 256;

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

/// How an RC QP ends: drained (every WR posted on it came back, so the provider may destroy
/// it off the event loop: [`Verbs::retire_qp`]), or forced (a watchdog, a failed set-up, a
/// stop past its bound: WRs may still be queued, and the destroy must sweep them now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QpEnd {
    Drained,
    Forced,
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

/// Resolution requests before a neighbour is given up.
const RESOLVE_RETRIES: u8 = 3;
/// Interval between resolution requests.
const RESOLVE_INTERVAL: Duration = Duration::from_secs(1);
/// Completions taken from a CQ per poll.
const CQ_BATCH: usize = 64;

#[cfg(test)]
mod tests;
