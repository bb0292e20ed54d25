//! Why the device could not be opened ([`HwError`]), and the errno of a failed verb as a
//! [`VerbsError`].

use std::io;

use crate::verbs::VerbsError;

/// Why a device could not be opened. Every variant whose message starts with "no RDMA device"
/// is [`HwError::is_no_device`].
#[derive(Debug, thiserror::Error)]
pub enum HwError {
    /// `ibv_get_device_list` failed: no RDMA stack (no kernel module, no libibverbs provider).
    #[error("no RDMA device: ibv_get_device_list: {0}")]
    NoRdmaStack(#[source] io::Error),
    /// The RDMA stack lists no device.
    #[error("no RDMA device: ibv_get_device_list found none")]
    NoDevices,
    /// The named device is not among those listed.
    #[error("no RDMA device: {name} not found (devices: {})", .available.join(" "))]
    NotFound {
        /// The device asked for.
        name: String,
        /// The devices there are.
        available: Vec<String>,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device: {0}")]
    Open(#[source] io::Error),
    /// `ibv_query_port` failed.
    #[error("ibv_query_port({device} port {port}): {source}")]
    QueryPort {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The GID table has no entry at the index asked for (or picked).
    #[error("{device} port {port}: GID index {index} is empty")]
    EmptyGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The GID index.
        index: u8,
    },
    /// `ibv_create_comp_channel` failed.
    #[error("ibv_create_comp_channel: {0}")]
    CompChannel(#[source] io::Error),
    /// The completion channel's or the async events' fd could not be made non-blocking.
    #[error("O_NONBLOCK: {0}")]
    NonBlocking(#[source] io::Error),
}

impl HwError {
    /// There is no usable device (as opposed to one that failed to open): the caller may say
    /// so and fall back, or exit 2.
    pub fn is_no_device(&self) -> bool {
        matches!(
            self,
            Self::NoRdmaStack(_) | Self::NoDevices | Self::NotFound { .. }
        )
    }
}

/// The error of verb `what` that returned `rc`: a positive errno, or -1 with `errno` set.
pub(super) fn errno_err(what: &str, rc: i32) -> VerbsError {
    let e = if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    };
    match e.raw_os_error() {
        Some(libc::ENOMEM) => VerbsError::OutOfResources("device memory"),
        _ => VerbsError::Io(format!("{what}: {e}")),
    }
}
