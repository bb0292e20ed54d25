//! `ipoib-cm perf`: the software RC provider alone (no TUN, no IPoIB) between two processes
//! over UDP, like perftest's `ib_send_bw` and `ib_send_lat`.
//!
//! The server (`ipoib-cm perf`) waits for one client on the TCP exchange port; the client
//! (`ipoib-cm perf SERVER_IP`) connects. The QPs are connected by the exchange of
//! [`super::rc_pingpong`] (rdma-core's pingpong format, on port [`DEFAULT_TCP_PORT`] by
//! default): it is not perftest's exchange, so this tool does not pair with `ib_send_bw`.
//! Both sides must be given the same mode, `-s` and `-n`.
//!
//! - `--bw` (default): the client streams `-n` RC SENDs of `-s` bytes, up to `--tx-depth`
//!   outstanding; the server keeps `--rx-depth` receives posted. Both report bytes, seconds,
//!   Gbit/s and messages/s. Both clocks start when the exchange ends (the client after it
//!   sent `"done"`, the server after it read it, so the server's clock starts a little
//!   later than the first send, never after it). The server stops at its last receive
//!   completion: the data arrived. The client stops at its last send completion, which the
//!   server's ACK of the last packet triggers, so it also counts that ACK's trip back. The
//!   server's figure is the honest one for what the data did; the client's is a little lower.
//! - `--lat`: ping-pong of `-n` messages of `-s` bytes; the client sends first. Each side
//!   times every round trip from posting its send to the completion of the peer's answer, and
//!   reports half of it (RTT/2) as p50, p99, max and average in microseconds. The client
//!   has `-n` samples, the server `-n - 1` (its last message is answered by nobody).
//!
//! The event loop sleeps in `epoll` between completions, as `ipoib-cm up` does without busy
//! polling; UDP GSO/GRO are on unless `--no-udp-offload`.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::exchange::{exchange_over_tcp, Dest, TcpExchange};
use super::rc_qp::{connect_rc_qp, open_rc_qp, RcQpSetup};
use super::soft_loop::{linger, stats_line, SoftLink, SoftLoop};
use super::{Options, PingpongError, RcLink, RECV_WRID, ROCE_V2_UDP_PORT, SEND_WRID};
use crate::daemon::config::{pick_duration, pick_int, ConfigError, FaultFlags};
use crate::soft::provider::UdpOffload;
use crate::verbs::setup::{clock_seed, DEFAULT_LOCAL_ACK_TIMEOUT};
use crate::verbs::{
    BufId, Completion, CqId, PathMtu, Provider, QpNum, SendWr, Verbs, WcOpcode, WcStatus,
};

/// The default TCP port of the exchange (rc-pingpong's 18515 plus one, so both can run).
pub const DEFAULT_TCP_PORT: u16 = 18516;

/// Largest message (`-s`).
pub const MAX_SIZE: usize = 1 << 24;

/// Most memory the receive and send buffers of one side may take.
pub const MAX_BUFFER_BYTES: usize = 1 << 30;

/// Longest sleep of the event loop without a timer or readiness.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// Completions taken per poll.
const CQ_BATCH: usize = 256;

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

/// One-way latency figures: half of each round trip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
    /// Mean.
    pub avg: Duration,
    /// Round trips timed.
    pub samples: usize,
}

impl Latency {
    /// The figures of `round_trips` (sorted in place); `None` without any.
    pub fn of_round_trips(round_trips: &mut [Duration]) -> Option<Self> {
        round_trips.sort_unstable();
        let n = round_trips.len();
        let max = *round_trips.last()?;
        // Nearest rank: the smallest sample with at least p% of them at or below it.
        let rank = |pct: usize| round_trips[(n * pct).div_ceil(100).clamp(1, n) - 1];
        let total: Duration = round_trips.iter().sum();
        Some(Self {
            p50: rank(50) / 2,
            p99: rank(99) / 2,
            max: max / 2,
            avg: total / (2 * n as u32).max(1),
            samples: n,
        })
    }
}

