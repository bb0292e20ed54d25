//! Why a librdmacm call failed ([`RdmaCmError`]).

use std::io;

use super::event::RdmaCmId;

/// Why a librdmacm call failed.
#[derive(Debug, thiserror::Error)]
pub enum RdmaCmError {
    /// The event channel could not be created: no `rdma_ucm` (no RDMA CM on this host).
    #[error("no RDMA CM: rdma_create_event_channel: {0}")]
    Unavailable(#[source] io::Error),
    /// The channel's fd could not be made non-blocking.
    #[error("rdma_cm event channel O_NONBLOCK: {0}")]
    NonBlocking(#[source] io::Error),
    /// A call failed with an errno.
    #[error("{call}: {source}")]
    Call {
        /// The librdmacm function.
        call: &'static str,
        /// Its errno.
        #[source]
        source: io::Error,
    },
    /// The handle names no live id.
    #[error("no such rdma_cm id {0:?}")]
    NoSuchId(RdmaCmId),
    /// The id table is full.
    #[error("rdma_cm id table full ({0} ids)")]
    TableFull(usize),
    /// Private data longer than a CM message holds.
    #[error("private data of {0} bytes is too long")]
    PrivateDataTooLong(usize),
    /// `rdma_init_qp_attr` gave attributes this wrapper cannot express.
    #[error("rdma_init_qp_attr: {0}")]
    QpAttr(String),
}

impl RdmaCmError {
    /// There is no RDMA CM on this host (as opposed to a call that failed): the caller says so
    /// and exits 2.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}
