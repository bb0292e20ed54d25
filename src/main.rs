//! The `ipoib-cm` command.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use ipoib_cm::daemon::config::{parse_path_mtu, pick_duration, Given, ProviderKind};
use ipoib_cm::daemon::{self, FaultFlags, Settings};
use ipoib_cm::tools::perf::{self, PerfArgs};
use ipoib_cm::tools::rc_pingpong::{self, RcPingpong, RcPingpongOptions, TestAids};
use ipoib_cm::tools::{PingpongError, RcLink};
use ipoib_cm::verbs::PathMtu;

/// Userspace IPoIB connected mode over InfiniBand RC queue pairs.
#[derive(Debug, Parser)]
#[command(name = "ipoib-cm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the interface and run the IPoIB-CM daemon in the foreground (until SIGINT or
    /// SIGTERM).
    Up(Box<Settings>),
    /// Show a running daemon's interface, neighbours, connections and counters (every daemon
    /// of this network namespace when no interface is named).
    Status(StatusArgs),
    /// Shut a running daemon down (DREQ every connection, remove the interface).
    Down(daemon::client::DownArgs),
    /// Show, add or remove a running daemon's static neighbours.
    #[command(subcommand)]
    Neigh(daemon::client::NeighCommand),
    /// Add or remove a running daemon's underlay peers.
    #[command(subcommand)]
    Peer(daemon::client::PeerCommand),
    /// Make a running daemon read its configuration file again (as SIGHUP does).
    Reload(daemon::client::Target),
    /// Ping-pong over one RC QP on the software RoCEv2 provider, like rdma-core's
    /// ibv_rc_pingpong (and compatible with its TCP QP-info exchange).
    RcPingpong(PingpongArgs),
    /// Ping-pong over UD QPs on the software RoCEv2 provider, like rdma-core's
    /// ibv_ud_pingpong (and compatible with its TCP QP-info exchange).
    UdPingpong(UdPingpongArgs),
    /// Measure the software RC provider alone between two hosts, like perftest's ib_send_bw
    /// (--bw, the default) and ib_send_lat (--lat); the server waits for one client.
    Perf(Box<PerfArgs>),
    /// Ask the InfiniBand subnet administrator for a path, or join or leave a multicast
    /// group, over a umad port.
    #[command(subcommand)]
    Sa(ipoib_cm::tools::sa::SaCommand),
    /// Run the provider conformance suite over two libibverbs devices (feature `verbs`).
    #[command(hide = true)]
    Conformance(ConformanceArgs),
    /// Write the man pages or shell completions of these commands into a directory (for
    /// packaging), or the settings table and example config into a source tree.
    #[command(hide = true)]
    Generate(GenerateArgs),
}

// --- generate: man pages, shell completions, the settings' docs -----------------------------

#[derive(Debug, Args)]
struct GenerateArgs {
    /// man: one page per command (section 1); completions: bash, zsh and fish; settings: the
    /// settings table of DIR/README.md and DIR/contrib/ipoib-cm.example.toml, from the
    /// declaration of the settings (DIR is the source tree).
    what: Generated,
    /// Directory to write into (created if missing).
    dir: std::path::PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Generated {
    Man,
    Completions,
    Settings,
}

/// `ipoib-cm generate man|completions|settings DIR`; a failed write exits 1.
fn generate_main(a: &GenerateArgs) -> ExitCode {
    let write = || -> std::io::Result<()> {
        if let Generated::Settings = a.what {
            return daemon::config::write_settings(&a.dir);
        }
        std::fs::create_dir_all(&a.dir)?;
        let mut cmd = Cli::command();
        match a.what {
            Generated::Settings => Ok(()),
            Generated::Man => clap_mangen::generate_to(cmd, &a.dir),
            Generated::Completions => {
                use clap_complete::Shell;
                for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                    clap_complete::generate_to(shell, &mut cmd, "ipoib-cm", &a.dir)?;
                }
                Ok(())
            }
        }
    };
    match write() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipoib-cm generate: {}: {e}", a.dir.display());
            ExitCode::FAILURE
        }
    }
}

// --- provider selection (hardware provider, feature `verbs`) ---------------------------------

