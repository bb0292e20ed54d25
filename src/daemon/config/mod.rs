//! Configuration of `ipoib-cm up`: one declaration of its settings ([`Settings`]) that is both
//! the command-line flags and the keys of the TOML file, and from which the validated
//! [`Config`] they resolve to, the README's settings table and the example config are made.
//!
//! Every flag but `--config` is also a config key, the same name with `_` for `-`
//! (`--rx-timeout` is `rx_timeout`, `--no-srq` is `no_srq = true`, `--quirk` is
//! `quirk = [...]`); [`Settings`] names the older aliases the file also reads. A flag given on
//! the command line wins over the file; a repeatable flag given at least once replaces the
//! file's whole list ([`Settings::over`]). A value is parsed by its type's one [`Setting`]
//! parse whether it came from a flag or the file. Each setting's default, bounds and meaning
//! are the doc of its [`Settings`] field, its rule there checks them; the endpoint's settings
//! default as [`EndpointConfig::new`](crate::ipoib::EndpointConfig::new) does.
//!
//! Adding a setting is one field of [`Settings`] (in `settings.rs`: its doc, attributes,
//! example and rule) and its test; then `ipoib-cm generate settings` rewrites the README table
//! and `contrib/ipoib-cm.example.toml`, which tests compare with [`settings_table`] and
//! [`example_config`].
//!
//! Errors are one line naming the field as the user wrote it: `--rx-timeout: ...` for a flag,
//! `config: rx_timeout: ...` for a file key, `config file PATH: line N: ...` for a file that
//! does not parse (TOML syntax, an unknown key, a value of the wrong TOML type). The caller
//! prints the [`ConfigError`] and exits with [`ConfigError::exit_code`].
//!
//! Parsing ([`parse_config_file`], [`parse_duration`]) and [`resolve_str`] are pure; only
//! [`resolve`] reads the file.

mod checks;
mod declare;
mod endpoint;
mod file;
mod generate;
mod rules;
mod settings;
mod types;

use std::path::Path;

pub use self::endpoint::{PathMtuChoice, PathMtuSource};
pub use self::file::parse_config_file;
pub use self::generate::{
    example_config, settings_table, with_settings_table, write_settings, EXAMPLE_CONFIG,
    README_BEGIN, README_END,
};
pub use self::settings::{Config, ConfigSource, Settings};
pub use self::types::*;
pub use crate::ipoib::{Mode, ParseChoiceError, QpBudgetPolicy};
pub use crate::mad::CmTransport;
use crate::setting::check_alias;
pub(crate) use crate::setting::os_message;
pub use crate::setting::{
    format_duration, parse_duration, parse_path_mtu, pick_duration, pick_int, ConfigError,
    DurationError, FaultFlags, FileDuration, Given, InvalidPathMtu, InvalidValue, Setting,
    TEST_HELP_HEADING,
};

/// Largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads the configuration file at `path` without waiting on anything but the file's own
/// bytes: it is opened non-blocking (a FIFO or a device there cannot hold the caller) and must
/// be a regular file (after symlinks) of at most [`MAX_CONFIG_BYTES`].
///
/// # Errors
/// [`ConfigError::Read`]: the OS error, `not a regular file`, or `longer than N bytes`.
pub fn read_config_text(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |message: String| ConfigError::Read {
        path: path.to_owned(),
        message,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| fail(os_message(&e)))?;
    let meta = file.metadata().map_err(|e| fail(os_message(&e)))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".to_owned()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(fail(format!("longer than {MAX_CONFIG_BYTES} bytes")));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(os_message(&e)))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(fail(format!("longer than {MAX_CONFIG_BYTES} bytes")));
    }
    Ok(text)
}

/// Reads `file` (if any), applies `flags` over it, validates and returns the [`Config`].
///
/// Pass `flags.config.as_deref()` as `file`.
///
/// # Errors
/// A one-line [`ConfigError`] naming the field; exit with [`ConfigError::EXIT_CODE`].
pub fn resolve(file: Option<&Path>, flags: &Settings) -> Result<Config, ConfigError> {
    let parsed = match file {
        Some(path) => parse_config_file(path, &read_config_text(path)?)?,
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
    settings::resolve_merged(&flags.clone().over(file.clone()))
}
