//! The TOML file of `ipoib-cm up` ([`ConfigFile`]): parsed, not yet validated.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::ConfigError;

/// The TOML configuration file: every key optional, unknown keys rejected.
///
/// The keys are the flags of [`UpArgs`](super::UpArgs) (without `--config`), the same name with
/// `_` for `-`, plus `srq`, `verify_icrc_v4`, `udp_offload` (the opposite of `no_srq`,
/// `no_icrc_v4`, `no_udp_offload`) and `qp_budget_policy = "evict"|"reject"` (`evict = true` /
/// `reject = true`), kept for the files that use them. [`ConfigFile::keys`] lists them.
/// Values are validated by [`resolve`](super::resolve), which names the key in its errors.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// See [`Config::ifname`](super::Config::ifname).
    pub ifname: Option<String>,
    /// See [`Config::addr`](super::Config::addr).
    pub addr: Option<Vec<String>>,
    /// See [`Config::bind`](super::Config::bind).
    pub bind: Option<String>,
    /// See [`Config::peer`](super::Config::peer).
    pub peer: Option<Vec<String>>,
    /// See [`Config::neigh`](super::Config::neigh).
    pub neigh: Option<Vec<String>>,
    /// See [`Config::udp_port`](super::Config::udp_port).
    pub udp_port: Option<i64>,
    /// See [`Config::cm_transport`](super::Config::cm_transport).
    pub cm_transport: Option<String>,
    /// See [`Config::mad_port`](super::Config::mad_port).
    pub mad_port: Option<i64>,
    /// `true`: see [`Config::verify_icrc_v4`](super::Config::verify_icrc_v4).
    pub no_icrc_v4: Option<bool>,
    /// Alias of `no_icrc_v4` with the opposite sense: see [`Config::verify_icrc_v4`](super::Config::verify_icrc_v4).
    pub verify_icrc_v4: Option<bool>,
    /// `true`: see [`Config::udp_offload`](super::Config::udp_offload).
    pub no_udp_offload: Option<bool>,
    /// Alias of `no_udp_offload` with the opposite sense: see [`Config::udp_offload`](super::Config::udp_offload).
    pub udp_offload: Option<bool>,
    /// See [`Config::qp_timeout`](super::Config::qp_timeout).
    pub qp_timeout: Option<i64>,
    /// See [`Config::mode`](super::Config::mode).
    pub mode: Option<String>,
    /// `true`: see [`Config::srq`](super::Config::srq).
    pub no_srq: Option<bool>,
    /// Alias of `no_srq` with the opposite sense: see [`Config::srq`](super::Config::srq).
    pub srq: Option<bool>,
    /// See [`Config::rx_timeout`](super::Config::rx_timeout).
    pub rx_timeout: Option<FileDuration>,
    /// See [`Config::drain_timeout`](super::Config::drain_timeout).
    pub drain_timeout: Option<FileDuration>,
    /// See [`Config::tx_stall_timeout`](super::Config::tx_stall_timeout).
    pub tx_stall_timeout: Option<FileDuration>,
    /// See [`Config::busy_poll`](super::Config::busy_poll).
    pub busy_poll: Option<FileDuration>,
    /// See [`Config::neigh_timeout`](super::Config::neigh_timeout).
    pub neigh_timeout: Option<FileDuration>,
    /// See [`Config::max_conn_qp`](super::Config::max_conn_qp).
    pub max_conn_qp: Option<i64>,
    /// `true`: `qp_budget_policy = "evict"`.
    pub evict: Option<bool>,
    /// `true`: `qp_budget_policy = "reject"`.
    pub reject: Option<bool>,
    /// See [`Config::qp_budget_policy`](super::Config::qp_budget_policy).
    pub qp_budget_policy: Option<String>,
    /// See [`Config::tx_queue_len`](super::Config::tx_queue_len).
    pub tx_queue_len: Option<i64>,
    /// See [`Config::path_mtu`](super::Config::path_mtu).
    pub path_mtu: Option<i64>,
    /// See [`FaultConfig::loss_pct`](crate::soft::FaultConfig::loss_pct).
    pub fault_loss: Option<f64>,
    /// See [`FaultConfig::reorder_pct`](crate::soft::FaultConfig::reorder_pct).
    pub fault_reorder: Option<f64>,
    /// See [`FaultConfig::dup_pct`](crate::soft::FaultConfig::dup_pct).
    pub fault_dup: Option<f64>,
    /// See [`FaultConfig::corrupt_pct`](crate::soft::FaultConfig::corrupt_pct).
    pub fault_corrupt: Option<f64>,
    /// See [`FaultConfig::seed`](crate::soft::FaultConfig::seed).
    pub fault_seed: Option<i64>,
    /// See [`Config::quirks`](super::Config::quirks).
    pub quirk: Option<Vec<String>>,
    /// See [`Config::control_socket`](super::Config::control_socket).
    pub control_socket: Option<PathBuf>,
    /// See [`Config::log`](super::Config::log).
    pub log: Option<String>,
    /// See [`Config::provider`](super::Config::provider).
    pub provider: Option<String>,
    /// See [`Config::ib_dev`](super::Config::ib_dev).
    pub ib_dev: Option<String>,
}

/// A duration in the config file: a string (`"1.5s"`) or an integer number of seconds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged, expecting = "a duration like \"5s\" or a number of seconds")]
pub enum FileDuration {
    /// Text that [`parse_duration`](super::parse_duration) reads.
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

impl ConfigFile {
    /// Every key a config file may have, in declaration order.
    pub fn keys() -> &'static [&'static str] {
        let mut names = FieldNames(&[]);
        // The derived impl hands its field list to `deserialize_struct`, which fails then.
        let _ = Self::deserialize(&mut names);
        names.0
    }
}

/// A deserializer that only records the field names of the struct asked of it.
struct FieldNames(&'static [&'static str]);

impl<'de> serde::Deserializer<'de> for &mut FieldNames {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("field names only"))
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = fields;
        Err(serde::de::Error::custom("field names only"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// Parses the text of a config file. Pure; `path` only names the file in errors.
///
/// # Errors
/// [`ConfigError::Parse`] naming the line: TOML syntax, unknown key, wrong type.
pub fn parse_config_file(path: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let mut message = e
            .message()
            .lines()
            .next()
            .unwrap_or("invalid TOML")
            .trim()
            .to_owned();
        for (from, to) in [
            ("expected i64", "expected an integer"),
            ("expected u64", "expected a non-negative integer"),
            ("expected f64", "expected a number"),
            ("expected a sequence", "expected an array"),
        ] {
            message = message.replace(from, to);
        }
        if let Some(rest) = message.strip_prefix("unknown field `") {
            let name = rest.split('`').next().unwrap_or_default();
            message = format!("unknown field {name:?}");
        } else if let Some(key) = e.span().and_then(|s| key_at(text, s.start)) {
            if !message.contains(&format!("`{key}`")) {
                message = format!("{key}: {message}");
            }
        }
        ConfigError::Parse {
            path: path.to_owned(),
            line,
            message,
        }
    })
}

/// 1-based line number of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text.as_bytes()[..at]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The bare key of the `key = value` line holding byte offset `at`.
fn key_at(text: &str, at: usize) -> Option<String> {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = &text[start..end];
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then(|| key.to_owned())
}
