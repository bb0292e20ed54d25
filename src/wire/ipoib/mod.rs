//! IPoIB link-layer codecs (RFC 4391, RFC 4755, as Linux `drivers/infiniband/ulp/ipoib` does
//! them): the 4-byte encapsulation header, the 20-byte hardware address, ARP and IPv6
//! Neighbor Discovery with 20-byte link-layer addresses, the IP multicast to MGID mapping and
//! a small IP classifier for the data path.
//!
//! Everything here works on byte slices. There is no I/O and no clock, and no parser panics
//! on received bytes: truncated or malformed input yields an [`IpoibError`].
//!
//! # Layers
//!
//! - [`header`]: the encapsulation header ([`IpoibHeader`]) and the MTU constants.
//! - [`hwaddr`]: the IPoIB hardware address ([`HwAddr`]: flags, UD QPN, GID), printed and
//!   parsed in the format of `ip link`.
//! - [`arp`]: ARP with 20-byte hardware addresses ([`IpoibArp`]).
//! - [`nd`]: IPv6 Neighbor Discovery with 24-byte link-layer address options: finding the
//!   option in any ND message, and whole-packet [`NeighborSolicitation`] /
//!   [`NeighborAdvertisement`] with the ICMPv6 checksum ([`icmpv6_checksum`]).
//! - [`mod@classify`]: version, addresses, lengths and multicast-ness of an IP packet
//!   ([`classify()`], [`IpInfo`]).
//! - [`mcast`]: IPv4/IPv6 multicast group → IB multicast GID ([`mgid_for_ipv4`],
//!   [`mgid_for_ipv6`], [`broadcast_mgid`]).
//!
//! # Byte order
//!
//! Every multi-byte field is big-endian (network order).
//!
//! # Panics
//!
//! Only the `emit` functions of the fixed-size codecs panic, and only when the caller's buffer
//! is shorter than the codec's `LEN`; that is a programming error, never a property of
//! received bytes.

pub mod arp;
pub mod classify;
pub mod header;
pub mod hwaddr;
pub mod mcast;
pub mod nd;

pub use arp::{ArpOp, IpoibArp, ARP_HTYPE_INFINIBAND, ARP_PTYPE_IPV4};
pub use classify::{classify, is_multicast_or_broadcast, IpInfo, IpVersion};
pub use header::{
    ipoib_ud_mtu, IpoibHeader, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPOIB_CM_BUF_SIZE,
    IPOIB_CM_MTU, IPOIB_ENCAP_LEN,
};
pub use hwaddr::{HwAddr, ParseHwAddrError};
pub use mcast::{broadcast_mgid, mgid_for_ipv4, mgid_for_ipv6, MGID_SCOPE_LINK_LOCAL};
pub use nd::{
    icmpv6_checksum, icmpv6_checksum_valid, nd_ll_option, nd_source_ll_addr, nd_target_ll_addr,
    solicited_node_multicast, LlOption, NdMessage, NdType, NeighborAdvertisement,
    NeighborSolicitation, ALL_NODES_MULTICAST, IPPROTO_ICMPV6, LL_OPTION_LEN, ND_HOP_LIMIT,
    ND_OPT_SOURCE_LL_ADDR, ND_OPT_TARGET_LL_ADDR,
};

/// Why an IPoIB frame, ARP packet, Neighbor Discovery message or IP packet could not be
/// parsed.
///
/// Every parser in [`ipoib`](self) returns this instead of panicking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum IpoibError {
    /// The buffer ends before the header or message does.
    #[error("truncated packet")]
    Truncated,
    /// The ARP hardware type is not [`ARP_HTYPE_INFINIBAND`].
    #[error("ARP hardware type {0} is not InfiniBand (32)")]
    BadHardwareType(u16),
    /// The ARP protocol type is not [`ARP_PTYPE_IPV4`].
    #[error("ARP protocol type {0:#06x} is not IPv4")]
    BadProtocolType(u16),
    /// The ARP hardware address length is not 20.
    #[error("ARP hardware address length {0} is not 20")]
    BadHardwareLen(u8),
    /// The ARP protocol address length is not 4.
    #[error("ARP protocol address length {0} is not 4")]
    BadProtocolLen(u8),
    /// The ARP operation is neither request (1) nor reply (2).
    #[error("unsupported ARP operation {0}")]
    BadArpOp(u16),
    /// The ICMPv6 type is not a Neighbor Discovery message (133..=137).
    #[error("ICMPv6 type {0} is not Neighbor Discovery")]
    NotNd(u8),
    /// The ND message is valid but of another type than the one asked for.
    #[error("unexpected ND message type {0}")]
    WrongNdType(u8),
    /// The ICMPv6 code of an ND message is not 0.
    #[error("ND message with ICMPv6 code {0}")]
    BadNdCode(u8),
    /// An ND option has length 0 or runs past the end of the message.
    #[error("malformed ND option")]
    BadNdOption,
    /// A link-layer address option does not have length 3 (24 bytes), the IPoIB size.
    #[error("link-layer address option of length {0} (IPoIB needs 3)")]
    BadLlOptionLen(u8),
    /// The IP version nibble is neither 4 nor 6 (or not 6 where IPv6 is required).
    #[error("IP version {0}")]
    BadIpVersion(u8),
    /// The IPv4 header length (IHL, in 4-byte words) is below 5, or above the total length.
    #[error("bad IPv4 header length {0}")]
    BadIpHeaderLen(u8),
    /// The IPv6 Next Header is not ICMPv6.
    #[error("next header {0} is not ICMPv6")]
    NotIcmpv6(u8),
    /// An ND message arrived with a hop limit other than 255.
    #[error("ND message with hop limit {0}")]
    BadHopLimit(u8),
    /// The ICMPv6 checksum is wrong.
    #[error("bad ICMPv6 checksum")]
    BadChecksum,
}

/// Result of the IPoIB parsers.
pub type Result<T> = core::result::Result<T, IpoibError>;
