//! The options of a perf run ([`PerfOptions`]) and the flags they are read from
//! ([`PerfArgs`]).

use std::net::IpAddr;
use std::time::Duration;

use crate::setting::{pick_duration, pick_int, ConfigError, FaultFlags};
use crate::soft::provider::UdpOffload;
use crate::tools::{Options, RcLink, ROCE_V2_UDP_PORT};
use crate::verbs::setup::DEFAULT_LOCAL_ACK_TIMEOUT;
use crate::verbs::PathMtu;

/// The default TCP port of the exchange (rc-pingpong's 18515 plus one, so both can run).
pub const DEFAULT_TCP_PORT: u16 = 18516;

/// Largest message (`-s`).
pub const MAX_SIZE: usize = 1 << 24;

/// Most memory the receive and send buffers of one side may take.
pub const MAX_BUFFER_BYTES: usize = 1 << 30;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Streaming SENDs, like `ib_send_bw`.
    Bw,
    /// Ping-pong, like `ib_send_lat`.
    Lat,
}

impl Mode {
    /// `"bw"` or `"lat"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bw => "bw",
            Self::Lat => "lat",
        }
    }
}

/// What perf takes beyond [`Options`] (whose `iters` are messages with `--bw`, round trips
/// with `--lat`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perf {
    /// Bandwidth or latency.
    pub mode: Mode,
    /// Path MTU, ACK timeout and faults.
    pub link: RcLink,
    /// Sends outstanding at most.
    pub tx_depth: u32,
    /// UDP GSO/GRO.
    pub offload: UdpOffload,
}

/// A validated perf run; everything, the exchange included, ends by its deadline.
pub type PerfOptions = Options<Perf>;

/// The flags of `ipoib-cm perf`; `#[command(flatten)]` it. Values are text, validated by
/// [`PerfArgs::resolve`] into one-line errors that name the flag.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PerfArgs {
    /// Server to connect to; without it, wait for one client.
    #[arg(value_name = "SERVER_IP")]
    pub server: Option<String>,
    /// Measure bandwidth: stream SENDs (the default).
    #[arg(long)]
    pub bw: bool,
    /// Measure latency: ping-pong, half the round trip.
    #[arg(long)]
    pub lat: bool,
    /// TCP port of the QP-info exchange [default: 18516].
    #[arg(short = 'p', long, value_name = "PORT", allow_negative_numbers = true)]
    pub port: Option<String>,
    /// Message size in bytes [default: 65536 with --bw, 2 with --lat].
    #[arg(short = 's', long, value_name = "BYTES", allow_negative_numbers = true)]
    pub size: Option<String>,
    /// Messages (--bw) or round trips (--lat) [default: 1000].
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true)]
    pub iters: Option<String>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 [default: 4096].
    #[arg(short = 'm', long, value_name = "BYTES", allow_negative_numbers = true)]
    pub mtu: Option<String>,
    /// Sends outstanding at most [default: 128].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub tx_depth: Option<String>,
    /// Receives kept posted [default: 512].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub rx_depth: Option<String>,
    /// Local underlay address (default: the route to the server, or the address the client
    /// reached).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// UDP port of RoCEv2 traffic, both directions [default: 4791].
    #[arg(long, value_name = "PORT", allow_negative_numbers = true)]
    pub udp_port: Option<String>,
    /// Local ACK timeout exponent: 4.096 us * 2^N [default: 14].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub qp_timeout: Option<String>,
    /// Don't verify the ICRC of IPv4 packets.
    #[arg(long)]
    pub no_icrc_v4: bool,
    /// Send and receive datagram by datagram (no UDP GSO/GRO).
    #[arg(long)]
    pub no_udp_offload: bool,
    /// Give up after this long, the wait for the client included (e.g. 30, 30s, 2m)
    /// [default: 60s].
    #[arg(long, value_name = "SECS")]
    pub deadline: Option<String>,
    /// Print the provider's counters at the end.
    #[arg(long)]
    pub stats: bool,
    /// End with one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Fault injection on what this side sends.
    #[command(flatten)]
    pub faults: FaultFlags,
}

