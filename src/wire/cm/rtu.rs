//! ReadyToUse (RTU, 0x0014; IBTA table 111), DisconnectRequest (DREQ, 0x0015; table 112) and
//! DisconnectReply (DREP, 0x0016; table 113).
//!
//! | Rel | Abs | Bits | RTU, DREP | DREQ |
//! |---|---|---|---|---|
//! | 0 | 24 | 32 | Local Communication ID | Local Communication ID |
//! | 4 | 28 | 32 | Remote Communication ID | Remote Communication ID |
//! | 8 | 32 | | private data (224 B) | Remote QPN/EECN (24 bits), reserved (8) |
//! | 12 | 36 | | | private data (220 B) |

use crate::wire::QpNum;

use super::MAD_DATA_LEN;
use crate::wire::field::Bytes;

/// ReadyToUse: the active side's confirmation that completes connection setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rtu {
    /// The active side's communication ID.
    pub local_comm_id: u32,
    /// The passive side's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

/// DisconnectReply: the answer to a DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Drep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The DREQ sender's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

/// Implements the identical RTU and DREP layouts.
macro_rules! ids_and_private {
    ($t:ident, $what:literal) => {
        impl Default for $t {
            /// All fields zero.
            fn default() -> Self {
                Self {
                    local_comm_id: 0,
                    remote_comm_id: 0,
                    private_data: [0; Self::PRIVATE_DATA_LEN],
                }
            }
        }

        impl $t {
            #[doc = concat!("Bytes of private data in a", $what, ".")]
            pub const PRIVATE_DATA_LEN: usize = 224;

            #[doc = concat!("Decodes a", $what, " from the 232 bytes after the MAD header.")]
            #[must_use]
            pub fn from_bytes(d: &[u8; MAD_DATA_LEN]) -> Self {
                Self {
                    local_comm_id: d.be32::<0>(),
                    remote_comm_id: d.be32::<4>(),
                    private_data: d.bytes::<8, { Self::PRIVATE_DATA_LEN }>(),
                }
            }

            /// Encodes the 232 bytes after the MAD header.
            #[must_use]
            pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
                let mut d = [0u8; MAD_DATA_LEN];
                d.put_be32::<0>(self.local_comm_id);
                d.put_be32::<4>(self.remote_comm_id);
                d.put_bytes::<8, { Self::PRIVATE_DATA_LEN }>(self.private_data);
                d
            }
        }
    };
}

ids_and_private!(Rtu, "n RTU");
ids_and_private!(Drep, " DREP");

/// DisconnectRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QP (24 bits). Linux ignores a DREQ whose Remote QPN is not its local
    /// QPN (`cm_dreq_handler`).
    pub remote_qpn: QpNum,
    /// Private data.
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

impl Default for Dreq {
    /// All fields zero.
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: QpNum::new(0),
            private_data: [0; Self::PRIVATE_DATA_LEN],
        }
    }
}

impl Dreq {
    /// Bytes of private data in a DREQ.
    pub const PRIVATE_DATA_LEN: usize = 220;

    /// Decodes a DREQ from the 232 bytes after the MAD header.
    #[must_use]
    pub fn from_bytes(d: &[u8; MAD_DATA_LEN]) -> Self {
        Self {
            local_comm_id: d.be32::<0>(),
            remote_comm_id: d.be32::<4>(),
            remote_qpn: QpNum::new(d.be24::<8>()),
            private_data: d.bytes::<12, { Self::PRIVATE_DATA_LEN }>(),
        }
    }

    /// Encodes the 232 bytes after the MAD header.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        d.put_be32::<0>(self.local_comm_id);
        d.put_be32::<4>(self.remote_comm_id);
        d.put_be24::<8>(self.remote_qpn.get());
        d.put_bytes::<12, { Self::PRIVATE_DATA_LEN }>(self.private_data);
        d
    }
}
