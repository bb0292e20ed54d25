//! A setting's value as the user gave it ([`Given`]) and the one text parse of each value type
//! ([`Setting`]).
//!
//! A flag is taken as text and a file key as its TOML value; both are parsed when the settings
//! are resolved, by the same [`Setting::from_text`] (a file's string goes through it too), so
//! that every mistake is one line naming the flag or the key.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use super::duration::{parse_duration, DurationError, FileDuration};
use super::error::Origin;
use crate::verbs::{PKey, PathMtu};
use crate::wire::ipoib::HwAddr;

/// A value type of a setting: how it reads from a flag's text and from its TOML value.
pub trait Setting: Sized {
    /// The TOML type of the key; a value of another type is a parse error of the file.
    type File: DeserializeOwned + Clone + fmt::Debug + PartialEq + Send + Sync + 'static;
    /// Why a value is invalid, one line quoting it.
    type Err: fmt::Display;
    /// Parses a flag's text.
    ///
    /// # Errors
    /// The value is not one of this type.
    fn from_text(text: &str) -> Result<Self, Self::Err>;
    /// Reads the file's value.
    ///
    /// # Errors
    /// The value is not one of this type.
    fn from_file(value: &Self::File) -> Result<Self, Self::Err>;
}

/// A setting's value as given, not yet parsed: a flag's text or the file's TOML value.
#[derive(Debug, Clone, PartialEq)]
pub enum Given<T: Setting> {
    /// The text of the flag.
    Flag(String),
    /// The value of the file's key.
    File(T::File),
}

impl<T: Setting> Given<T> {
    /// Where it came from.
    pub(crate) fn origin(&self) -> Origin {
        match self {
            Self::Flag(_) => Origin::Flag,
            Self::File(_) => Origin::File,
        }
    }

    /// Parses it with [`Setting::from_text`] or [`Setting::from_file`].
    ///
    /// # Errors
    /// The setting's error; [`resolve`](super::resolve) names the flag or key with it.
    pub fn parse(&self) -> Result<T, T::Err> {
        match self {
            Self::Flag(s) => T::from_text(s),
            Self::File(v) => T::from_file(v),
        }
    }
}

/// What clap's value parser makes of a flag's text: the text, parsed when resolved.
impl<T: Setting> From<String> for Given<T> {
    fn from(text: String) -> Self {
        Self::Flag(text)
    }
}

impl<'de, T: Setting> Deserialize<'de> for Given<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::File::deserialize(d).map(Self::File)
    }
}

/// A value that is not one of a setting's type; the text is the whole one-line message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(String);

impl InvalidValue {
    /// The one-line message, quoting the value.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Implements [`Setting`] for types whose file value is a TOML string read by the type's
/// [`FromStr`].
macro_rules! text_setting {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::setting::Setting for $t {
            type File = String;
            type Err = <$t as ::std::str::FromStr>::Err;
            fn from_text(text: &str) -> Result<Self, Self::Err> {
                text.parse()
            }
            fn from_file(value: &String) -> Result<Self, Self::Err> {
                Self::from_text(value)
            }
        }
    )*};
}

pub(crate) use text_setting;

text_setting!(String);

impl Setting for PathBuf {
    type File = Self;
    type Err = std::convert::Infallible;
    fn from_text(text: &str) -> Result<Self, Self::Err> {
        Ok(Self::from(text))
    }
    fn from_file(value: &Self) -> Result<Self, Self::Err> {
        Ok(value.clone())
    }
}

impl Setting for IpAddr {
    type File = String;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        text.parse()
            .map_err(|_| InvalidValue(format!("invalid IP address {text:?}")))
    }
    fn from_file(value: &String) -> Result<Self, InvalidValue> {
        Self::from_text(value)
    }
}

impl Setting for SocketAddr {
    type File = String;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        text.parse().map_err(|_| {
            InvalidValue(format!(
                "invalid address {text:?}: expected ADDR:PORT, [IPv6]:PORT for IPv6"
            ))
        })
    }
    fn from_file(value: &String) -> Result<Self, InvalidValue> {
        Self::from_text(value)
    }
}

/// A static neighbour, `IP=HWADDR`.
impl Setting for (IpAddr, HwAddr) {
    type File = String;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        let bad = || InvalidValue(format!("expected IP=HWADDR, got {text:?}"));
        let (ip, hw) = text.split_once('=').ok_or_else(bad)?;
        let ip = ip.trim().parse::<IpAddr>().map_err(|_| bad())?;
        let hw = hw.trim().parse::<HwAddr>().map_err(|_| bad())?;
        Ok((ip, hw))
    }
    fn from_file(value: &String) -> Result<Self, InvalidValue> {
        Self::from_text(value)
    }
}

