//! Address vectors and paths: where a UD send or an RC QP's packets go (`ibv_ah_attr`), with
//! the IB routing fields (DLID, SL, source path bits, static rate) and an optional GRH.
//!
//! On RoCEv2 (the software provider, rxe) every address vector has a GRH: the destination is
//! an IP address and the LID fields mean nothing. On an InfiniBand link layer a subnet-local
//! unicast address vector has no GRH and is routed by its DLID; a GRH is added for a global
//! path (hop limit above 1) and for multicast.

use super::types::{Gid, PathMtu};
use crate::wire::sa::PathRecord;

/// A 16-bit local identifier. Unicast LIDs are `0x0001..=0xBFFF`, multicast `0xC000..=0xFFFE`;
/// [`Lid::PERMISSIVE`] is `0xFFFF` and [`Lid::NONE`] (0) is reserved (what a RoCE port has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lid(pub u16);

impl Lid {
    /// LID 0: no LID (RoCE ports, unconfigured IB ports).
    pub const NONE: Self = Self(0);
    /// The permissive LID (`IB_LID_PERMISSIVE`): what a routed REQ carries.
    pub const PERMISSIVE: Self = Self(0xFFFF);
    /// The first multicast LID (`IB_MULTICAST_LID_BASE`).
    pub const MULTICAST_BASE: Self = Self(0xC000);

    /// Whether this is a unicast LID (`0x0001..=0xBFFF`).
    pub const fn is_unicast(self) -> bool {
        self.0 != 0 && self.0 < Self::MULTICAST_BASE.0
    }

    /// Whether this is a multicast LID (`0xC000..=0xFFFE`).
    pub const fn is_multicast(self) -> bool {
        self.0 >= Self::MULTICAST_BASE.0 && self.0 != Self::PERMISSIVE.0
    }
}

impl std::fmt::Display for Lid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#06x}", self.0)
    }
}

/// A service level, 0..=15 (4 bits in the LRH and in CM paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Sl(u8);

impl Sl {
    /// SL 0, the default of every fabric without QoS.
    pub const ZERO: Self = Self(0);

    /// `n` as an SL if it is one (0..=15).
    pub const fn new(n: u8) -> Option<Self> {
        if n <= 15 {
            Some(Self(n))
        } else {
            None
        }
    }

    /// The low 4 bits of `n`: how a 4-bit wire field decodes.
    pub const fn from_bits(n: u8) -> Self {
        Self(n & 0x0F)
    }

    /// The SL's value, 0..=15.
    pub const fn get(self) -> u8 {
        self.0
    }
}

/// A static rate, the IB rate code (`enum ibv_rate`: 0 = the port's rate, 2 = 2.5 Gb/s,
/// 3 = 10 Gb/s, ...; 6 bits in CM paths and PathRecords).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rate(pub u8);

impl Rate {
    /// No limit: the port's rate (`IBV_RATE_MAX`).
    pub const PORT: Self = Self(0);
    /// 10 Gb/s (`IB_RATE_10_GBPS`).
    pub const GBPS_10: Self = Self(3);
}

/// The global route header of an address vector (`ibv_global_route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grh {
    /// Destination GID (the peer's IP address on RoCEv2).
    pub dgid: Gid,
    /// The source GID's index in the port's table; `None`: the GID the provider runs on.
    pub sgid_index: Option<u8>,
    /// Flow label (20 bits; higher bits are ignored).
    pub flow_label: u32,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP + ECN).
    pub traffic_class: u8,
}

impl Grh {
    /// A GRH to `dgid` with hop limit 64 and no traffic class or flow label: what every
    /// RoCEv2 address vector of this project used before paths existed.
    pub const fn to_gid(dgid: Gid) -> Self {
        Self {
            dgid,
            sgid_index: None,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
        }
    }
}

/// An address vector (`ibv_ah_attr`): where a UD send goes, or an RC QP's primary path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// Destination LID; [`Lid::NONE`] on RoCE.
    pub dlid: Lid,
    /// Service level.
    pub sl: Sl,
    /// Source path bits (the low LMC bits of the source LID; 0 without LMC).
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: Rate,
    /// The GRH; always present on RoCE (`is_global`).
    pub grh: Option<Grh>,
}

impl AddressVector {
    /// A RoCE address vector to `dgid`: a GRH with hop limit 64, no LID, SL 0, port rate.
    pub const fn to_gid(dgid: Gid) -> Self {
        Self::global(Grh::to_gid(dgid))
    }

    /// An address vector with `grh` and no LID, SL 0, port rate.
    pub const fn global(grh: Grh) -> Self {
        Self {
            dlid: Lid::NONE,
            sl: Sl::ZERO,
            src_path_bits: 0,
            static_rate: Rate::PORT,
            grh: Some(grh),
        }
    }

    /// A subnet-local IB address vector to `dlid` with SL `sl` and no GRH.
    pub const fn to_lid(dlid: Lid, sl: Sl) -> Self {
        Self {
            dlid,
            sl,
            src_path_bits: 0,
            static_rate: Rate::PORT,
            grh: None,
        }
    }

    /// The destination GID, where there is a GRH.
    pub fn dgid(&self) -> Option<Gid> {
        self.grh.map(|g| g.dgid)
    }
}

