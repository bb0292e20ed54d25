//! The resolved settings of `ipoib-cm up` ([`Config`]) and the value types of its fields.
//!
//! The endpoint's settings default as [`EndpointConfig::new`] does: the daemon's defaults are
//! the endpoint's. The constants here are the daemon's own defaults and the accepted bounds.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::daemon::logging::LogFormat;
use crate::ipoib::{EndpointConfig, Mode, ParseChoiceError, QpBudgetPolicy};
use crate::soft::{FaultConfig, Quirks};
use crate::verbs::PathMtu;
use crate::wire::ipoib::HwAddr;

/// Default interface name.
pub const DEFAULT_IFNAME: &str = "ib0";
/// Default RoCEv2 UDP port.
pub const DEFAULT_UDP_PORT: u16 = 4791;
/// Accepted `qp_timeout` exponents.
pub const QP_TIMEOUT_RANGE: std::ops::RangeInclusive<u8> = 8..=24;
/// Smallest accepted RX idle timeout.
pub const MIN_RX_TIMEOUT: Duration = Duration::from_secs(1);
/// The default `tx_stall_timeout` is the endpoint's, or this many local ACK timeouts
/// (`qp_timeout`) if that is longer.
pub const TX_STALL_ACK_TIMEOUTS: u32 = 4;
/// Longest `--busy-poll`.
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(10);
/// Smallest accepted neighbour timeout.
pub const MIN_NEIGH_TIMEOUT: Duration = Duration::from_secs(1);
/// Largest accepted neighbour table.
pub const MAX_NEIGH_MAX: u32 = 1 << 20;
/// Largest accepted QP budget.
pub const MAX_MAX_CONN_QP: u32 = 65536;
/// Largest accepted `max_pending_rx`.
pub const MAX_MAX_PENDING_RX: u32 = 4096;
/// Largest accepted per-neighbour queue.
pub const MAX_TX_QUEUE_LEN: u32 = 65536;
/// Default log filter.
pub const DEFAULT_LOG: &str = "info";
/// Path MTU when none is configured and the underlay link MTU is unknown.
pub const FALLBACK_PATH_MTU: PathMtu = PathMtu::Mtu1024;
/// Headroom a RoCEv2 packet needs on the underlay link beyond its IB payload (what Linux rxe
/// reserves: `RXE_MAX_HDR_LENGTH`).
pub const ROCE_MAX_HDR_BYTES: u32 = 80;
/// The endpoint's defaults, which are the daemon's.
pub(crate) fn endpoint_defaults() -> EndpointConfig {
    EndpointConfig::new(Vec::new())
}

/// How the default control sockets are named: an abstract Unix socket (a `--control-socket`
/// that starts with `@` names one) `@ipoib-cm/<ifname>`. Abstract sockets belong to the
/// network namespace, so daemons in two namespaces never collide, and none leaves a file
/// behind.
pub const CONTROL_SOCKET_PREFIX: &str = "@ipoib-cm/";

/// The default control socket of an interface: `@ipoib-cm/<ifname>`.
pub fn default_control_socket(ifname: &str) -> PathBuf {
    PathBuf::from(format!("{CONTROL_SOCKET_PREFIX}{ifname}"))
}

/// Most static neighbours (`neigh`, in the file, the flags and added at run time).
pub const MAX_STATIC_NEIGHBOURS: usize = 4096;
/// Most peers (`peer`, in the file, the flags and added at run time).
pub const MAX_PEERS: usize = 1024;

/// The largest IB path MTU whose RoCEv2 packets fit an underlay link of `link_mtu` bytes (as
/// Linux rxe derives it), at most 4096 and at least 256.
pub fn path_mtu_for_link_mtu(link_mtu: u32) -> PathMtu {
    match link_mtu.saturating_sub(ROCE_MAX_HDR_BYTES) {
        4096.. => PathMtu::Mtu4096,
        2048..=4095 => PathMtu::Mtu2048,
        1024..=2047 => PathMtu::Mtu1024,
        512..=1023 => PathMtu::Mtu512,
        _ => PathMtu::Mtu256,
    }
}

pub use crate::mad::CmTransport;

/// Which provider a command runs on (`--provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum ProviderKind {
    /// The embedded software RoCEv2 provider.
    #[default]
    Soft,
    /// libibverbs hardware (or the kernel's rxe); needs a build with `--features verbs`.
    Verbs,
}

impl FromStr for ProviderKind {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "soft" => Ok(Self::Soft),
            "verbs" => Ok(Self::Verbs),
            _ => Err(ParseChoiceError::new("\"soft\" or \"verbs\"", s)),
        }
    }
}

