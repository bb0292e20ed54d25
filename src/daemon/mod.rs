//! The operator surface of the `ipoib-cm` daemon: what `ipoib-cm up` reads and what
//! `ipoib-cm status` shows.
//!
//! - [`config`]: TOML file plus flag overrides resolved into a validated [`Config`], with
//!   one-line errors naming the field.
//! - [`status`]: the [`Status`] snapshot (its JSON schema), derived from the endpoint's
//!   snapshot with the endpoint's states, and its text rendering.
//! - [`preflight`]: what `up` checks before it sets anything up (`CAP_NET_ADMIN`, the TUN
//!   device).
//! - `workers`: `up --workers N`: control's node and the other workers' threads, what they
//!   report and the changes control makes on them.
//! - [`resources`]: the memory and file descriptors `up` needs with its settings, against the
//!   memory cgroup's limit and `RLIMIT_NOFILE`.
//! - [`control`]: the control socket, server side ([`ControlServer`]) for the event loop and
//!   client side ([`query`]) for `ipoib-cm status`.

pub mod client;
mod client_slots;
pub mod config;
pub mod control;
mod error;
mod floods;
pub mod logging;
pub mod metrics;
mod open;
pub mod preflight;
pub mod provider;
pub mod reload;
mod report;
pub mod resources;
pub mod run;
pub mod service;
pub mod status;
pub mod underlay;
mod workers_setup;

pub use config::{
    default_control_socket, resolve, Cidr, CmTransport, Config, ConfigError, FaultFlags, Mode,
    ProviderKind, QpBudgetPolicy, Settings,
};
pub use control::{command, namespace_daemons, query, ControlError, ControlServer, Request};
pub use status::{
    render_json, render_prometheus, render_prometheus_all, render_text, Counters, InterfaceStatus,
    NeighbourState, NeighbourStatus, RxState, RxStatus, Shown, Status, TxState, TxStatus,
    UnderlayStatus,
};