/// A path to a neighbour: what a PathRecord gives (or, on RoCE, the defaults that reproduce
/// the address vectors and REQs of a RoCE port), as seen from the local port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Path {
    /// The remote port's GID.
    pub dgid: Gid,
    /// The local port's GID.
    pub sgid: Gid,
    /// The remote port's LID.
    pub dlid: Lid,
    /// The local port's LID.
    pub slid: Lid,
    /// Service level.
    pub sl: Sl,
    /// Path MTU.
    pub mtu: PathMtu,
    /// Static rate.
    pub rate: Rate,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit: above 1, the path leaves the subnet (or is RoCE) and needs a GRH.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Packet life time exponent (4.096 µs · 2^n).
    pub packet_life_time: u8,
}

impl Path {
    /// The hop limit of a RoCE path (`HOP_LIMIT` of a routed RoCEv2 connection).
    pub const ROCE_HOP_LIMIT: u8 = 64;

    /// A RoCE path from `sgid` to `dgid` with MTU `mtu`: no LIDs, SL 0, hop limit 64, the
    /// port's rate, packet life time 16 (`CMA_IBOE_PACKET_LIFETIME`). The rate is 0,
    /// `IB_RATE_PORT_CURRENT`, what Linux's rdma_cm puts in a RoCE path
    /// (`cma_resolve_iboe_route`) and so in its REQ. A fixed rate would not be informative
    /// only: the passive side takes it as the static rate of its QP's address vector
    /// (`cm_format_paths_from_req` → `ib_init_ah_attr_from_path`), which a NIC that honours it
    /// enforces on what it sends us.
    pub const fn roce(sgid: Gid, dgid: Gid, mtu: PathMtu) -> Self {
        Self {
            dgid,
            sgid,
            dlid: Lid::NONE,
            slid: Lid::NONE,
            sl: Sl::ZERO,
            mtu,
            rate: Rate::PORT,
            flow_label: 0,
            hop_limit: Self::ROCE_HOP_LIMIT,
            traffic_class: 0,
            packet_life_time: 16,
        }
    }

    /// The path a PathRecord gives (`ib_init_ah_attr_from_path`'s inputs): its GIDs, LIDs, SL,
    /// MTU (1024 where the record's code is none), rate, flow label, hop limit, traffic class
    /// and packet life time.
    pub fn from_record(rec: &PathRecord) -> Self {
        Self {
            dgid: rec.dgid,
            sgid: rec.sgid,
            dlid: Lid(rec.dlid),
            slid: Lid(rec.slid),
            sl: Sl::from_bits(rec.sl),
            mtu: PathMtu::from_enum(rec.mtu.value).unwrap_or(PathMtu::Mtu1024),
            rate: Rate(rec.rate.value),
            flow_label: rec.flow_label & 0x000F_FFFF,
            hop_limit: rec.hop_limit,
            traffic_class: rec.tclass,
            packet_life_time: rec.packet_life_time.value,
        }
    }

    /// Whether the path is global (hop limit above 1: it crosses a router, or it is RoCE),
    /// so that its address vector carries a GRH and its REQ permissive LIDs (Linux
    /// `cm_format_req`: LIDs only when `hop_limit <= 1`).
    pub const fn is_global(&self) -> bool {
        self.hop_limit > 1
    }

    /// The address vector of the path (`ib_init_ah_attr_from_path`): DLID, SL, rate; a GRH
    /// with the path's flow label, hop limit and traffic class when the path is global. On
    /// RoCE ([`Path::roce`]) that is exactly [`AddressVector::to_gid`].
    pub const fn av(&self) -> AddressVector {
        AddressVector {
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: 0,
            static_rate: self.rate,
            grh: if self.is_global() {
                Some(Grh {
                    dgid: self.dgid,
                    sgid_index: None,
                    flow_label: self.flow_label & 0x000F_FFFF,
                    hop_limit: self.hop_limit,
                    traffic_class: self.traffic_class,
                })
            } else {
                None
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lid_and_sl_ranges() {
        assert!(Lid(1).is_unicast() && Lid(0xBFFF).is_unicast());
        assert!(!Lid::NONE.is_unicast() && !Lid(0xC000).is_unicast());
        assert!(Lid(0xC000).is_multicast() && !Lid::PERMISSIVE.is_multicast());
        assert_eq!(Sl::new(15).map(Sl::get), Some(15));
        assert_eq!(Sl::new(16), None);
        assert_eq!(Sl::from_bits(0x1F).get(), 15);
        assert_eq!(Lid(4).to_string(), "0x0004");
    }

    #[test]
    fn a_roce_path_gives_todays_address_vector_and_an_ib_path_a_lid_one() {
        let (a, b) = (Gid::from_ip("10.0.0.1".parse().unwrap()), Gid([0xfe; 16]));
        let roce = Path::roce(a, b, PathMtu::Mtu1024);
        assert!(roce.is_global());
        assert_eq!(roce.av(), AddressVector::to_gid(b));
        let ib = Path {
            dlid: Lid(7),
            slid: Lid(4),
            sl: Sl::new(3).unwrap(),
            hop_limit: 0,
            rate: Rate(7),
            ..roce
        };
        assert!(!ib.is_global());
        let av = ib.av();
        assert_eq!(
            (av.dlid, av.sl.get(), av.static_rate, av.grh),
            (Lid(7), 3, Rate(7), None)
        );
        let routed = Path {
            hop_limit: 4,
            flow_label: 0xFFF_FFFF,
            traffic_class: 0x20,
            ..ib
        };
        let g = routed.av().grh.unwrap();
        assert_eq!(
            (g.dgid, g.hop_limit, g.flow_label, g.traffic_class),
            (b, 4, 0xF_FFFF, 0x20)
        );
        assert_eq!(routed.av().dlid, Lid(7));
    }
}