#[derive(Debug, Args)]
struct ConformanceArgs {
    /// First device (default: the first one).
    #[arg(long, value_name = "DEV")]
    dev_a: Option<String>,
    /// Second device (default: the first one).
    #[arg(long, value_name = "DEV")]
    dev_b: Option<String>,
    /// IPv4/IPv6 address of the first device (selects its RoCEv2 GID).
    #[arg(long, value_name = "ADDR")]
    ip_a: Option<IpAddr>,
    /// IPv4/IPv6 address of the second device.
    #[arg(long, value_name = "ADDR")]
    ip_b: Option<IpAddr>,
    /// Run only this check.
    #[arg(long, value_name = "NAME")]
    check: Option<String>,
    /// Milliseconds one settle of the fabric sleeps.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    settle_ms: u64,
    /// The devices are kernel rxe on this kernel release (`uname -r`): hold them to what that
    /// kernel's rxe is known to do (its row of `hw::conformance::RXE_KERNELS`; the contract
    /// for a series not listed). Without it, the contract.
    #[arg(long, value_name = "RELEASE")]
    rxe_kernel: Option<String>,
}

/// What a command's error ends the process with: 2 when the command could not start (a usage
/// or configuration mistake, a set-up step or device that failed), 1 when its run failed.
trait ExitStatus: std::fmt::Display {
    /// The exit status.
    fn exit_code(&self) -> u8;
}

impl ExitStatus for daemon::ConfigError {
    fn exit_code(&self) -> u8 {
        Self::exit_code(self)
    }
}

impl ExitStatus for daemon::run::DaemonError {
    fn exit_code(&self) -> u8 {
        Self::exit_code(self)
    }
}

impl ExitStatus for daemon::ControlError {
    fn exit_code(&self) -> u8 {
        Self::exit_code(self)
    }
}

impl ExitStatus for daemon::preflight::PreflightError {
    fn exit_code(&self) -> u8 {
        Self::EXIT_CODE
    }
}

impl ExitStatus for daemon::resources::ResourceError {
    fn exit_code(&self) -> u8 {
        Self::EXIT_CODE
    }
}

impl ExitStatus for PingpongError {
    fn exit_code(&self) -> u8 {
        Self::exit_code(self)
    }
}

#[cfg(feature = "verbs")]
impl ExitStatus for ipoib_cm::tools::hw_pingpong::HwPingpongError {
    fn exit_code(&self) -> u8 {
        Self::exit_code(self)
    }
}

#[cfg(feature = "verbs")]
impl ExitStatus for ipoib_cm::tools::rdmacm_pingpong::RdmaCmPingpongError {
    fn exit_code(&self) -> u8 {
        Self::exit_code(self)
    }
}

#[cfg(feature = "verbs")]
impl ExitStatus for ipoib_cm::hw::HwError {
    fn exit_code(&self) -> u8 {
        2
    }
}

/// Prints `error: ipoib-cm CMD: ERROR` (one line) and gives the error's exit status.
fn fail(cmd: &str, e: &impl ExitStatus) -> ExitCode {
    eprintln!("error: ipoib-cm {cmd}: {e}");
    ExitCode::from(e.exit_code())
}

/// [`fail`] for a daemon whose log is set up: the line goes through the log (its format,
/// its timestamp), at the error level.
fn fail_logged(cmd: &str, e: &impl ExitStatus) -> ExitCode {
    tracing::error!("ipoib-cm {cmd}: {e}");
    ExitCode::from(e.exit_code())
}

/// With `--provider verbs` in a build without the feature: one line, exit 2.
#[cfg(not(feature = "verbs"))]
fn verbs_provider(cmd: &str, _local_ip: Option<IpAddr>) -> ExitCode {
    fail(cmd, &daemon::run::DaemonError::VerbsNotBuilt)
}

/// `up --provider verbs`.
#[cfg(feature = "verbs")]
fn up_verbs(cfg: &daemon::Config) -> Result<(), daemon::run::DaemonError> {
    let hw = ipoib_cm::hw::HwConfig {
        device: cfg.ib_dev.clone(),
        local_ip: Some(cfg.bind),
        ..ipoib_cm::hw::HwConfig::default()
    };
    daemon::run::up_verbs(cfg, &hw)
}

