//! The TOML file of `ipoib-cm up`: parsed into [`Settings`], not yet validated.

use std::path::Path;

use serde::Deserialize;

use super::settings::Settings;
use crate::setting::ConfigError;

impl Settings {
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
pub fn parse_config_file(path: &Path, text: &str) -> Result<Settings, ConfigError> {
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
