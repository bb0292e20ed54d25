//! Message Receipt Acknowledgement (MRA, attribute 0x0011; IBTA table 107).
//!
//! | Rel | Abs | Bits | Field |
//! |---|---|---|---|
//! | 0 | 24 | 32 | Local Communication ID |
//! | 4 | 28 | 32 | Remote Communication ID |
//! | 8 | 32 | 2,6 | Message MRAed, reserved |
//! | 9 | 33 | 5,3 | Service Timeout, reserved |
//! | 10 | 34 | 222 B | private data |

use super::{TargetMsg, MAD_DATA_LEN};
use crate::wire::field::Bytes;

/// Message Receipt Acknowledgement: "I got your message; the answer will take a while".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (for an MRA of a REQ, the REQ's Local Communication
    /// ID).
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub msg_mraed: TargetMsg,
    /// How much longer the sender needs (5-bit exponent); the receiver extends its timeout by
    /// [`cm_timeout_ms`](super::cm_timeout_ms) of it.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

impl Default for Mra {
    /// An MRA of a REQ with everything else zero.
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            remote_comm_id: 0,
            msg_mraed: TargetMsg::Req,
            service_timeout: 0,
            private_data: [0; Self::PRIVATE_DATA_LEN],
        }
    }
}

impl Mra {
    /// Bytes of private data in an MRA.
    pub const PRIVATE_DATA_LEN: usize = 222;

    /// Decodes an MRA from the 232 bytes after the MAD header.
    #[must_use]
    pub fn from_bytes(d: &[u8; MAD_DATA_LEN]) -> Self {
        Self {
            local_comm_id: d.be32::<0>(),
            remote_comm_id: d.be32::<4>(),
            msg_mraed: TargetMsg::from_bits(d[8] >> 6),
            service_timeout: d[9] >> 3,
            private_data: d.bytes::<10, { Self::PRIVATE_DATA_LEN }>(),
        }
    }

    /// Encodes the 232 bytes after the MAD header.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        d.put_be32::<0>(self.local_comm_id);
        d.put_be32::<4>(self.remote_comm_id);
        d[8] = self.msg_mraed.bits() << 6;
        d[9] = (self.service_timeout & 0x1F) << 3;
        d.put_bytes::<10, { Self::PRIVATE_DATA_LEN }>(self.private_data);
        d
    }
}
