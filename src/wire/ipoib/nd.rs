//! IPv6 Neighbor Discovery with IPoIB link-layer addresses (RFC 4861; RFC 4391 §9.1).
//!
//! On IPoIB the Source and Target Link-Layer Address options are 24 bytes long (length field
//! 3): type, length, two reserved zero bytes, then the 20-byte [`HwAddr`]. Linux calls the
//! two bytes `ndisc_addr_option_pad(ARPHRD_INFINIBAND) = 2`.
//!
//! Two levels of input:
//!
//! - **ICMPv6 message** (the bytes after the IPv6 header, starting with the ICMPv6 type):
//!   [`nd_ll_option`], [`nd_source_ll_addr`] and [`nd_target_ll_addr`] find a link-layer
//!   address option in any ND message (RS, RA, NS, NA, Redirect). They do not check the
//!   checksum, which needs the IPv6 addresses.
//! - **Whole IPv6 packet** (no link header), as read from or written to the TUN device and
//!   carried over UD: [`NdMessage::parse`] validates the IPv6 header, hop limit 255 and the
//!   ICMPv6 checksum; [`NeighborSolicitation`] and [`NeighborAdvertisement`] parse and build
//!   the two messages the daemon answers and sends itself.
//!
//! IPv6 extension headers are not walked: a packet whose Next Header is not ICMPv6 is not an
//! ND packet here (ND messages never carry extension headers in practice).

use std::net::Ipv6Addr;

use etherparse::checksum::Sum16BitWords;

use super::{HwAddr, IpoibError, Result};
use crate::wire::field::{read_array, write_u16, Bytes};

/// The IPv6 Next Header value of ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;

/// The hop limit every ND message carries (and receivers require).
pub const ND_HOP_LIMIT: u8 = 255;

/// ND option type of the Source Link-Layer Address.
pub const ND_OPT_SOURCE_LL_ADDR: u8 = 1;

/// ND option type of the Target Link-Layer Address.
pub const ND_OPT_TARGET_LL_ADDR: u8 = 2;

/// Size of an IPoIB link-layer address option: 2 + 2 reserved + 20 (length field 3).
pub const LL_OPTION_LEN: usize = 24;

/// Size of the IPv6 header.
const IPV6_HEADER_LEN: usize = 40;

/// Byte offset of the ICMPv6 checksum inside the ICMPv6 message.
const CHECKSUM_OFFSET: usize = 2;

/// The ND message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdType {
    /// ICMPv6 type 133.
    RouterSolicitation,
    /// ICMPv6 type 134.
    RouterAdvertisement,
    /// ICMPv6 type 135.
    NeighborSolicitation,
    /// ICMPv6 type 136.
    NeighborAdvertisement,
    /// ICMPv6 type 137.
    Redirect,
}

impl NdType {
    /// The ICMPv6 type.
    #[must_use]
    pub const fn icmp_type(self) -> u8 {
        match self {
            Self::RouterSolicitation => 133,
            Self::RouterAdvertisement => 134,
            Self::NeighborSolicitation => 135,
            Self::NeighborAdvertisement => 136,
            Self::Redirect => 137,
        }
    }

    /// The ND message type of an ICMPv6 type, if it is one.
    #[must_use]
    pub const fn from_icmp_type(t: u8) -> Option<Self> {
        match t {
            133 => Some(Self::RouterSolicitation),
            134 => Some(Self::RouterAdvertisement),
            135 => Some(Self::NeighborSolicitation),
            136 => Some(Self::NeighborAdvertisement),
            137 => Some(Self::Redirect),
            _ => None,
        }
    }

    /// Size of the fixed part of the message, ICMPv6 header included; the options follow it.
    #[must_use]
    pub const fn fixed_len(self) -> usize {
        match self {
            Self::RouterSolicitation => 8,
            Self::RouterAdvertisement => 16,
            Self::NeighborSolicitation | Self::NeighborAdvertisement => 24,
            Self::Redirect => 40,
        }
    }
}

/// Which link-layer address option to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlOption {
    /// Source Link-Layer Address (type 1): in RS, RA, NS.
    Source,
    /// Target Link-Layer Address (type 2): in NA, Redirect.
    Target,
}

