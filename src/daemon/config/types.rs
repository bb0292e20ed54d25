//! The value types of the settings of `ipoib-cm up` that are the daemon's own ([`Cidr`],
//! [`ProviderKind`], [`Quirk`]), the [`Setting`] parse of every daemon value type, and the
//! daemon's own defaults and accepted bounds.
//!
//! The endpoint's settings default as [`EndpointConfig::new`] does: the daemon's defaults are
//! the endpoint's.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::daemon::logging::LogFormat;
use crate::ipoib::{EndpointConfig, Mode, ParseChoiceError, QpBudgetPolicy, SourceCheck};
use crate::mad::CmTransport;
#[cfg(test)]
use crate::setting::Setting;
use crate::setting::{text_setting, ConfigError, InvalidValue, Origin};
use crate::verbs::PathMtu;

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
/// Largest accepted `rx_spare`.
pub const MAX_RX_SPARE: u32 = 65536;
/// Largest accepted `fault_tun_rate` (packets a second).
pub const MAX_TUN_RATE: u32 = 10_000_000;
/// Largest accepted `max_pending_rx`.
pub const MAX_MAX_PENDING_RX: u32 = 4096;
/// Largest accepted per-neighbour queue.
pub const MAX_TX_QUEUE_LEN: u32 = 65536;
/// Default log filter.
pub const DEFAULT_LOG: &str = "info";
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

/// The largest IB path MTU whose RoCEv2 packets fit an underlay link of `link_mtu` bytes
/// ([`PathMtu::for_link_mtu`], as Linux rxe derives it), at least 256.
pub fn path_mtu_for_link_mtu(link_mtu: u32) -> PathMtu {
    PathMtu::carried_by_link(link_mtu)
}

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

/// The software provider's link layer (`--link-layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum LinkLayerKind {
    /// RoCEv2: the underlay's addresses are the GIDs.
    #[default]
    Rocev2,
    /// A port of a simulated InfiniBand fabric (ibsim): LIDs, P_Keys and the SM's events
    /// read from the port's SMA through `umad2sim`, packets with an LRH.
    Infiniband,
}

impl FromStr for LinkLayerKind {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "rocev2" => Ok(Self::Rocev2),
            "infiniband" => Ok(Self::Infiniband),
            _ => Err(ParseChoiceError::new("\"rocev2\" or \"infiniband\"", s)),
        }
    }
}

impl From<LinkLayerKind> for crate::soft::SoftLink {
    fn from(k: LinkLayerKind) -> Self {
        match k {
            LinkLayerKind::Rocev2 => Self::RoceV2,
            LinkLayerKind::Infiniband => Self::Infiniband,
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

/// A deliberate provider contract violation (`--quirk`); see [`crate::soft::Quirks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// `drain-never`: [`Quirks::drain_never`](crate::soft::Quirks::drain_never).
    DrainNever,
    /// `no-last-wqe`: [`Quirks::no_last_wqe`](crate::soft::Quirks::no_last_wqe).
    NoLastWqe,
    /// `dup-last-wqe`: [`Quirks::dup_last_wqe`](crate::soft::Quirks::dup_last_wqe).
    DupLastWqe,
    /// `clean-cq-on-destroy`:
    /// [`Quirks::clean_cq_on_destroy`](crate::soft::Quirks::clean_cq_on_destroy).
    CleanCqOnDestroy,
    /// `moves-later`: [`Quirks::moves_later`](crate::soft::Quirks::moves_later).
    MovesLater,
}

impl FromStr for Quirk {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        match s {
            "drain-never" => Ok(Self::DrainNever),
            "no-last-wqe" => Ok(Self::NoLastWqe),
            "dup-last-wqe" => Ok(Self::DupLastWqe),
            "clean-cq-on-destroy" => Ok(Self::CleanCqOnDestroy),
            "moves-later" => Ok(Self::MovesLater),
            _ => Err(InvalidValue::new(format!(
                "unknown quirk {s:?} (known: drain-never, no-last-wqe, dup-last-wqe, \
                 clean-cq-on-destroy, moves-later)"
            ))),
        }
    }
}

impl Quirk {
    /// Turns this quirk on in `q`.
    pub fn set(self, q: &mut crate::soft::Quirks) {
        match self {
            Self::DrainNever => q.drain_never = true,
            Self::NoLastWqe => q.no_last_wqe = true,
            Self::DupLastWqe => q.dup_last_wqe = true,
            Self::CleanCqOnDestroy => q.clean_cq_on_destroy = true,
            Self::MovesLater => q.moves_later = true,
        }
    }
}

/// A fault of worker threads (`--fault-worker`), for the tests of what the daemon does when
/// one fails: [`WORKER_FAULT_AFTER`] after start, every worker but control panics or stops
/// turning (for [`WORKER_STALL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerFault {
    /// `panic`: the workers' threads panic.
    Panic,
    /// `stall`: the workers' threads stop turning.
    Stall,
}

