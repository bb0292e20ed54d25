//! Subnet Management Packets (IBTA Vol. 1 §14.2): the 256-byte SMP a port's own Subnet
//! Management Agent answers, and the attributes a driver reads from it to learn what the SM
//! made of the port: [`NodeInfo`] (the port GUID), [`PortInfo`] (LID, LMC, the SM's LID and
//! SL, the port state, the active MTU, the ClientReregister bit) and a [`PkeyBlock`] of the
//! P_Key table.
//!
//! A simulated port (ibsim's SMA, reached through `umad2sim`) has no firmware to tell it
//! these: it asks its own SMA with a directed-route Get of hop count 0, as `smpquery -D … 0`
//! does, and a watcher ([`crate::sa::port`]) turns what changes into port events.
//!
//! # Layout of an SMP
//!
//! | Off | Size | Directed route (class 0x81) | LID routed (class 0x01) |
//! |---|---|---|---|
//! | 0 | 4 | base version 1, class, class version 1, method | same |
//! | 4 | 2 | D bit (15) and status (14..0) | status |
//! | 6 | 2 | hop pointer, hop count | class-specific (0) |
//! | 8 | 8 | transaction ID | same |
//! | 16 | 8 | attribute ID, reserved, attribute modifier | same |
//! | 24 | 8 | M_Key | same |
//! | 32 | 4 | DrSLID, DrDLID | reserved |
//! | 36 | 28 | reserved | reserved |
//! | 64 | 64 | SMP data (the attribute) | same |
//! | 128 | 128 | initial and return paths | reserved |
//!
//! Field offsets follow Linux `include/rdma/ib_smi.h` (`struct ib_smp`, `ib_port_info`,
//! `ib_node_info`), which follows IBTA tables 145 (SMP), 146 (NodeInfo), 148 (PortInfo) and
//! 151 (P_KeyTable). Every multi-byte field is big-endian.
//!
//! # Panics
//!
//! Parsing never panics and never allocates.

use crate::wire::field::Bytes;
use crate::wire::PathMtu;

/// Size of an SMP.
pub const SMP_LEN: usize = 256;

/// Size of an SMP's attribute data.
pub const SMP_DATA_LEN: usize = 64;

/// Management class of LID-routed SMPs (`IB_MGMT_CLASS_SUBN_LID_ROUTED`).
pub const SMI_LID_ROUTED: u8 = 0x01;

/// Management class of directed-route SMPs (`IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE`).
pub const SMI_DIRECTED_ROUTE: u8 = 0x81;

/// Class version of every SMP.
pub const SMI_CLASS_VERSION: u8 = 1;

/// `SubnGet`.
pub const METHOD_GET: u8 = 0x01;

/// `SubnGetResp`.
pub const METHOD_GET_RESP: u8 = 0x81;

/// Attribute ID of NodeInfo.
pub const ATTR_NODE_INFO: u16 = 0x0011;

/// Attribute ID of PortInfo.
pub const ATTR_PORT_INFO: u16 = 0x0015;

/// Attribute ID of P_KeyTable.
pub const ATTR_PKEY_TABLE: u16 = 0x0016;

/// The permissive LID: the DrSLID and DrDLID of a directed route that starts and ends at
/// its ends, and the DLID a directed-route SMP is sent to.
pub const PERMISSIVE_LID: u16 = 0xFFFF;

/// P_Keys in one block of the P_Key table.
pub const PKEYS_PER_BLOCK: usize = 32;

/// The direction bit of a directed-route SMP's status word: set in responses.
const DIRECTION: u16 = 0x8000;

/// Why an SMP could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SmpError {
    /// The buffer is shorter than an SMP.
    #[error("truncated SMP")]
    Truncated,
    /// The management class is neither SMP class.
    #[error("management class {0:#04x} is not an SMP")]
    NotSmp(u8),
    /// The base or class version is not 1.
    #[error("unsupported SMP version {0}")]
    BadVersion(u8),
}

/// The fields of an SMP this crate reads or writes; the paths and M_Key stay zero (no
/// M_Key protection, hop count 0 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Smp {
    /// [`SMI_DIRECTED_ROUTE`] or [`SMI_LID_ROUTED`].
    pub mgmt_class: u8,
    /// The method ([`METHOD_GET`], [`METHOD_GET_RESP`], ...).
    pub method: u8,
    /// The status, without a directed route's D bit.
    pub status: u16,
    /// Whether the D bit is set (directed route: a response).
    pub direction_in: bool,
    /// Hop pointer (directed route).
    pub hop_ptr: u8,
    /// Hop count (directed route; 0 is the sender's own port).
    pub hop_cnt: u8,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Attribute modifier (PortInfo: the port, 0 the one asked through; P_KeyTable: the
    /// block).
    pub attr_mod: u32,
    /// The attribute.
    pub data: [u8; SMP_DATA_LEN],
}