/// A one-line error for `field`.
fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

fn parse_ip(field: &str, text: Option<&str>) -> Result<Option<IpAddr>, ConfigError> {
    text.map(|s| {
        s.parse()
            .map_err(|_| invalid(field, format!("invalid IP address {s:?}")))
    })
    .transpose()
}

impl PerfArgs {
    /// Validates the flags.
    ///
    /// # Errors
    /// A one-line [`ConfigError`] naming the flag; exit with [`ConfigError::EXIT_CODE`].
    pub fn resolve(&self) -> Result<PerfOptions, ConfigError> {
        if self.bw && self.lat {
            return Err(invalid("--lat", "conflicts with --bw (one mode a run)"));
        }
        let mode = if self.lat { Mode::Lat } else { Mode::Bw };
        let peer = parse_ip("SERVER_IP", self.server.as_deref())?;
        let bind = parse_ip("--bind", self.bind.as_deref())?;
        if let (Some(p), Some(b)) = (peer, bind) {
            if p.is_ipv4() != b.is_ipv4() {
                return Err(invalid(
                    "--bind",
                    format!("{b} is not the same address family as the server {p}"),
                ));
            }
        }
        let int = |key: &str, text: &Option<String>, lo: i64, hi: i64, default: i64| {
            pick_int(key, text.as_deref(), None, lo, hi).map(|v| v.unwrap_or(default))
        };
        let default_size = match mode {
            Mode::Bw => 65536,
            Mode::Lat => 2,
        };
        let size = int("size", &self.size, 1, MAX_SIZE as i64, default_size)? as usize;
        let tx_depth = int("tx_depth", &self.tx_depth, 1, 8192, 128)? as u32;
        let rx_depth = int("rx_depth", &self.rx_depth, 1, 16384, 512)? as u32;
        let buffers = size * (tx_depth as usize + rx_depth as usize);
        if buffers > MAX_BUFFER_BYTES {
            return Err(invalid(
                "--size",
                format!(
                    "{size} B x ({rx_depth} receives + {tx_depth} sends) is over 1 GiB of buffers; lower --size, --rx-depth or --tx-depth"
                ),
            ));
        }
        let mtu_bytes = int("mtu", &self.mtu, 256, 4096, 4096)?;
        let mtu = PathMtu::from_bytes(mtu_bytes as usize).ok_or_else(|| {
            invalid(
                "--mtu",
                format!("must be 256, 512, 1024, 2048 or 4096 (got {mtu_bytes})"),
            )
        })?;
        Ok(Options {
            peer,
            bind,
            tcp_port: int("port", &self.port, 1, 65535, i64::from(DEFAULT_TCP_PORT))? as u16,
            udp_port: int(
                "udp_port",
                &self.udp_port,
                1,
                65535,
                i64::from(ROCE_V2_UDP_PORT),
            )? as u16,
            size,
            iters: int("iters", &self.iters, 1, 100_000_000, 1000)? as u32,
            rx_depth,
            verify_icrc_v4: !self.no_icrc_v4,
            deadline: pick_duration(
                "deadline",
                self.deadline.as_deref(),
                None,
                Duration::from_secs(1),
                Duration::from_secs(60),
            )?,
            tool: Perf {
                mode,
                link: RcLink {
                    mtu,
                    qp_timeout: int(
                        "qp_timeout",
                        &self.qp_timeout,
                        1,
                        31,
                        i64::from(DEFAULT_LOCAL_ACK_TIMEOUT),
                    )? as u8,
                    faults: self.faults.to_config()?,
                },
                tx_depth,
                offload: if self.no_udp_offload {
                    UdpOffload::Off
                } else {
                    UdpOffload::On
                },
            },
        })
    }
}
