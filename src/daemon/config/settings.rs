//! The one definition of the settings of `ipoib-cm up` ([`Settings`]): its fields are the
//! command-line flags (clap) and the keys of the TOML file (serde), and their docs are the
//! `--help` text.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::faults::TEST_HELP_HEADING;
use super::given::{Given, Quirk};
use super::resolved::{Cidr, ProviderKind};
use crate::daemon::logging::LogFormat;
use crate::ipoib::{Mode, QpBudgetPolicy};
use crate::mad::CmTransport;
use crate::verbs::PathMtu;
use crate::wire::ipoib::HwAddr;

/// How a field of the command line is laid over the same field of the file.
trait Merge {
    /// `flag` if it was given, else `file`.
    fn merge(flag: Self, file: Self) -> Self;
}

/// A single value: the flag's if given.
impl<T> Merge for Option<T> {
    fn merge(flag: Self, file: Self) -> Self {
        flag.or(file)
    }
}

/// A repeatable value: the flags given at least once replace the file's whole list.
impl<T> Merge for Vec<T> {
    fn merge(flag: Self, file: Self) -> Self {
        if flag.is_empty() {
            file
        } else {
            flag
        }
    }
}

/// Defines [`Settings`] and its [`Settings::over`] from one list of fields.
macro_rules! settings {
    ($(#[$meta:meta])* pub struct Settings { $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        pub struct Settings {
            $($(#[$fmeta])* pub $field: $ty,)*
        }

        impl Settings {
            /// These settings (the command line) laid over `file`'s: each field given here
            /// wins, a repeatable one given at least once replaces the file's list.
            pub fn over(self, file: Self) -> Self {
                Self {
                    $($field: Merge::merge(self.$field, file.$field),)*
                }
            }
        }
    };
}

settings! {
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
    #[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Settings {
        /// TOML configuration file; flags override its keys.
        #[arg(long, value_name = "FILE")]
        #[serde(skip)]
        pub config: Option<PathBuf>,
        /// Interface name [default: ib0].
        #[arg(long, value_name = "NAME")]
        pub ifname: Option<Given<String>>,
        /// Address of the interface, IPv4 or IPv6 CIDR; without a prefix a host address (/32,
        /// /128) as `ip` takes it (repeatable).
        #[arg(long, value_name = "CIDR")]
        #[serde(default)]
        pub addr: Vec<Given<Cidr>>,
        /// Underlay address of the software provider (required, here or in the file).
        #[arg(long, value_name = "ADDR")]
        pub bind: Option<Given<IpAddr>>,
        /// Underlay address of another node (repeatable); broadcast is fanned out to them, by
        /// unicast, besides IP multicast.
        #[arg(long, value_name = "ADDR")]
        #[serde(default)]
        pub peer: Vec<Given<IpAddr>>,
        /// Don't carry the broadcast group as IP multicast on the underlay (UDP 4791 to
        /// 239.255.<P_Key>, or on IPv6 the MGID itself); then only --peer addresses hear it.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub no_multicast: Option<Given<bool>>,
        /// TTL (IPv4) or hop limit (IPv6) of the underlay multicast, 1..=255 [default: 1, the
        /// link].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub multicast_ttl: Option<Given<i64>>,
        /// Static neighbour, IP=HWADDR with the 20-byte hardware address in `ip link` form
        /// (repeatable).
        #[arg(long, value_name = "IP=HWADDR")]
        #[serde(default)]
        pub neigh: Vec<Given<(IpAddr, HwAddr)>>,
        /// RoCEv2 UDP port [default: 4791].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub udp_port: Option<Given<i64>>,
        /// How CM MADs travel: qp1 or udp [default: qp1 on soft, udp on verbs].
        #[arg(long, value_name = "TRANSPORT")]
        pub cm_transport: Option<Given<CmTransport>>,
        /// UDP port of the CM MAD side channel (--cm-transport udp) [default: 4792].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub mad_port: Option<Given<i64>>,
        /// Don't verify the ICRC of IPv4 packets at all (peers with their own IPv4 IDs, such as
        /// the kernel's rxe, need no flag: the ID is solved for from the ICRC).
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub no_icrc_v4: Option<Given<bool>>,
        /// Alias of `no_icrc_v4` with the opposite sense (file only).
        #[arg(skip)]
        pub verify_icrc_v4: Option<Given<bool>>,
        /// Send and receive one UDP datagram per syscall: no GSO trains, no GRO (captures on a
        /// veth then show every RoCE packet as sent).
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub no_udp_offload: Option<Given<bool>>,
        /// Alias of `no_udp_offload` with the opposite sense (file only).
        #[arg(skip)]
        pub udp_offload: Option<Given<bool>>,
        /// Local ACK timeout exponent of RC QPs, 4.096 us * 2^N, 8..=24 [default: 12].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub qp_timeout: Option<Given<i64>>,
        /// IPoIB mode: connected or datagram [default: connected].
        #[arg(long, value_name = "MODE")]
        pub mode: Option<Given<Mode>>,
        /// Do not use a shared receive queue.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub no_srq: Option<Given<bool>>,
        /// Alias of `no_srq` with the opposite sense (file only).
        #[arg(skip)]
        pub srq: Option<Given<bool>>,
        /// Reap RX connections idle this long, at least 1s [default: 60s].
        #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
        pub rx_timeout: Option<Given<Duration>>,
        /// Give up waiting for a QP to drain after this long [default: 5s].
        #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
        pub drain_timeout: Option<Given<Duration>>,
        /// Fail a TX connection whose sends complete none for this long, freeing its send
        /// buffers for other peers [default: 1s, or 4 local ACK timeouts if longer].
        #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
        pub tx_stall_timeout: Option<Given<Duration>>,
        /// Spin looking for events this long after each one, e.g. 200us; at most 10ms
        /// [default: 0].
        #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
        pub busy_poll: Option<Given<Duration>>,
        /// Forget neighbours after this long [default: 300s].
        #[arg(long, value_name = "DURATION", allow_negative_numbers = true)]
        pub neigh_timeout: Option<Given<Duration>>,
        /// Most learned neighbour entries; one more evicts the least recently used entry
        /// without a connection [default: 1024].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub neigh_max: Option<Given<i64>>,
        /// Connected-mode QP budget [default: 128].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub max_conn_qp: Option<Given<i64>>,
        /// Half-open RX connections (REP sent, no RTU yet) held at once; a REQ beyond them
        /// tears down the oldest [default: 16].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub max_pending_rx: Option<Given<i64>>,
        /// When the QP budget is spent, evict the idlest RX connection (default).
        #[arg(long, num_args = 0, default_missing_value = "true", conflicts_with = "reject")]
        pub evict: Option<Given<bool>>,
        /// When the QP budget is spent, reject new connections.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pub reject: Option<Given<bool>>,
        /// `evict` or `reject` (file only).
        #[arg(skip)]
        pub qp_budget_policy: Option<Given<QpBudgetPolicy>>,
        /// Packets queued per neighbour while it connects [default: 3].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub tx_queue_len: Option<Given<i64>>,
        /// IB path MTU: 256, 512, 1024, 2048 or 4096 [default: from the underlay link MTU].
        #[arg(long, value_name = "BYTES", allow_negative_numbers = true)]
        pub path_mtu: Option<Given<PathMtu>>,
        /// Percentage of sent packets the software provider drops.
        #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
        pub fault_loss: Option<Given<f64>>,
        /// Percentage of sent packets the software provider reorders.
        #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
        pub fault_reorder: Option<Given<f64>>,
        /// Percentage of sent packets the software provider duplicates.
        #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
        pub fault_dup: Option<Given<f64>>,
        /// Percentage of sent packets the software provider corrupts.
        #[arg(long, value_name = "PCT", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
        pub fault_corrupt: Option<Given<f64>>,
        /// Seed of the fault RNG [default: 1].
        #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = TEST_HELP_HEADING)]
        pub fault_seed: Option<Given<i64>>,
        /// Seed of the software provider's QPN order, which fixes its hardware address (for
        /// peers that name it in a static --neigh) [default: drawn at each start].
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        pub qpn_seed: Option<Given<i64>>,
        /// Provider quirk: drain-never, no-last-wqe or dup-last-wqe (repeatable).
        #[arg(long, value_name = "QUIRK", help_heading = TEST_HELP_HEADING)]
        #[serde(default)]
        pub quirk: Vec<Given<Quirk>>,
        /// Control socket: a path, or @NAME for an abstract socket (default: @ipoib-cm/IFNAME).
        #[arg(long, value_name = "PATH")]
        pub control_socket: Option<Given<PathBuf>>,
        /// Serve the Prometheus exposition over HTTP at this ADDR:PORT (`GET /metrics`), e.g.
        /// 127.0.0.1:9464; no authentication, so loopback unless meant [default: off].
        #[arg(long, value_name = "ADDR:PORT")]
        pub metrics_listen: Option<Given<SocketAddr>>,
        /// Log filter: off, error, warn, info, debug, trace or target=level,... [default: info].
        #[arg(long, value_name = "LEVEL")]
        pub log: Option<Given<String>>,
        /// Log line format: text or json [default: text]. Lines carry no timestamp of their
        /// own when stderr is the systemd journal.
        #[arg(long, value_name = "FORMAT")]
        pub log_format: Option<Given<LogFormat>>,
        /// Provider: soft or verbs (libibverbs; CM MADs over UDP, see --cm-transport)
        /// [default: soft].
        #[arg(long, value_name = "PROVIDER")]
        pub provider: Option<Given<ProviderKind>>,
        /// With --provider verbs: the IB device [default: the first one].
        #[arg(long, value_name = "DEV")]
        pub ib_dev: Option<Given<String>>,
    }
}