/// What one side measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Bandwidth or latency.
    pub mode: Mode,
    /// This side connected (the client) rather than waited.
    pub is_client: bool,
    /// Message size in bytes.
    pub size: usize,
    /// Messages (bw) or round trips (lat).
    pub iters: u32,
    /// The measured time (see the module docs for what it spans).
    pub elapsed: Duration,
    /// With `--lat`, and at least one round trip timed.
    pub latency: Option<Latency>,
    /// The provider's counters (`soft-rc: tx_packets=… …`, one line).
    pub stats: String,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Report {
    /// Bytes this side sent (client) or received (server): size × iters.
    pub fn bytes(&self) -> u64 {
        self.size as u64 * u64::from(self.iters)
    }

    fn side(&self) -> &'static str {
        if self.is_client {
            "client"
        } else {
            "server"
        }
    }

    /// Gbit/s over [`Report::elapsed`] (bw only).
    pub fn gbit_per_s(&self) -> Option<f64> {
        (self.mode == Mode::Bw)
            .then(|| self.bytes() as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9)
    }

    /// Messages per second over [`Report::elapsed`] (bw only).
    pub fn msg_per_s(&self) -> Option<f64> {
        (self.mode == Mode::Bw)
            .then(|| f64::from(self.iters) / self.elapsed.as_secs_f64().max(1e-9))
    }

    /// The human-readable result line.
    pub fn text(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        match (self.mode, &self.latency) {
            (Mode::Bw, _) => format!(
                "bw {side}: {bytes} bytes in {secs:.4} seconds = {gbit:.2} Gbit/s, {mps:.0} msg/s ({iters} x {size} B; {what})",
                side = self.side(),
                bytes = self.bytes(),
                gbit = self.gbit_per_s().unwrap_or(0.0),
                mps = self.msg_per_s().unwrap_or(0.0),
                iters = self.iters,
                size = self.size,
                what = if self.is_client {
                    "until the last send completed"
                } else {
                    "until the last receive completed"
                },
            ),
            (Mode::Lat, Some(l)) => format!(
                "lat {side}: {iters} x {size} B round trips in {secs:.4} seconds; one-way (RTT/2) p50 {p50:.2} us, p99 {p99:.2} us, max {max:.2} us, avg {avg:.2} us ({n} samples)",
                side = self.side(),
                iters = self.iters,
                size = self.size,
                p50 = us(l.p50),
                p99 = us(l.p99),
                max = us(l.max),
                avg = us(l.avg),
                n = l.samples,
            ),
            (Mode::Lat, None) => format!(
                "lat {side}: {iters} x {size} B round trips in {secs:.4} seconds; no round trip timed on this side",
                side = self.side(),
                iters = self.iters,
                size = self.size,
            ),
        }
    }

    /// One JSON object (one line): mode, side, size, iters, bytes, seconds, gbit_s,
    /// msg_per_s and lat_{p50,p99,max,avg}_us (null where they do not apply).
    pub fn json(&self) -> String {
        let lat = |f: fn(&Latency) -> Duration| self.latency.as_ref().map(|l| us(f(l)));
        serde_json::json!({
            "mode": self.mode.name(),
            "side": self.side(),
            "size": self.size,
            "iters": self.iters,
            "bytes": self.bytes(),
            "seconds": self.elapsed.as_secs_f64(),
            "gbit_s": self.gbit_per_s(),
            "msg_per_s": self.msg_per_s(),
            "lat_p50_us": lat(|l| l.p50),
            "lat_p99_us": lat(|l| l.p99),
            "lat_max_us": lat(|l| l.max),
            "lat_avg_us": lat(|l| l.avg),
            "lat_samples": self.latency.as_ref().map(|l| l.samples),
        })
        .to_string()
    }
}

/// What one turn of the loop completed.
#[derive(Debug, Default, Clone, Copy)]
struct Turn {
    sends: u32,
    recvs: u32,
}

impl Turn {
    fn is_idle(self) -> bool {
        self.sends == 0 && self.recvs == 0
    }
}

/// One side's provider, QP and buffers.
struct Run {
    lp: SoftLoop,
    cq: CqId,
    qp: QpNum,
    my: Dest,
    /// Send buffers not posted.
    free_send: Vec<BufId>,
    wcs: Vec<Completion>,
    /// Receives completed so far (to name a bad one).
    received: u32,
}

impl Run {
    fn open(opts: &PerfOptions, local: IpAddr) -> Result<Self, PingpongError> {
        let mut lp = SoftLoop::bind(&SoftLink {
            local,
            udp_port: opts.udp_port,
            verify_icrc_v4: opts.verify_icrc_v4,
            faults: opts.tool.link.faults,
            offload: opts.tool.offload,
        })?;
        let v = lp.prov.verbs();
        let RcQpSetup {
            cq,
            qp,
            send_buf,
            spare_send_bufs,
            my,
            ..
        } = open_rc_qp(
            v,
            opts.size,
            (opts.rx_depth, opts.tool.tx_depth),
            clock_seed(),
        )?;
        let mut free_send = spare_send_bufs;
        free_send.push(send_buf);
        Ok(Self {
            lp,
            cq,
            qp,
            my,
            free_send,
            wcs: Vec::with_capacity(CQ_BATCH),
            received: 0,
        })
    }

