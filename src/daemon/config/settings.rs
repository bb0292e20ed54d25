//! The one declaration of the settings of `ipoib-cm up`: each field of [`Settings`] is a
//! command-line flag (clap) and a key of the TOML file (serde); its doc is the `--help` text,
//! the README row and the example config's comment; its [`Shown`] is its example; its rule
//! after `=>` resolves it into its field of [`Config`] with its bounds and default.
//!
//! Adding a setting is one field here (doc with its bounds and `[default: ...]`, attributes,
//! example, rule) and its test; `ipoib-cm generate settings` rewrites the README table and
//! the example config from it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::checks;
use super::declare::settings;
use super::rules::{duration, int, list, switch, value, Computed, RuleExt};
use super::types::{
    endpoint_defaults, Cidr, LinkLayerKind, ProviderKind, Quirk, WorkerFault, DEFAULT_UDP_PORT,
    MAX_BUSY_POLL, MAX_MAX_CONN_QP, MAX_MAX_PENDING_RX, MAX_NEIGH_MAX, MAX_PEERS, MAX_RX_SPARE,
    MAX_STATIC_NEIGHBOURS, MAX_TUN_RATE, MAX_TX_QUEUE_LEN, MIN_NEIGH_TIMEOUT, MIN_RX_TIMEOUT,
    QP_TIMEOUT_RANGE,
};
use crate::daemon::logging::LogFormat;
use crate::ipoib::{Mode, QpBudgetPolicy, SourceCheck};
use crate::mad::CmTransport;
use crate::setting::{fault_flags_of, with_fault_fields, Given, Shown, TEST_HELP_HEADING};
use crate::soft::{FaultConfig, Quirks};
use crate::verbs::{PKey, PathMtu};
use crate::wire::ipoib::HwAddr;
use crate::wire::WorkerCount;

/// The sections of the example config.
const INTERFACE: &str = "The interface";
const UNDERLAY: &str = "The underlay (the software RoCEv2 provider over UDP)";
const CONNECTIONS: &str = "Connections";
const OPERATION: &str = "Operation";

