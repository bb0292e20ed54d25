//! The command-line flags of `ipoib-cm up` ([`UpArgs`]) and the fault-injection flags it shares
//! with the tools ([`FaultFlags`]).

use std::path::PathBuf;

use super::error::ConfigError;
use super::file::ConfigFile;
use super::value::{pick_int, pick_pct};
use crate::soft::FaultConfig;

/// The flags of `ipoib-cm up`; `#[command(flatten)]` it into the subcommand.
///
/// Values are taken as text and validated by [`resolve`](super::resolve), so that every mistake
/// gives the same one-line error format whether it came from a flag or the file. Every flag but
/// `--config` is also a key of [`ConfigFile`], the same name with `_` for `-`.
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
    /// Provider: soft or verbs (libibverbs; CM MADs over UDP, see --cm-transport)
    /// [default: soft].
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<String>,
    /// With --provider verbs: the IB device [default: the first one].
    #[arg(long, value_name = "DEV")]
    pub ib_dev: Option<String>,
}

/// The fault-injection flags of the software provider, shared by `ipoib-cm up` and the
/// tools; `#[command(flatten)]` it. Values are text, validated by [`FaultFlags::resolve`] (or
/// [`FaultFlags::to_config`] where there is no file).
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

    /// The flags alone, for the tools, which read no file.
    ///
    /// # Errors
    /// A one-line [`ConfigError`] naming the flag.
    pub fn to_config(&self) -> Result<FaultConfig, ConfigError> {
        self.resolve(&ConfigFile::default())
    }
}
