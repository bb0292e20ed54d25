//! Configuration mistakes: one line each, naming the flag or key.

use std::path::PathBuf;

/// A configuration mistake. Its `Display` is the one line to print; exit with
/// [`ConfigError::exit_code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {}: {message}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error, without its `(os error N)` suffix.
        message: String,
    },
    /// The config file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("config file {}: {}{message}", path.display(), line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the mistake, when known.
        line: Option<usize>,
        /// What is wrong, one line.
        message: String,
    },
    /// A value is invalid.
    #[error("{field}: {message}")]
    Invalid {
        /// The field as the user wrote it: `--rx-timeout` or `config: rx_timeout`.
        field: String,
        /// What is wrong, one line.
        message: String,
    },
}

impl ConfigError {
    /// The process exit code for a configuration mistake.
    pub const EXIT_CODE: u8 = 2;

    /// The process exit code for this mistake: [`ConfigError::EXIT_CODE`].
    pub const fn exit_code(&self) -> u8 {
        Self::EXIT_CODE
    }

    /// A mistake in the value of `field`, named as the user wrote it (`--size`, `SERVER_IP`).
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// An I/O error's text without the `(os error N)` suffix std appends.
pub(crate) fn os_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) if s.ends_with(')') => s[..i].to_owned(),
        _ => s,
    }
}

/// Where a value came from, to name it in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A command-line flag.
    Flag,
    /// A key of the config file.
    File,
}

impl Origin {
    /// `--rx-timeout` or `config: rx_timeout` for the config key `rx_timeout`.
    pub(crate) fn name(self, key: &str) -> String {
        match self {
            Self::Flag => format!("--{}", key.replace('_', "-")),
            Self::File => format!("config: {key}"),
        }
    }

    /// The mistake `message` in the value of `key` as it was given.
    pub(crate) fn err(self, key: &str, message: impl ToString) -> ConfigError {
        ConfigError::Invalid {
            field: self.name(key),
            message: message.to_string(),
        }
    }
}
