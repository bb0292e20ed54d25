//! Configuration of `ipoib-cm up`: a TOML file ([`ConfigFile`]), command-line flags that
//! override it ([`UpArgs`]), and the validated [`Config`] they resolve to.
//!
//! Every flag but `--config` is also a config key, the same name with `_` for `-`
//! (`--rx-timeout` is `rx_timeout`, `--no-srq` is `no_srq = true`, `--quirk` is
//! `quirk = [...]`); [`ConfigFile`] names the older aliases it also reads. A flag given on the
//! command line wins over the file; a repeatable flag given at least once replaces the file's
//! whole list. Each setting's default and meaning is the doc of its [`Config`] field; the
//! endpoint's settings default as [`EndpointConfig::new`](crate::ipoib::EndpointConfig::new)
//! does.
//!
//! Errors are one line naming the field as the user wrote it: `--rx-timeout: ...` for a flag,
//! `config: rx_timeout: ...` for a file key, `config file PATH: line N: ...` for a file that
//! does not parse. The caller prints the [`ConfigError`] and exits with
//! [`ConfigError::exit_code`].
//!
//! Parsing ([`parse_config_file`], [`parse_duration`]) and [`resolve_str`] are pure; only
//! [`resolve`] reads the file.

mod cli;
mod error;
mod file;
mod resolved;
mod value;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

pub use self::cli::{FaultFlags, UpArgs};
pub(crate) use self::error::os_message;
pub use self::error::ConfigError;
use self::error::Origin;
pub use self::file::{parse_config_file, ConfigFile, FileDuration};
pub use self::resolved::*;
use self::value::{
    add_quirk, check_ifname, check_log, pick, pick_list, pick_str, pick_switch, Choice,
};
pub use self::value::{format_duration, parse_duration, pick_duration, pick_int, DurationError};
pub use crate::ipoib::{Mode, ParseChoiceError, QpBudgetPolicy};
use crate::soft::Quirks;
use crate::verbs::PathMtu;
use crate::wire::ipoib::HwAddr;

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
    let d = endpoint_defaults();
    let ifname = match pick_str(flags.ifname.as_deref(), file.ifname.as_deref()) {
        Some((origin, s)) => {
            check_ifname(origin, s)?;
            s.to_owned()
        }
        None => DEFAULT_IFNAME.to_owned(),
    };

    let (origin, list) = pick_list(&flags.addr, file.addr.as_deref());
    let addr = list
        .iter()
        .map(|s| s.parse::<Cidr>().map_err(|e| origin.err("addr", e)))
        .collect::<Result<Vec<_>, _>>()?;

    let bind = match pick_str(flags.bind.as_deref(), file.bind.as_deref()) {
        Some((origin, s)) => s
            .parse::<IpAddr>()
            .map_err(|_| origin.err("bind", format!("invalid IP address {s:?}")))?,
        None => return Err(ConfigError::invalid(
            "--bind",
            "required (the underlay address of the software provider; or bind in the config file)",
        )),
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
        let hw = hw.trim().parse::<HwAddr>().map_err(|_| bad())?;
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
                .map_err(|e| origin.err("cm_transport", e))?,
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

    let verify_icrc_v4 = !pick_switch(
        "no_icrc_v4",
        flags.no_icrc_v4,
        file.no_icrc_v4,
        "verify_icrc_v4",
        file.verify_icrc_v4,
    )?;
    let udp_offload = !pick_switch(
        "no_udp_offload",
        flags.no_udp_offload,
        file.no_udp_offload,
        "udp_offload",
        file.udp_offload,
    )?;

    let qp_timeout = pick_int(
        "qp_timeout",
        flags.qp_timeout.as_deref(),
        file.qp_timeout,
        i64::from(*QP_TIMEOUT_RANGE.start()),
        i64::from(*QP_TIMEOUT_RANGE.end()),
    )?
    .map_or(d.qp_timeout, |v| v as u8);

    let mode = match pick_str(flags.mode.as_deref(), file.mode.as_deref()) {
        Some((origin, s)) => s.parse::<Mode>().map_err(|e| origin.err("mode", e))?,
        None => d.mode,
    };

    let srq = !pick_switch("no_srq", flags.no_srq, file.no_srq, "srq", file.srq)?;

    let rx_timeout = pick_duration(
        "rx_timeout",
        flags.rx_timeout.as_deref(),
        file.rx_timeout.as_ref().map(FileDuration::text).as_deref(),
        MIN_RX_TIMEOUT,
        d.rx_timeout,
    )?;
    let drain_timeout = pick_duration(
        "drain_timeout",
        flags.drain_timeout.as_deref(),
        file.drain_timeout
            .as_ref()
            .map(FileDuration::text)
            .as_deref(),
        Duration::from_millis(1),
        d.drain_timeout,
    )?;
    let ack_timeout = crate::wire::cm::ibta_timeout(qp_timeout);
    let tx_stall_timeout = pick_duration(
        "tx_stall_timeout",
        flags.tx_stall_timeout.as_deref(),
        file.tx_stall_timeout
            .as_ref()
            .map(FileDuration::text)
            .as_deref(),
        Duration::from_millis(1),
        d.tx_stall_timeout.max(ack_timeout * TX_STALL_ACK_TIMEOUTS),
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
        file.busy_poll.as_ref().map(FileDuration::text).as_deref(),
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
        file.neigh_timeout
            .as_ref()
            .map(FileDuration::text)
            .as_deref(),
        MIN_NEIGH_TIMEOUT,
        d.neigh_timeout,
    )?;

    let max_conn_qp = pick_int(
        "max_conn_qp",
        flags.max_conn_qp.as_deref(),
        file.max_conn_qp,
        1,
        i64::from(MAX_MAX_CONN_QP),
    )?
    .map_or(d.max_conn_qp as u32, |v| v as u32);

    let qp_budget_policy = qp_budget_policy(flags, file)?.unwrap_or(d.budget_policy);

    let tx_queue_len = pick_int(
        "tx_queue_len",
        flags.tx_queue_len.as_deref(),
        file.tx_queue_len,
        1,
        i64::from(MAX_TX_QUEUE_LEN),
    )?
    .map_or(d.tx_queue_len as u32, |v| v as u32);

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
        add_quirk(&mut quirks, origin, q)?;
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
            check_log(origin, s)?;
            s.to_owned()
        }
        None => DEFAULT_LOG.to_owned(),
    };

    let provider = match pick_str(flags.provider.as_deref(), file.provider.as_deref()) {
        Some((origin, s)) => s
            .parse::<ProviderKind>()
            .map_err(|e| origin.err("provider", e))?,
        None => ProviderKind::default(),
    };
    let ib_dev = match pick_str(flags.ib_dev.as_deref(), file.ib_dev.as_deref()) {
        Some((origin, "")) => return Err(origin.err("ib_dev", "must not be empty")),
        Some((_, s)) => Some(s.to_owned()),
        None => None,
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
        provider,
        ib_dev,
    })
}

