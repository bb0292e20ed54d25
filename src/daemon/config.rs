//! Configuration of `ipoib-cm up`: a TOML file, command-line flags that override it, and the
//! validated [`Config`] they resolve to.
//!
//! Every flag is also a config key, the same name with `_` for `-` (`--rx-timeout` is
//! `rx_timeout`), except `--no-srq` (`srq = false`), `--evict`/`--reject`
//! (`qp_budget_policy = "evict"|"reject"`) and the repeatable `--quirk` (`quirk = [...]`). A
//! flag given on the command line wins over the file; a repeatable flag given at least once
//! replaces the file's whole list.
//!
//! Errors are one line naming the field as the user wrote it: `--rx-timeout: ...` for a flag,
//! `config: rx_timeout: ...` for a file key, `config file PATH: line N: ...` for a file that
//! does not parse. The caller prints the [`ConfigError`] and exits with
//! [`ConfigError::EXIT_CODE`].
//!
//! Parsing (`parse_*`) and [`resolve_str`] are pure; only [`resolve`] reads the file.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::soft::{FaultConfig, Quirks};
use crate::verbs::PathMtu;

/// Default interface name.
pub const DEFAULT_IFNAME: &str = "ib0";
/// Default RoCEv2 UDP port.
pub const DEFAULT_UDP_PORT: u16 = 4791;
/// Default `qp_timeout`: 4.096 µs · 2^12 ≈ 17 ms.
pub const DEFAULT_QP_TIMEOUT: u8 = 12;
/// Default RX idle timeout (Linux `IPOIB_CM_RX_TIMEOUT`).
pub const DEFAULT_RX_TIMEOUT: Duration = Duration::from_secs(60);
/// Smallest accepted RX idle timeout.
pub const MIN_RX_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time to wait for a QP to drain before it is destroyed anyway.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// `tx_stall_timeout` when not given: this, or [`TX_STALL_ACK_TIMEOUTS`] local ACK timeouts
/// if that is longer.
pub const DEFAULT_TX_STALL_TIMEOUT: Duration = Duration::from_secs(1);
/// The default `tx_stall_timeout` is at least this many local ACK timeouts (`qp_timeout`).
pub const TX_STALL_ACK_TIMEOUTS: u32 = 4;
/// Longest `--busy-poll`.
pub const MAX_BUSY_POLL: Duration = Duration::from_millis(10);
/// Default neighbour entry lifetime.
pub const DEFAULT_NEIGH_TIMEOUT: Duration = Duration::from_secs(300);
/// Smallest accepted neighbour timeout.
pub const MIN_NEIGH_TIMEOUT: Duration = Duration::from_secs(1);
/// Default connected-mode QP budget (Linux `max_nonsrq_conn_qp` default).
pub const DEFAULT_MAX_CONN_QP: u32 = 128;
/// Largest accepted QP budget.
pub const MAX_MAX_CONN_QP: u32 = 65536;
/// Default packets queued per neighbour while its connection comes up.
pub const DEFAULT_TX_QUEUE_LEN: u32 = 3;
/// Largest accepted per-neighbour queue.
pub const MAX_TX_QUEUE_LEN: u32 = 65536;
/// Default log filter.
pub const DEFAULT_LOG: &str = "info";
/// Path MTU when none is configured and the underlay link MTU is unknown.
pub const FALLBACK_PATH_MTU: PathMtu = PathMtu::Mtu1024;
/// Headroom a RoCEv2 packet needs on the underlay link beyond its IB payload (what Linux rxe
/// reserves: `RXE_MAX_HDR_LENGTH`).
pub const ROCE_MAX_HDR_BYTES: u32 = 80;
/// Directory of the control sockets.
pub const CONTROL_SOCKET_DIR: &str = "/run/ipoib-cm";
/// Linux `IFNAMSIZ` less the terminating NUL.
const IFNAME_MAX_BYTES: usize = 15;

/// The default control socket of an interface: `/run/ipoib-cm/<ifname>.sock`.
pub fn default_control_socket(ifname: &str) -> PathBuf {
    Path::new(CONTROL_SOCKET_DIR).join(format!("{ifname}.sock"))
}

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

/// IPoIB mode of the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Connected mode: one RC QP per peer, large MTU (RFC 4755).
    #[default]
    Connected,
    /// Datagram mode: UD only, MTU bounded by the path MTU (RFC 4391).
    Datagram,
}