impl LlOption {
    /// The option type.
    #[must_use]
    pub const fn option_type(self) -> u8 {
        match self {
            Self::Source => ND_OPT_SOURCE_LL_ADDR,
            Self::Target => ND_OPT_TARGET_LL_ADDR,
        }
    }
}

/// Checks the ICMPv6 type and code of an ND message and returns its options.
fn nd_options(icmp: &[u8]) -> Result<(NdType, &[u8])> {
    let [t, code, ..] = *icmp else {
        return Err(IpoibError::Truncated);
    };
    let kind = NdType::from_icmp_type(t).ok_or(IpoibError::NotNd(t))?;
    if code != 0 {
        return Err(IpoibError::BadNdCode(code));
    }
    let options = icmp.get(kind.fixed_len()..).ok_or(IpoibError::Truncated)?;
    Ok((kind, options))
}

/// Finds the `which` link-layer address option in the ND message `icmp` (the ICMPv6 message,
/// starting with its type byte) and returns its address; `Ok(None)` if there is none.
///
/// All options are checked, as Linux `ndisc_parse_options` does; if the option appears more
/// than once, the first wins.
///
/// # Errors
///
/// - [`IpoibError::Truncated`] if `icmp` is shorter than the message's fixed part.
/// - [`IpoibError::NotNd`] if the ICMPv6 type is not 133..=137; [`IpoibError::BadNdCode`] if
///   the code is not 0.
/// - [`IpoibError::BadNdOption`] if an option has length 0 or runs past the message.
/// - [`IpoibError::BadLlOptionLen`] if the wanted option's length field is not 3 (an
///   Ethernet-sized option, say); Linux drops such messages.
pub fn nd_ll_option(icmp: &[u8], which: LlOption) -> Result<Option<HwAddr>> {
    let (_, mut options) = nd_options(icmp)?;
    let mut found = None;
    while !options.is_empty() {
        let [t, len, ..] = *options else {
            return Err(IpoibError::BadNdOption);
        };
        let size = usize::from(len) * 8;
        if len == 0 || size > options.len() {
            return Err(IpoibError::BadNdOption);
        }
        let (opt, rest) = options.split_at(size);
        if t == which.option_type() && found.is_none() {
            if size != LL_OPTION_LEN {
                return Err(IpoibError::BadLlOptionLen(len));
            }
            found = opt.get(4..).map(HwAddr::parse).transpose()?;
        }
        options = rest;
    }
    Ok(found)
}

/// The Source Link-Layer Address of an ND message; see [`nd_ll_option`].
///
/// # Errors
///
/// As [`nd_ll_option`].
pub fn nd_source_ll_addr(icmp: &[u8]) -> Result<Option<HwAddr>> {
    nd_ll_option(icmp, LlOption::Source)
}

/// The Target Link-Layer Address of an ND message; see [`nd_ll_option`].
///
/// # Errors
///
/// As [`nd_ll_option`].
pub fn nd_target_ll_addr(icmp: &[u8]) -> Result<Option<HwAddr>> {
    nd_ll_option(icmp, LlOption::Target)
}

/// Writes a link-layer address option.
fn push_ll_option(out: &mut Vec<u8>, which: LlOption, hw: &HwAddr) {
    out.extend_from_slice(&[which.option_type(), (LL_OPTION_LEN / 8) as u8, 0, 0]);
    out.extend_from_slice(&hw.to_bytes());
}

/// The ICMPv6 checksum of `icmp` (the whole ICMPv6 message) sent from `src` to `dst`: the
/// ones' complement of the ones' complement sum of the pseudo-header (RFC 8200 §8.1) and
/// the message, **including** whatever its checksum field holds.
///
/// With the checksum field zero the result is the value to store; over a message with a
/// correct checksum the result is 0 (see [`icmpv6_checksum_valid`]).
#[must_use]
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, icmp: &[u8]) -> u16 {
    // The pseudo-header's upper-layer length is 32 bits; an ND message is far shorter.
    let len = u32::try_from(icmp.len()).unwrap_or(u32::MAX);
    Sum16BitWords::new()
        .add_16bytes(src.octets())
        .add_16bytes(dst.octets())
        .add_4bytes(len.to_be_bytes())
        .add_2bytes([0, IPPROTO_ICMPV6])
        .add_slice(icmp)
        .ones_complement()
        .to_be()
}

