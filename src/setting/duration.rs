//! Durations of settings: the one text parse ([`parse_duration`]), its inverse
//! ([`format_duration`]) and how a config file writes one ([`FileDuration`]).

use std::time::Duration;

use serde::Deserialize;

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

/// A duration in the config file: a string (`"1.5s"`) or an integer number of seconds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged, expecting = "a duration like \"5s\" or a number of seconds")]
pub enum FileDuration {
    /// Text that [`parse_duration`] reads.
    Text(String),
    /// Whole seconds.
    Seconds(i64),
}

impl FileDuration {
    /// The duration as text, as a flag would give it.
    pub fn text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::Seconds(n) => n.to_string(),
        }
    }
}