/// Opens (and closes) the device `up --provider verbs` would use.
#[cfg(feature = "verbs")]
fn verbs_device_check(ib_dev: Option<&str>) -> Result<(), daemon::run::DaemonError> {
    ipoib_cm::hw::HwVerbs::open(&ipoib_cm::hw::HwConfig {
        device: ib_dev.map(str::to_owned),
        ..ipoib_cm::hw::HwConfig::default()
    })
    .map(drop)
    .map_err(daemon::run::DaemonError::VerbsOpen)
}

#[cfg(not(feature = "verbs"))]
fn verbs_device_check(_ib_dev: Option<&str>) -> Result<(), daemon::run::DaemonError> {
    Err(daemon::run::DaemonError::VerbsNotBuilt)
}

#[cfg(not(feature = "verbs"))]
fn up_verbs(_cfg: &daemon::Config) -> Result<(), daemon::run::DaemonError> {
    Err(daemon::run::DaemonError::VerbsNotBuilt)
}

/// `rc-pingpong --provider verbs`: no device exits 2 with one line; a failed run exits 1.
#[cfg(feature = "verbs")]
fn verbs_rc_pingpong(a: &PingpongArgs, opts: &RcPingpongOptions) -> ExitCode {
    use ipoib_cm::hw::HwConfig;
    use ipoib_cm::tools::hw_pingpong as pingpong;
    let cfg = HwConfig {
        device: a.ib_dev.clone(),
        gid_index: a.gid_idx.and_then(|g| u8::try_from(g).ok()),
        local_ip: a.bind,
        ..HwConfig::default()
    };
    if a.rdma_cm {
        return match ipoib_cm::tools::rdmacm_pingpong::run(opts, &cfg) {
            Ok(s) => {
                s.print();
                ExitCode::SUCCESS
            }
            Err(e) => fail("rc-pingpong", &e),
        };
    }
    match pingpong::run(opts, &cfg) {
        Ok(s) => {
            s.print();
            ExitCode::SUCCESS
        }
        Err(e) => fail("rc-pingpong", &e),
    }
}

#[cfg(not(feature = "verbs"))]
fn verbs_rc_pingpong(a: &PingpongArgs, _opts: &RcPingpongOptions) -> ExitCode {
    let _ = &a.ib_dev;
    verbs_provider("rc-pingpong", a.bind)
}

#[cfg(feature = "verbs")]
fn conformance_main(a: &ConformanceArgs) -> ExitCode {
    use ipoib_cm::hw::conformance::HwPair;
    use ipoib_cm::hw::HwConfig;
    use ipoib_cm::verbs::conformance::Behaviours;
    let cfg = |device: &Option<String>, local_ip| HwConfig {
        device: device.clone(),
        local_ip,
        ..HwConfig::default()
    };
    let pair = HwPair::open(
        &cfg(&a.dev_a, a.ip_a),
        &cfg(&a.dev_b, a.ip_b),
        Duration::from_millis(a.settle_ms),
    );
    match pair {
        Err(e) => fail("conformance", &e),
        Ok(mut p) => {
            if let Some(release) = &a.rxe_kernel {
                let row = ipoib_cm::hw::conformance::rxe_behaviours(release);
                let expected = row.unwrap_or(Behaviours::SPEC);
                println!(
                    "conformance: rxe on kernel {release}: {} ({expected})",
                    if row.is_some() {
                        "known series"
                    } else {
                        "unknown series, the contract"
                    }
                );
                p.set_expected(expected);
            }
            if p.run(a.check.as_deref()) == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(not(feature = "verbs"))]
fn conformance_main(_a: &ConformanceArgs) -> ExitCode {
    verbs_provider("conformance", None)
}

// --- ud-pingpong -----------------------------------------------------------------------------

#[derive(Debug, Args)]
struct UdPingpongArgs {
    /// Server to connect to; without it, wait for a client.
    peer: Option<IpAddr>,
    /// Local underlay address.
    #[arg(long, value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// TCP port of the QP-info exchange.
    #[arg(short = 'p', long, default_value_t = rc_pingpong::DEFAULT_TCP_PORT)]
    port: u16,
    /// UDP port of RoCEv2 traffic (both directions).
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Size of message to exchange (at most the path MTU).
    #[arg(short = 's', long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=4096))]
    size: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=16384))]
    rx_depth: u32,
    /// GID index (accepted for compatibility with ibv_ud_pingpong).
    #[arg(short = 'g', long, value_name = "N")]
    gid_idx: Option<u32>,
    /// Don't verify the ICRC of IPv4 packets at all (peers with their own IPv4 IDs, such as
    /// the kernel's rxe, need no flag: the ID is solved for from the ICRC).
    #[arg(long)]
    no_icrc_v4: bool,
    /// Give up after this long, the wait for a client included (e.g. 30, 30s, 500ms)
    /// [default: 120s].
    #[arg(long, value_name = "DURATION")]
    deadline: Option<String>,
}