/// True if the checksum field of `icmp` is correct for `src` → `dst`.
#[must_use]
pub fn icmpv6_checksum_valid(src: Ipv6Addr, dst: Ipv6Addr, icmp: &[u8]) -> bool {
    icmpv6_checksum(src, dst, icmp) == 0
}

/// The all-nodes multicast address `ff02::1` (RFC 4291 §2.7.1): unsolicited Neighbor
/// Advertisements and answers to Duplicate Address Detection go to it.
pub const ALL_NODES_MULTICAST: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The solicited-node multicast address of `addr` (`ff02::1:ffXX:XXXX`, RFC 4291 §2.7.1),
/// where Neighbor Solicitations for `addr` are sent.
#[must_use]
pub const fn solicited_node_multicast(addr: Ipv6Addr) -> Ipv6Addr {
    let a = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | a[13] as u16,
        u16::from_be_bytes([a[14], a[15]]),
    )
}

/// A validated ND packet: an IPv6 packet (no link header) carrying an ND message with hop
/// limit 255 and a correct ICMPv6 checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NdMessage<'a> {
    /// IPv6 source address.
    pub src: Ipv6Addr,
    /// IPv6 destination address.
    pub dst: Ipv6Addr,
    /// The message type.
    pub kind: NdType,
    /// The ICMPv6 message (type byte onwards), for [`nd_ll_option`]; bytes after the IPv6
    /// payload length are excluded.
    pub icmp: &'a [u8],
}

impl<'a> NdMessage<'a> {
    /// Validates the IPv6 packet `packet` as an ND message. Bytes after the IPv6 payload
    /// length are ignored.
    ///
    /// # Errors
    ///
    /// - [`IpoibError::Truncated`] if the packet is shorter than its headers or payload
    ///   length, or the message shorter than its fixed part.
    /// - [`IpoibError::BadIpVersion`] if it is not IPv6.
    /// - [`IpoibError::NotIcmpv6`] if the Next Header is not 58.
    /// - [`IpoibError::BadHopLimit`] if the hop limit is not 255 (RFC 4861 requires receivers
    ///   to drop such messages: they may come from off-link).
    /// - [`IpoibError::BadChecksum`] if the ICMPv6 checksum is wrong.
    /// - [`IpoibError::NotNd`] / [`IpoibError::BadNdCode`] as in [`nd_ll_option`].
    pub fn parse(packet: &'a [u8]) -> Result<Self> {
        let (hdr, rest) = packet
            .split_first_chunk::<IPV6_HEADER_LEN>()
            .ok_or(IpoibError::Truncated)?;
        let src = Ipv6Addr::from(hdr.bytes::<8, 16>());
        let dst = Ipv6Addr::from(hdr.bytes::<24, 16>());
        let version = hdr[0] >> 4;
        if version != 6 {
            return Err(IpoibError::BadIpVersion(version));
        }
        let payload_len = usize::from(hdr.be16::<4>());
        if hdr[6] != IPPROTO_ICMPV6 {
            return Err(IpoibError::NotIcmpv6(hdr[6]));
        }
        if hdr[7] != ND_HOP_LIMIT {
            return Err(IpoibError::BadHopLimit(hdr[7]));
        }
        let icmp = rest.get(..payload_len).ok_or(IpoibError::Truncated)?;
        let (kind, _) = nd_options(icmp)?;
        if !icmpv6_checksum_valid(src, dst, icmp) {
            return Err(IpoibError::BadChecksum);
        }
        Ok(Self {
            src,
            dst,
            kind,
            icmp,
        })
    }

    /// The target address of an NS, NA or Redirect (bytes 8..24 of the message); `None` for
    /// RS and RA.
    #[must_use]
    pub fn target(&self) -> Option<Ipv6Addr> {
        match self.kind {
            NdType::NeighborSolicitation | NdType::NeighborAdvertisement | NdType::Redirect => {
                read_array::<16>(self.icmp, 8..24).map(Ipv6Addr::from)
            }
            NdType::RouterSolicitation | NdType::RouterAdvertisement => None,
        }
    }