impl Mode {
    /// The name used in flags, config and status (`connected`, `datagram`).
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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "connected" => Ok(Self::Connected),
            "datagram" => Ok(Self::Datagram),
            _ => Err(format!("must be \"connected\" or \"datagram\" (got {s:?})")),
        }
    }
}

pub use crate::mad::CmTransport;

/// What to do with a new connection when `max_conn_qp` QPs are already live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QpBudgetPolicy {
    /// Evict the least recently active RX connection to make room.
    #[default]
    Evict,
    /// Reject the new connection (CM REJ), as Linux does for non-SRQ.
    Reject,
}

impl QpBudgetPolicy {
    /// The name used in config (`evict`, `reject`).
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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "evict" => Ok(Self::Evict),
            "reject" => Ok(Self::Reject),
            _ => Err(format!("must be \"evict\" or \"reject\" (got {s:?})")),
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

impl FromStr for Cidr {
    type Err = String;
    /// Parses `ADDR/PREFIX`; the error is `invalid CIDR "<input>"`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid CIDR {s:?}");
        let (a, p) = s.split_once('/').ok_or_else(bad)?;
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

/// Parses a duration: `500ms`, `5s`, `2m`, `1h`, or plain seconds (`60`).
///
/// # Errors
/// `invalid duration "<input>" (use e.g. 50us, 500ms, 5s, 2m, 1h or plain seconds)`, or `duration
/// "<input>" is too large`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("invalid duration {s:?} (use e.g. 50us, 500ms, 5s, 2m, 1h or plain seconds)");
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(bad());
    }
    let (num, unit) = s.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("duration {s:?} is too large"))?;
    let us_per_unit: u64 = match unit {
        "us" => 1,
        "ms" => 1000,
        "" | "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(us_per_unit)
        .map(Duration::from_micros)
        .ok_or_else(|| format!("duration {s:?} is too large"))
}

/// Formats a duration the way [`parse_duration`] reads it back (`50us`, `500ms`, `5s`, `2m`,
/// `1h`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        "0s".to_owned()
    } else if d.as_micros() % 1000 != 0 {
        format!("{}us", d.as_micros())
    } else if ms % 3_600_000 == 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Parses one provider quirk name (`drain-never`, `no-last-wqe`, `dup-last-wqe`) into `q`.
fn add_quirk(q: &mut Quirks, name: &str) -> Result<(), String> {
    match name {
        "drain-never" => q.drain_never = true,
        "no-last-wqe" => q.no_last_wqe = true,
        "dup-last-wqe" => q.dup_last_wqe = true,
        _ => {
            return Err(format!(
                "unknown quirk {name:?} (known: drain-never, no-last-wqe, dup-last-wqe)"
            ))
        }
    }
    Ok(())
}

/// Checks a log filter: a level (`off`, `error`, `warn`, `info`, `debug`, `trace`) or a
/// `tracing` directive list with `target=level` entries.
fn check_log(s: &str) -> Result<(), String> {
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
        Err(format!(
            "invalid log filter {s:?} (use off, error, warn, info, debug, trace or target=level)"
        ))
    }
}

/// Checks an interface name against what Linux accepts.
fn check_ifname(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if s.len() > IFNAME_MAX_BYTES {
        return Err(format!(
            "must be at most {IFNAME_MAX_BYTES} bytes (got {s:?})"
        ));
    }
    if s == "."
        || s == ".."
        || s.bytes()
            .any(|b| b == b'/' || b == b':' || !b.is_ascii_graphic())
    {
        return Err(format!("invalid interface name {s:?}"));
    }
    Ok(())
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
    /// Static neighbours (`--neigh IP=HWADDR`, repeatable): never resolved, never aged.
    pub neigh: Vec<(IpAddr, crate::wire::ipoib::HwAddr)>,
    /// RoCEv2 UDP port (`--udp-port`, default 4791).
    pub udp_port: u16,
    /// How CM MADs travel (`--cm-transport qp1|udp`); `None`: the provider's default (QP1 on
    /// the software provider, UDP on libibverbs, whose QP1 the kernel owns).
    pub cm_transport: Option<CmTransport>,
    /// UDP port of the CM MAD side channel (`--mad-port`, default 4792); see
    /// [`crate::mad::MadUdp`].
    pub mad_port: u16,
    /// Verify the ICRC of IPv4 packets on the software provider (`--no-icrc-v4` turns it off;
    /// needed with the kernel's rxe, which sends random IPv4 IDs).
    pub verify_icrc_v4: bool,
    /// Use UDP GSO/GRO on the software provider's socket (`--no-udp-offload` turns it off; see
    /// [`crate::soft::provider::UdpOffload`]).
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
    /// Connected-mode QP budget (`--max-conn-qp`, default 128), SRQ or not.
    pub max_conn_qp: u32,
    /// What to do when the budget is exhausted (`--evict`/`--reject`, default evict).
    pub qp_budget_policy: QpBudgetPolicy,
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
    /// Control socket path (`--control-socket`, default `/run/ipoib-cm/<ifname>.sock`).
    pub control_socket: PathBuf,
    /// Log filter (`--log`, default `info`).
    pub log: String,
}