/// A pingpong's `--deadline`: a duration (`30s`, `500ms`) or plain seconds, at least 1 ms.
fn pingpong_deadline(flag: Option<&str>) -> Result<Duration, daemon::ConfigError> {
    pick_duration(
        "deadline",
        flag,
        None,
        Duration::from_millis(1),
        Duration::from_secs(120),
    )
}

fn ud_pingpong_main(a: &UdPingpongArgs) -> ExitCode {
    use ipoib_cm::tools::ud_pingpong;
    let _ = a.gid_idx;
    let deadline = match pingpong_deadline(a.deadline.as_deref()) {
        Ok(d) => d,
        Err(e) => return fail("ud-pingpong", &e),
    };
    let opts = ipoib_cm::tools::Options {
        peer: a.peer,
        bind: a.bind,
        tcp_port: a.port,
        udp_port: a.udp_port,
        size: a.size as usize,
        iters: a.iters,
        rx_depth: a.rx_depth,
        verify_icrc_v4: !a.no_icrc_v4,
        deadline,
        tool: (),
    };
    match ud_pingpong::run(&opts) {
        Ok(s) => {
            s.print();
            ExitCode::SUCCESS
        }
        Err(e) => fail("ud-pingpong", &e),
    }
}

// --- end of provider selection ----------------------------------------------------------------

#[derive(Debug, Args)]
struct StatusArgs {
    /// Interface name [default: every daemon of this network namespace].
    ifname: Option<String>,
    /// Print the JSON document instead of tables.
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// Print the Prometheus text exposition (for node_exporter's textfile collector).
    #[arg(long)]
    prometheus: bool,
    /// Show every counter, zero or not, endpoint and provider apart (the tables show only
    /// those that are not zero, grouped).
    #[arg(long, short = 'v', conflicts_with_all = ["json", "prometheus"])]
    all: bool,
    /// Control socket of the daemon: a path, or @NAME for an abstract socket (default:
    /// @ipoib-cm/IFNAME).
    #[arg(long, value_name = "PATH")]
    control_socket: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
struct PingpongArgs {
    /// Server to connect to; without it, wait for a client.
    peer: Option<IpAddr>,
    /// Local underlay address (default: the route to the peer, or the address the client
    /// reached).
    #[arg(long, value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// TCP port of the QP-info exchange.
    #[arg(short = 'p', long, default_value_t = rc_pingpong::DEFAULT_TCP_PORT)]
    port: u16,
    /// UDP port of RoCEv2 traffic (both directions).
    #[arg(long, default_value_t = 4791)]
    udp_port: u16,
    /// Size of message to exchange.
    #[arg(short = 's', long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=(1 << 24)))]
    size: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long, default_value = "1024", value_parser = parse_path_mtu)]
    mtu: PathMtu,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=16384))]
    rx_depth: u32,
    /// Validate every received payload.
    #[arg(short = 'c', long)]
    chk: bool,
    /// GID index (accepted for compatibility with ibv_rc_pingpong; the software provider has
    /// one GID).
    #[arg(short = 'g', long, value_name = "N")]
    gid_idx: Option<u32>,
    /// Local ACK timeout exponent: 4.096 us * 2^N (ibv_rc_pingpong uses 14).
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    qp_timeout: u8,
    /// Don't verify the ICRC of IPv4 packets at all (peers with their own IPv4 IDs, such as
    /// the kernel's rxe, need no flag: the ID is solved for from the ICRC).
    #[arg(long)]
    no_icrc_v4: bool,
    /// Give up after this long, the wait for a client included (e.g. 30, 30s, 500ms)
    /// [default: 120s].
    #[arg(long, value_name = "DURATION")]
    deadline: Option<String>,
    /// Print the provider's counters at the end.
    #[arg(long)]
    stats: bool,
    /// Connect through the InfiniBand CM (REQ/REP/RTU over QP1, DREQ/DREP at the end) instead
    /// of the TCP exchange; the server then needs --bind.
    #[arg(long)]
    cm: bool,
    /// rdma_cm's way of connecting, to meet the kernel's rdma_cm (rdma_server, rdma_client,
    /// ucmatose; port -p in RDMA_PS_TCP). With --provider verbs: the kernel's CM through
    /// librdmacm instead of the TCP exchange. On the soft provider, with --cm: our CM with
    /// rdma_cm's framing (a cma_hdr in front of the REQ's private data; the server refuses a
    /// REQ without a valid one naming its --bind address, as rdma_cm does). The server then
    /// needs --bind.
    #[arg(long)]
    rdma_cm: bool,
    /// Test aid (lab negative case): with --cm on the soft provider, the REQ's primary path
    /// names ADDR's GID as the receiver's port GID instead of the peer's (the MAD still goes
    /// to the peer; the kernel answers REJ 12, invalid GID).
    #[arg(long, value_name = "ADDR")]
    req_dgid: Option<IpAddr>,
    /// Test aid (lab): with --provider verbs --rdma-cm, the server accepts this long after the
    /// connection request came (e.g. 3s), so that the kernel's rdma_cm MRAs the peer's
    /// retransmitted REQ.
    #[arg(long, value_name = "DURATION")]
    accept_delay: Option<String>,
    /// Test aid (lab negative case): with --provider verbs --rdma-cm, no ping-pong: try an
    /// AF_IB rdma_cm id (client: resolve the peer's GID with IPoIB's service ID of our QPN,
    /// then the route; server: bind to the --bind address's GID and listen) and report the
    /// call that fails and its errno (exit 1), or that none did (exit 0).
    #[arg(long)]
    af_ib: bool,
    #[command(flatten)]
    faults: FaultFlags,
    /// Provider: soft (default) or verbs (libibverbs).
    #[arg(long, value_enum, default_value_t)]
    provider: ProviderKind,
    /// With --provider verbs: the IB device (default: the first one).
    #[arg(short = 'd', long, value_name = "DEV")]
    ib_dev: Option<String>,
}