    /// Checks that the message is of type `kind`.
    fn expect(&self, kind: NdType) -> Result<()> {
        if self.kind == kind {
            Ok(())
        } else {
            Err(IpoibError::WrongNdType(self.kind.icmp_type()))
        }
    }
}

/// Writes the IPv6 header and the ICMPv6 message `icmp` (checksum field zero) into `out`
/// (cleared first), then fills in the checksum.
fn emit_packet(src: Ipv6Addr, dst: Ipv6Addr, icmp: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(IPV6_HEADER_LEN + icmp.len());
    let mut fixed = [0x60, 0, 0, 0, 0, 0, IPPROTO_ICMPV6, ND_HOP_LIMIT];
    fixed.put_be16::<4>(u16::try_from(icmp.len()).unwrap_or(u16::MAX));
    out.extend_from_slice(&fixed);
    out.extend_from_slice(&src.octets());
    out.extend_from_slice(&dst.octets());
    out.extend_from_slice(icmp);
    let at = IPV6_HEADER_LEN + CHECKSUM_OFFSET;
    write_u16(out, at..at + 2, icmpv6_checksum(src, dst, icmp));
}

/// A Neighbor Solicitation (ICMPv6 type 135) as a whole IPv6 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NeighborSolicitation {
    /// IPv6 source: our address, or `::` for Duplicate Address Detection.
    pub src: Ipv6Addr,
    /// IPv6 destination: the target's solicited-node multicast address for resolution, the
    /// target itself for unreachability detection.
    pub dst: Ipv6Addr,
    /// The address being resolved.
    pub target: Ipv6Addr,
    /// The Source Link-Layer Address option: our hardware address. RFC 4861 forbids it
    /// when `src` is `::`.
    pub source_hw: Option<HwAddr>,
}

impl NeighborSolicitation {
    /// Size of the ICMPv6 message without options.
    const FIXED_LEN: usize = 24;

    /// An address-resolution solicitation for `target` from `src` (whose hardware address is
    /// `our_hw`), sent to the target's solicited-node multicast address. If `src` is `::`
    /// (DAD) the source link-layer option is omitted.
    #[must_use]
    pub fn new(src: Ipv6Addr, our_hw: HwAddr, target: Ipv6Addr) -> Self {
        Self {
            src,
            dst: solicited_node_multicast(target),
            target,
            source_hw: (!src.is_unspecified()).then_some(our_hw),
        }
    }

    /// Decodes a validated NS packet (see [`NdMessage::parse`]).
    ///
    /// # Errors
    ///
    /// Those of [`NdMessage::parse`] and [`nd_ll_option`];
    /// [`IpoibError::WrongNdType`] if the message is another ND type.
    pub fn parse(packet: &[u8]) -> Result<Self> {
        let m = NdMessage::parse(packet)?;
        m.expect(NdType::NeighborSolicitation)?;
        Ok(Self {
            src: m.src,
            dst: m.dst,
            target: m.target().ok_or(IpoibError::Truncated)?,
            source_hw: nd_source_ll_addr(m.icmp)?,
        })
    }

    /// Replaces the contents of `out` with the IPv6 packet (hop limit 255, correct ICMPv6
    /// checksum). `out` is cleared first; reusing one buffer avoids reallocating.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let mut icmp = Vec::with_capacity(Self::FIXED_LEN + LL_OPTION_LEN);
        icmp.extend_from_slice(&[
            NdType::NeighborSolicitation.icmp_type(),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ]);
        icmp.extend_from_slice(&self.target.octets());
        if let Some(hw) = &self.source_hw {
            push_ll_option(&mut icmp, LlOption::Source, hw);
        }
        emit_packet(self.src, self.dst, &icmp, out);
    }

    /// The IPv6 packet in a new buffer; see [`NeighborSolicitation::emit`].
    #[must_use]
    pub fn to_packet(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.emit(&mut out);
        out
    }
}