    /// Posts one SEND of `size` bytes if a send buffer is free; false if none is.
    fn post_send(&mut self, size: usize) -> Result<bool, PingpongError> {
        let Some(buf) = self.free_send.pop() else {
            return Ok(false);
        };
        self.lp
            .prov
            .verbs()
            .post_send(self.qp, &SendWr::send(SEND_WRID, buf, size))
            .map_err(PingpongError::verbs("Couldn't post send"))?;
        Ok(true)
    }

    /// Does the pending I/O, then takes the completions: send buffers go back to the free
    /// list, receives are checked (length) and posted again.
    fn turn(&mut self, size: usize) -> Result<Turn, PingpongError> {
        self.lp.prov.handle_io(Instant::now())?;
        self.wcs.clear();
        let v = self.lp.prov.verbs();
        v.poll_cq(self.cq, &mut self.wcs, CQ_BATCH);
        let mut t = Turn::default();
        for wc in &self.wcs {
            if wc.status != WcStatus::Success {
                return Err(PingpongError::Completion(*wc));
            }
            let buf = wc.buf.ok_or(PingpongError::NoBuffer(*wc))?;
            match wc.opcode {
                WcOpcode::Send => {
                    self.free_send.push(buf);
                    t.sends += 1;
                }
                WcOpcode::Recv => {
                    if wc.byte_len as usize != size {
                        return Err(PingpongError::Mismatch(self.received));
                    }
                    self.received += 1;
                    t.recvs += 1;
                    v.post_recv(self.qp, RECV_WRID, buf)
                        .map_err(PingpongError::verbs("Couldn't post receive"))?;
                }
            }
        }
        Ok(t)
    }

    /// Sleeps until something may be ready, at most until `deadline`.
    fn idle(&mut self, deadline: Instant) -> Result<(), PingpongError> {
        self.lp.wait(IDLE_WAIT, Some(deadline))
    }
}

/// Counts of a run, to say how far it got when it timed out.
fn check_deadline(
    deadline: Instant,
    opts: &PerfOptions,
    sends: u32,
    recvs: u32,
) -> Result<(), PingpongError> {
    if Instant::now() > deadline {
        return Err(PingpongError::Timeout {
            after: opts.deadline,
            sends,
            recvs,
        });
    }
    Ok(())
}

/// `--bw`: the client keeps up to `tx_depth` sends posted until `iters` have completed; the
/// server takes `iters` receives.
fn stream(run: &mut Run, opts: &PerfOptions, deadline: Instant) -> Result<Duration, PingpongError> {
    let is_client = opts.peer.is_some();
    let start = Instant::now();
    let (mut posted, mut sends, mut recvs) = (0u32, 0u32, 0u32);
    while (if is_client { sends } else { recvs }) < opts.iters {
        check_deadline(deadline, opts, sends, recvs)?;
        while is_client && posted < opts.iters && run.post_send(opts.size)? {
            posted += 1;
        }
        let t = run.turn(opts.size)?;
        sends += t.sends;
        recvs += t.recvs;
        if t.is_idle() {
            run.idle(deadline)?;
        }
    }
    Ok(start.elapsed())
}

/// `--lat`: each side sends when the peer's message arrived (the client first) and times
/// the round trip from its send to the answer. Returns the loop's time and the round trips.
fn ping_pong(
    run: &mut Run,
    opts: &PerfOptions,
    deadline: Instant,
) -> Result<(Duration, Vec<Duration>), PingpongError> {
    let start = Instant::now();
    let mut round_trips = Vec::with_capacity(opts.iters as usize);
    let (mut sent, mut sends_done, mut received) = (0u32, 0u32, 0u32);
    let mut my_turn = opts.peer.is_some();
    let mut sent_at: Option<Instant> = None;
    while received < opts.iters || sends_done < opts.iters {
        check_deadline(deadline, opts, sends_done, received)?;
        if my_turn && sent < opts.iters && run.post_send(opts.size)? {
            sent += 1;
            my_turn = false;
            sent_at = Some(Instant::now());
        }
        let t = run.turn(opts.size)?;
        sends_done += t.sends;
        if t.recvs > 0 {
            let now = Instant::now();
            received += t.recvs;
            if let Some(at) = sent_at.take() {
                round_trips.push(now - at);
            }
            my_turn = true;
        }
        if t.is_idle() {
            run.idle(deadline)?;
        }
    }
    Ok((start.elapsed(), round_trips))
}

