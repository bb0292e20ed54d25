//! ConnectRequest (REQ, attribute 0x0010; IBTA table 106).
//!
//! | Rel | Abs | Bits | Field |
//! |---|---|---|---|
//! | 0 | 24 | 32 | Local Communication ID |
//! | 4 | 28 | 8 | reserved |
//! | 5 | 29 | 24 | Vendor ID (ECE) |
//! | 8 | 32 | 64 | Service ID |
//! | 16 | 40 | 64 | Local CA GUID |
//! | 24 | 48 | 32 | reserved |
//! | 28 | 52 | 32 | Local Q_Key |
//! | 32 | 56 | 24 + 8 | Local QPN, Responder Resources |
//! | 36 | 60 | 24 + 8 | Local EECN, Initiator Depth |
//! | 40 | 64 | 24 + 5,2,1 | Remote EECN, Remote CM Response Timeout, Transport Service Type, E2E Flow Control |
//! | 44 | 68 | 24 + 5,3 | Starting PSN, Local CM Response Timeout, Retry Count |
//! | 48 | 72 | 16 | P_Key |
//! | 50 | 74 | 4,1,3 | Path MTU, RDC Exists, RNR Retry Count |
//! | 51 | 75 | 4,1,3 | Max CM Retries, SRQ, Extended Transport Type |
//! | 52 | 76 | 44 B | primary path ([`CmPath`]) |
//! | 96 | 120 | 44 B | alternate path; bit 2 of rel 139 is SAP Supported |
//! | 140 | 164 | 92 B | private data |

use crate::wire::{Gid, PathMtu, Psn, QpNum};

use super::MAD_DATA_LEN;
use crate::wire::field::Bytes;

/// One path of a REQ (44 bytes; the primary path at rel 52, the alternate at rel 96).
///
/// | Rel | Bits | Field |
/// |---|---|---|
/// | 0 | 16 | Local Port LID |
/// | 2 | 16 | Remote Port LID |
/// | 4 | 128 | Local Port GID |
/// | 20 | 128 | Remote Port GID |
/// | 36 | 20 + 6 + 6 | Flow Label, reserved, Packet Rate |
/// | 40 | 8 | Traffic Class |
/// | 41 | 8 | Hop Limit |
/// | 42 | 4,1,3 | SL, Subnet Local, reserved |
/// | 43 | 5,3 | Local ACK Timeout, reserved (SAP Supported in the alternate path) |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local port LID; 0xFFFF (permissive) on RoCEv2 when the hop limit is above 1.
    pub local_lid: u16,
    /// Remote port LID; 0xFFFF on RoCEv2 when the hop limit is above 1.
    pub remote_lid: u16,
    /// The sender's GID (on RoCEv2, its IP address; IPv4 as `::ffff:a.b.c.d`).
    pub local_gid: Gid,
    /// The receiver's GID. Linux answers REJ INVALID_GID (12) if it is not one of its own.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate, the IB rate enum (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet Local: Linux sets it when `hop_limit <= 1`.
    pub subnet_local: bool,
    /// Local ACK Timeout exponent (5 bits; 4.096 µs · 2^t).
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Size of a path in a REQ.
    pub const LEN: usize = 44;

    /// Decodes a path from its 44 bytes; reserved bits are ignored.
    #[must_use]
    pub fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let fl = b.be32::<36>();
        Self {
            local_lid: b.be16::<0>(),
            remote_lid: b.be16::<2>(),
            local_gid: Gid(b.bytes::<4, 16>()),
            remote_gid: Gid(b.bytes::<20, 16>()),
            flow_label: fl >> 12,
            packet_rate: (fl & 0x3F) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: b[42] >> 4,
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: b[43] >> 3,
        }
    }

    /// Encodes the path; fields are masked to their widths, reserved bits are zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b.put_be16::<0>(self.local_lid);
        b.put_be16::<2>(self.remote_lid);
        b.put_bytes::<4, 16>(self.local_gid.0);
        b.put_bytes::<20, 16>(self.remote_gid.0);
        let fl = (self.flow_label & 0x000F_FFFF) << 12 | u32::from(self.packet_rate & 0x3F);
        b.put_be32::<36>(fl);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = (self.sl & 0x0F) << 4 | u8::from(self.subnet_local) << 3;
        b[43] = (self.local_ack_timeout & 0x1F) << 3;
        b
    }

    /// True if any field is non-zero. An absent alternate path is all zeros; Linux tests the
    /// alternate local LID or GID (`cm_req_has_alt_path`).
    #[must_use]
    pub fn is_present(&self) -> bool {
        *self != Self::default()
    }
}

/// ConnectRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Req {
    /// The active side's communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits; 0 unless ECE is in use).
    pub vendor_id: u32,
    /// The service to connect to (IPoIB-CM: [`ipoib_service_id`](super::ipoib_service_id)).
    pub service_id: u64,
    /// The active side's CA GUID; with the comm ID it identifies duplicate REQs.
    pub local_ca_guid: u64,
    /// Local Q_Key (0 for RC).
    pub local_qkey: u32,
    /// The active side's QP.
    pub local_qpn: QpNum,
    /// RDMA READ/atomic requests the active side will accept at once (8 bits).
    pub responder_resources: u8,
    /// Local EE context (24 bits; 0 except for RD).
    pub local_eecn: u32,
    /// RDMA READ/atomic requests the active side will have outstanding (8 bits).
    pub initiator_depth: u8,
    /// Remote EE context (24 bits; 0 except for RD).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer (5-bit exponent).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits): [`Req::TRANSPORT_RC`], [`Req::TRANSPORT_UC`],
    /// [`Req::TRANSPORT_RD`] or [`Req::TRANSPORT_EXTENDED`].
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// The PSN the active side expects to receive first (Linux semantics); the passive side
    /// uses it as its send PSN.
    pub starting_psn: Psn,
    /// How long the active side may take to answer (5-bit exponent); the passive side's REP
    /// retransmission timeout.
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, the IB enum). `None` on receive for a value other than 1..=5, and
    /// written as 0 on emit.
    pub path_mtu: Option<PathMtu>,
    /// RDC Exists (RD only).
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// How many times the CM retransmits (4 bits).
    pub max_cm_retries: u8,
    /// The active side's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC) when the service type is extended.
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: CmPath,
    /// The alternate path; all zeros when there is none ([`CmPath::is_present`]).
    pub alternate_path: CmPath,
    /// SAP Supported (bit 2 of rel 139).
    pub sap_supported: bool,
    /// Private data (IPoIB-CM: [`IpoibCmData`](super::IpoibCmData) in the first 8 bytes).
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

impl Default for Req {
    /// All fields zero, `path_mtu` `None`.
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            vendor_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: QpNum::new(0),
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_service_type: 0,
            e2e_flow_control: false,
            starting_psn: Psn::new(0),
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: None,
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary_path: CmPath::default(),
            alternate_path: CmPath::default(),
            sap_supported: false,
            private_data: [0; Self::PRIVATE_DATA_LEN],
        }
    }
}

impl Req {
    /// Bytes of private data in a REQ.
    pub const PRIVATE_DATA_LEN: usize = 92;
    /// Transport service type: reliable connected.
    pub const TRANSPORT_RC: u8 = 0;
    /// Transport service type: unreliable connected.
    pub const TRANSPORT_UC: u8 = 1;
    /// Transport service type: reliable datagram.
    pub const TRANSPORT_RD: u8 = 2;
    /// Transport service type: extended (see `extended_transport_type`).
    pub const TRANSPORT_EXTENDED: u8 = 3;

    /// Decodes a REQ from the 232 bytes after the MAD header.
    #[must_use]
    pub fn from_bytes(d: &[u8; MAD_DATA_LEN]) -> Self {
        let (b43, b47, b50, b51) = (d[43], d[47], d[50], d[51]);
        Self {
            local_comm_id: d.be32::<0>(),
            vendor_id: d.be24::<5>(),
            service_id: d.be64::<8>(),
            local_ca_guid: d.be64::<16>(),
            local_qkey: d.be32::<28>(),
            local_qpn: QpNum::new(d.be24::<32>()),
            responder_resources: d[35],
            local_eecn: d.be24::<36>(),
            initiator_depth: d[39],
            remote_eecn: d.be24::<40>(),
            remote_cm_response_timeout: b43 >> 3,
            transport_service_type: (b43 >> 1) & 3,
            e2e_flow_control: b43 & 1 != 0,
            starting_psn: Psn::new(d.be24::<44>()),
            local_cm_response_timeout: b47 >> 3,
            retry_count: b47 & 7,
            pkey: d.be16::<48>(),
            path_mtu: PathMtu::from_enum(b50 >> 4),
            rdc_exists: b50 & 0x08 != 0,
            rnr_retry_count: b50 & 7,
            max_cm_retries: b51 >> 4,
            srq: b51 & 0x08 != 0,
            extended_transport_type: b51 & 7,
            primary_path: CmPath::from_bytes(&d.bytes::<52, { CmPath::LEN }>()),
            alternate_path: CmPath::from_bytes(&d.bytes::<96, { CmPath::LEN }>()),
            sap_supported: d[139] & 0x04 != 0,
            private_data: d.bytes::<140, { Self::PRIVATE_DATA_LEN }>(),
        }
    }

    /// Encodes the 232 bytes after the MAD header.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        d.put_be32::<0>(self.local_comm_id);
        d.put_be24::<5>(self.vendor_id);
        d.put_be64::<8>(self.service_id);
        d.put_be64::<16>(self.local_ca_guid);
        d.put_be32::<28>(self.local_qkey);
        d.put_be24::<32>(self.local_qpn.get());
        d[35] = self.responder_resources;
        d.put_be24::<36>(self.local_eecn);
        d[39] = self.initiator_depth;
        d.put_be24::<40>(self.remote_eecn);
        d[43] = (self.remote_cm_response_timeout & 0x1F) << 3
            | (self.transport_service_type & 3) << 1
            | u8::from(self.e2e_flow_control);
        d.put_be24::<44>(self.starting_psn.get());
        d[47] = (self.local_cm_response_timeout & 0x1F) << 3 | (self.retry_count & 7);
        d.put_be16::<48>(self.pkey);
        d[50] = self.path_mtu.map_or(0, PathMtu::to_enum) << 4
            | u8::from(self.rdc_exists) << 3
            | (self.rnr_retry_count & 7);
        d[51] = (self.max_cm_retries & 0x0F) << 4
            | u8::from(self.srq) << 3
            | (self.extended_transport_type & 7);
        d.put_bytes::<52, { CmPath::LEN }>(self.primary_path.to_bytes());
        d.put_bytes::<96, { CmPath::LEN }>(self.alternate_path.to_bytes());
        if self.sap_supported {
            d[139] |= 0x04;
        }
        d.put_bytes::<140, { Self::PRIVATE_DATA_LEN }>(self.private_data);
        d
    }
}
