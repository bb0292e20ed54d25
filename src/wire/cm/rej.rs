//! ConnectReject (REJ, attribute 0x0012; IBTA table 108) and its reason codes.
//!
//! | Rel | Abs | Bits | Field |
//! |---|---|---|---|
//! | 0 | 24 | 32 | Local Communication ID (0 when rejecting a REQ before replying) |
//! | 4 | 28 | 32 | Remote Communication ID |
//! | 8 | 32 | 2,6 | Message REJected, reserved |
//! | 9 | 33 | 7,1 | Reject Info Length, reserved |
//! | 10 | 34 | 16 | Reason |
//! | 12 | 36 | 72 B | Additional Reject Information (ARI) |
//! | 84 | 108 | 148 B | private data |

use super::{TargetMsg, MAD_DATA_LEN};
use crate::wire::field::Bytes;
use crate::wire::PathMtu;

/// Declares [`RejReason`] with its codes, `from_code` and `code`.
macro_rules! rej_reasons {
    ($($(#[$doc:meta])* $name:ident = $code:literal,)*) => {
        /// The reason of a REJ (`enum ib_cm_rej_reason` in Linux `include/rdma/ib_cm.h`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RejReason {
            $($(#[$doc])* $name,)*
            /// Any other code (0, 34, 36 and above). Holds the code; the defined codes decode
            /// as the named variants, so `Other` of a defined code does not survive a round
            /// trip.
            Other(u16),
        }

        impl RejReason {
            /// Decodes a reason code.
            #[must_use]
            pub const fn from_code(code: u16) -> Self {
                match code {
                    $($code => Self::$name,)*
                    c => Self::Other(c),
                }
            }

            /// The reason code.
            #[must_use]
            pub const fn code(self) -> u16 {
                match self {
                    $(Self::$name => $code,)*
                    Self::Other(c) => c,
                }
            }
        }
    };
}

rej_reasons! {
    /// 1: no QP available.
    NoQp = 1,
    /// 2: no EE context available.
    NoEec = 2,
    /// 3: no resources.
    NoResources = 3,
    /// 4: timeout; the ARI holds the sender's CA GUID.
    Timeout = 4,
    /// 5: the request is not supported.
    Unsupported = 5,
    /// 6: invalid communication ID.
    InvalidCommId = 6,
    /// 7: invalid communication instance.
    InvalidCommInstance = 7,
    /// 8: no listener for the service ID.
    InvalidServiceId = 8,
    /// 9: invalid transport service type.
    InvalidTransportType = 9,
    /// 10: stale connection (the QPN is still in time-wait, or a duplicate REQ in time-wait).
    StaleConn = 10,
    /// 11: RDC does not exist.
    RdcNotExist = 11,
    /// 12: invalid GID (Linux: the primary remote GID is not one of the receiver's).
    InvalidGid = 12,
    /// 13: invalid primary LID.
    InvalidLid = 13,
    /// 14: invalid primary SL.
    InvalidSl = 14,
    /// 15: invalid primary traffic class.
    InvalidTrafficClass = 15,
    /// 16: invalid primary hop limit.
    InvalidHopLimit = 16,
    /// 17: invalid primary packet rate.
    InvalidPacketRate = 17,
    /// 18: invalid alternate GID.
    InvalidAltGid = 18,
    /// 19: invalid alternate LID.
    InvalidAltLid = 19,
    /// 20: invalid alternate SL.
    InvalidAltSl = 20,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass = 21,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit = 22,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate = 23,
    /// 24: port CM redirect.
    PortCmRedirect = 24,
    /// 25: port redirect.
    PortRedirect = 25,
    /// 26: invalid path MTU.
    InvalidMtu = 26,
    /// 27: insufficient responder resources.
    InsufficientRespResources = 27,
    /// 28: consumer defined (Linux IPoIB-CM uses it to refuse a REP with too small an MTU).
    ConsumerDefined = 28,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry = 29,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId = 30,
    /// 31: invalid class version.
    InvalidClassVersion = 31,
    /// 32: invalid primary flow label.
    InvalidFlowLabel = 32,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel = 33,
    /// 35: vendor option (ECE) not supported.
    VendorOptionNotSupported = 35,
}

/// ConnectReject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej {
    /// The rejecting side's communication ID (0 when a REQ is rejected before any reply).
    pub local_comm_id: u32,
    /// The rejected side's communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub msg_rejected: TargetMsg,
    /// How many bytes of [`ari`](Self::ari) are meaningful (7 bits).
    pub reject_info_len: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional Reject Information.
    pub ari: [u8; Self::ARI_LEN],
    /// Private data.
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

impl Default for Rej {
    /// A REJ of a REQ with reason [`RejReason::Other`]`(0)` and everything else zero.
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            remote_comm_id: 0,
            msg_rejected: TargetMsg::Req,
            reject_info_len: 0,
            reason: RejReason::Other(0),
            ari: [0; Self::ARI_LEN],
            private_data: [0; Self::PRIVATE_DATA_LEN],
        }
    }
}

impl Rej {
    /// Bytes of Additional Reject Information.
    pub const ARI_LEN: usize = 72;
    /// Bytes of private data in a REJ.
    pub const PRIVATE_DATA_LEN: usize = 148;

    /// The ARI of a REJ [`RejReason::InvalidMtu`]: the largest path MTU the rejecter accepts,
    /// as the IB MTU code in one byte (IBTA table 112, "MTU"); `reject_info_len` 1.
    #[must_use]
    pub fn invalid_mtu_ari(acceptable: PathMtu) -> [u8; 1] {
        [acceptable.to_enum()]
    }

    /// The largest path MTU the rejecter accepts, from the ARI of a REJ
    /// [`RejReason::InvalidMtu`] ([`Rej::invalid_mtu_ari`]); `None` for any other reason, an
    /// empty ARI or a code that names no MTU.
    #[must_use]
    pub fn acceptable_mtu(&self) -> Option<PathMtu> {
        if self.reason != RejReason::InvalidMtu || self.reject_info_len == 0 {
            return None;
        }
        PathMtu::from_enum(self.ari[0])
    }

    /// Decodes a REJ from the 232 bytes after the MAD header.
    #[must_use]
    pub fn from_bytes(d: &[u8; MAD_DATA_LEN]) -> Self {
        Self {
            local_comm_id: d.be32::<0>(),
            remote_comm_id: d.be32::<4>(),
            msg_rejected: TargetMsg::from_bits(d[8] >> 6),
            reject_info_len: d[9] >> 1,
            reason: RejReason::from_code(d.be16::<10>()),
            ari: d.bytes::<12, { Self::ARI_LEN }>(),
            private_data: d.bytes::<84, { Self::PRIVATE_DATA_LEN }>(),
        }
    }

    /// Encodes the 232 bytes after the MAD header.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        d.put_be32::<0>(self.local_comm_id);
        d.put_be32::<4>(self.remote_comm_id);
        d[8] = self.msg_rejected.bits() << 6;
        d[9] = (self.reject_info_len & 0x7F) << 1;
        d.put_be16::<10>(self.reason.code());
        d.put_bytes::<12, { Self::ARI_LEN }>(self.ari);
        d.put_bytes::<84, { Self::PRIVATE_DATA_LEN }>(self.private_data);
        d
    }
}
