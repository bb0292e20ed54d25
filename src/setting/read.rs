//! Reading one setting as the user gave it ([`Given`]: flag text or file value) with its
//! bounds, and errors naming the flag or key it came from.

use std::time::Duration;

use super::duration::{format_duration, FileDuration};
use super::error::{ConfigError, Origin};
use super::given::{Given, Setting};

/// Parses a given value, naming its flag or key in the error.
pub(crate) fn parse<T: Setting>(
    key: &str,
    given: Option<&Given<T>>,
) -> Result<Option<T>, ConfigError> {
    given
        .map(|g| g.parse().map_err(|e| g.origin().err(key, e)))
        .transpose()
}

/// Parses every value of a repeatable setting, naming its flag or key in the error.
pub(crate) fn parse_list<T: Setting>(key: &str, given: &[Given<T>]) -> Result<Vec<T>, ConfigError> {
    given
        .iter()
        .map(|g| g.parse().map_err(|e| g.origin().err(key, e)))
        .collect()
}

/// Where a setting came from: its flag or its key (also when it was not given at all, as a
/// default can only be wrong through the file's other keys).
pub(crate) fn origin_of<T: Setting>(given: Option<&Given<T>>) -> Origin {
    given.map_or(Origin::File, Given::origin)
}

/// An integer setting in `lo..=hi`; `None` when not given.
///
/// # Errors
/// `KEY: invalid number "x"` or `KEY: must be between LO and HI (got N)`, naming the flag
/// or key.
pub(crate) fn int_in(
    key: &str,
    given: Option<&Given<i64>>,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ConfigError> {
    let Some(v) = parse(key, given)? else {
        return Ok(None);
    };
    if !(lo..=hi).contains(&v) {
        return Err(origin_of(given).err(key, format!("must be between {lo} and {hi} (got {v})")));
    }
    Ok(Some(v))
}

/// A duration setting of at least `min`; `default` when not given.
///
/// # Errors
/// The [`DurationError`] or `must be at least MIN (got "x")`, naming the flag or key.
pub(crate) fn duration_at_least(
    key: &str,
    given: Option<&Given<Duration>>,
    min: Duration,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let Some(d) = parse(key, given)? else {
        return Ok(default);
    };
    if d < min {
        let what = if min == Duration::from_millis(1) {
            "must be positive".to_owned()
        } else {
            format!("must be at least {}", format_duration(min))
        };
        let text = match given {
            Some(Given::Flag(s)) => s.clone(),
            Some(Given::File(v)) => v.text(),
            None => String::new(),
        };
        return Err(origin_of(given).err(key, format!("{what} (got {text:?})")));
    }
    Ok(d)
}

/// A percentage setting in 0..=100; 0 when not given.
pub(crate) fn percentage(key: &str, given: Option<&Given<f64>>) -> Result<f64, ConfigError> {
    let Some(v) = parse(key, given)? else {
        return Ok(0.0);
    };
    if !(0.0..=100.0).contains(&v) {
        return Err(origin_of(given).err(
            key,
            format!("must be a percentage between 0 and 100 (got {v})"),
        ));
    }
    Ok(v)
}

/// A switch `key` with the file-only alias `alias` of the opposite sense (`no_srq = true` is
/// `srq = false`): whether it is on.
pub(crate) fn switch(
    key: &str,
    given: Option<&Given<bool>>,
    alias: &str,
    alias_given: Option<&Given<bool>>,
) -> Result<bool, ConfigError> {
    let on = parse(key, given)?;
    let from_alias = parse(alias, alias_given)?.map(|v| !v);
    Ok(on.or(from_alias).unwrap_or(false))
}

/// The file's `key` and its opposite-sense `alias` must agree.
///
/// # Errors
/// `config: KEY: contradicts ALIAS`.
pub(crate) fn check_alias(
    key: &str,
    given: Option<&Given<bool>>,
    alias: &str,
    alias_given: Option<&Given<bool>>,
) -> Result<(), ConfigError> {
    if let (Some(a), Some(b)) = (parse(key, given)?, parse(alias, alias_given)?) {
        if a == b {
            return Err(Origin::File.err(key, format!("contradicts {alias}")));
        }
    }
    Ok(())
}

/// An integer flag of a tool in `lo..=hi`: the text of `--KEY` or, for a key that has a file,
/// the file's integer. `None` when neither was given.
///
/// # Errors
/// As the daemon's integer settings: `--KEY: invalid number "x"` or `--KEY: must be between LO
/// and HI (got N)`, or the same naming `config: KEY`.
pub fn pick_int(
    key: &str,
    flag: Option<&str>,
    file: Option<i64>,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ConfigError> {
    int_in(key, given(flag, file).as_ref(), lo, hi)
}

/// A duration flag of a tool of at least `min` ([`parse_duration`](super::parse_duration)): the text of `--KEY` or,
/// for a key that has a file, the file's text; `default` when neither was given.
///
/// # Errors
/// The [`DurationError`](super::DurationError) or `must be at least MIN (got "x")`, naming `--KEY` or
/// `config: KEY`.
pub fn pick_duration(
    key: &str,
    flag: Option<&str>,
    file: Option<&str>,
    min: Duration,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let file = file.map(|s| FileDuration::Text(s.to_owned()));
    duration_at_least(key, given(flag, file).as_ref(), min, default)
}

/// The flag's text if given, else the file's value.
fn given<T: Setting>(flag: Option<&str>, file: Option<T::File>) -> Option<Given<T>> {
    match flag {
        Some(s) => Some(Given::Flag(s.to_owned())),
        None => file.map(Given::File),
    }
}
