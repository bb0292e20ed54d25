//! Reading one value as the user gave it, flag text or file value, with errors naming it.
//!
//! Each `pick_*` takes the flag's text (if the flag was given) and the file's value (if the
//! key was set), prefers the flag, validates, and names whichever it used in its error.

use std::time::Duration;

use super::error::{ConfigError, Origin};
use crate::soft::Quirks;

/// Linux `IFNAMSIZ` less the terminating NUL.
const IFNAME_MAX_BYTES: usize = 15;

/// A duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration at all.
    #[error("invalid duration {0:?} (use e.g. 50us, 500ms, 1.5s, 1m30s, 1h or plain seconds)")]
    Invalid(String),
    /// Longer than a [`Duration`] holds.
    #[error("duration {0:?} is too large")]
    TooLarge(String),
}

/// Parses a duration as [`humantime`] reads it (`50us`, `500ms`, `1.5s`, `1m30s`, `2h`, ...)
/// or plain seconds (`60`).
///
/// # Errors
/// [`DurationError`], whose text quotes the input.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| DurationError::TooLarge(s.to_owned()));
    }
    humantime::parse_duration(s).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => DurationError::TooLarge(s.to_owned()),
        _ => DurationError::Invalid(s.to_owned()),
    })
}

/// Formats a duration to whole microseconds as [`humantime`] writes it (`16ms 777us`, `5s`,
/// `1m 30s`), which [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    let whole_us = Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    if whole_us.is_zero() {
        return "0s".to_owned();
    }
    humantime::format_duration(whole_us).to_string()
}

/// The flag's value if given, else the file's, with where it came from.
pub(crate) fn pick<F, T>(flag: Option<F>, file: Option<T>) -> Option<(Origin, Choice<F, T>)> {
    match (flag, file) {
        (Some(f), _) => Some((Origin::Flag, Choice::Flag(f))),
        (None, Some(t)) => Some((Origin::File, Choice::File(t))),
        (None, None) => None,
    }
}

/// A value from a flag or from the file.
#[derive(Clone, Copy)]
pub(crate) enum Choice<F, T> {
    /// The flag's text.
    Flag(F),
    /// The file's value.
    File(T),
}

/// Picks a text value (flag string or file string).
pub(crate) fn pick_str<'a>(
    flag: Option<&'a str>,
    file: Option<&'a str>,
) -> Option<(Origin, &'a str)> {
    pick(flag, file).map(|(o, c)| match c {
        Choice::Flag(s) | Choice::File(s) => (o, s),
    })
}

/// Picks an integer in `lo..=hi`: the text of flag `--KEY` or the file's integer for `key`
/// (pass `None` for a key that has no file). `None` when neither was given.
///
/// # Errors
/// `--KEY: invalid number "x"` or `--KEY: must be between LO and HI (got N)`, or the same
/// naming `config: KEY`.
pub fn pick_int(
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

/// Picks a duration of at least `min` ([`parse_duration`]): the text of flag `--KEY` or the
/// file's text for `key` (pass `None` for a key that has no file); `default` when neither
/// was given.
///
/// # Errors
/// The [`DurationError`] or `must be at least MIN (got "x")`, naming `--KEY` or
/// `config: KEY`.
pub fn pick_duration(
    key: &str,
    flag: Option<&str>,
    file: Option<&str>,
    min: Duration,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let Some((origin, s)) = pick_str(flag, file) else {
        return Ok(default);
    };
    let d = parse_duration(s).map_err(|e| origin.err(key, e))?;
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

/// Picks a percentage in 0..=100 (0 when not given): a flag string or a file number.
pub(crate) fn pick_pct(
    key: &str,
    flag: Option<&str>,
    file: Option<f64>,
) -> Result<f64, ConfigError> {
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
pub(crate) fn pick_list<'a>(
    flag: &'a [String],
    file: Option<&'a [String]>,
) -> (Origin, &'a [String]) {
    if flag.is_empty() {
        (Origin::File, file.unwrap_or(&[]))
    } else {
        (Origin::Flag, flag)
    }
}

/// Picks a switch that has a flag `--KEY` (on when given) and, in the file, the key `key`
/// and the opposite-sense alias `alias` (`no_srq = true` is `srq = false`). Whether it is on.
///
/// # Errors
/// `config: KEY: contradicts ALIAS` when the file sets both and they disagree.
pub(crate) fn pick_switch(
    key: &str,
    flag: bool,
    file: Option<bool>,
    alias: &str,
    file_alias: Option<bool>,
) -> Result<bool, ConfigError> {
    let from_alias = file_alias.map(|v| !v);
    if let (Some(a), Some(b)) = (file, from_alias) {
        if a != b {
            return Err(Origin::File.err(key, format!("contradicts {alias}")));
        }
    }
    Ok(flag || file.or(from_alias).unwrap_or(false))
}

/// Adds one provider quirk name (`drain-never`, `no-last-wqe`, `dup-last-wqe`) to `q`.
pub(crate) fn add_quirk(q: &mut Quirks, origin: Origin, name: &str) -> Result<(), ConfigError> {
    match name {
        "drain-never" => q.drain_never = true,
        "no-last-wqe" => q.no_last_wqe = true,
        "dup-last-wqe" => q.dup_last_wqe = true,
        _ => {
            return Err(origin.err(
                "quirk",
                format!("unknown quirk {name:?} (known: drain-never, no-last-wqe, dup-last-wqe)"),
            ))
        }
    }
    Ok(())
}

/// Checks a log filter: a level (`off`, `error`, `warn`, `info`, `debug`, `trace`) or a
/// `tracing` directive list with `target=level` entries.
pub(crate) fn check_log(origin: Origin, s: &str) -> Result<(), ConfigError> {
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
        Err(origin.err(
            "log",
            format!(
                "invalid log filter {s:?} (use off, error, warn, info, debug, trace or target=level)"
            ),
        ))
    }
}

/// Checks an interface name against what Linux accepts.
pub(crate) fn check_ifname(origin: Origin, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() {
        return Err(origin.err("ifname", "must not be empty"));
    }
    if s.len() > IFNAME_MAX_BYTES {
        return Err(origin.err(
            "ifname",
            format!("must be at most {IFNAME_MAX_BYTES} bytes (got {s:?})"),
        ));
    }
    if s == "."
        || s == ".."
        || s.bytes()
            .any(|b| b == b'/' || b == b':' || !b.is_ascii_graphic())
    {
        return Err(origin.err("ifname", format!("invalid interface name {s:?}")));
    }
    Ok(())
}
