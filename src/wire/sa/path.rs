//! PathRecord (IBTA 15.2.5.16, table 182): 64 bytes.
//!
//! | Off | Bits | Field |
//! |---|---|---|
//! | 0 | 64 | ServiceID |
//! | 8 | 128 | DGID |
//! | 24 | 128 | SGID |
//! | 40 | 16 | DLID |
//! | 42 | 16 | SLID |
//! | 44 | 1 / 3 / 20 / 8 | RawTraffic, reserved, FlowLabel, HopLimit |
//! | 48 | 8 | TClass |
//! | 49 | 1 / 7 | Reversible, NumbPath |
//! | 50 | 16 | P_Key |
//! | 52 | 12 / 4 | QoSClass, SL |
//! | 54 | 2 / 6 | MTUSelector, MTU |
//! | 55 | 2 / 6 | RateSelector, Rate |
//! | 56 | 2 / 6 | PacketLifeTimeSelector, PacketLifeTime |
//! | 57 | 8 | Preference |
//! | 58 | 48 | reserved |

use crate::wire::field::Bytes;
use crate::wire::sa::Selected;
use crate::wire::{Gid, PathMtu};

/// The component-mask bits of a PathRecord query (`IB_SA_PATH_REC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRecordMask;

impl PathRecordMask {
    /// ServiceID (two bits: the field spans two 32-bit words).
    pub const SERVICE_ID: u64 = 0b11;
    /// DGID.
    pub const DGID: u64 = 1 << 2;
    /// SGID.
    pub const SGID: u64 = 1 << 3;
    /// DLID.
    pub const DLID: u64 = 1 << 4;
    /// SLID.
    pub const SLID: u64 = 1 << 5;
    /// RawTraffic.
    pub const RAW_TRAFFIC: u64 = 1 << 6;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 8;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 9;
    /// TClass.
    pub const TCLASS: u64 = 1 << 10;
    /// Reversible.
    pub const REVERSIBLE: u64 = 1 << 11;
    /// NumbPath.
    pub const NUMB_PATH: u64 = 1 << 12;
    /// P_Key.
    pub const PKEY: u64 = 1 << 13;
    /// QoSClass.
    pub const QOS_CLASS: u64 = 1 << 14;
    /// SL.
    pub const SL: u64 = 1 << 15;
    /// MTUSelector.
    pub const MTU_SELECTOR: u64 = 1 << 16;
    /// MTU.
    pub const MTU: u64 = 1 << 17;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 18;
    /// Rate.
    pub const RATE: u64 = 1 << 19;
    /// PacketLifeTimeSelector.
    pub const PACKET_LIFE_TIME_SELECTOR: u64 = 1 << 20;
    /// PacketLifeTime.
    pub const PACKET_LIFE_TIME: u64 = 1 << 21;
    /// Preference.
    pub const PREFERENCE: u64 = 1 << 22;

    /// What kernel ipoib's `path_rec_start` names: DGID, SGID, NumbPath, TClass and P_Key
    /// (with NumbPath 1 and Reversible set, so a SubnAdmGet draws exactly one record).
    pub const IPOIB_QUERY: u64 =
        Self::DGID | Self::SGID | Self::NUMB_PATH | Self::TCLASS | Self::PKEY | Self::REVERSIBLE;
}

/// One PathRecord. Narrow fields keep their IB codes (MTU enum, rate enum, lifetime
/// exponent); see [`PathRecord::mtu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecord {
    /// ServiceID.
    pub service_id: u64,
    /// Destination GID.
    pub dgid: Gid,
    /// Source GID.
    pub sgid: Gid,
    /// Destination LID.
    pub dlid: u16,
    /// Source LID.
    pub slid: u16,
    /// RawTraffic (1 bit).
    pub raw_traffic: bool,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub tclass: u8,
    /// Reversible (1 bit).
    pub reversible: bool,
    /// NumbPath (7 bits): in a query, the most records wanted.
    pub numb_path: u8,
    /// P_Key.
    pub pkey: u16,
    /// QoS class (12 bits).
    pub qos_class: u16,
    /// Service level (4 bits).
    pub sl: u8,
    /// MTU selector and MTU enum.
    pub mtu: Selected,
    /// Rate selector and rate enum.
    pub rate: Selected,
    /// Packet lifetime selector and exponent.
    pub packet_life_time: Selected,
    /// Preference.
    pub preference: u8,
}

impl Default for Selected {
    fn default() -> Self {
        Self::new(super::Selector::GreaterThan, 0)
    }
}

impl PathRecord {
    /// Size of the record.
    pub const LEN: usize = 64;

    /// Decodes 64 bytes; reserved bits are ignored.
    #[must_use]
    pub fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let w44 = b.be32::<44>();
        let [b49] = b.bytes::<49, 1>();
        let w52 = b.be16::<52>();
        Self {
            service_id: b.be64::<0>(),
            dgid: Gid(b.bytes::<8, 16>()),
            sgid: Gid(b.bytes::<24, 16>()),
            dlid: b.be16::<40>(),
            slid: b.be16::<42>(),
            raw_traffic: w44 >> 31 != 0,
            flow_label: (w44 >> 8) & 0xF_FFFF,
            hop_limit: (w44 & 0xFF) as u8,
            tclass: b.bytes::<48, 1>()[0],
            reversible: b49 & 0x80 != 0,
            numb_path: b49 & 0x7F,
            pkey: b.be16::<50>(),
            qos_class: w52 >> 4,
            sl: (w52 & 0xF) as u8,
            mtu: Selected::from_byte(b.bytes::<54, 1>()[0]),
            rate: Selected::from_byte(b.bytes::<55, 1>()[0]),
            packet_life_time: Selected::from_byte(b.bytes::<56, 1>()[0]),
            preference: b.bytes::<57, 1>()[0],
        }
    }

    /// Encodes 64 bytes, each field masked to its width, reserved bits zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b.put_be64::<0>(self.service_id);
        b.put_bytes::<8, 16>(self.dgid.0);
        b.put_bytes::<24, 16>(self.sgid.0);
        b.put_be16::<40>(self.dlid);
        b.put_be16::<42>(self.slid);
        b.put_be32::<44>(
            (u32::from(self.raw_traffic) << 31)
                | ((self.flow_label & 0xF_FFFF) << 8)
                | u32::from(self.hop_limit),
        );
        b.put_bytes::<48, 1>([self.tclass]);
        b.put_bytes::<49, 1>([(u8::from(self.reversible) << 7) | (self.numb_path & 0x7F)]);
        b.put_be16::<50>(self.pkey);
        b.put_be16::<52>(((self.qos_class & 0xFFF) << 4) | u16::from(self.sl & 0xF));
        b.put_bytes::<54, 1>([self.mtu.to_byte()]);
        b.put_bytes::<55, 1>([self.rate.to_byte()]);
        b.put_bytes::<56, 1>([self.packet_life_time.to_byte()]);
        b.put_bytes::<57, 1>([self.preference]);
        b
    }

    /// The query kernel ipoib sends for the path from `sgid` to `dgid` in partition `pkey`
    /// (component mask [`PathRecordMask::IPOIB_QUERY`]).
    #[must_use]
    pub fn ipoib_query(sgid: Gid, dgid: Gid, pkey: u16) -> Self {
        Self {
            sgid,
            dgid,
            pkey,
            reversible: true,
            numb_path: 1,
            ..Self::default()
        }
    }

    /// The path MTU, if the MTU code is one of the five IB MTUs.
    #[must_use]
    pub const fn mtu(&self) -> Option<PathMtu> {
        PathMtu::from_enum(self.mtu.value)
    }
}