impl Smp {
    /// A directed-route `SubnGet` of `attr_id` with `attr_mod` to the sender's own port (hop
    /// count 0, DrSLID and DrDLID permissive): what a port asks its own SMA.
    #[must_use]
    pub const fn get_local(attr_id: u16, attr_mod: u32, transaction_id: u64) -> Self {
        Self {
            mgmt_class: SMI_DIRECTED_ROUTE,
            method: METHOD_GET,
            status: 0,
            direction_in: false,
            hop_ptr: 0,
            hop_cnt: 0,
            transaction_id,
            attr_id,
            attr_mod,
            data: [0; SMP_DATA_LEN],
        }
    }

    /// Decodes an SMP of either class.
    ///
    /// # Errors
    ///
    /// [`SmpError`] for a short buffer, another class or another version.
    pub fn parse(buf: &[u8]) -> Result<Self, SmpError> {
        let b = buf.first_chunk::<SMP_LEN>().ok_or(SmpError::Truncated)?;
        let class = b.bytes::<1, 1>()[0];
        if class != SMI_DIRECTED_ROUTE && class != SMI_LID_ROUTED {
            return Err(SmpError::NotSmp(class));
        }
        let [base, _, version, method] = b.bytes::<0, 4>();
        if base != 1 || version != SMI_CLASS_VERSION {
            return Err(SmpError::BadVersion(if base == 1 { version } else { base }));
        }
        let word = b.be16::<4>();
        let dr = class == SMI_DIRECTED_ROUTE;
        let [hop_ptr, hop_cnt] = if dr { b.bytes::<6, 2>() } else { [0, 0] };
        Ok(Self {
            mgmt_class: class,
            method,
            status: if dr { word & !DIRECTION } else { word },
            direction_in: dr && word & DIRECTION != 0,
            hop_ptr,
            hop_cnt,
            transaction_id: b.be64::<8>(),
            attr_id: b.be16::<16>(),
            attr_mod: b.be32::<20>(),
            data: b.bytes::<64, SMP_DATA_LEN>(),
        })
    }

    /// Encodes the SMP: a directed route's DrSLID and DrDLID permissive, M_Key and paths zero.
    #[must_use]
    pub fn emit(&self) -> [u8; SMP_LEN] {
        let mut b = [0u8; SMP_LEN];
        b.put_bytes::<0, 4>([1, self.mgmt_class, SMI_CLASS_VERSION, self.method]);
        let dr = self.mgmt_class == SMI_DIRECTED_ROUTE;
        let d = if dr && self.direction_in {
            DIRECTION
        } else {
            0
        };
        b.put_be16::<4>(self.status | d);
        if dr {
            b.put_bytes::<6, 2>([self.hop_ptr, self.hop_cnt]);
            b.put_be16::<32>(PERMISSIVE_LID);
            b.put_be16::<34>(PERMISSIVE_LID);
        }
        b.put_be64::<8>(self.transaction_id);
        b.put_be16::<16>(self.attr_id);
        b.put_be32::<20>(self.attr_mod);
        b.put_bytes::<64, SMP_DATA_LEN>(self.data);
        b
    }

    /// Whether this answers a Get (`SubnGetResp`).
    #[must_use]
    pub const fn is_get_resp(&self) -> bool {
        self.method == METHOD_GET_RESP
    }
}

/// The logical port state (PortInfo `PortState`, `enum ibv_port_state`'s values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// 1: the link is down.
    Down,
    /// 2: the link is up, the SM has not configured the port.
    Init,
    /// 3: configured, not yet carrying data.
    Armed,
    /// 4: carrying data.
    Active,
    /// 5: ActiveDefer.
    ActiveDefer,
    /// 0 (no state change) or a value the spec reserves.
    Other(u8),
}

impl PortState {
    /// The state of a 4-bit field.
    #[must_use]
    pub const fn from_bits(v: u8) -> Self {
        match v & 0x0F {
            1 => Self::Down,
            2 => Self::Init,
            3 => Self::Armed,
            4 => Self::Active,
            5 => Self::ActiveDefer,
            n => Self::Other(n),
        }
    }