/// A Neighbor Advertisement (ICMPv6 type 136) as a whole IPv6 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NeighborAdvertisement {
    /// IPv6 source: one of our addresses (normally `target`).
    pub src: Ipv6Addr,
    /// IPv6 destination: the solicitor, or `ff02::1` for an unsolicited advertisement or an
    /// answer to a DAD probe.
    pub dst: Ipv6Addr,
    /// The address being advertised.
    pub target: Ipv6Addr,
    /// R flag: the sender is a router.
    pub router: bool,
    /// S flag: sent in response to a solicitation.
    pub solicited: bool,
    /// O flag: the advertisement overrides a cached link-layer address.
    pub override_flag: bool,
    /// The Target Link-Layer Address option: the hardware address of `target`.
    pub target_hw: Option<HwAddr>,
}

impl NeighborAdvertisement {
    /// Size of the ICMPv6 message without options.
    const FIXED_LEN: usize = 24;
    /// R flag bit in byte 4.
    const FLAG_ROUTER: u8 = 0x80;
    /// S flag bit in byte 4.
    const FLAG_SOLICITED: u8 = 0x40;
    /// O flag bit in byte 4.
    const FLAG_OVERRIDE: u8 = 0x20;

    /// The answer to `ns` for its target, which is ours at `our_hw` (RFC 4861 §7.2.4): from
    /// the target, to the solicitor (solicited flag set), or to `ff02::1` (solicited flag
    /// clear) if the solicitation came from `::`; override set; router clear.
    #[must_use]
    pub fn answer(ns: &NeighborSolicitation, our_hw: HwAddr) -> Self {
        let dad = ns.src.is_unspecified();
        Self {
            src: ns.target,
            dst: if dad { ALL_NODES_MULTICAST } else { ns.src },
            target: ns.target,
            router: false,
            solicited: !dad,
            override_flag: true,
            target_hw: Some(our_hw),
        }
    }

    /// Decodes a validated NA packet (see [`NdMessage::parse`]). Reserved bits are ignored.
    ///
    /// # Errors
    ///
    /// Those of [`NdMessage::parse`] and [`nd_ll_option`];
    /// [`IpoibError::WrongNdType`] if the message is another ND type.
    pub fn parse(packet: &[u8]) -> Result<Self> {
        let m = NdMessage::parse(packet)?;
        m.expect(NdType::NeighborAdvertisement)?;
        let flags = *m.icmp.get(4).ok_or(IpoibError::Truncated)?;
        Ok(Self {
            src: m.src,
            dst: m.dst,
            target: m.target().ok_or(IpoibError::Truncated)?,
            router: flags & Self::FLAG_ROUTER != 0,
            solicited: flags & Self::FLAG_SOLICITED != 0,
            override_flag: flags & Self::FLAG_OVERRIDE != 0,
            target_hw: nd_target_ll_addr(m.icmp)?,
        })
    }

    /// Replaces the contents of `out` with the IPv6 packet (hop limit 255, correct ICMPv6
    /// checksum). `out` is cleared first; reusing one buffer avoids reallocating.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let mut flags = 0;
        if self.router {
            flags |= Self::FLAG_ROUTER;
        }
        if self.solicited {
            flags |= Self::FLAG_SOLICITED;
        }
        if self.override_flag {
            flags |= Self::FLAG_OVERRIDE;
        }
        let mut icmp = Vec::with_capacity(Self::FIXED_LEN + LL_OPTION_LEN);
        icmp.extend_from_slice(&[
            NdType::NeighborAdvertisement.icmp_type(),
            0,
            0,
            0,
            flags,
            0,
            0,
            0,
        ]);
        icmp.extend_from_slice(&self.target.octets());
        if let Some(hw) = &self.target_hw {
            push_ll_option(&mut icmp, LlOption::Target, hw);
        }
        emit_packet(self.src, self.dst, &icmp, out);
    }

    /// The IPv6 packet in a new buffer; see [`NeighborAdvertisement::emit`].
    #[must_use]
    pub fn to_packet(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.emit(&mut out);
        out
    }
}

#[cfg(test)]
mod tests;