impl Config {
    /// The path MTU to use: the configured one, else the largest that fits the underlay
    /// `link_mtu`, else [`FALLBACK_PATH_MTU`].
    pub fn effective_path_mtu(&self, link_mtu: Option<u32>) -> PathMtu {
        self.path_mtu
            .or_else(|| link_mtu.map(path_mtu_for_link_mtu))
            .unwrap_or(FALLBACK_PATH_MTU)
    }
}

/// The flags of `ipoib-cm up`; `#[command(flatten)]` it into the subcommand.
///
/// Values are taken as text and validated by [`resolve`], so that every mistake gives the
/// same one-line error format whether it came from a flag or the file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct UpArgs {
    /// TOML configuration file; flags override its keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Interface name [default: ib0].
    #[arg(long, value_name = "NAME")]
    pub ifname: Option<String>,
    /// Address of the interface, IPv4 or IPv6 CIDR (repeatable).
    #[arg(long, value_name = "CIDR")]
    pub addr: Vec<String>,
    /// Underlay address of the software provider (required, here or in the file).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Underlay address of another node (repeatable); broadcast is fanned out to them.
    #[arg(long, value_name = "ADDR")]
    pub peer: Vec<String>,
    /// Static neighbour, IP=HWADDR with the 20-byte hardware address in `ip link` form
    /// (repeatable).
    #[arg(long, value_name = "IP=HWADDR")]
    pub neigh: Vec<String>,
    /// RoCEv2 UDP port [default: 4791].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub udp_port: Option<String>,
    /// How CM MADs travel: qp1 or udp [default: qp1 on soft, udp on verbs].
    #[arg(long, value_name = "TRANSPORT")]
    pub cm_transport: Option<String>,
    /// UDP port of the CM MAD side channel (--cm-transport udp) [default: 4792].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub mad_port: Option<String>,
    /// Don't verify the ICRC of IPv4 packets (needed with the kernel's rxe).
    #[arg(long)]
    pub no_icrc_v4: bool,
    /// Send and receive one UDP datagram per syscall: no GSO trains, no GRO (captures on a
    /// veth then show every RoCE packet as sent).
    #[arg(long)]
    pub no_udp_offload: bool,
    /// Local ACK timeout exponent of RC QPs, 4.096 us * 2^N, 8..=24 [default: 12].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub qp_timeout: Option<String>,
    /// IPoIB mode: connected or datagram [default: connected].
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// Do not use a shared receive queue.
    #[arg(long)]
    pub no_srq: bool,
    /// Reap RX connections idle this long, at least 1s [default: 60s].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub rx_timeout: Option<String>,
    /// Give up waiting for a QP to drain after this long [default: 5s].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub drain_timeout: Option<String>,
    /// Fail a TX connection whose sends complete none for this long, freeing its send
    /// buffers for other peers [default: 1s, or 4 local ACK timeouts if longer].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub tx_stall_timeout: Option<String>,
    /// Spin looking for events this long after each one, e.g. 200us; at most 10ms [default: 0].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub busy_poll: Option<String>,
    /// Forget neighbours after this long [default: 300s].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub neigh_timeout: Option<String>,
    /// Connected-mode QP budget [default: 128].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_conn_qp: Option<String>,
    /// When the QP budget is spent, evict the idlest RX connection (default).
    #[arg(long, conflicts_with = "reject")]
    pub evict: bool,
    /// When the QP budget is spent, reject new connections.
    #[arg(long)]
    pub reject: bool,
    /// Packets queued per neighbour while it connects [default: 3].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub tx_queue_len: Option<String>,
    /// IB path MTU: 256, 512, 1024, 2048 or 4096 [default: from the underlay link MTU].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub path_mtu: Option<String>,
    /// Fault injection on what the software provider sends.
    #[command(flatten)]
    pub faults: FaultFlags,
    /// Provider quirk: drain-never, no-last-wqe or dup-last-wqe (repeatable).
    #[arg(long, value_name = "QUIRK")]
    pub quirk: Vec<String>,
    /// Control socket [default: /run/ipoib-cm/IFNAME.sock].
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    /// Log filter: off, error, warn, info, debug, trace or target=level,... [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log: Option<String>,
}