/// An integer; its bounds are the setting's, checked when resolved.
impl Setting for i64 {
    type File = Self;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        text.parse()
            .map_err(|_| InvalidValue(format!("invalid number {text:?}")))
    }
    fn from_file(value: &Self) -> Result<Self, InvalidValue> {
        Ok(*value)
    }
}

/// A percentage; its bounds are checked when resolved.
impl Setting for f64 {
    type File = Self;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        text.parse()
            .map_err(|_| InvalidValue(format!("invalid percentage {text:?}")))
    }
    fn from_file(value: &Self) -> Result<Self, InvalidValue> {
        Ok(*value)
    }
}

/// A switch: a flag without a value (clap hands it `true`), a boolean in the file.
impl Setting for bool {
    type File = Self;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        text.parse()
            .map_err(|_| InvalidValue(format!("expected true or false, got {text:?}")))
    }
    fn from_file(value: &Self) -> Result<Self, InvalidValue> {
        Ok(*value)
    }
}

/// A duration as [`parse_duration`] reads it; in the file also whole seconds.
impl Setting for Duration {
    type File = FileDuration;
    type Err = DurationError;
    fn from_text(text: &str) -> Result<Self, DurationError> {
        parse_duration(text)
    }
    fn from_file(value: &FileDuration) -> Result<Self, DurationError> {
        parse_duration(&value.text())
    }
}

/// An IB path MTU in bytes: 256, 512, 1024, 2048 or 4096.
impl Setting for PathMtu {
    type File = i64;
    type Err = InvalidPathMtu;
    fn from_text(text: &str) -> Result<Self, InvalidPathMtu> {
        text.parse::<usize>()
            .ok()
            .and_then(Self::from_bytes)
            .ok_or_else(|| InvalidPathMtu(format!("{text:?}")))
    }
    fn from_file(value: &i64) -> Result<Self, InvalidPathMtu> {
        usize::try_from(*value)
            .ok()
            .and_then(Self::from_bytes)
            .ok_or_else(|| InvalidPathMtu(value.to_string()))
    }
}

/// A partition key: `0x8001`-style hex or decimal text on the command line, an integer in the
/// file (TOML writes hex as `0x8001` too); the low 15 bits must not be zero.
impl Setting for PKey {
    type File = i64;
    type Err = InvalidValue;
    fn from_text(text: &str) -> Result<Self, InvalidValue> {
        Self::parse(text).map_err(InvalidValue)
    }
    fn from_file(value: &i64) -> Result<Self, InvalidValue> {
        u16::try_from(*value)
            .ok()
            .and_then(Self::checked)
            .ok_or_else(|| {
                InvalidValue(format!(
                    "invalid P_Key {value:#x}: expected 0x0001..=0xffff, low 15 bits not zero"
                ))
            })
    }
}

/// A path MTU that is none of the five; holds the value as given (quoted if it was text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be 256, 512, 1024, 2048 or 4096 (got {0})")]
pub struct InvalidPathMtu(String);

/// Parses a path MTU flag's text; a clap value parser for the tools.
///
/// # Errors
/// [`InvalidPathMtu`] quoting the text.
pub fn parse_path_mtu(text: &str) -> Result<PathMtu, InvalidPathMtu> {
    PathMtu::from_text(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_text_and_file_value_parse_alike() {
        let flag: Given<Duration> = Given::from("90".to_owned());
        let file: Given<Duration> = Given::File(FileDuration::Seconds(90));
        assert_eq!((flag.origin(), file.origin()), (Origin::Flag, Origin::File));
        assert_eq!(flag.parse(), Ok(Duration::from_secs(90)));
        assert_eq!(flag.parse(), file.parse());
        let text: Given<String> = Given::File("datagram".to_owned());
        assert_eq!(text.parse().as_deref(), Ok("datagram"));
    }

    #[test]
    fn path_mtu_names_the_value_as_given() {
        assert_eq!(PathMtu::from_file(&2048), Ok(PathMtu::Mtu2048));
        assert_eq!(
            PathMtu::from_file(&-1).unwrap_err().to_string(),
            "must be 256, 512, 1024, 2048 or 4096 (got -1)"
        );
        assert_eq!(
            PathMtu::from_text("big").unwrap_err().to_string(),
            "must be 256, 512, 1024, 2048 or 4096 (got \"big\")"
        );
    }

    #[test]
    fn neighbours_and_switches() {
        assert!(<(IpAddr, HwAddr)>::from_text("10.0.0.1").is_err());
        assert!(bool::from_text("yes").is_err());
    }
}