/// How long after start a [`WorkerFault`] strikes.
pub const WORKER_FAULT_AFTER: Duration = Duration::from_secs(2);

/// How long a [`WorkerFault::Stall`] holds a worker (longer than the stall limit, after which
/// the daemon ends anyway).
pub const WORKER_STALL: Duration = Duration::from_secs(60);

impl FromStr for WorkerFault {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        match s {
            "panic" => Ok(Self::Panic),
            "stall" => Ok(Self::Stall),
            _ => Err(InvalidValue::new(format!(
                "unknown worker fault {s:?} (known: panic, stall)"
            ))),
        }
    }
}

text_setting!(
    WorkerFault,
    Cidr,
    Mode,
    QpBudgetPolicy,
    SourceCheck,
    CmTransport,
    LinkLayerKind,
    ProviderKind,
    Quirk,
    LogFormat
);

/// Linux `IFNAMSIZ` less the terminating NUL.
const IFNAME_MAX_BYTES: usize = 15;

/// Checks a log filter: a level (`off`, `error`, `warn`, `info`, `debug`, `trace`) or a
/// `tracing` directive list with `target=level` entries.
pub(super) fn check_log(origin: Origin, s: &str) -> Result<(), ConfigError> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let ok = !s.is_empty()
        && s.split(',').all(|d| {
            let level = d
                .rsplit_once('=')
                .map_or(d, |(target, l)| if target.is_empty() { "" } else { l });
            LEVELS.contains(&level.to_ascii_lowercase().as_str())
        });
    if ok {
        Ok(())
    } else {
        Err(origin.err(
            "log",
            format!(
                "invalid log filter {s:?} (use off, error, warn, info, debug, trace or target=level)"
            ),
        ))
    }
}

/// Checks an interface name against what Linux accepts.
pub(super) fn check_ifname(origin: Origin, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() {
        return Err(origin.err("ifname", "must not be empty"));
    }
    if s.len() > IFNAME_MAX_BYTES {
        return Err(origin.err(
            "ifname",
            format!("must be at most {IFNAME_MAX_BYTES} bytes (got {s:?})"),
        ));
    }
    if s == "."
        || s == ".."
        || s.bytes()
            .any(|b| b == b'/' || b == b':' || !b.is_ascii_graphic())
    {
        return Err(origin.err("ifname", format!("invalid interface name {s:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quirks_and_choices_parse_as_settings() {
        let mut q = crate::soft::Quirks::default();
        "no-last-wqe".parse::<Quirk>().unwrap().set(&mut q);
        assert!(q.no_last_wqe && !q.drain_never && !q.dup_last_wqe);
        assert!("slow".parse::<Quirk>().is_err());
        assert_eq!(Mode::from_file(&"datagram".to_owned()), Ok(Mode::Datagram));
    }
}
