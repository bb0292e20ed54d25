//! Configuration of `ipoib-cm up`: one definition of its settings ([`Settings`]) that is both
//! the command-line flags and the keys of the TOML file, and the validated [`Config`] they
//! resolve to.
//!
//! Every flag but `--config` is also a config key, the same name with `_` for `-`
//! (`--rx-timeout` is `rx_timeout`, `--no-srq` is `no_srq = true`, `--quirk` is
//! `quirk = [...]`); [`Settings`] names the older aliases the file also reads. A flag given on
//! the command line wins over the file; a repeatable flag given at least once replaces the
//! file's whole list ([`Settings::over`]). A value is parsed by its type's one [`Setting`]
//! parse whether it came from a flag or the file. Each setting's default and meaning is the
//! doc of its [`Config`] field; the endpoint's settings default as
//! [`EndpointConfig::new`](crate::ipoib::EndpointConfig::new) does.
//!
//! Adding a setting is a field of [`Settings`] (its doc is the `--help` line), its field in
//! [`Config`] with the line of [`resolve`] that validates it, its README row and its test.
//!
//! Errors are one line naming the field as the user wrote it: `--rx-timeout: ...` for a flag,
//! `config: rx_timeout: ...` for a file key, `config file PATH: line N: ...` for a file that
//! does not parse (TOML syntax, an unknown key, a value of the wrong TOML type). The caller
//! prints the [`ConfigError`] and exits with [`ConfigError::exit_code`].
//!
//! Parsing ([`parse_config_file`], [`parse_duration`]) and [`resolve_str`] are pure; only
//! [`resolve`] reads the file.

mod error;
mod faults;
mod file;
mod given;
mod resolved;
mod settings;
mod value;

use std::path::Path;
use std::time::Duration;

pub(crate) use self::error::os_message;
pub use self::error::ConfigError;
use self::error::Origin;
use self::faults::fault_config;
pub use self::faults::{FaultFlags, TEST_HELP_HEADING};
pub use self::file::{parse_config_file, FileDuration};
pub use self::given::{parse_path_mtu, Given, InvalidPathMtu, InvalidValue, Quirk, Setting};
pub use self::resolved::*;
pub use self::settings::Settings;
use self::value::{
    check_alias, check_ifname, check_log, duration_at_least, int_in, origin_of, parse, parse_list,
    switch,
};
pub use self::value::{format_duration, parse_duration, pick_duration, pick_int, DurationError};
pub use crate::ipoib::{Mode, ParseChoiceError, QpBudgetPolicy};
use crate::soft::Quirks;

/// Reads `file` (if any), applies `flags` over it, validates and returns the [`Config`].
///
/// Pass `flags.config.as_deref()` as `file`.
///
/// # Errors
/// A one-line [`ConfigError`] naming the field; exit with [`ConfigError::EXIT_CODE`].
pub fn resolve(file: Option<&Path>, flags: &Settings) -> Result<Config, ConfigError> {
    let parsed = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                path: path.to_owned(),
                message: os_message(&e),
            })?;
            parse_config_file(path, &text)?
        }
        None => Settings::default(),
    };
    let mut cfg = resolve_parsed(&parsed, flags)?;
    cfg.source = file.map(|file| ConfigSource {
        file: file.to_owned(),
        flags: flags.clone(),
    });
    Ok(cfg)
}

/// [`resolve`] on config text instead of a file. Pure.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_str(path: &Path, text: &str, flags: &Settings) -> Result<Config, ConfigError> {
    resolve_parsed(&parse_config_file(path, text)?, flags)
}

/// Applies `flags` over an already parsed file and validates. Pure.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_parsed(file: &Settings, flags: &Settings) -> Result<Config, ConfigError> {
    // The file's keys and their opposite-sense aliases agree, whatever the flags say.
    check_alias(
        "no_icrc_v4",
        file.no_icrc_v4.as_ref(),
        "verify_icrc_v4",
        file.verify_icrc_v4.as_ref(),
    )?;
    check_alias(
        "no_udp_offload",
        file.no_udp_offload.as_ref(),
        "udp_offload",
        file.udp_offload.as_ref(),
    )?;
    check_alias("no_srq", file.no_srq.as_ref(), "srq", file.srq.as_ref())?;
    let s = flags.clone().over(file.clone());
    validate(&s)
}