/// A duration in the config file: a string (`"5s"`) or an integer number of seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationValue(pub String);

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = DurationValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration like \"5s\" or a number of seconds")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationValue, E> {
                Ok(DurationValue(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationValue, E> {
                Ok(DurationValue(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationValue, E> {
                Ok(DurationValue(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The fault-injection flags of the software provider, shared by `ipoib-cm up` and the
/// tools; `#[command(flatten)]` it. Values are text, validated by [`FaultFlags::resolve`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FaultFlags {
    /// Percentage of sent packets the software provider drops.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true)]
    pub fault_loss: Option<String>,
    /// Percentage of sent packets the software provider reorders.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true)]
    pub fault_reorder: Option<String>,
    /// Percentage of sent packets the software provider duplicates.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true)]
    pub fault_dup: Option<String>,
    /// Percentage of sent packets the software provider corrupts.
    #[arg(long, value_name = "PCT", allow_negative_numbers = true)]
    pub fault_corrupt: Option<String>,
    /// Seed of the fault RNG [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub fault_seed: Option<String>,
}

impl FaultFlags {
    /// The flags over the file's `fault_*` keys (pass `ConfigFile::default()` without a file).
    ///
    /// # Errors
    /// A one-line [`ConfigError`] naming the flag or key.
    pub fn resolve(&self, file: &ConfigFile) -> Result<FaultConfig, ConfigError> {
        let seed = pick_int(
            "fault_seed",
            self.fault_seed.as_deref(),
            file.fault_seed,
            0,
            i64::MAX,
        )?
        .map_or(1, |v| v as u64);
        Ok(FaultConfig {
            loss_pct: pick_pct("fault_loss", self.fault_loss.as_deref(), file.fault_loss)?,
            reorder_pct: pick_pct(
                "fault_reorder",
                self.fault_reorder.as_deref(),
                file.fault_reorder,
            )?,
            dup_pct: pick_pct("fault_dup", self.fault_dup.as_deref(), file.fault_dup)?,
            corrupt_pct: pick_pct(
                "fault_corrupt",
                self.fault_corrupt.as_deref(),
                file.fault_corrupt,
            )?,
            seed,
        })
    }
}

/// The TOML configuration file: every key optional, unknown keys rejected.
///
/// Values are validated by [`resolve`], which names the key in its errors.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// See [`Config::ifname`].
    pub ifname: Option<String>,
    /// See [`Config::addr`].
    pub addr: Option<Vec<String>>,
    /// See [`Config::bind`].
    pub bind: Option<String>,
    /// See [`Config::peer`].
    pub peer: Option<Vec<String>>,
    /// See [`Config::neigh`].
    pub neigh: Option<Vec<String>>,
    /// See [`Config::udp_port`].
    pub udp_port: Option<i64>,
    /// See [`Config::cm_transport`].
    pub cm_transport: Option<String>,
    /// See [`Config::mad_port`].
    pub mad_port: Option<i64>,
    /// See [`Config::verify_icrc_v4`].
    pub verify_icrc_v4: Option<bool>,
    /// See [`Config::udp_offload`].
    pub udp_offload: Option<bool>,
    /// See [`Config::qp_timeout`].
    pub qp_timeout: Option<i64>,
    /// See [`Config::mode`].
    pub mode: Option<String>,
    /// See [`Config::srq`].
    pub srq: Option<bool>,
    /// See [`Config::rx_timeout`].
    pub rx_timeout: Option<DurationValue>,
    /// See [`Config::drain_timeout`].
    pub drain_timeout: Option<DurationValue>,
    /// See [`Config::tx_stall_timeout`].
    pub tx_stall_timeout: Option<DurationValue>,
    /// See [`Config::busy_poll`].
    pub busy_poll: Option<DurationValue>,
    /// See [`Config::neigh_timeout`].
    pub neigh_timeout: Option<DurationValue>,
    /// See [`Config::max_conn_qp`].
    pub max_conn_qp: Option<i64>,
    /// See [`Config::qp_budget_policy`].
    pub qp_budget_policy: Option<String>,
    /// See [`Config::tx_queue_len`].
    pub tx_queue_len: Option<i64>,
    /// See [`Config::path_mtu`].
    pub path_mtu: Option<i64>,
    /// See [`FaultConfig::loss_pct`].
    pub fault_loss: Option<f64>,
    /// See [`FaultConfig::reorder_pct`].
    pub fault_reorder: Option<f64>,
    /// See [`FaultConfig::dup_pct`].
    pub fault_dup: Option<f64>,
    /// See [`FaultConfig::corrupt_pct`].
    pub fault_corrupt: Option<f64>,
    /// See [`FaultConfig::seed`].
    pub fault_seed: Option<i64>,
    /// See [`Config::quirks`].
    pub quirk: Option<Vec<String>>,
    /// See [`Config::control_socket`].
    pub control_socket: Option<PathBuf>,
    /// See [`Config::log`].
    pub log: Option<String>,
}

/// A configuration mistake. Its `Display` is the one line to print; exit with
/// [`ConfigError::EXIT_CODE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {}: {message}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error, without its `(os error N)` suffix.
        message: String,
    },
    /// The config file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("config file {}: {}{message}", path.display(), line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the mistake, when known.
        line: Option<usize>,
        /// What is wrong, one line.
        message: String,
    },
    /// A value is invalid.
    #[error("{field}: {message}")]
    Invalid {
        /// The field as the user wrote it: `--rx-timeout` or `config: rx_timeout`.
        field: String,
        /// What is wrong, one line.
        message: String,
    },
}

impl ConfigError {
    /// The process exit code for a configuration mistake.
    pub const EXIT_CODE: u8 = 2;
}

/// An I/O error's text without the `(os error N)` suffix std appends.
pub(crate) fn os_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_owned(),
        _ => s,
    }
}

/// Where a value came from, to name it in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Flag,
    File,
}

impl Origin {
    /// Where a value that was given came from: the flag if it was set, else the file.
    fn of<T>(flag: Option<T>) -> Self {
        if flag.is_some() {
            Self::Flag
        } else {
            Self::File
        }
    }

    /// `--rx-timeout` or `config: rx_timeout` for the config key `rx_timeout`.
    fn name(self, key: &str) -> String {
        match self {
            Self::Flag => format!("--{}", key.replace('_', "-")),
            Self::File => format!("config: {key}"),
        }
    }

    fn err(self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            field: self.name(key),
            message: message.into(),
        }
    }
}

