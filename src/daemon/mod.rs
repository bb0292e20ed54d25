//! The operator surface of the `ipoib-cm` daemon: what `ipoib-cm up` reads and what
//! `ipoib-cm status` shows.
//!
//! - [`config`]: TOML file plus flag overrides resolved into a validated [`Config`], with
//!   one-line errors naming the field.

pub mod config;

pub use config::{
    default_control_socket, resolve, Cidr, Config, ConfigError, ConfigFile, Mode, QpBudgetPolicy,
    UpArgs,
};
