//! The 4-byte IPoIB encapsulation header and the MTU constants (Linux `ipoib.h`).
//!
//! Every IPoIB packet, on UD and on RC alike, starts with `struct ipoib_header { __be16
//! proto; u16 reserved; }`. On UD the receive buffer additionally begins with the 40-byte GRH;
//! on RC there is no GRH. The 20-byte "pseudo header" Linux pushes in front of the header is
//! kernel-internal and never on the wire.

use super::{IpoibError, Result};
use crate::wire::field::{emit_head, head};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;

/// Size of the encapsulation header (`IPOIB_ENCAP_LEN`).
pub const IPOIB_ENCAP_LEN: usize = 4;

/// The largest connected-mode MTU (`IPOIB_CM_MTU = 0x10000 - 0x10`, "padding to align
/// header to 16"). This is the IP MTU, without the 4-byte header.
pub const IPOIB_CM_MTU: u32 = 0x10000 - 0x10;

/// Connected-mode receive buffer size: [`IPOIB_CM_MTU`] plus the 4-byte header
/// (`IPOIB_CM_BUF_SIZE`). Linux advertises it in the `mtu` field of `ipoib_cm_data`.
pub const IPOIB_CM_BUF_SIZE: u32 = IPOIB_CM_MTU + IPOIB_ENCAP_LEN as u32;

/// The datagram-mode IP MTU for an IB path MTU in bytes (`IPOIB_UD_MTU(ib_mtu) = ib_mtu -
/// 4`): 2044 for a 2048-byte IB MTU, 4092 for 4096. Saturates at 0 for absurd inputs.
#[must_use]
pub const fn ipoib_ud_mtu(ib_mtu: u32) -> u32 {
    ib_mtu.saturating_sub(IPOIB_ENCAP_LEN as u32)
}

/// The IPoIB encapsulation header: the EtherType of the payload followed by two reserved
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpoibHeader {
    /// EtherType of the payload ([`ETHERTYPE_IPV4`], [`ETHERTYPE_IPV6`], [`ETHERTYPE_ARP`],
    /// …).
    pub ethertype: u16,
}

impl IpoibHeader {
    /// Size on the wire.
    pub const LEN: usize = IPOIB_ENCAP_LEN;

    /// A header for `ethertype`.
    #[must_use]
    pub const fn new(ethertype: u16) -> Self {
        Self { ethertype }
    }

    /// Decodes the header at the start of `buf`. The reserved bytes are ignored, as Linux
    /// ignores them.
    ///
    /// # Errors
    ///
    /// [`IpoibError::Truncated`] if `buf` is shorter than 4
    /// bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        head::<{ Self::LEN }>(buf)
            .ok_or(IpoibError::Truncated)
            .map(Self::from_bytes)
    }

    /// Decodes exactly 4 bytes (the reserved bytes are ignored).
    #[must_use]
    pub const fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        Self {
            ethertype: u16::from_be_bytes([b[0], b[1]]),
        }
    }

    /// Encodes the header; the reserved bytes are zero.
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; Self::LEN] {
        let e = self.ethertype.to_be_bytes();
        [e[0], e[1], 0, 0]
    }

    /// Writes the header into the first 4 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 4 bytes.
    #[track_caller]
    pub fn emit(&self, buf: &mut [u8]) {
        emit_head(buf, &self.to_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipoib::IpoibError;
    use proptest::prelude::*;

    #[test]
    fn constants_match_linux() {
        assert_eq!(IPOIB_CM_MTU, 65520);
        assert_eq!(IPOIB_CM_BUF_SIZE, 65524);
        assert_eq!(ipoib_ud_mtu(2048), 2044);
        assert_eq!(ipoib_ud_mtu(4096), 4092);
        assert_eq!(ipoib_ud_mtu(2), 0);
        assert_eq!(IpoibHeader::LEN, 4);
    }

    #[test]
    fn fixed_vectors() {
        assert_eq!(
            IpoibHeader::new(ETHERTYPE_IPV4).to_bytes(),
            [0x08, 0x00, 0, 0]
        );
        assert_eq!(
            IpoibHeader::new(ETHERTYPE_IPV6).to_bytes(),
            [0x86, 0xDD, 0, 0]
        );
        assert_eq!(
            IpoibHeader::new(ETHERTYPE_ARP).to_bytes(),
            [0x08, 0x06, 0, 0]
        );
        assert_eq!(
            IpoibHeader::parse(&[0x08, 0x06, 0xAA, 0xBB, 0x45]),
            Ok(IpoibHeader::new(ETHERTYPE_ARP))
        );
        assert_eq!(
            IpoibHeader::parse(&[0x08, 0x00, 0]),
            Err(IpoibError::Truncated)
        );
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn emit_into_short_buffer_panics() {
        IpoibHeader::new(ETHERTYPE_IPV4).emit(&mut [0u8; 3]);
    }

    proptest! {
        #[test]
        fn round_trip(ethertype in any::<u16>(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
            let h = IpoibHeader::new(ethertype);
            let mut buf = vec![0xEEu8; IpoibHeader::LEN];
            buf.extend_from_slice(&tail);
            h.emit(&mut buf);
            prop_assert_eq!(&buf[2..4], &[0, 0]);
            prop_assert_eq!(IpoibHeader::parse(&buf)?, h);
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..8)) {
            match IpoibHeader::parse(&b) {
                Ok(h) => prop_assert_eq!(&h.to_bytes()[..2], &b[..2]),
                Err(e) => {
                    prop_assert_eq!(e, IpoibError::Truncated);
                    prop_assert!(b.len() < 4);
                }
            }
        }
    }
}