with_fault_fields!(settings! {
    validate(s, d = endpoint_defaults())
    derived {
        /// Fault injection on the software provider (`fault_*`).
        fault: FaultConfig = with_fault_fields!(fault_flags_of! { @from s; }).to_config(),
    }
    /// Fully resolved and validated configuration of `ipoib-cm up`: each field is its
    /// setting's, with the setting's bounds checked and its default taken.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Config {
        /// Where this configuration came from when a file was read (`--config`): what a
        /// reload (SIGHUP) reads again. `None` without a file.
        pub source: Option<ConfigSource> = None,
    }
    /// The settings of `ipoib-cm up`: its flags (`#[command(flatten)]` it into the subcommand)
    /// and the keys of its TOML file ([`parse_config_file`](super::parse_config_file)), one
    /// field each, not yet validated.
    ///
    /// Every flag but `--config` is a key, the same name with `_` for `-`; a switch flag
    /// (`--no-srq`) is a boolean key (`no_srq = true`), a repeatable one (`--quirk`) an array.
    /// The file also reads `srq`, `verify_icrc_v4`, `udp_offload` (the opposite of `no_srq`,
    /// `no_icrc_v4`, `no_udp_offload`) and `qp_budget_policy = "evict"|"reject"` (`evict =
    /// true` / `reject = true`), kept for the files that use them; [`Settings::keys`] lists the
    /// keys. A value is held as given ([`Given`]) and parsed by [`resolve`](super::resolve),
    /// which names the flag or key in its errors; the defaults are taken there, from
    /// [`EndpointConfig::new`](crate::ipoib::EndpointConfig::new) for the endpoint's settings.
    // The fields' docs are `--help` text with `[default: ...]`, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Settings;
    /// TOML configuration file; flags override its keys.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf> [Shown::flag_only()],
    /// Interface name; the systemd unit passes it from its instance name (ipoib-cm@ib0)
    /// [default: ib0].
    #[arg(long, value_name = "NAME")]
    pub ifname: Option<Given<String>> [Shown::example("\"ib0\"").section(INTERFACE)]
        => ifname: String = Computed(checks::ifname(s.ifname.as_ref())),
    /// Address of the interface, IPv4 or IPv6, ADDR/PREFIX; ADDR alone is a host address
    /// (/32, /128) as `ip` takes it (repeatable).
    #[arg(long, value_name = "CIDR")]
    #[serde(default)]
    pub addr: Vec<Given<Cidr>>
        [Shown::example("[\"198.19.0.1/24\", \"2001:db8:19::1/64\"]").set()]
        => addr: Vec<Cidr> = list(),
    /// IPoIB mode: connected (RC connections to CM-capable peers, MTU 65520) or datagram
    /// (UD only, MTU = path MTU - 4) [default: connected].
    #[arg(long, value_name = "MODE")]
    pub mode: Option<Given<Mode>> [Shown::example("\"connected\"")]
        => mode: Mode = value().or(d.mode),
    /// Static neighbour, IP=HWADDR with the 20-byte hardware address as `ip link` prints
    /// it, shown as `permanent` in status; a soft daemon's is 80:00:00:11 then its GID,
    /// ::ffff:BIND (repeatable).
    #[arg(long, value_name = "IP=HWADDR")]
    #[serde(default)]
    pub neigh: Vec<Given<(IpAddr, HwAddr)>>
        [Shown::example("[\"198.19.0.2=80:00:00:11:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:02\"]")]
        => neigh: Vec<(IpAddr, HwAddr)> = list().at_most(MAX_STATIC_NEIGHBOURS, "static neighbours"),
    /// Partition key, 0x8001-style hex or decimal (a TOML integer in the file); bit 15 set
    /// is full membership, clear is limited (talks to full members only); its low 15 bits
    /// must not be zero. The port must carry it in its P_Key table; the MGIDs and the
    /// broadcast address carry it with bit 15 set [default: 0xffff].
    #[arg(long, value_name = "PKEY", allow_negative_numbers = true)]
    pub pkey: Option<Given<PKey>> [Shown::example("0xffff")]
        => pkey: PKey = value().or(d.pkey),
    /// Underlay address of the software provider: its UDP sockets bind to it and it is
    /// this node's GID (required, here or in the file).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<Given<IpAddr>> [Shown::example("\"198.18.0.1\"").set().section(UNDERLAY)]
        => bind: IpAddr = Computed(checks::bind(s.bind.as_ref())),
    /// Underlay address of another node (repeatable); the broadcast group (ARP, ND,
    /// multicast) is fanned out to them by unicast, besides IP multicast. Needed only
    /// where the underlay carries no IP multicast (L3 tunnels, most cloud networks).
    #[arg(long, value_name = "ADDR")]
    #[serde(default)]
    pub peer: Vec<Given<IpAddr>> [Shown::example("[\"198.18.0.2\"]").set()]
        => peer: Vec<IpAddr> = Computed(checks::peers(&s.peer, bind, MAX_PEERS)),
    /// Don't carry the broadcast group as IP multicast on the underlay (UDP 4791 to
    /// 239.255.<P_Key> on IPv4, the MGID itself on IPv6); then only --peer addresses hear
    /// it.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub no_multicast: Option<Given<bool>> [Shown::example("false")]
        => /// Carry the broadcast group as IP multicast (`--no-multicast` turns it off).
        multicast: bool = switch().off(),
    /// TTL (IPv4) or hop limit (IPv6) of the underlay multicast, 1..=255 (1: the link)
    /// [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub multicast_ttl: Option<Given<i64>> [Shown::example("1")]
        => multicast_ttl: u8 = int(1..=255u8).or(crate::soft::DEFAULT_MULTICAST_TTL),
    /// RoCEv2 UDP port; open it between the nodes [default: 4791].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub udp_port: Option<Given<i64>> [Shown::example("4791")]
        => udp_port: u16 = int(1..=u16::MAX).or(DEFAULT_UDP_PORT),
    /// How connections are set up: qp1 (our CM, MADs on QP1 through the provider; soft),
    /// rdmacm (verbs: the kernel's CM through librdmacm, listening on rdma_cm_port), umad
    /// (verbs: our CM on the kernel's QP1 through /dev/infiniband/umadN, where ib_cm is not
    /// loaded) or udp (our CM over the side channel on mad_port; meets only udp peers);
    /// docs/kernel-cm.md [default: qp1 on soft; on verbs rdmacm where
    /// /dev/infiniband/rdma_cm opens, else umad].
    #[arg(long, value_name = "TRANSPORT")]
    pub cm_transport: Option<Given<CmTransport>> [Shown::example("\"qp1\"")]
        => /// `None`: the provider's (QP1 on soft; on libibverbs, whose QP1 the kernel owns,
        /// the kernel's CM, else umad).
        cm_transport: Option<CmTransport> = value(),
    /// UDP port of the CM MAD side channel (--cm-transport udp) [default: 4792].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub mad_port: Option<Given<i64>> [Shown::example("4792")]
        => mad_port: u16 = int(1..=u16::MAX).or(crate::mad::DEFAULT_MAD_PORT),
    /// Port of the CM's rdma_cm service (RDMA_PS_IB, service ID 0x13F0000 + port, REQs with
    /// rdma_cm's cma_hdr), where peers on the kernel's CM connect and are connected to; the
    /// same on every node [default: 4793].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub rdma_cm_port: Option<Given<i64>> [Shown::example("4793")]
        => rdma_cm_port: u16 = int(1..=u16::MAX).or(d.rdma_cm_port),
    /// Cap on the IB path MTU: 256, 512, 1024, 2048 or 4096; it lowers the path MTU, never
    /// raises it [default: no cap: the port's active MTU, on RoCE and the soft provider at
    /// most what the --bind link carries (1500 carries 1024, 9000 carries 4096)].
    #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
    pub path_mtu: Option<Given<PathMtu>> [Shown::example("4096")]
        => /// `None`: no cap ([`Config::path_mtu_choice`]).
        path_mtu: Option<PathMtu> = value(),
    /// Don't verify the ICRC of IPv4 packets at all. Not needed with the kernel's rxe: the
    /// IPv4 ID it picks is solved for from each ICRC (a 2^-16 false-accept chance per corrupted
    /// packet instead of 2^-32, logged once per such peer).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub no_icrc_v4: Option<Given<bool>> [Shown::example("false")],
    /// The same with the opposite sense, for older files; it must not contradict
    /// no_icrc_v4.
    #[arg(skip)]
    pub verify_icrc_v4: Option<Given<bool>> [Shown::example("true").alias_of("no_icrc_v4")]
        => /// Verify the ICRC of IPv4 packets (`no_icrc_v4`, or this alias).
        verify_icrc_v4: bool = Computed(checks::on_unless(
            "no_icrc_v4",
            s.no_icrc_v4.as_ref(),
            "verify_icrc_v4",
            s.verify_icrc_v4.as_ref(),
        )),
    /// Send and receive one UDP datagram per syscall: no GSO trains, no GRO (captures on a
    /// veth then show every RoCE packet as sent; see docs/tools.md).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub no_udp_offload: Option<Given<bool>> [Shown::example("false")],
    /// The same with the opposite sense, for older files.
    #[arg(skip)]
    pub udp_offload: Option<Given<bool>> [Shown::example("true").alias_of("no_udp_offload")]
        => /// Use UDP GSO/GRO (`no_udp_offload`, or this alias).
        udp_offload: bool = Computed(checks::on_unless(
            "no_udp_offload",
            s.no_udp_offload.as_ref(),
            "udp_offload",
            s.udp_offload.as_ref(),
        )),
    /// Provider: soft (the embedded software RoCEv2 provider) or verbs (libibverbs, a build
    /// with --features verbs; its CM the kernel's or ours on the kernel's QP1, see
    /// --cm-transport) [default: soft].
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<Given<ProviderKind>> [Shown::example("\"soft\"")]
        => provider: ProviderKind = value().or(ProviderKind::default()),
    /// With --provider soft: its link layer, rocev2 (the underlay's addresses are the GIDs)
    /// or infiniband (a port of a simulated fabric: run under ibsim's umad2sim with SIM_HOST
    /// naming the node; its LID, P_Keys and events come from the fabric's SM, its paths and
    /// groups from the SA) [default: rocev2].
    #[arg(long, value_name = "LINK")]
    pub link_layer: Option<Given<LinkLayerKind>> [Shown::example("\"rocev2\"")]
        => link_layer: LinkLayerKind = value().or(LinkLayerKind::default()),
    /// With --provider verbs: the IB device [default: the first one].
    #[arg(long, value_name = "DEV")]
    pub ib_dev: Option<Given<String>> [Shown::example("\"mlx5_0\"")]
        => ib_dev: Option<String> = Computed(checks::ib_dev(s.ib_dev.as_ref())),
    /// Local ACK timeout exponent of RC QPs, 4.096 us * 2^N, 8..=24 (12 is about 17 ms); a
    /// lost tail packet costs this long, and a connection fails after 8 in a row without
    /// progress (the software provider waits longer where the measured round trip needs it,
    /// and backs off 1, 2, 4, then 8 times: about 47 of them, 0.8 s at 12;
    /// --tx-stall-timeout bounds either) [default: 12].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub qp_timeout: Option<Given<i64>> [Shown::example("12").section(CONNECTIONS)]
        => qp_timeout: u8 = int(QP_TIMEOUT_RANGE).or(d.qp_timeout),
    /// Software provider: RC packets that arrive ahead of a missing one and are held until
    /// it comes, all connections together (about 4 KiB each at path MTU 4096), so that a
    /// path that reorders costs no resends; only connections whose path was seen to reorder
    /// hold (a NAK proved spurious), the others drop them as rxe does; 0: none holds
    /// (README, Threat model), 0..=65536 [default: 1024].
    #[arg(long, value_name = "PACKETS", allow_negative_numbers = true)]
    pub reorder_hold: Option<Given<i64>> [Shown::example("1024")]
        => reorder_hold: usize = int(0..=65_536usize).or(crate::soft::DEFAULT_REORDER_HOLD_PACKETS),
    /// Per-QP receive rings instead of one shared receive queue.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub no_srq: Option<Given<bool>> [Shown::example("false")],
    /// The same with the opposite sense, for older files.
    #[arg(skip)]
    pub srq: Option<Given<bool>> [Shown::example("true").alias_of("no_srq")]
        => /// Receive on a shared receive queue (`no_srq`, or this alias).
        srq: bool = Computed(checks::on_unless("no_srq", s.no_srq.as_ref(), "srq", s.srq.as_ref())),
    /// Receive WRs on the shared receive queue, a power of two from 2 to 8192 (Linux's
    /// recv_queue_size range); its limit event is armed at a quarter of it [default: 256].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub srq_depth: Option<Given<i64>> [Shown::example("256")]
        => srq_depth: u32 = Computed(checks::srq_depth(s.srq_depth.as_ref(), d.srq_depth)),
    /// Receive buffers beyond the SRQ's (or the rings'), 1 to 65536: a packet waits for the
    /// TUN device only once a spare took its place on the SRQ or its connection's ring, and
    /// is dropped (rx_buffer_drops) when none is free, so a slow TUN device never RNR-NAKs a
    /// peer [default: 256].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub rx_spare: Option<Given<i64>> [Shown::example("256")]
        => rx_spare: u32 = int(1..=MAX_RX_SPARE).or(d.rx_spare),
    /// RNR retries of TX connections, 0 to 7 (7: for ever; Linux's ipoib_cm sends 0)
    /// [default: 7].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub tx_rnr_retry: Option<Given<i64>> [Shown::example("7")]
        => tx_rnr_retry: u8 = int(0..=7u8).or(d.tx_rnr_retry),
    /// Transport retries of TX connections, 0 to 7 (Linux's ipoib_cm sends 0) [default: 7].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub tx_retry_count: Option<Given<i64>> [Shown::example("7")]
        => tx_retry_count: u8 = int(0..=7u8).or(d.tx_retry_count),
    /// Reap RX connections idle this long, at least 1s (Linux: 4.3-21 min) [default: 60s].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub rx_timeout: Option<Given<Duration>> [Shown::example("\"60s\"")]
        => rx_timeout: Duration = duration(MIN_RX_TIMEOUT).or(d.rx_timeout),
    /// Bound on every teardown wait: give up waiting for a QP to drain after this long
    /// [default: 5s].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub drain_timeout: Option<Given<Duration>> [Shown::example("\"5s\"")]
        => drain_timeout: Duration = duration(Duration::from_millis(1)).or(d.drain_timeout),
    /// Fail a TX connection with sends in flight and none completed for this long, giving
    /// its send buffers back: how long a vanished or stuck peer can hold the buffers every
    /// other peer needs; longer than one local ACK timeout [default: 1s, or 4 local ACK
    /// timeouts if longer].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub tx_stall_timeout: Option<Given<Duration>> [Shown::example("\"1s\"")]
        => tx_stall_timeout: Duration = Computed(checks::tx_stall_timeout(
            s.tx_stall_timeout.as_ref(),
            d.tx_stall_timeout,
            qp_timeout,
        )),
    /// Threads that carry the interface, each with its own TUN queue, provider socket or
    /// device context, connections and reaper: a power of two from 1 to 64. A flow stays on
    /// one; a peer of ours gets a connection from each, any other peer one. Needs connected
    /// mode; on the software provider cm_transport qp1 or udp.
    /// Fixed at start. The default stays 1 until a measurement on many cores shows what more
    /// buy (docs/benchmarks.md) [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub workers: Option<Given<i64>> [Shown::example("1").section(OPERATION)]
        => workers: WorkerCount = Computed(checks::workers(s.workers.as_ref())),
    /// After each event keep looking for the next one this long instead of sleeping, e.g.
    /// 200us, at most 10ms: no process wakeup for a packet that arrives meanwhile, at the
    /// cost of a CPU busy while traffic flows [default: 0s, off].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub busy_poll: Option<Given<Duration>> [Shown::example("\"0s\"")]
        => busy_poll: Duration = duration(Duration::ZERO).at_most(MAX_BUSY_POLL).or(Duration::ZERO),
    /// Forget unused neighbours and their TX connections after this long, at least 1s
    /// [default: 300s].
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
    pub neigh_timeout: Option<Given<Duration>> [Shown::example("\"300s\"")]
        => neigh_timeout: Duration = duration(MIN_NEIGH_TIMEOUT).or(d.neigh_timeout),
    /// Most learned neighbour entries (resolving ones too, static ones not counted), at
    /// most 2^20; one more evicts the least recently used entry without a connection, and
    /// at most 16 come from one source GID. The default holds an IPv4, a global IPv6 and a
    /// link-local IPv6 entry for each node of a 5,000-node partition [default: 16384].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub neigh_max: Option<Given<i64>> [Shown::example("16384")]
        => neigh_max: u32 = int(1..=MAX_NEIGH_MAX).or(d.neigh_max as u32),
    /// How the source of an IP packet arriving over the UD QP (datagram mode, multicast) is
    /// checked: strict (its source address must be bound, by ARP/ND or a static neighbour,
    /// to the node that sent it, as rp_filter strict or WireGuard's allowed IPs) or loose
    /// (for routers: a source outside the interface's prefixes is also taken from any node
    /// the daemon knows, a bound neighbour or a --peer); the rest is dropped and counted
    /// (rx_ud_*_drops). Fixed at start [default: strict].
    #[arg(long, value_name = "CHECK")]
    pub ud_source_check: Option<Given<SourceCheck>> [Shown::example("\"strict\"")]
        => ud_source_check: SourceCheck = value().or(d.ud_source_check),
    /// Pin the neighbours bound to a --peer: such an address is bound again only to a
    /// --peer, never to another node that claims it, even once the peer stopped answering
    /// (static neighbours are always pinned). Fixed at start.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub pin_peer_neighbours: Option<Given<bool>> [Shown::example("false")]
        => pin_peer_neighbours: bool = switch(),
    /// Connected-mode QP budget: most established RX connections, at most 65536; at most
    /// 16 of them from one peer GID [default: 8192 with an SRQ (room for a 4,000-node
    /// cluster), 128 without, as Linux's ipoib_max_conn_qp].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_conn_qp: Option<Given<i64>> [Shown::example("8192")]
        => max_conn_qp: u32 = int(1..=MAX_MAX_CONN_QP)
            .or(crate::ipoib::default_max_conn_qp(srq) as u32),
    /// Half-open RX connections (REP sent, no RTU yet) held at once, at most 4096; a REQ
    /// beyond them tears down the oldest. They are reaped when their REP retries run out
    /// and never count against max_conn_qp [default: 256].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_pending_rx: Option<Given<i64>> [Shown::example("256")]
        => max_pending_rx: u32 = int(1..=MAX_MAX_PENDING_RX).or(d.max_pending_rx as u32),
    /// When the QP budget is spent, evict the least recently active RX connection; set one
    /// of evict, reject and qp_budget_policy, not two that disagree (the default).
    #[arg(long, num_args = 0, default_missing_value = "true", conflicts_with = "reject")]
    pub evict: Option<Given<bool>> [Shown::example("true")],
    /// When the QP budget is spent, reject new connections (REQs get NO_QP while
    /// max_conn_qp are established).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub reject: Option<Given<bool>> [Shown::example("false")],
    /// The same as evict or reject, as "evict" or "reject", for older files.
    #[arg(skip)]
    pub qp_budget_policy: Option<Given<QpBudgetPolicy>>
        [Shown::example("\"evict\"").alias_of("evict")]
        => /// What to do when the budget is spent (`evict`, `reject` or this alias).
        qp_budget_policy: QpBudgetPolicy = Computed(checks::budget_policy(
            s.evict.as_ref(),
            s.reject.as_ref(),
            s.qp_budget_policy.as_ref(),
        ).map(|p| p.unwrap_or(d.budget_policy))),
    /// Packets held per neighbour while it resolves or connects, at most 65536
    /// [default: 3].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub tx_queue_len: Option<Given<i64>> [Shown::example("3")]
        => tx_queue_len: u32 = int(1..=MAX_TX_QUEUE_LEN).or(d.tx_queue_len as u32),
    /// Control socket of status, down, neigh, peer and reload (root or the daemon's user
    /// only): a path (mode 0600), or @NAME for an abstract socket, one per network
    /// namespace [default: @ipoib-cm/IFNAME].
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<Given<PathBuf>>
        [Shown::example("\"/run/ipoib-cm/ib0.sock\"").section(OPERATION)]
        => control_socket: PathBuf = Computed(checks::control_socket(s.control_socket.as_ref(), &ifname)),
    /// Serve the Prometheus exposition over HTTP at this ADDR:PORT ([IPv6]:PORT for IPv6,
    /// `GET /metrics`), e.g. 127.0.0.1:9464; no authentication, so loopback unless meant;
    /// fixed at start (a reload leaves it) [default: off].
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics_listen: Option<Given<SocketAddr>> [Shown::example("\"127.0.0.1:9464\"")]
        => metrics_listen: Option<SocketAddr> = value(),
    /// Log filter: off, error, warn, info, debug, trace or target=level,... (RUST_LOG
    /// overrides) [default: info].
    #[arg(long, value_name = "LEVEL")]
    pub log: Option<Given<String>> [Shown::example("\"info\"")]
        => log: String = Computed(checks::log(s.log.as_ref())),
    /// Log line format: text or json (one object per line). Lines carry no timestamp of
    /// their own when stderr is the systemd journal [default: text].
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<Given<LogFormat>> [Shown::example("\"text\"")]
        => log_format: LogFormat = value().or(LogFormat::default()),
} {
    /// Seed of the software provider's QPN order, which fixes its hardware address, for
    /// peers that name it in a static --neigh [default: drawn at each start, so that a
    /// restarted daemon never reuses its predecessor's QPNs].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub qpn_seed: Option<Given<i64>> [Shown::example("0")]
        => qpn_seed: Option<u64> = int(0..=i64::MAX as u64),
    /// Provider contract violation, to test the watchdogs: drain-never, no-last-wqe,
    /// dup-last-wqe, clean-cq-on-destroy (a destroy cleans the QP's completions from its
    /// CQs and returns their SRQ receives to the SRQ, as mlx5 does), or moves-later (QP set-up
    /// and teardown moves done a millisecond later, as the verbs provider's command thread
    /// does them) (repeatable).
    #[arg(long, value_name = "QUIRK", help_heading = TEST_HELP_HEADING)]
    #[serde(default)]
    pub quirk: Vec<Given<Quirk>> [Shown::example("[\"drain-never\"]")]
        => quirks: Quirks = Computed(checks::quirks(&s.quirk)),
    /// The TUN device takes at most this many packets a second, 1 to 10,000,000; the rest wait
    /// for it in their receive buffers, as behind a host slower than the fabric (any
    /// provider) [default: as fast as it takes them].
    #[arg(long, value_name = "PPS", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
    pub fault_tun_rate: Option<Given<i64>> [Shown::example("1000")]
        => fault_tun_rate: Option<u32> = int(1..=MAX_TUN_RATE),
    /// With --workers above 1: 2 s after start every worker but the first panics (panic)
    /// or stops turning (stall), to test that the daemon then ends with exit 1 [default:
    /// no fault].
    #[arg(long, value_name = "FAULT", help_heading = TEST_HELP_HEADING)]
    pub fault_worker: Option<Given<WorkerFault>> [Shown::example("\"panic\"")]
        => fault_worker: Option<WorkerFault> = value(),
});

/// The configuration file and the command line a [`Config`] was resolved from: a reload
/// resolves the file again with the same flags (which still win over it).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSource {
    /// The file (`--config`).
    pub file: PathBuf,
    /// The command line's settings.
    pub flags: Settings,
}

/// Resolves merged settings: [`validate`] made by the declaration.
pub(super) fn resolve_merged(s: &Settings) -> Result<Config, crate::setting::ConfigError> {
    validate(s)
}