/// The flag's value if given, else the file's, with where it came from.
fn pick<F, T>(flag: Option<F>, file: Option<T>) -> Option<(Origin, Choice<F, T>)> {
    match (flag, file) {
        (Some(f), _) => Some((Origin::Flag, Choice::Flag(f))),
        (None, Some(t)) => Some((Origin::File, Choice::File(t))),
        (None, None) => None,
    }
}

/// A value from a flag or from the file.
#[derive(Clone, Copy)]
enum Choice<F, T> {
    Flag(F),
    File(T),
}

/// Picks a text value (flag string or file string).
fn pick_str<'a>(flag: Option<&'a str>, file: Option<&'a str>) -> Option<(Origin, &'a str)> {
    pick(flag, file).map(|(o, c)| match c {
        Choice::Flag(s) | Choice::File(s) => (o, s),
    })
}

/// Picks an integer in `lo..=hi`: a flag string or a file integer.
pub(crate) fn pick_int(
    key: &str,
    flag: Option<&str>,
    file: Option<i64>,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ConfigError> {
    let Some((origin, c)) = pick(flag, file) else {
        return Ok(None);
    };
    let v = match c {
        Choice::Flag(s) => s
            .parse::<i64>()
            .map_err(|_| origin.err(key, format!("invalid number {s:?}")))?,
        Choice::File(v) => v,
    };
    if !(lo..=hi).contains(&v) {
        return Err(origin.err(key, format!("must be between {lo} and {hi} (got {v})")));
    }
    Ok(Some(v))
}

/// Picks a duration of at least `min`: a flag string or a file string/integer.
pub(crate) fn pick_duration(
    key: &str,
    flag: Option<&str>,
    file: Option<&DurationValue>,
    min: Duration,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let Some((origin, s)) = pick_str(flag, file.map(|d| d.0.as_str())) else {
        return Ok(default);
    };
    let d = parse_duration(s).map_err(|m| origin.err(key, m))?;
    if d < min {
        let what = if min == Duration::from_millis(1) {
            "must be positive".to_owned()
        } else {
            format!("must be at least {}", format_duration(min))
        };
        return Err(origin.err(key, format!("{what} (got {s:?})")));
    }
    Ok(d)
}

/// Picks a percentage in 0..=100: a flag string or a file number.
fn pick_pct(key: &str, flag: Option<&str>, file: Option<f64>) -> Result<f64, ConfigError> {
    let Some((origin, c)) = pick(flag, file) else {
        return Ok(0.0);
    };
    let v = match c {
        Choice::Flag(s) => s
            .parse::<f64>()
            .map_err(|_| origin.err(key, format!("invalid percentage {s:?}")))?,
        Choice::File(v) => v,
    };
    if !(0.0..=100.0).contains(&v) {
        return Err(origin.err(
            key,
            format!("must be a percentage between 0 and 100 (got {v})"),
        ));
    }
    Ok(v)
}

/// Picks a repeatable value: the flags if any were given, else the file's list.
fn pick_list<'a>(flag: &'a [String], file: Option<&'a [String]>) -> (Origin, &'a [String]) {
    if !flag.is_empty() {
        (Origin::Flag, flag)
    } else {
        (Origin::File, file.unwrap_or(&[]))
    }
}