/// Validates merged settings into the [`Config`], with the defaults of the settings not given.
fn validate(s: &Settings) -> Result<Config, ConfigError> {
    let d = endpoint_defaults();
    let ifname = match parse("ifname", s.ifname.as_ref())? {
        Some(name) => {
            check_ifname(origin_of(s.ifname.as_ref()), &name)?;
            name
        }
        None => DEFAULT_IFNAME.to_owned(),
    };

    let addr = parse_list("addr", &s.addr)?;

    let Some(bind) = parse("bind", s.bind.as_ref())? else {
        return Err(ConfigError::invalid(
            "--bind",
            "required (the underlay address of the software provider; or bind in the config file)",
        ));
    };

    let peer = parse_list("peer", &s.peer)?;
    for (ip, given) in peer.iter().zip(&s.peer) {
        if ip.is_ipv4() != bind.is_ipv4() {
            return Err(given.origin().err(
                "peer",
                format!("{ip} is not the same address family as bind address {bind}"),
            ));
        }
        if *ip == bind {
            return Err(given
                .origin()
                .err("peer", format!("{ip} is the bind address itself")));
        }
    }

    if let Some(over) = s.peer.get(MAX_PEERS) {
        return Err(over
            .origin()
            .err("peer", format!("more than {MAX_PEERS} peers")));
    }

    let multicast = parse("no_multicast", s.no_multicast.as_ref())? != Some(true);
    let multicast_ttl = int_in("multicast_ttl", s.multicast_ttl.as_ref(), 1, 255)?
        .map_or(crate::soft::DEFAULT_MULTICAST_TTL, |v| v as u8);

    let neigh = parse_list("neigh", &s.neigh)?;
    if let Some(over) = s.neigh.get(MAX_STATIC_NEIGHBOURS) {
        return Err(over.origin().err(
            "neigh",
            format!("more than {MAX_STATIC_NEIGHBOURS} static neighbours"),
        ));
    }

    let port = |key, given| -> Result<Option<u16>, ConfigError> {
        Ok(int_in(key, given, 1, i64::from(u16::MAX))?.map(|v| v as u16))
    };
    let udp_port = port("udp_port", s.udp_port.as_ref())?.unwrap_or(DEFAULT_UDP_PORT);
    let cm_transport = parse("cm_transport", s.cm_transport.as_ref())?;
    let mad_port = port("mad_port", s.mad_port.as_ref())?.unwrap_or(crate::mad::DEFAULT_MAD_PORT);

    let verify_icrc_v4 = !switch(
        "no_icrc_v4",
        s.no_icrc_v4.as_ref(),
        "verify_icrc_v4",
        s.verify_icrc_v4.as_ref(),
    )?;
    let udp_offload = !switch(
        "no_udp_offload",
        s.no_udp_offload.as_ref(),
        "udp_offload",
        s.udp_offload.as_ref(),
    )?;

    let qp_timeout = int_in(
        "qp_timeout",
        s.qp_timeout.as_ref(),
        i64::from(*QP_TIMEOUT_RANGE.start()),
        i64::from(*QP_TIMEOUT_RANGE.end()),
    )?
    .map_or(d.qp_timeout, |v| v as u8);

    let mode = parse("mode", s.mode.as_ref())?.unwrap_or(d.mode);
    let srq = !switch("no_srq", s.no_srq.as_ref(), "srq", s.srq.as_ref())?;

    let rx_timeout = duration_at_least(
        "rx_timeout",
        s.rx_timeout.as_ref(),
        MIN_RX_TIMEOUT,
        d.rx_timeout,
    )?;
    let drain_timeout = duration_at_least(
        "drain_timeout",
        s.drain_timeout.as_ref(),
        Duration::from_millis(1),
        d.drain_timeout,
    )?;
    let ack_timeout = crate::wire::cm::ibta_timeout(qp_timeout);
    let tx_stall_timeout = duration_at_least(
        "tx_stall_timeout",
        s.tx_stall_timeout.as_ref(),
        Duration::from_millis(1),
        d.tx_stall_timeout.max(ack_timeout * TX_STALL_ACK_TIMEOUTS),
    )?;
    if tx_stall_timeout <= ack_timeout {
        return Err(origin_of(s.tx_stall_timeout.as_ref()).err(
            "tx_stall_timeout",
            format!(
                "must be longer than the local ACK timeout of qp_timeout {qp_timeout} ({})",
                format_duration(ack_timeout)
            ),
        ));
    }
    let busy_poll = duration_at_least(
        "busy_poll",
        s.busy_poll.as_ref(),
        Duration::ZERO,
        Duration::ZERO,
    )?;
    if busy_poll > MAX_BUSY_POLL {
        return Err(origin_of(s.busy_poll.as_ref()).err(
            "busy_poll",
            format!("must be at most {}", format_duration(MAX_BUSY_POLL)),
        ));
    }
    let neigh_timeout = duration_at_least(
        "neigh_timeout",
        s.neigh_timeout.as_ref(),
        MIN_NEIGH_TIMEOUT,
        d.neigh_timeout,
    )?;
    let neigh_max = int_in(
        "neigh_max",
        s.neigh_max.as_ref(),
        1,
        i64::from(MAX_NEIGH_MAX),
    )?
    .map_or(d.neigh_max as u32, |v| v as u32);

    let max_conn_qp = int_in(
        "max_conn_qp",
        s.max_conn_qp.as_ref(),
        1,
        i64::from(MAX_MAX_CONN_QP),
    )?
    .map_or(d.max_conn_qp as u32, |v| v as u32);

    let qp_budget_policy = qp_budget_policy(s)?.unwrap_or(d.budget_policy);

    let max_pending_rx = int_in(
        "max_pending_rx",
        s.max_pending_rx.as_ref(),
        1,
        i64::from(MAX_MAX_PENDING_RX),
    )?
    .map_or(d.max_pending_rx as u32, |v| v as u32);

    let tx_queue_len = int_in(
        "tx_queue_len",
        s.tx_queue_len.as_ref(),
        1,
        i64::from(MAX_TX_QUEUE_LEN),
    )?
    .map_or(d.tx_queue_len as u32, |v| v as u32);

    let path_mtu = parse("path_mtu", s.path_mtu.as_ref())?;

    let fault = fault_config(
        s.fault_loss.as_ref(),
        s.fault_reorder.as_ref(),
        s.fault_dup.as_ref(),
        s.fault_corrupt.as_ref(),
        s.fault_seed.as_ref(),
    )?;

    let mut quirks = Quirks::default();
    for q in parse_list("quirk", &s.quirk)? {
        q.set(&mut quirks);
    }

    let control_socket = match parse("control_socket", s.control_socket.as_ref())? {
        Some(p) => {
            let origin = origin_of(s.control_socket.as_ref());
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
            p
        }
        None => default_control_socket(&ifname),
    };

    let metrics_listen = parse("metrics_listen", s.metrics_listen.as_ref())?;

    let log = match parse("log", s.log.as_ref())? {
        Some(filter) => {
            check_log(origin_of(s.log.as_ref()), &filter)?;
            filter
        }
        None => DEFAULT_LOG.to_owned(),
    };

    let log_format = parse("log_format", s.log_format.as_ref())?.unwrap_or_default();
    let qpn_seed = int_in("qpn_seed", s.qpn_seed.as_ref(), 0, i64::MAX)?.map(|v| v as u64);

    let provider = parse("provider", s.provider.as_ref())?.unwrap_or_default();
    let ib_dev = match parse("ib_dev", s.ib_dev.as_ref())? {
        Some(dev) if dev.is_empty() => {
            return Err(origin_of(s.ib_dev.as_ref()).err("ib_dev", "must not be empty"))
        }
        dev => dev,
    };

    Ok(Config {
        ifname,
        addr,
        bind,
        peer,
        multicast,
        multicast_ttl,
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
        neigh_max,
        max_conn_qp,
        qp_budget_policy,
        max_pending_rx,
        tx_queue_len,
        path_mtu,
        fault,
        quirks,
        qpn_seed,
        control_socket,
        metrics_listen,
        log,
        log_format,
        provider,
        ib_dev,
        source: None,
    })
}

/// The QP budget policy: the flag `--reject`/`--evict`, else the file's `reject`/`evict`/
/// `qp_budget_policy`, which must agree; `None` when none is given.
fn qp_budget_policy(s: &Settings) -> Result<Option<QpBudgetPolicy>, ConfigError> {
    for (given, policy) in [
        (&s.reject, QpBudgetPolicy::Reject),
        (&s.evict, QpBudgetPolicy::Evict),
    ] {
        if matches!(given, Some(Given::Flag(_))) {
            return Ok(Some(policy));
        }
    }
    let mut given = Vec::new();
    if parse("evict", s.evict.as_ref())? == Some(true) {
        given.push(("evict", QpBudgetPolicy::Evict));
    }
    if parse("reject", s.reject.as_ref())? == Some(true) {
        given.push(("reject", QpBudgetPolicy::Reject));
    }
    if let Some(p) = parse("qp_budget_policy", s.qp_budget_policy.as_ref())? {
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