fn rc_pingpong_main(a: &PingpongArgs) -> ExitCode {
    let faults = match a.faults.to_config() {
        Ok(f) => f,
        Err(e) => return fail("rc-pingpong", &e),
    };
    let deadline = match pingpong_deadline(a.deadline.as_deref()) {
        Ok(d) => d,
        Err(e) => return fail("rc-pingpong", &e),
    };
    let accept_delay = match a.accept_delay.as_deref() {
        None => Duration::ZERO,
        Some(d) => match pick_duration(
            "accept-delay",
            Some(d),
            None,
            Duration::ZERO,
            Duration::ZERO,
        ) {
            Ok(d) => d,
            Err(e) => return fail("rc-pingpong", &e),
        },
    };
    let opts = RcPingpongOptions {
        peer: a.peer,
        bind: a.bind,
        tcp_port: a.port,
        udp_port: a.udp_port,
        size: a.size as usize,
        iters: a.iters,
        rx_depth: a.rx_depth,
        verify_icrc_v4: !a.no_icrc_v4,
        deadline,
        tool: RcPingpong {
            link: RcLink {
                mtu: a.mtu,
                qp_timeout: a.qp_timeout,
                faults,
            },
            validate: a.chk,
            cm: a.cm,
            rdma_cm: a.rdma_cm,
            aids: TestAids {
                req_dgid: a.req_dgid,
                accept_delay,
                af_ib: a.af_ib,
            },
        },
    };
    let verbs = a.provider == ProviderKind::Verbs;
    if (a.accept_delay.is_some() || a.af_ib) && !(verbs && a.rdma_cm) {
        return fail(
            "rc-pingpong",
            &PingpongError::Usage("--accept-delay and --af-ib need --provider verbs --rdma-cm"),
        );
    }
    if a.req_dgid.is_some() && (verbs || !a.cm) {
        return fail(
            "rc-pingpong",
            &PingpongError::Usage("--req-dgid needs --cm on the soft provider"),
        );
    }
    if verbs {
        return verbs_rc_pingpong(a, &opts);
    }
    if a.rdma_cm && !a.cm {
        return fail(
            "rc-pingpong",
            &PingpongError::Usage(
                "--rdma-cm: the soft provider needs --cm too (our CM with rdma_cm's framing)",
            ),
        );
    }
    let _ = a.gid_idx;
    match rc_pingpong::run(&opts) {
        Ok(out) => {
            out.summary.print();
            if a.stats {
                println!("{}", out.stats);
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail("rc-pingpong", &e),
    }
}

fn perf_main(a: &PerfArgs) -> ExitCode {
    let opts = match a.resolve() {
        Ok(o) => o,
        Err(e) => return fail("perf", &e),
    };
    match perf::run(&opts) {
        Ok(report) => {
            println!("{}", report.text());
            if a.stats {
                println!("{}", report.stats);
            }
            if a.json {
                println!("{}", report.json());
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail("perf", &e),
    }
}

fn up_main(a: &Settings) -> ExitCode {
    // Without a usable device, say so before any configuration mistake.
    if matches!(
        a.provider.as_ref().map(Given::parse),
        Some(Ok(ProviderKind::Verbs))
    ) {
        let ib_dev = a.ib_dev.as_ref().and_then(|d| d.parse().ok());
        if let Err(e) = verbs_device_check(ib_dev.as_deref()) {
            return fail("up", &e);
        }
    }
    let cfg = match daemon::resolve(a.config.as_deref(), a) {
        Ok(c) => c,
        Err(e) => return fail("up", &e),
    };
    if let Err(e) = daemon::run::check_workers(&cfg) {
        return fail("up", &e);
    }
    if let Err(e) = daemon::preflight::check(&cfg.ifname) {
        return fail("up", &e);
    }
    if let Err(e) = daemon::resources::check(&cfg) {
        return fail("up", &e);
    }
    daemon::logging::init(&cfg.log, cfg.log_format);
    let r = match cfg.provider {
        ProviderKind::Soft => daemon::run::up(&cfg),
        ProviderKind::Verbs => up_verbs(&cfg),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail_logged("up", &e),
    }
}

fn status_main(a: &StatusArgs) -> ExitCode {
    use daemon::client;
    let targets = match client::targets(a.ifname.as_deref(), a.control_socket.as_deref()) {
        Ok(t) => t,
        Err(e) => return fail("status", &e),
    };
    let mut shown = Vec::new();
    for (path, ifname) in &targets {
        match client::status_of(path, ifname.as_deref()) {
            Ok(s) => shown.push(s),
            Err(e) => return fail("status", &e),
        }
    }
    if a.prometheus {
        print!("{}", daemon::render_prometheus_all(&shown));
    } else if a.json {
        match shown.as_slice() {
            [one] => println!("{}", daemon::render_json(one)),
            all => println!(
                "{}",
                serde_json::Value::from(
                    all.iter()
                        .map(|s| serde_json::to_value(s).unwrap_or_default())
                        .collect::<Vec<_>>(),
                )
            ),
        }
    } else {
        let detail = if a.all {
            daemon::Shown::All
        } else {
            daemon::Shown::NonZero
        };
        let texts: Vec<String> = shown
            .iter()
            .map(|s| daemon::render_text(s, detail))
            .collect();
        print!("{}", texts.join("\n"));
    }
    ExitCode::SUCCESS
}

/// Prints a control command's answer, or fails with its one line.
fn control_main(cmd: &str, r: Result<String, daemon::ControlError>) -> ExitCode {
    match r {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(cmd, &e),
    }
}

fn init_logging(default: &str) {
    daemon::logging::init(default, daemon::logging::LogFormat::Text);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Up(a) => up_main(a),
        Command::Conformance(a) => conformance_main(a),
        Command::Generate(a) => generate_main(a),
        Command::UdPingpong(a) => {
            init_logging("warn");
            ud_pingpong_main(a)
        }
        Command::Status(a) => status_main(a),
        Command::Down(a) => control_main("down", daemon::client::down(a)),
        Command::Neigh(c) => control_main("neigh", daemon::client::neigh(c)),
        Command::Peer(c) => control_main("peer", daemon::client::peer(c)),
        Command::Reload(t) => control_main("reload", daemon::client::reload(t)),
        Command::RcPingpong(a) => {
            init_logging("warn");
            rc_pingpong_main(a)
        }
        Command::Perf(a) => {
            init_logging("warn");
            perf_main(a)
        }
        Command::Sa(c) => {
            init_logging("warn");
            match ipoib_cm::tools::sa::run(c) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ipoib-cm sa: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