/// Parses the text of a config file. Pure; `path` only names the file in errors.
///
/// # Errors
/// [`ConfigError::Parse`] naming the line: TOML syntax, unknown key, wrong type.
pub fn parse_config_file(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let mut message = e
            .message()
            .lines()
            .next()
            .unwrap_or("invalid TOML")
            .trim()
            .to_owned();
        for (from, to) in [
            ("expected i64", "expected an integer"),
            ("expected u64", "expected a non-negative integer"),
            ("expected f64", "expected a number"),
            ("expected a sequence", "expected an array"),
        ] {
            message = message.replace(from, to);
        }
        if let Some(rest) = message.strip_prefix("unknown field `") {
            let name = rest.split('`').next().unwrap_or_default();
            message = format!("unknown field {name:?}");
        } else if let Some(key) = e.span().and_then(|s| key_at(text, s.start)) {
            if !message.contains(&format!("`{key}`")) {
                message = format!("{key}: {message}");
            }
        }
        ConfigError::Parse {
            path: path.to_owned(),
            line,
            message,
        }
    })
}

/// 1-based line number of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text.as_bytes()[..at]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The bare key of the `key = value` line holding byte offset `at`.
fn key_at(text: &str, at: usize) -> Option<String> {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = &text[start..end];
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then(|| key.to_owned())
}

/// Reads `file` (if any), applies `flags` over it, validates and returns the [`Config`].
///
/// Pass `flags.config.as_deref()` as `file`.
///
/// # Errors
/// A one-line [`ConfigError`] naming the field; exit with [`ConfigError::EXIT_CODE`].
pub fn resolve(file: Option<&Path>, flags: &UpArgs) -> Result<Config, ConfigError> {
    let parsed = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                path: path.to_owned(),
                message: os_message(&e),
            })?;
            parse_config_file(path, &text)?
        }
        None => ConfigFile::default(),
    };
    resolve_parsed(&parsed, flags)
}

/// [`resolve`] on config text instead of a file. Pure.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_str(path: &Path, text: &str, flags: &UpArgs) -> Result<Config, ConfigError> {
    resolve_parsed(&parse_config_file(path, text)?, flags)
}