/// Runs one side.
///
/// # Errors
/// Any [`PingpongError`]; the caller prints it and exits with
/// [`PingpongError::exit_code`].
pub fn run(opts: &PerfOptions) -> Result<Report, PingpongError> {
    let deadline = Instant::now() + opts.deadline;
    let ex = TcpExchange {
        accept_deadline: Some(deadline),
        ..TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline)
    };
    let (mut run, _) = exchange_over_tcp(
        &ex,
        |local| {
            let run = Run::open(opts, local)?;
            let my = run.my;
            Ok((run, my))
        },
        |run, rem| {
            let psns = (rem.psn, run.my.psn);
            connect_rc_qp(run.lp.prov.verbs(), run.qp, rem, &opts.tool.link, psns)
        },
    )?;
    let is_client = opts.peer.is_some();
    let mode = opts.tool.mode;
    let (elapsed, latency) = match (mode, is_client) {
        (Mode::Bw, _) => (stream(&mut run, opts, deadline)?, None),
        (Mode::Lat, _) => {
            let (elapsed, mut round_trips) = ping_pong(&mut run, opts, deadline)?;
            (elapsed, Latency::of_round_trips(&mut round_trips))
        }
    };
    // The streaming client has nothing left to acknowledge; everyone else may have.
    if mode == Mode::Lat || !is_client {
        linger(&mut run, opts.tool.link.qp_timeout, |run, now, cap| {
            run.lp.prov.handle_io(now)?;
            run.idle(now + cap)
        })?;
    }
    Ok(Report {
        mode,
        is_client,
        size: opts.size,
        iters: opts.iters,
        elapsed,
        latency,
        stats: stats_line(run.lp.prov.engine()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        perf: PerfArgs,
    }

    /// Why a command line was refused: by clap, or by [`PerfArgs::resolve`].
    #[derive(Debug, thiserror::Error)]
    enum Refused {
        #[error("clap: {0}")]
        Clap(#[from] clap::Error),
        #[error(transparent)]
        Resolve(#[from] ConfigError),
    }

    fn parse(args: &[&str]) -> Result<PerfOptions, Refused> {
        let cli = Cli::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))?;
        let opts = cli.perf.resolve().inspect_err(|e| {
            let s = e.to_string();
            assert!(!s.contains('\n'), "multi-line error: {s:?}");
        })?;
        Ok(opts)
    }

    fn err(args: &[&str]) -> String {
        parse(args).expect_err("should be rejected").to_string()
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.tool.mode, Mode::Bw);
        assert_eq!(o.peer, None);
        assert_eq!(o.tcp_port, DEFAULT_TCP_PORT);
        assert_ne!(o.tcp_port, super::super::rc_pingpong::DEFAULT_TCP_PORT);
        assert_eq!(o.udp_port, 4791);
        assert_eq!(o.size, 65536);
        assert_eq!(o.iters, 1000);
        assert_eq!(o.tool.link.mtu, PathMtu::Mtu4096);
        assert_eq!((o.tool.tx_depth, o.rx_depth), (128, 512));
        assert_eq!(o.tool.link.qp_timeout, 14);
        assert!(o.verify_icrc_v4);
        assert_eq!(o.tool.offload, UdpOffload::On);
        assert!(o.tool.link.faults.is_clean());
        assert_eq!(o.deadline, Duration::from_secs(60));
        let lat = parse(&["--lat"]).unwrap();
        assert_eq!((lat.tool.mode, lat.size), (Mode::Lat, 2));
    }

    #[test]
    fn every_flag() {
        let o = parse(&[
            "--lat",
            "198.18.0.1",
            "-p",
            "20000",
            "-s",
            "64",
            "-n",
            "2000",
            "-m",
            "1024",
            "--tx-depth",
            "16",
            "--rx-depth",
            "64",
            "--bind",
            "198.18.0.2",
            "--udp-port",
            "4800",
            "--qp-timeout",
            "10",
            "--no-icrc-v4",
            "--no-udp-offload",
            "--deadline",
            "30",
            "--fault-loss",
            "5",
            "--fault-seed",
            "7",
        ])
        .unwrap();
        assert_eq!(o.tool.mode, Mode::Lat);
        assert_eq!(o.peer, Some("198.18.0.1".parse().unwrap()));
        assert_eq!(o.bind, Some("198.18.0.2".parse().unwrap()));
        assert_eq!((o.tcp_port, o.udp_port), (20000, 4800));
        assert_eq!((o.size, o.iters), (64, 2000));
        assert_eq!(o.tool.link.mtu, PathMtu::Mtu1024);
        assert_eq!(
            (o.tool.tx_depth, o.rx_depth, o.tool.link.qp_timeout),
            (16, 64, 10)
        );
        assert!(!o.verify_icrc_v4);
        assert_eq!(o.tool.offload, UdpOffload::Off);
        assert_eq!(
            (o.tool.link.faults.loss_pct, o.tool.link.faults.seed),
            (5.0, 7)
        );
        assert_eq!(o.deadline, Duration::from_secs(30));
        assert_eq!(
            err(&["--deadline", "500ms"]),
            "--deadline: must be at least 1s (got \"500ms\")"
        );
    }

    #[test]
    fn errors_name_the_flag() {
        for (args, field) in [
            (&["-s", "0"][..], "--size:"),
            (&["-s", "abc"], "--size:"),
            (&["-s", "16777217"], "--size:"),
            (&["-s", "16777216"], "--size:"),
            (&["-n", "0"], "--iters:"),
            (&["-n", "-5"], "--iters:"),
            (&["-m", "1000"], "--mtu:"),
            (&["-m", "8192"], "--mtu:"),
            (&["-p", "0"], "--port:"),
            (&["-p", "70000"], "--port:"),
            (&["--udp-port", "x"], "--udp-port:"),
            (&["--tx-depth", "0"], "--tx-depth:"),
            (&["--rx-depth", "20000"], "--rx-depth:"),
            (&["--qp-timeout", "32"], "--qp-timeout:"),
            (&["--deadline", "soon"], "--deadline:"),
            (&["--bind", "host"], "--bind:"),
            (&["not-an-ip"], "SERVER_IP:"),
            (&["--bind", "::1", "198.18.0.1"], "--bind:"),
            (&["--bw", "--lat"], "--lat:"),
            (&["--fault-loss", "101"], "--fault-loss:"),
        ] {
            let e = err(args);
            assert!(e.starts_with(field), "{args:?}: {e}");
        }
        assert_eq!(
            err(&["-m", "1000"]),
            "--mtu: must be 256, 512, 1024, 2048 or 4096 (got 1000)"
        );
    }

    #[test]
    fn latency_is_half_the_round_trip_by_nearest_rank() {
        let mut rtts: Vec<Duration> = (1..=100u64).rev().map(Duration::from_micros).collect();
        let l = Latency::of_round_trips(&mut rtts).unwrap();
        assert_eq!(l.p50, Duration::from_nanos(25_000));
        assert_eq!(l.p99, Duration::from_nanos(49_500));
        assert_eq!(l.max, Duration::from_micros(50));
        assert_eq!(l.avg, Duration::from_nanos(25_250));
        assert_eq!(l.samples, 100);
        let mut one = vec![Duration::from_micros(10)];
        let l = Latency::of_round_trips(&mut one).unwrap();
        let half = Duration::from_micros(5);
        assert_eq!((l.p50, l.p99, l.max, l.avg), (half, half, half, half));
        assert_eq!(Latency::of_round_trips(&mut []), None);
    }

    #[test]
    fn report_json_has_nulls_where_figures_do_not_apply() {
        let bw = Report {
            mode: Mode::Bw,
            is_client: false,
            size: 65536,
            iters: 2000,
            elapsed: Duration::from_millis(100),
            latency: None,
            stats: String::new(),
        };
        let j: serde_json::Value = serde_json::from_str(&bw.json()).unwrap();
        assert_eq!(j["bytes"], 65536 * 2000);
        assert_eq!(j["side"], "server");
        assert!((j["gbit_s"].as_f64().unwrap() - 10.48576).abs() < 1e-6);
        assert!((j["msg_per_s"].as_f64().unwrap() - 20000.0).abs() < 1e-6);
        assert!(j["lat_p50_us"].is_null());
        let mut rtts = vec![Duration::from_micros(40); 10];
        let lat = Report {
            mode: Mode::Lat,
            is_client: true,
            latency: Latency::of_round_trips(&mut rtts),
            ..bw
        };
        let j: serde_json::Value = serde_json::from_str(&lat.json()).unwrap();
        assert_eq!(j["mode"], "lat");
        assert!(j["gbit_s"].is_null() && j["msg_per_s"].is_null());
        assert_eq!(j["lat_p50_us"].as_f64(), Some(20.0));
        assert!(lat.text().contains("p50 20.00 us"), "{}", lat.text());
    }
}