    /// The 4-bit value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        match self {
            Self::Down => 1,
            Self::Init => 2,
            Self::Armed => 3,
            Self::Active => 4,
            Self::ActiveDefer => 5,
            Self::Other(n) => n & 0x0F,
        }
    }
}

/// What PortInfo says of a port that a driver needs (IBTA table 148).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortInfo {
    /// The subnet prefix: the upper 64 bits of the port's GIDs.
    pub gid_prefix: u64,
    /// The port's base LID.
    pub lid: u16,
    /// The master SM's LID.
    pub sm_lid: u16,
    /// The capability mask.
    pub cap_mask: u32,
    /// The port's number on its node.
    pub local_port: u8,
    /// The logical state.
    pub state: PortState,
    /// The physical state (5: LinkUp).
    pub phys_state: u8,
    /// LID mask control: the port answers `2^lmc` LIDs from `lid`.
    pub lmc: u8,
    /// The MTU the link runs at (NeighborMTU, an IB MTU enum).
    pub neighbor_mtu: u8,
    /// The SL of MADs to the SM.
    pub sm_sl: u8,
    /// The largest MTU the port supports (MTUCap).
    pub mtu_cap: u8,
    /// P_Key violations counted by the port.
    pub pkey_violations: u16,
    /// Q_Key violations counted by the port.
    pub qkey_violations: u16,
    /// The SM asks the port's clients to register again.
    pub client_reregister: bool,
    /// Subnet timeout (4.096 µs × 2^n).
    pub subnet_timeout: u8,
}

impl PortInfo {
    /// Decodes the 64-byte attribute; reserved and unread fields are ignored.
    #[must_use]
    pub fn from_bytes(d: &[u8; SMP_DATA_LEN]) -> Self {
        let [_, _, _, _, state, phys, lmc, _, mtu_sl, _, _, _, _, mtu_cap] = d.bytes::<28, 14>();
        let [_, cr_timeout] = d.bytes::<50, 2>();
        Self {
            gid_prefix: d.be64::<8>(),
            lid: d.be16::<16>(),
            sm_lid: d.be16::<18>(),
            cap_mask: d.be32::<20>(),
            local_port: d.bytes::<28, 1>()[0],
            state: PortState::from_bits(state),
            phys_state: phys >> 4,
            lmc: lmc & 0x07,
            neighbor_mtu: mtu_sl >> 4,
            sm_sl: mtu_sl & 0x0F,
            mtu_cap: mtu_cap & 0x0F,
            pkey_violations: d.be16::<46>(),
            qkey_violations: d.be16::<48>(),
            client_reregister: cr_timeout & 0x80 != 0,
            subnet_timeout: cr_timeout & 0x1F,
        }
    }

    /// Encodes the fields this type holds (what an SMA's answer carries of them); the rest
    /// is zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SMP_DATA_LEN] {
        let mut d = [0u8; SMP_DATA_LEN];
        d.put_be64::<8>(self.gid_prefix);
        d.put_be16::<16>(self.lid);
        d.put_be16::<18>(self.sm_lid);
        d.put_be32::<20>(self.cap_mask);
        d.put_bytes::<28, 1>([self.local_port]);
        d.put_bytes::<32, 3>([
            self.state.bits(),
            (self.phys_state & 0x0F) << 4,
            self.lmc & 0x07,
        ]);
        d.put_bytes::<36, 1>([(self.neighbor_mtu & 0x0F) << 4 | (self.sm_sl & 0x0F)]);
        d.put_bytes::<41, 1>([self.mtu_cap & 0x0F]);
        d.put_be16::<46>(self.pkey_violations);
        d.put_be16::<48>(self.qkey_violations);
        let cr = if self.client_reregister { 0x80 } else { 0 };
        d.put_bytes::<51, 1>([cr | (self.subnet_timeout & 0x1F)]);
        d
    }

    /// The active MTU, where NeighborMTU holds a valid enum.
    #[must_use]
    pub const fn active_mtu(&self) -> Option<PathMtu> {
        PathMtu::from_enum(self.neighbor_mtu)
    }
}

/// What NodeInfo says of a node (IBTA table 146), as far as a port needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeInfo {
    /// 1: channel adapter, 2: switch, 3: router.
    pub node_type: u8,
    /// Physical ports on the node.
    pub num_ports: u8,
    /// The node's GUID.
    pub node_guid: u64,
    /// The GUID of the port the SMP came through (the port's default GID's low half).
    pub port_guid: u64,
    /// Entries in each port's P_Key table (PartitionCap).
    pub partition_cap: u16,
    /// The port the SMP came through.
    pub local_port: u8,
}

