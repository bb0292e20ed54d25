//! The resolution of the settings that a plain [`Rule`](super::rules::Rule) does not cover:
//! those checked against another setting, aliases of the opposite sense, and the QP budget
//! policy's three spellings. Each takes the fields as given and names them in its errors.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::types::{
    check_ifname, check_log, default_control_socket, Quirk, DEFAULT_IFNAME, DEFAULT_LOG,
    TX_STALL_ACK_TIMEOUTS,
};
use crate::ipoib::{QpBudgetPolicy, MAX_SRQ_DEPTH, MIN_SRQ_DEPTH};
use crate::setting::{
    duration_at_least, format_duration, origin_of, parse, parse_list, switch, ConfigError, Given,
    Origin,
};
use crate::soft::Quirks;
use crate::wire::{BadWorkerCount, WorkerCount};

/// The interface name, checked as Linux takes it; [`DEFAULT_IFNAME`] when not given.
pub(super) fn ifname(given: Option<&Given<String>>) -> Result<String, ConfigError> {
    match parse("ifname", given)? {
        Some(name) => {
            check_ifname(origin_of(given), &name)?;
            Ok(name)
        }
        None => Ok(DEFAULT_IFNAME.to_owned()),
    }
}

/// The underlay address, required.
pub(super) fn bind(given: Option<&Given<IpAddr>>) -> Result<IpAddr, ConfigError> {
    parse("bind", given)?.ok_or_else(|| {
        ConfigError::invalid(
            "--bind",
            "required (the underlay address of the software provider; or bind in the config file)",
        )
    })
}

/// The peers: of `bind`'s family, not `bind` itself, at most `max`.
pub(super) fn peers(
    given: &[Given<IpAddr>],
    bind: IpAddr,
    max: usize,
) -> Result<Vec<IpAddr>, ConfigError> {
    let peer = parse_list("peer", given)?;
    for (ip, given) in peer.iter().zip(given) {
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
    if let Some(over) = given.get(max) {
        return Err(over.origin().err("peer", format!("more than {max} peers")));
    }
    Ok(peer)
}

/// Whether a switch `key` with the file-only alias `alias` of the opposite sense is off.
pub(super) fn on_unless(
    key: &str,
    given: Option<&Given<bool>>,
    alias: &str,
    alias_given: Option<&Given<bool>>,
) -> Result<bool, ConfigError> {
    Ok(!switch(key, given, alias, alias_given)?)
}

/// The TX stall timeout: positive, longer than the local ACK timeout of `qp_timeout`; when
/// not given the endpoint's `default` or [`TX_STALL_ACK_TIMEOUTS`] local ACK timeouts,
/// whichever is longer.
pub(super) fn tx_stall_timeout(
    given: Option<&Given<Duration>>,
    default: Duration,
    qp_timeout: u8,
) -> Result<Duration, ConfigError> {
    let ack_timeout = crate::wire::cm::ibta_timeout(qp_timeout);
    let default = default.max(ack_timeout * TX_STALL_ACK_TIMEOUTS);
    let d = duration_at_least("tx_stall_timeout", given, Duration::from_millis(1), default)?;
    if d <= ack_timeout {
        return Err(origin_of(given).err(
            "tx_stall_timeout",
            format!(
                "must be longer than the local ACK timeout of qp_timeout {qp_timeout} ({})",
                format_duration(ack_timeout)
            ),
        ));
    }
    Ok(d)
}

/// The QP budget policy: the flag `--reject`/`--evict`, else the file's `reject`/`evict`/
/// `qp_budget_policy`, which must agree; `None` when none is given.
pub(super) fn budget_policy(
    evict: Option<&Given<bool>>,
    reject: Option<&Given<bool>>,
    policy: Option<&Given<QpBudgetPolicy>>,
) -> Result<Option<QpBudgetPolicy>, ConfigError> {
    for (given, p) in [
        (reject, QpBudgetPolicy::Reject),
        (evict, QpBudgetPolicy::Evict),
    ] {
        if matches!(given, Some(Given::Flag(_))) {
            return Ok(Some(p));
        }
    }
    let mut given = Vec::new();
    if parse("evict", evict)? == Some(true) {
        given.push(("evict", QpBudgetPolicy::Evict));
    }
    if parse("reject", reject)? == Some(true) {
        given.push(("reject", QpBudgetPolicy::Reject));
    }
    if let Some(p) = parse("qp_budget_policy", policy)? {
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

/// The quirks turned on.
pub(super) fn quirks(given: &[Given<Quirk>]) -> Result<Quirks, ConfigError> {
    let mut quirks = Quirks::default();
    for q in parse_list("quirk", given)? {
        q.set(&mut quirks);
    }
    Ok(quirks)
}

/// The control socket: not empty, fits `sun_path`; `@ipoib-cm/IFNAME` when not given.
pub(super) fn control_socket(
    given: Option<&Given<PathBuf>>,
    ifname: &str,
) -> Result<PathBuf, ConfigError> {
    let Some(p) = parse("control_socket", given)? else {
        return Ok(default_control_socket(ifname));
    };
    let origin = origin_of(given);
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
    Ok(p)
}

/// The log filter, checked; [`DEFAULT_LOG`] when not given.
pub(super) fn log(given: Option<&Given<String>>) -> Result<String, ConfigError> {
    match parse("log", given)? {
        Some(filter) => {
            check_log(origin_of(given), &filter)?;
            Ok(filter)
        }
        None => Ok(DEFAULT_LOG.to_owned()),
    }
}

/// The IB device, not empty; `None` when not given.
pub(super) fn ib_dev(given: Option<&Given<String>>) -> Result<Option<String>, ConfigError> {
    match parse("ib_dev", given)? {
        Some(dev) if dev.is_empty() => Err(origin_of(given).err("ib_dev", "must not be empty")),
        dev => Ok(dev),
    }
}

/// The SRQ depth: a power of two in [`MIN_SRQ_DEPTH`]..=[`MAX_SRQ_DEPTH`]; `default` when
/// not given.
pub(super) fn srq_depth(given: Option<&Given<i64>>, default: u32) -> Result<u32, ConfigError> {
    let Some(n) = parse("srq_depth", given)? else {
        return Ok(default);
    };
    u32::try_from(n)
        .ok()
        .filter(|n| (MIN_SRQ_DEPTH..=MAX_SRQ_DEPTH).contains(n) && n.is_power_of_two())
        .ok_or_else(|| {
            origin_of(given).err(
                "srq_depth",
                format!("must be a power of two from {MIN_SRQ_DEPTH} to {MAX_SRQ_DEPTH} (got {n})"),
            )
        })
}

/// The worker count: a power of two from 1 to 64; 1 when not given.
pub(super) fn workers(given: Option<&Given<i64>>) -> Result<WorkerCount, ConfigError> {
    let Some(n) = parse("workers", given)? else {
        return Ok(WorkerCount::ONE);
    };
    let n = u32::try_from(n).unwrap_or(0);
    WorkerCount::new(n).map_err(|e: BadWorkerCount| origin_of(given).err("workers", e.to_string()))
}
