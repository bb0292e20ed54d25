//! MCMemberRecord (IBTA 15.2.5.17, table 187): 52 bytes, sent in a 56-byte slot
//! (AttributeOffset 7).
//!
//! | Off | Bits | Field |
//! |---|---|---|
//! | 0 | 128 | MGID |
//! | 16 | 128 | PortGID |
//! | 32 | 32 | Q_Key |
//! | 36 | 16 | MLID |
//! | 38 | 2 / 6 | MTUSelector, MTU |
//! | 39 | 8 | TClass |
//! | 40 | 16 | P_Key |
//! | 42 | 2 / 6 | RateSelector, Rate |
//! | 43 | 2 / 6 | PacketLifeTimeSelector, PacketLifeTime |
//! | 44 | 4 / 20 / 8 | SL, FlowLabel, HopLimit |
//! | 48 | 4 / 4 | Scope, JoinState |
//! | 49 | 1 / 23 | ProxyJoin, reserved |

use crate::wire::field::Bytes;
use crate::wire::sa::Selected;
use crate::wire::{Gid, PathMtu};

/// The component-mask bits of an MCMemberRecord (`IB_SA_MCMEMBER_REC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McMemberRecordMask;

impl McMemberRecordMask {
    /// MGID.
    pub const MGID: u64 = 1 << 0;
    /// PortGID.
    pub const PORT_GID: u64 = 1 << 1;
    /// Q_Key.
    pub const QKEY: u64 = 1 << 2;
    /// MLID.
    pub const MLID: u64 = 1 << 3;
    /// MTUSelector.
    pub const MTU_SELECTOR: u64 = 1 << 4;
    /// MTU.
    pub const MTU: u64 = 1 << 5;
    /// TClass.
    pub const TCLASS: u64 = 1 << 6;
    /// P_Key.
    pub const PKEY: u64 = 1 << 7;
    /// RateSelector.
    pub const RATE_SELECTOR: u64 = 1 << 8;
    /// Rate.
    pub const RATE: u64 = 1 << 9;
    /// PacketLifeTimeSelector.
    pub const PACKET_LIFE_TIME_SELECTOR: u64 = 1 << 10;
    /// PacketLifeTime.
    pub const PACKET_LIFE_TIME: u64 = 1 << 11;
    /// SL.
    pub const SL: u64 = 1 << 12;
    /// FlowLabel.
    pub const FLOW_LABEL: u64 = 1 << 13;
    /// HopLimit.
    pub const HOP_LIMIT: u64 = 1 << 14;
    /// Scope.
    pub const SCOPE: u64 = 1 << 15;
    /// JoinState.
    pub const JOIN_STATE: u64 = 1 << 16;
    /// ProxyJoin.
    pub const PROXY_JOIN: u64 = 1 << 17;

    /// A join that names the group, the port and the partition only: what kernel ipoib sends
    /// for the broadcast group, which the SM must already have created (no create fields).
    pub const JOIN_EXISTING: u64 = Self::MGID | Self::PORT_GID | Self::PKEY | Self::JOIN_STATE;

    /// A join that may create the group: [`Self::JOIN_EXISTING`] plus Q_Key, MTU, TClass,
    /// rate, SL, flow label and hop limit copied from the broadcast group (kernel ipoib's
    /// joins of every other group).
    pub const JOIN_CREATE: u64 = Self::JOIN_EXISTING
        | Self::QKEY
        | Self::MTU_SELECTOR
        | Self::MTU
        | Self::TCLASS
        | Self::RATE_SELECTOR
        | Self::RATE
        | Self::SL
        | Self::FLOW_LABEL
        | Self::HOP_LIMIT;
}

/// The JoinState nibble: which memberships a join adds (or a leave removes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct JoinState(pub u8);

impl JoinState {
    /// Full member: sends and receives.
    pub const FULL_MEMBER: Self = Self(0x1);
    /// Non member.
    pub const NON_MEMBER: Self = Self(0x2);
    /// Send-only non member.
    pub const SEND_ONLY_NON_MEMBER: Self = Self(0x4);
    /// Send-only full member.
    pub const SEND_ONLY_FULL_MEMBER: Self = Self(0x8);
}

/// One MCMemberRecord. Narrow fields keep their IB codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct McMemberRecord {
    /// The group's multicast GID.
    pub mgid: Gid,
    /// The joining port's GID.
    pub port_gid: Gid,
    /// The group's Q_Key.
    pub qkey: u32,
    /// The group's multicast LID.
    pub mlid: u16,
    /// MTU selector and MTU enum.
    pub mtu: Selected,
    /// Traffic class.
    pub tclass: u8,
    /// P_Key.
    pub pkey: u16,
    /// Rate selector and rate enum.
    pub rate: Selected,
    /// Packet lifetime selector and exponent.
    pub packet_life_time: Selected,
    /// Service level (4 bits).
    pub sl: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Scope (4 bits; 2 is link-local).
    pub scope: u8,
    /// JoinState (4 bits).
    pub join_state: JoinState,
    /// ProxyJoin (1 bit): the port joins on another port's behalf.
    pub proxy_join: bool,
}

impl McMemberRecord {
    /// Size of the record.
    pub const LEN: usize = 52;

    /// AttributeOffset of the record in a table, in 8-byte words (56 bytes).
    pub const ATTR_OFFSET: u16 = 7;

    /// Decodes 52 bytes; reserved bits are ignored.
    #[must_use]
    pub fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let w44 = b.be32::<44>();
        let [b48, b49] = b.bytes::<48, 2>();
        Self {
            mgid: Gid(b.bytes::<0, 16>()),
            port_gid: Gid(b.bytes::<16, 16>()),
            qkey: b.be32::<32>(),
            mlid: b.be16::<36>(),
            mtu: Selected::from_byte(b.bytes::<38, 1>()[0]),
            tclass: b.bytes::<39, 1>()[0],
            pkey: b.be16::<40>(),
            rate: Selected::from_byte(b.bytes::<42, 1>()[0]),
            packet_life_time: Selected::from_byte(b.bytes::<43, 1>()[0]),
            sl: (w44 >> 28) as u8,
            flow_label: (w44 >> 8) & 0xF_FFFF,
            hop_limit: (w44 & 0xFF) as u8,
            scope: b48 >> 4,
            join_state: JoinState(b48 & 0xF),
            proxy_join: b49 & 0x80 != 0,
        }
    }

    /// Encodes 52 bytes, each field masked to its width, reserved bits zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b.put_bytes::<0, 16>(self.mgid.0);
        b.put_bytes::<16, 16>(self.port_gid.0);
        b.put_be32::<32>(self.qkey);
        b.put_be16::<36>(self.mlid);
        b.put_bytes::<38, 1>([self.mtu.to_byte()]);
        b.put_bytes::<39, 1>([self.tclass]);
        b.put_be16::<40>(self.pkey);
        b.put_bytes::<42, 1>([self.rate.to_byte()]);
        b.put_bytes::<43, 1>([self.packet_life_time.to_byte()]);
        b.put_be32::<44>(
            (u32::from(self.sl & 0xF) << 28)
                | ((self.flow_label & 0xF_FFFF) << 8)
                | u32::from(self.hop_limit),
        );
        b.put_bytes::<48, 2>([
            ((self.scope & 0xF) << 4) | (self.join_state.0 & 0xF),
            u8::from(self.proxy_join) << 7,
        ]);
        b
    }

    /// The group's MTU, if the MTU code is one of the five IB MTUs.
    #[must_use]
    pub const fn mtu(&self) -> Option<PathMtu> {
        PathMtu::from_enum(self.mtu.value)
    }
}
