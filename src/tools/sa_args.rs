//! The port and partition options every `ipoib-cm sa …` command takes, and why one fails.

use std::io;
use std::time::Duration;

use crate::sa::PathLookup;
use crate::wire::sa::SaStatus;

/// Which port and partition.
#[derive(Debug, Clone, clap::Args)]
pub struct SaPortArgs {
    /// The device (default: the first umad port's).
    #[arg(long, value_name = "CA")]
    pub ca: Option<String>,
    /// The port number.
    #[arg(long, value_name = "N")]
    pub port: Option<u8>,
    /// The partition key.
    #[arg(long, value_name = "PKEY", default_value = "0xffff", value_parser = parse_pkey)]
    pub pkey: u16,
    /// Print every MAD received as hex (path, join, leave).
    #[arg(long)]
    pub dump: bool,
    /// Give up after this long.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

fn parse_pkey(s: &str) -> Result<u16, std::num::ParseIntError> {
    u16::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16)
}

/// Why an `ipoib-cm sa …` command failed.
#[derive(Debug, thiserror::Error)]
pub enum SaToolError {
    /// No umad port was found.
    #[error("no umad port: {0}")]
    NoPort(#[source] io::Error),
    /// The port is not active or knows no SM.
    #[error("{ca} port {port}: not active or no SM (lid {lid:#x}, sm_lid {sm_lid:#x})")]
    NotActive {
        /// The device.
        ca: String,
        /// The port number.
        port: u8,
        /// Its LID.
        lid: u16,
        /// Its SM's LID.
        sm_lid: u16,
    },
    /// An agent could not be registered.
    #[error("umad{umad}: {step}: {source}")]
    Agent {
        /// The umad device's index.
        umad: u32,
        /// The step that failed.
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A call to the OS failed (a MAD sent or read, the poll, a signal handler).
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Nothing came within `--timeout`.
    #[error("timed out")]
    TimedOut,
    /// The port's SMA answered no read within this long.
    #[error("the port's SMA did not answer within {0:?}")]
    NoAnswer(Duration),
    /// The path query could not start.
    #[error("path query not started: {0:?}")]
    PathNotStarted(PathLookup),
    /// The SA had no path (its status), or did not answer (`None`).
    #[error("no path: status {0:?}")]
    NoPath(Option<SaStatus>),
    /// The join failed.
    #[error("join failed")]
    JoinFailed,
    /// `sa node --addr`: not ADDR/PREFIX.
    #[error("--addr {0}: not ADDR/PREFIX")]
    BadAddr(String),
    /// The SA driver did not open.
    #[error("SA driver: {0}")]
    SaDriver(#[source] io::Error),
    /// The endpoint could not be set up.
    #[error("endpoint set-up: {0}")]
    Endpoint(#[source] crate::verbs::VerbsError),
    /// The leaves at the stop were not all answered in time.
    #[error("leaves unanswered")]
    LeavesUnanswered,
    /// The port's own SMA could not be read (`sa port`).
    #[error(transparent)]
    Port(#[from] crate::soft::sim_port::SimPortError),
}

impl SaToolError {
    /// An OS error of `what`.
    pub(super) fn io(what: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { what, source }
    }
}