/// An interface address with its prefix length, like `198.19.0.1/24` or `fd00::1/64`.
///
/// Host bits may be set (it is an address on a subnet, not a route).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The address.
    pub addr: IpAddr,
    /// Prefix length: at most 32 for IPv4, 128 for IPv6.
    pub prefix_len: u8,
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Text that is neither `ADDR/PREFIX` nor `ADDR`; displays as `invalid CIDR "<input>"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {0:?}")]
pub struct InvalidCidr(pub String);

impl FromStr for Cidr {
    type Err = InvalidCidr;
    /// Parses `ADDR/PREFIX`, or `ADDR` alone as a host address (/32, /128), as `ip` does.
    fn from_str(s: &str) -> Result<Self, InvalidCidr> {
        let bad = || InvalidCidr(s.to_owned());
        let Some((a, p)) = s.split_once('/') else {
            let addr: IpAddr = s.parse().map_err(|_| bad())?;
            let prefix_len = if addr.is_ipv4() { 32 } else { 128 };
            return Ok(Self { addr, prefix_len });
        };
        let addr: IpAddr = a.parse().map_err(|_| bad())?;
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.len() > 3 {
            return Err(bad());
        }
        let prefix_len: u8 = p.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(bad());
        }
        Ok(Self { addr, prefix_len })
    }
}

/// Fully resolved and validated configuration of `ipoib-cm up`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Interface name (`--ifname`, default `ib0`).
    pub ifname: String,
    /// Addresses put on the interface (`--addr`, repeatable).
    pub addr: Vec<Cidr>,
    /// Underlay address the software provider binds (`--bind`, required).
    pub bind: IpAddr,
    /// Underlay addresses of the other nodes (`--peer`, repeatable); the broadcast group is
    /// fanned out to them on the software provider. Same family as `bind`.
    pub peer: Vec<IpAddr>,
    /// Carry multicast UD (the broadcast group) as IP multicast on the software provider's
    /// underlay, where the bind interface carries multicast (`--no-multicast` turns it off;
    /// see [`crate::soft::SoftConfig::multicast`]; default on).
    pub multicast: bool,
    /// TTL / hop limit of that multicast (`--multicast-ttl`, default
    /// [`crate::soft::DEFAULT_MULTICAST_TTL`]).
    pub multicast_ttl: u8,
    /// Static neighbours (`--neigh IP=HWADDR`, repeatable): never resolved, never aged.
    pub neigh: Vec<(IpAddr, HwAddr)>,
    /// RoCEv2 UDP port (`--udp-port`, default 4791).
    pub udp_port: u16,
    /// How CM MADs travel (`--cm-transport qp1|udp`); `None`: the provider's default (QP1 on
    /// the software provider, UDP on libibverbs, whose QP1 the kernel owns).
    pub cm_transport: Option<CmTransport>,
    /// UDP port of the CM MAD side channel (`--mad-port`, default 4792); see
    /// [`crate::mad::MadUdp`].
    pub mad_port: u16,
    /// Verify the ICRC of IPv4 packets on the software provider (`--no-icrc-v4` turns it off;
    /// default on; IPv4 IDs the receiver cannot see, such as rxe's, are solved for).
    pub verify_icrc_v4: bool,
    /// Use UDP GSO/GRO on the software provider's socket (`--no-udp-offload` turns it off; see
    /// [`crate::soft::provider::UdpOffload`]; default on).
    pub udp_offload: bool,
    /// Local ACK timeout exponent of the RC QPs, `4.096 µs · 2^n` (`--qp-timeout`, default 12,
    /// about 17 ms: a lost tail packet costs that long; with retry count 7 a connection fails
    /// after 8 of them without progress, which the software provider spreads over about 47
    /// by backing off; `tx_stall_timeout` bounds either).
    pub qp_timeout: u8,
    /// IPoIB mode (`--mode`, default connected).
    pub mode: Mode,
    /// Receive on a shared receive queue (`--no-srq` turns it off; default on).
    pub srq: bool,
    /// RX connections idle this long are reaped (`--rx-timeout`, default 60s, at least 1s).
    pub rx_timeout: Duration,
    /// How long to wait for a QP to drain before destroying it anyway (`--drain-timeout`,
    /// default 5s).
    pub drain_timeout: Duration,
    /// A TX connection with sends in flight and none completed for this long fails and gives
    /// its send buffers back (`--tx-stall-timeout`, default 1s or 4 local ACK timeouts if
    /// longer; longer than one local ACK timeout): how long a vanished or stuck peer can hold
    /// the send buffers every other peer needs too, whatever the provider's retry budget.
    pub tx_stall_timeout: Duration,
    /// After each event, keep looking for the next one without sleeping for this long
    /// (`--busy-poll`, default 0: off; at most 10ms). Saves a process wakeup per packet that
    /// arrives within it, at the cost of a busy CPU meanwhile.
    pub busy_poll: Duration,
    /// Neighbour entry lifetime (`--neigh-timeout`, default 300s).
    pub neigh_timeout: Duration,
    /// Most learned neighbour entries (`--neigh-max`, default 1024, at most 2^20).
    pub neigh_max: u32,
    /// Connected-mode QP budget (`--max-conn-qp`, default 128), SRQ or not.
    pub max_conn_qp: u32,
    /// What to do when the budget is exhausted (`--evict`/`--reject`, default evict).
    pub qp_budget_policy: QpBudgetPolicy,
    /// Half-open RX connections held at once (`--max-pending-rx`, default 16).
    pub max_pending_rx: u32,
    /// Packets queued per neighbour while its path/connection comes up (`--tx-queue-len`,
    /// default 3).
    pub tx_queue_len: u32,
    /// IB path MTU (`--path-mtu`); `None`: derive it from the underlay link MTU with
    /// [`Config::effective_path_mtu`].
    pub path_mtu: Option<PathMtu>,
    /// Fault injection on the software provider (`--fault-*`).
    pub fault: FaultConfig,
    /// Deliberate provider contract violations (`--quirk`).
    pub quirks: Quirks,
    /// The software provider's QPN order (`--qpn-seed`); `None`: drawn at each start, so
    /// that a restarted daemon never reuses its predecessor's QPNs.
    pub qpn_seed: Option<u64>,
    /// Control socket (`--control-socket`: a path, or `@name` for an abstract socket; default
    /// `@ipoib-cm/<ifname>`).
    pub control_socket: PathBuf,
    /// The Prometheus HTTP listener (`--metrics-listen`; `None`: off).
    pub metrics_listen: Option<SocketAddr>,
    /// Log filter (`--log`, default `info`).
    pub log: String,
    /// Log line format (`--log-format`, default text).
    pub log_format: LogFormat,
    /// The provider (`--provider soft|verbs`, default soft).
    pub provider: ProviderKind,
    /// With the verbs provider: the IB device (`--ib-dev`; `None`: the first one).
    pub ib_dev: Option<String>,
    /// Where this configuration came from when a file was read (`--config`): what a reload
    /// (SIGHUP) reads again. `None` without a file.
    pub source: Option<ConfigSource>,
}

/// The configuration file and the command line a [`Config`] was resolved from: a reload
/// resolves the file again with the same flags (which still win over it).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSource {
    /// The file (`--config`).
    pub file: PathBuf,
    /// The command line's settings.
    pub flags: super::Settings,
}

impl Config {
    /// The path MTU to use: the configured one, else the largest that fits the underlay
    /// `link_mtu`, else [`FALLBACK_PATH_MTU`].
    pub fn effective_path_mtu(&self, link_mtu: Option<u32>) -> PathMtu {
        self.path_mtu
            .or_else(|| link_mtu.map(path_mtu_for_link_mtu))
            .unwrap_or(FALLBACK_PATH_MTU)
    }

    /// The endpoint's settings from these: `path_mtu` as [`Config::effective_path_mtu`] gave
    /// it, `seed` for PSNs and CM ids; the rest as [`EndpointConfig::new`] sets them.
    pub fn endpoint_config(&self, path_mtu: PathMtu, seed: u64) -> EndpointConfig {
        EndpointConfig {
            mode: self.mode,
            srq: self.srq,
            rx_timeout: self.rx_timeout,
            drain_timeout: self.drain_timeout,
            tx_stall_timeout: self.tx_stall_timeout,
            neigh_timeout: self.neigh_timeout,
            neigh_max: self.neigh_max as usize,
            max_conn_qp: self.max_conn_qp as usize,
            budget_policy: self.qp_budget_policy,
            max_pending_rx: self.max_pending_rx as usize,
            tx_queue_len: self.tx_queue_len as usize,
            static_neighbours: self.neigh.clone(),
            qp_timeout: self.qp_timeout,
            path_mtu,
            seed,
            ..EndpointConfig::new(self.addr.iter().map(|c| (c.addr, c.prefix_len)).collect())
        }
    }
}
