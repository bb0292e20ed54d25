//! [`SoftConfig`], the configuration of a provider instance, and the engine's fixed limits.

use std::net::IpAddr;

use super::fault::{FaultConfig, Quirks};
pub(super) use super::ib::SoftLink;
use crate::verbs::{PKey, PathMtu, QpNum};
use crate::wire::{WorkerId, ROCEV2_UDP_PORT};

/// The QPN of multicast packets.
pub const MULTICAST_QPN: QpNum = QpNum::new(0x00FF_FFFF);

/// TTL / hop limit of IP multicast datagrams unless configured: link-local, as the IPoIB
/// groups are.
pub const DEFAULT_MULTICAST_TTL: u8 = 1;

/// Largest RC message, in bytes (IBTA allows 2^31).
pub const MAX_RC_MSG: usize = 1 << 31;

/// Default [`SoftConfig::reorder_hold_packets`]: 4 MiB of packets at path MTU 4096, taken
/// only while requests arrive out of sequence.
pub const DEFAULT_REORDER_HOLD_PACKETS: usize = 1024;

/// Configuration of a software provider instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftConfig {
    /// The local IP address; the port's GID is derived from it.
    pub local_ip: IpAddr,
    /// UDP source port of everything sent (the bound port). It is covered by the ICRC.
    pub src_port: u16,
    /// UDP destination port of everything sent (4791 on a real network).
    pub dst_port: u16,
    /// Active MTU of the port (the largest path MTU accepted).
    pub port_mtu: PathMtu,
    /// The port's P_Key table, one entry (index 0): the P_Key every packet is sent with, and
    /// what every received BTH must match ([`PKey::matches`]: the same partition, and not both
    /// limited members); a mismatch is dropped and counted (`rx_bad_pkey`).
    pub pkey: PKey,
    /// Verify the ICRC of IPv4 packets: first assuming the sender used IP ID 0 (as any
    /// unconnected DF sender does, this provider among them), and when that fails by solving
    /// for the one ID that explains the received ICRC (later segments of our UDP GSO trains
    /// carry 1..64; rxe picks its own IDs). That accepts a corrupted IPv4 packet with
    /// probability 2^-16 instead of 2^-32 (see [`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)).
    /// Off, IPv4 ICRCs are not checked at all. IPv6 ICRCs are always verified.
    pub verify_icrc_v4: bool,
    /// Most QPs that may exist at once.
    pub max_qps: usize,
    /// Carry multicast UD sends as IP multicast: one datagram to the group the MGID maps to
    /// ([`multicast_group_addr`](super::multicast_group_addr)), besides the unicast copies to the fan-out peers; and, in
    /// [`SoftProvider`](super::provider::SoftProvider), join the groups of the attached MGIDs on the bind
    /// interface. Off, multicast reaches the fan-out peers only.
    pub multicast: bool,
    /// TTL (IPv4) or hop limit (IPv6) of those multicast datagrams: 1 keeps them on the
    /// link.
    pub multicast_ttl: u8,
    /// Most RC requests that arrived ahead of a gap the responders hold at once (all QPs
    /// together) until the gap fills, instead of dropping them and having the requester
    /// resend them; 0 drops them, as rxe does (the daemon's `reorder_hold`). Memory: this
    /// many slots of 4,160 bytes, taken when first needed, or at start by
    /// [`SoftVerbs::commit_reorder_hold`](super::SoftVerbs::commit_reorder_hold). Only a QP
    /// whose path was seen to reorder (a NAK proved spurious) holds; holding makes a blind
    /// sender's guess of a PSN on it up to 1,024 times easier (README, Threat model).
    pub reorder_hold_packets: usize,
    /// Transmit-side fault injection.
    pub faults: FaultConfig,
    /// Deliberate contract violations for tests.
    pub quirks: Quirks,
    /// Picks the order QPNs are handed out in (a permutation of the 24-bit space). Fixed by
    /// [`SoftConfig::new`], so that simulations repeat; a daemon draws one per process
    /// (from [`os_seed`](crate::verbs::setup::os_seed)), so that a restarted process
    /// never receives packets meant for its previous incarnation's QPs.
    pub qpn_seed: u64,
    /// Which of the interface's workers this provider is: every QPN it allocates carries
    /// the worker's index in its low `log2(count)` bits ([`WorkerId::tag`]), so that a
    /// steered socket group ([`UdpTransport::bind_steered`](super::transport::UdpTransport::bind_steered))
    /// delivers its datagrams to it, and with two or more workers the provider hands out the
    /// received datagrams of other workers' QPNs rather than delivering them
    /// ([`SoftProvider::take_foreign`](super::provider::SoftProvider::take_foreign)).
    /// [`WorkerId::SINGLE`] (the default) changes nothing.
    pub workers: WorkerId,
    /// The port's link layer: RoCEv2 (the default), or an InfiniBand port whose LIDs come
    /// from an SM ([`SoftLink::Infiniband`], `soft::ib`).
    pub link: SoftLink,
}

impl SoftConfig {
    /// Defaults for a provider on `local_ip`: port 4791 both ways, MTU 1024, P_Key 0xffff, ICRC
    /// checked, no IP multicast (the daemon turns it on: see its `multicast` setting).
    pub fn new(local_ip: IpAddr) -> Self {
        Self {
            local_ip,
            src_port: ROCEV2_UDP_PORT,
            dst_port: ROCEV2_UDP_PORT,
            port_mtu: PathMtu::Mtu1024,
            pkey: PKey::DEFAULT,
            verify_icrc_v4: true,
            max_qps: 1 << 16,
            multicast: false,
            multicast_ttl: DEFAULT_MULTICAST_TTL,
            reorder_hold_packets: DEFAULT_REORDER_HOLD_PACKETS,
            faults: FaultConfig::default(),
            quirks: Quirks::default(),
            qpn_seed: 0,
            workers: WorkerId::SINGLE,
            link: SoftLink::RoceV2,
        }
    }
}