impl NodeInfo {
    /// Decodes the 64-byte attribute.
    #[must_use]
    pub fn from_bytes(d: &[u8; SMP_DATA_LEN]) -> Self {
        let [_, _, node_type, num_ports] = d.bytes::<0, 4>();
        Self {
            node_type,
            num_ports,
            node_guid: d.be64::<12>(),
            port_guid: d.be64::<20>(),
            partition_cap: d.be16::<28>(),
            local_port: d.bytes::<36, 1>()[0],
        }
    }

    /// Encodes the fields this type holds (base and class version 1); the rest is zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SMP_DATA_LEN] {
        let mut d = [0u8; SMP_DATA_LEN];
        d.put_bytes::<0, 4>([1, 1, self.node_type, self.num_ports]);
        d.put_be64::<12>(self.node_guid);
        d.put_be64::<20>(self.port_guid);
        d.put_be16::<28>(self.partition_cap);
        d.put_bytes::<36, 1>([self.local_port]);
        d
    }
}

/// One block of 32 entries of a port's P_Key table (IBTA table 151); an entry of 0 (or
/// 0x8000) is unused; bit 15 of an entry is the full-membership bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PkeyBlock(pub [u16; PKEYS_PER_BLOCK]);

impl PkeyBlock {
    /// Decodes the 64-byte attribute.
    #[must_use]
    pub fn from_bytes(d: &[u8; SMP_DATA_LEN]) -> Self {
        let mut keys = [0u16; PKEYS_PER_BLOCK];
        for (k, pair) in keys.iter_mut().zip(d.chunks_exact(2)) {
            *k = u16::from_be_bytes([
                pair.first().copied().unwrap_or(0),
                pair.get(1).copied().unwrap_or(0),
            ]);
        }
        Self(keys)
    }

