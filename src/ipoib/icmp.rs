//! ICMP errors the endpoint writes back to the TUN device: "fragmentation needed" (IPv4) and
//! "packet too big" (IPv6) for a packet larger than the path it would take.

use std::net::IpAddr;

use etherparse::{icmpv4::DestUnreachableHeader, Icmpv4Type, Icmpv6Type, PacketBuilder};

use super::Endpoint;
use crate::wire::ipoib::classify;

impl Endpoint {
    /// Writes an ICMP "fragmentation needed" / "packet too big" for `packet` into the TUN
    /// device, carrying `mtu`, as the local stack would get from a router.
    pub(super) fn too_big(&mut self, packet: &[u8], mtu: u32) {
        let Ok(info) = classify(packet) else { return };
        let mut out = Vec::new();
        let built = match (info.src, info.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let quote = packet.get(..packet.len().min(548)).unwrap_or(packet);
                // From the destination, as a router on the way would: the kernel drops
                // packets arriving with one of its own addresses as the source.
                PacketBuilder::ipv4(dst.octets(), src.octets(), 64)
                    .icmpv4(Icmpv4Type::DestinationUnreachable(
                        DestUnreachableHeader::FragmentationNeeded {
                            next_hop_mtu: u16::try_from(mtu).unwrap_or(u16::MAX),
                        },
                    ))
                    .write(&mut out, quote)
                    .is_ok()
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let quote = packet.get(..packet.len().min(1232)).unwrap_or(packet);
                PacketBuilder::ipv6(dst.octets(), src.octets(), 64)
                    .icmpv6(Icmpv6Type::PacketTooBig { mtu })
                    .write(&mut out, quote)
                    .is_ok()
            }
            _ => false,
        };
        if built {
            self.counters.icmp_too_big_sent += 1;
            self.tun.push_owned(out);
        }
        self.counters.tx_dropped += 1;
    }
}