/// The QP budget policy: `--reject`/`--evict`, else the file's `reject`/`evict`/
/// `qp_budget_policy`; `None` when none is given.
fn qp_budget_policy(
    flags: &UpArgs,
    file: &ConfigFile,
) -> Result<Option<QpBudgetPolicy>, ConfigError> {
    if flags.reject {
        return Ok(Some(QpBudgetPolicy::Reject));
    }
    if flags.evict {
        return Ok(Some(QpBudgetPolicy::Evict));
    }
    let mut given = Vec::new();
    if file.evict == Some(true) {
        given.push(("evict", QpBudgetPolicy::Evict));
    }
    if file.reject == Some(true) {
        given.push(("reject", QpBudgetPolicy::Reject));
    }
    if let Some(s) = file.qp_budget_policy.as_deref() {
        let p = s
            .parse::<QpBudgetPolicy>()
            .map_err(|e| Origin::File.err("qp_budget_policy", e))?;
        given.push(("qp_budget_policy", p));
    }
    match given.as_slice() {
        [] => Ok(None),
        [(_, p)] => Ok(Some(*p)),
        [(first, p), rest @ ..] => match rest.iter().find(|(_, q)| q != p) {
            Some((other, _)) => Err(Origin::File.err(first, format!("contradicts {other}"))),
            None => Ok(Some(*p)),
        },
    }
}