    /// Encodes the block.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SMP_DATA_LEN] {
        let mut d = [0u8; SMP_DATA_LEN];
        for (pair, k) in d.chunks_exact_mut(2).zip(self.0) {
            pair.copy_from_slice(&k.to_be_bytes());
        }
        d
    }

    /// The entries in use (low 15 bits nonzero), in table order.
    pub fn valid(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().copied().filter(|k| k & 0x7FFF != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// PortInfo of Hca2 on `net.2sw2path4hca` under opensm, as ibsim's SMA answered it
    /// (`smpquery -D portinfo 0`: Lid 4, SMLid 1, CapMask 0x50c048, LocalPort 1, Active,
    /// LinkUp, LMC 0, NeighborMTU 2048, SMSL 0, MtuCap 2048), bytes 0-63.
    const IBSIM_PORTINFO: [u8; 64] = {
        let mut d = [0u8; 64];
        d[8] = 0xfe;
        d[9] = 0x80;
        d[17] = 4;
        d[19] = 1;
        d[21] = 0x50;
        d[22] = 0xc0;
        d[23] = 0x48;
        d[28] = 1;
        d[32] = 0x74; // LinkSpeedSupported 7 | PortState 4 (Active)
        d[33] = 0x52; // PortPhysicalState 5 (LinkUp) | LinkDownDefault 2 (Polling)
        d[34] = 0x00;
        d[36] = 0x40; // NeighborMTU 4 (2048) | MasterSMSL 0
        d[41] = 0x04; // MTUCap 4
        d[51] = 0x12; // no ClientReregister, SubnetTimeOut 18
        d
    };

    #[test]
    fn portinfo_decodes_what_ibsim_answers() {
        let p = PortInfo::from_bytes(&IBSIM_PORTINFO);
        assert_eq!(p.gid_prefix, 0xfe80_0000_0000_0000);
        assert_eq!((p.lid, p.sm_lid, p.sm_sl, p.lmc), (4, 1, 0, 0));
        assert_eq!(p.cap_mask, 0x0050_c048);
        assert_eq!(p.state, PortState::Active);
        assert_eq!(p.phys_state, 5);
        assert_eq!(p.active_mtu(), Some(PathMtu::Mtu2048));
        assert_eq!(p.mtu_cap, 4);
        assert!(!p.client_reregister);
        assert_eq!(p.subnet_timeout, 18);
    }

    #[test]
    fn the_reregister_bit_is_the_top_bit_of_byte_51() {
        let mut d = IBSIM_PORTINFO;
        d[51] |= 0x80;
        assert!(PortInfo::from_bytes(&d).client_reregister);
    }

    #[test]
    fn a_local_get_is_a_directed_route_of_no_hops() {
        let b = Smp::get_local(ATTR_PORT_INFO, 0, 0x1234).emit();
        assert_eq!(&b[0..4], &[1, 0x81, 1, 0x01]);
        assert_eq!(&b[4..8], &[0, 0, 0, 0]);
        assert_eq!(&b[16..18], &[0x00, 0x15]);
        assert_eq!(&b[32..36], &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(u64::from_be_bytes(b[8..16].try_into().unwrap()), 0x1234);
    }

    #[test]
    fn a_response_keeps_its_direction_bit_apart_from_its_status() {
        let mut s = Smp::get_local(ATTR_NODE_INFO, 0, 9);
        s.method = METHOD_GET_RESP;
        s.direction_in = true;
        s.status = 0x001c;
        let b = s.emit();
        assert_eq!(&b[4..6], &[0x80, 0x1c]);
        let back = Smp::parse(&b).unwrap();
        assert_eq!(back, s);
        assert!(back.is_get_resp());
    }

    #[test]
    fn what_is_not_an_smp_is_refused() {
        assert_eq!(Smp::parse(&[0u8; 255]), Err(SmpError::Truncated));
        let mut b = Smp::get_local(ATTR_PORT_INFO, 0, 1).emit();
        b[1] = 0x03;
        assert_eq!(Smp::parse(&b), Err(SmpError::NotSmp(3)));
        b[1] = 0x81;
        b[2] = 2;
        assert_eq!(Smp::parse(&b), Err(SmpError::BadVersion(2)));
    }

    #[test]
    fn pkey_blocks_list_the_entries_in_use() {
        let mut keys = [0u16; 32];
        keys[0] = 0xffff;
        keys[1] = 0x8000;
        keys[2] = 0x0001;
        let b = PkeyBlock(keys);
        assert_eq!(PkeyBlock::from_bytes(&b.to_bytes()), b);
        assert_eq!(b.valid().collect::<Vec<_>>(), vec![0xffff, 0x0001]);
    }

    proptest! {
        #[test]
        fn parsing_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(s) = Smp::parse(&buf) {
                let _ = PortInfo::from_bytes(&s.data);
                let _ = NodeInfo::from_bytes(&s.data);
                let _ = PkeyBlock::from_bytes(&s.data);
            }
        }

        #[test]
        fn portinfo_round_trips(
            gid_prefix: u64, lid: u16, sm_lid: u16, cap_mask: u32, local_port: u8,
            state in 0u8..16, phys in 0u8..16, lmc in 0u8..8, mtu in 0u8..16, sl in 0u8..16,
            mtu_cap in 0u8..16, pv: u16, qv: u16, cr: bool, to in 0u8..32,
        ) {
            let p = PortInfo {
                gid_prefix, lid, sm_lid, cap_mask, local_port,
                state: PortState::from_bits(state), phys_state: phys, lmc, neighbor_mtu: mtu,
                sm_sl: sl, mtu_cap, pkey_violations: pv, qkey_violations: qv,
                client_reregister: cr, subnet_timeout: to,
            };
            prop_assert_eq!(PortInfo::from_bytes(&p.to_bytes()), p);
        }

        #[test]
        fn nodeinfo_and_smps_round_trip(
            t: u8, n: u8, ng: u64, pg: u64, cap: u16, lp: u8, tid: u64, attr: u16, m: u32,
            dr: bool, resp: bool, status in 0u16..0x8000,
        ) {
            let ni = NodeInfo { node_type: t, num_ports: n, node_guid: ng, port_guid: pg,
                partition_cap: cap, local_port: lp };
            prop_assert_eq!(NodeInfo::from_bytes(&ni.to_bytes()), ni);
            let s = Smp {
                mgmt_class: if dr { SMI_DIRECTED_ROUTE } else { SMI_LID_ROUTED },
                method: METHOD_GET_RESP, status, direction_in: dr && resp,
                hop_ptr: 0, hop_cnt: 0, transaction_id: tid, attr_id: attr, attr_mod: m,
                data: ni.to_bytes(),
            };
            prop_assert_eq!(Smp::parse(&s.emit()), Ok(s));
        }
    }
}
