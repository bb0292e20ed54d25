//! IPoIB connected mode conventions on top of the CM (RFC 4755; Linux `ipoib_cm.c`).
//!
//! - The service ID is a 40-bit prefix ORed with the listener's **UD** QPN in the low 24 bits.
//!   Linux uses `0x1000000000000000` ([`IPOIB_CM_SERVICE_ID_LINUX`]); RFC 4755 specifies
//!   `0x0100000000000000` ([`IPOIB_CM_SERVICE_ID_RFC4755`]). To interoperate with Linux,
//!   connect to and listen on the Linux value; also listening on the RFC value (as illumos
//!   does) costs nothing.
//! - REQ and REP carry `struct ipoib_cm_data { __be32 qpn; __be32 mtu; }` at the start of
//!   their private data ([`IpoibCmData`]).

use crate::wire::QpNum;

use super::CmError;

/// The IPoIB-CM service ID prefix Linux uses (`IPOIB_CM_IETF_ID`).
pub const IPOIB_CM_SERVICE_ID_LINUX: u64 = 0x1000_0000_0000_0000;

/// The IPoIB-CM service ID prefix RFC 4755 specifies (illumos `IBD_RC_SERVICE_ID`).
pub const IPOIB_CM_SERVICE_ID_RFC4755: u64 = 0x0100_0000_0000_0000;

/// Bits of a service ID that hold the QPN.
const QPN_BITS: u64 = 0x00FF_FFFF;

/// Which IPoIB-CM service ID prefix a service ID uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceIdFlavor {
    /// [`IPOIB_CM_SERVICE_ID_LINUX`].
    Linux,
    /// [`IPOIB_CM_SERVICE_ID_RFC4755`].
    Rfc4755,
}

impl ServiceIdFlavor {
    /// The prefix of this flavour.
    #[must_use]
    pub const fn prefix(self) -> u64 {
        match self {
            Self::Linux => IPOIB_CM_SERVICE_ID_LINUX,
            Self::Rfc4755 => IPOIB_CM_SERVICE_ID_RFC4755,
        }
    }
}

/// The IPoIB-CM service ID for the UD QP `qpn`: the Linux prefix if `linux`, else the
/// RFC 4755 one.
#[must_use]
pub const fn ipoib_service_id(qpn: QpNum, linux: bool) -> u64 {
    let prefix = if linux {
        IPOIB_CM_SERVICE_ID_LINUX
    } else {
        IPOIB_CM_SERVICE_ID_RFC4755
    };
    prefix | qpn.get() as u64
}

/// Splits an IPoIB-CM service ID into the UD QPN and the prefix flavour; `None` if the upper
/// 40 bits are neither prefix.
#[must_use]
pub const fn parse_ipoib_service_id(service_id: u64) -> Option<(QpNum, ServiceIdFlavor)> {
    let qpn = QpNum::new((service_id & QPN_BITS) as u32);
    match service_id & !QPN_BITS {
        IPOIB_CM_SERVICE_ID_LINUX => Some((qpn, ServiceIdFlavor::Linux)),
        IPOIB_CM_SERVICE_ID_RFC4755 => Some((qpn, ServiceIdFlavor::Rfc4755)),
        _ => None,
    }
}

/// `struct ipoib_cm_data`: the first 8 bytes of the private data of an IPoIB-CM REQ and REP,
/// both fields big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpoibCmData {
    /// The sender's **UD** QPN. The high byte of the 32-bit field is ignored on receive (RFC
    /// 4755); Linux never uses the received value.
    pub qpn: QpNum,
    /// The largest IPoIB packet (IP packet plus the 4-byte IPoIB header) the sender can
    /// receive; Linux sends [`IpoibCmData::LINUX_MTU`] and refuses a REP whose value is 4 or
    /// less with REJ [`ConsumerDefined`](super::RejReason::ConsumerDefined).
    pub mtu: u32,
}

impl IpoibCmData {
    /// Size on the wire.
    pub const LEN: usize = 8;

    /// The `mtu` Linux sends: `IPOIB_CM_BUF_SIZE`, 65520 bytes of IP MTU plus the 4-byte
    /// IPoIB header.
    pub const LINUX_MTU: u32 = 65524;

    /// Decodes exactly 8 bytes.
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        Self {
            qpn: QpNum::new(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            mtu: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Encodes the 8 bytes (the high byte of the QPN field is zero).
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::LEN] {
        let q = self.qpn.get().to_be_bytes();
        let m = self.mtu.to_be_bytes();
        [q[0], q[1], q[2], q[3], m[0], m[1], m[2], m[3]]
    }

    /// Decodes the first 8 bytes of `private_data`.
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] if `private_data` is shorter than 8 bytes.
    pub fn decode(private_data: &[u8]) -> Result<Self, CmError> {
        private_data
            .first_chunk::<{ Self::LEN }>()
            .map(Self::from_bytes)
            .ok_or(CmError::Truncated)
    }

    /// Writes the 8 bytes at the start of `private_data`, leaving the rest untouched.
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] if `private_data` is shorter than 8 bytes (every CM message's
    /// private data is longer).
    pub fn encode(&self, private_data: &mut [u8]) -> Result<(), CmError> {
        let dst = private_data
            .first_chunk_mut::<{ Self::LEN }>()
            .ok_or(CmError::Truncated)?;
        *dst = self.to_bytes();
        Ok(())
    }
}