/// Applies `flags` over an already parsed file and validates. Pure.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_parsed(file: &ConfigFile, flags: &UpArgs) -> Result<Config, ConfigError> {
    let ifname = match pick_str(flags.ifname.as_deref(), file.ifname.as_deref()) {
        Some((origin, s)) => {
            check_ifname(s).map_err(|m| origin.err("ifname", m))?;
            s.to_owned()
        }
        None => DEFAULT_IFNAME.to_owned(),
    };

    let (origin, list) = pick_list(&flags.addr, file.addr.as_deref());
    let addr = list
        .iter()
        .map(|s| s.parse::<Cidr>().map_err(|m| origin.err("addr", m)))
        .collect::<Result<Vec<_>, _>>()?;

    let bind = match pick_str(flags.bind.as_deref(), file.bind.as_deref()) {
        Some((origin, s)) => s
            .parse::<IpAddr>()
            .map_err(|_| origin.err("bind", format!("invalid IP address {s:?}")))?,
        None => {
            return Err(ConfigError::Invalid {
                field: "--bind".to_owned(),
                message: "required (the underlay address of the software provider; or bind in the config file)".to_owned(),
            })
        }
    };

    let (origin, list) = pick_list(&flags.peer, file.peer.as_deref());
    let mut peer = Vec::with_capacity(list.len());
    for s in list {
        let ip = s
            .parse::<IpAddr>()
            .map_err(|_| origin.err("peer", format!("invalid IP address {s:?}")))?;
        if ip.is_ipv4() != bind.is_ipv4() {
            return Err(origin.err(
                "peer",
                format!("{ip} is not the same address family as bind address {bind}"),
            ));
        }
        if ip == bind {
            return Err(origin.err("peer", format!("{ip} is the bind address itself")));
        }
        peer.push(ip);
    }

    let (origin, list) = pick_list(&flags.neigh, file.neigh.as_deref());
    let mut neigh = Vec::with_capacity(list.len());
    for s in list {
        let bad = || origin.err("neigh", format!("expected IP=HWADDR, got {s:?}"));
        let (ip, hw) = s.split_once('=').ok_or_else(bad)?;
        let ip = ip.trim().parse::<IpAddr>().map_err(|_| bad())?;
        let hw = hw
            .trim()
            .parse::<crate::wire::ipoib::HwAddr>()
            .map_err(|_| bad())?;
        neigh.push((ip, hw));
    }

    let udp_port = pick_int(
        "udp_port",
        flags.udp_port.as_deref(),
        file.udp_port,
        1,
        i64::from(u16::MAX),
    )?
    .map_or(DEFAULT_UDP_PORT, |v| v as u16);

    let cm_transport = match pick_str(flags.cm_transport.as_deref(), file.cm_transport.as_deref()) {
        Some((origin, s)) => Some(
            s.parse::<CmTransport>()
                .map_err(|m| origin.err("cm_transport", m))?,
        ),
        None => None,
    };

    let mad_port = pick_int(
        "mad_port",
        flags.mad_port.as_deref(),
        file.mad_port,
        1,
        i64::from(u16::MAX),
    )?
    .map_or(crate::mad::DEFAULT_MAD_PORT, |v| v as u16);

    let verify_icrc_v4 = if flags.no_icrc_v4 {
        false
    } else {
        file.verify_icrc_v4.unwrap_or(true)
    };
    let udp_offload = !flags.no_udp_offload && file.udp_offload.unwrap_or(true);

    let qp_timeout = pick_int(
        "qp_timeout",
        flags.qp_timeout.as_deref(),
        file.qp_timeout,
        8,
        24,
    )?
    .map_or(DEFAULT_QP_TIMEOUT, |v| v as u8);

    let mode = match pick_str(flags.mode.as_deref(), file.mode.as_deref()) {
        Some((origin, s)) => s.parse::<Mode>().map_err(|m| origin.err("mode", m))?,
        None => Mode::default(),
    };

    let srq = if flags.no_srq {
        false
    } else {
        file.srq.unwrap_or(true)
    };

    let rx_timeout = pick_duration(
        "rx_timeout",
        flags.rx_timeout.as_deref(),
        file.rx_timeout.as_ref(),
        MIN_RX_TIMEOUT,
        DEFAULT_RX_TIMEOUT,
    )?;
    let drain_timeout = pick_duration(
        "drain_timeout",
        flags.drain_timeout.as_deref(),
        file.drain_timeout.as_ref(),
        Duration::from_millis(1),
        DEFAULT_DRAIN_TIMEOUT,
    )?;
    let ack_timeout = crate::wire::cm::ibta_timeout(qp_timeout);
    let tx_stall_timeout = pick_duration(
        "tx_stall_timeout",
        flags.tx_stall_timeout.as_deref(),
        file.tx_stall_timeout.as_ref(),
        Duration::from_millis(1),
        DEFAULT_TX_STALL_TIMEOUT.max(ack_timeout * TX_STALL_ACK_TIMEOUTS),
    )?;
    if tx_stall_timeout <= ack_timeout {
        return Err(Origin::of(flags.tx_stall_timeout.as_ref()).err(
            "tx_stall_timeout",
            format!(
                "must be longer than the local ACK timeout of qp_timeout {qp_timeout} ({})",
                format_duration(ack_timeout)
            ),
        ));
    }
    let busy_poll = pick_duration(
        "busy_poll",
        flags.busy_poll.as_deref(),
        file.busy_poll.as_ref(),
        Duration::ZERO,
        Duration::ZERO,
    )?;
    if busy_poll > MAX_BUSY_POLL {
        return Err(Origin::of(flags.busy_poll.as_ref()).err(
            "busy_poll",
            format!("must be at most {}", format_duration(MAX_BUSY_POLL)),
        ));
    }
    let neigh_timeout = pick_duration(
        "neigh_timeout",
        flags.neigh_timeout.as_deref(),
        file.neigh_timeout.as_ref(),
        MIN_NEIGH_TIMEOUT,
        DEFAULT_NEIGH_TIMEOUT,
    )?;

    let max_conn_qp = pick_int(
        "max_conn_qp",
        flags.max_conn_qp.as_deref(),
        file.max_conn_qp,
        1,
        i64::from(MAX_MAX_CONN_QP),
    )?
    .map_or(DEFAULT_MAX_CONN_QP, |v| v as u32);

    let qp_budget_policy = if flags.reject {
        QpBudgetPolicy::Reject
    } else if flags.evict {
        QpBudgetPolicy::Evict
    } else {
        match file.qp_budget_policy.as_deref() {
            Some(s) => s
                .parse::<QpBudgetPolicy>()
                .map_err(|m| Origin::File.err("qp_budget_policy", m))?,
            None => QpBudgetPolicy::default(),
        }
    };

    let tx_queue_len = pick_int(
        "tx_queue_len",
        flags.tx_queue_len.as_deref(),
        file.tx_queue_len,
        1,
        i64::from(MAX_TX_QUEUE_LEN),
    )?
    .map_or(DEFAULT_TX_QUEUE_LEN, |v| v as u32);

    let path_mtu = match pick(flags.path_mtu.as_deref(), file.path_mtu) {
        None => None,
        Some((origin, c)) => {
            let v = match c {
                Choice::Flag(s) => s.parse::<i64>().ok(),
                Choice::File(v) => Some(v),
            };
            let mtu = match v {
                Some(256) => PathMtu::Mtu256,
                Some(512) => PathMtu::Mtu512,
                Some(1024) => PathMtu::Mtu1024,
                Some(2048) => PathMtu::Mtu2048,
                Some(4096) => PathMtu::Mtu4096,
                _ => {
                    let got = match c {
                        Choice::Flag(s) => format!("{s:?}"),
                        Choice::File(v) => v.to_string(),
                    };
                    return Err(origin.err(
                        "path_mtu",
                        format!("must be 256, 512, 1024, 2048 or 4096 (got {got})"),
                    ));
                }
            };
            Some(mtu)
        }
    };

    let fault = flags.faults.resolve(file)?;

    let (origin, list) = pick_list(&flags.quirk, file.quirk.as_deref());
    let mut quirks = Quirks::default();
    for q in list {
        add_quirk(&mut quirks, q).map_err(|m| origin.err("quirk", m))?;
    }

    let control_socket = match pick(
        flags.control_socket.as_deref(),
        file.control_socket.as_deref(),
    ) {
        Some((origin, c)) => {
            let p = match c {
                Choice::Flag(p) | Choice::File(p) => p,
            };
            if p.as_os_str().is_empty() {
                return Err(origin.err("control_socket", "must not be empty"));
            }
            // sun_path holds 108 bytes including the NUL.
            if p.as_os_str().len() > 107 {
                return Err(origin.err(
                    "control_socket",
                    format!("path is longer than 107 bytes ({})", p.display()),
                ));
            }
            p.to_owned()
        }
        None => default_control_socket(&ifname),
    };

    let log = match pick_str(flags.log.as_deref(), file.log.as_deref()) {
        Some((origin, s)) => {
            check_log(s).map_err(|m| origin.err("log", m))?;
            s.to_owned()
        }
        None => DEFAULT_LOG.to_owned(),
    };

    Ok(Config {
        ifname,
        addr,
        bind,
        peer,
        neigh,
        udp_port,
        cm_transport,
        mad_port,
        verify_icrc_v4,
        udp_offload,
        qp_timeout,
        mode,
        srq,
        rx_timeout,
        drain_timeout,
        tx_stall_timeout,
        busy_poll,
        neigh_timeout,
        max_conn_qp,
        qp_budget_policy,
        tx_queue_len,
        path_mtu,
        fault,
        quirks,
        control_socket,
        log,
    })
}
