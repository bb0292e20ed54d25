//! ConnectReply (REP, attribute 0x0013; IBTA table 110).
//!
//! | Rel | Abs | Bits | Field |
//! |---|---|---|---|
//! | 0 | 24 | 32 | Local Communication ID |
//! | 4 | 28 | 32 | Remote Communication ID |
//! | 8 | 32 | 32 | Local Q_Key |
//! | 12 | 36 | 24 + 8 | Local QPN, Vendor ID bits 23:16 |
//! | 16 | 40 | 24 + 8 | Local EECN, Vendor ID bits 15:8 |
//! | 20 | 44 | 24 + 8 | Starting PSN, Vendor ID bits 7:0 |
//! | 24 | 48 | 8 | Responder Resources |
//! | 25 | 49 | 8 | Initiator Depth |
//! | 26 | 50 | 5,2,1 | Target ACK Delay, Failover Accepted, E2E Flow Control |
//! | 27 | 51 | 3,1,4 | RNR Retry Count, SRQ, reserved |
//! | 28 | 52 | 64 | Local CA GUID |
//! | 36 | 60 | 196 B | private data |

use crate::wire::{Psn, QpNum};

use super::MAD_DATA_LEN;
use crate::wire::field::Bytes;

/// ConnectReply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep {
    /// The passive side's communication ID.
    pub local_comm_id: u32,
    /// The active side's communication ID (from the REQ).
    pub remote_comm_id: u32,
    /// Local Q_Key (0 for RC).
    pub local_qkey: u32,
    /// The passive side's QP.
    pub local_qpn: QpNum,
    /// ECE vendor ID (24 bits, spread over rel 15, 19 and 23; 0 unless ECE is in use).
    pub vendor_id: u32,
    /// Local EE context (24 bits; 0 except for RD).
    pub local_eecn: u32,
    /// The PSN the passive side expects to receive first (Linux semantics); the active side
    /// uses it as its send PSN.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests the passive side will accept at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the passive side will have outstanding.
    pub initiator_depth: u8,
    /// Target ACK delay (5-bit exponent).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count the active side should use (3 bits).
    pub rnr_retry_count: u8,
    /// The passive side's QP uses an SRQ.
    pub srq: bool,
    /// The passive side's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (IPoIB-CM: [`IpoibCmData`](super::IpoibCmData) in the first 8 bytes).
    pub private_data: [u8; Self::PRIVATE_DATA_LEN],
}

impl Default for Rep {
    /// All fields zero.
    fn default() -> Self {
        Self {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: QpNum::new(0),
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: Psn::new(0),
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            e2e_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; Self::PRIVATE_DATA_LEN],
        }
    }
}

impl Rep {
    /// Bytes of private data in a REP.
    pub const PRIVATE_DATA_LEN: usize = 196;

    /// Decodes a REP from the 232 bytes after the MAD header.
    #[must_use]
    pub fn from_bytes(d: &[u8; MAD_DATA_LEN]) -> Self {
        let (b26, b27) = (d[26], d[27]);
        Self {
            local_comm_id: d.be32::<0>(),
            remote_comm_id: d.be32::<4>(),
            local_qkey: d.be32::<8>(),
            local_qpn: QpNum::new(d.be24::<12>()),
            vendor_id: u32::from_be_bytes([0, d[15], d[19], d[23]]),
            local_eecn: d.be24::<16>(),
            starting_psn: Psn::new(d.be24::<20>()),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: b26 >> 3,
            failover_accepted: (b26 >> 1) & 3,
            e2e_flow_control: b26 & 1 != 0,
            rnr_retry_count: b27 >> 5,
            srq: b27 & 0x10 != 0,
            local_ca_guid: d.be64::<28>(),
            private_data: d.bytes::<36, { Self::PRIVATE_DATA_LEN }>(),
        }
    }

    /// Encodes the 232 bytes after the MAD header.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        let [_, v_hi, v_mid, v_lo] = self.vendor_id.to_be_bytes();
        d.put_be32::<0>(self.local_comm_id);
        d.put_be32::<4>(self.remote_comm_id);
        d.put_be32::<8>(self.local_qkey);
        d.put_be24::<12>(self.local_qpn.get());
        d[15] = v_hi;
        d.put_be24::<16>(self.local_eecn);
        d[19] = v_mid;
        d.put_be24::<20>(self.starting_psn.get());
        d[23] = v_lo;
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        d[26] = (self.target_ack_delay & 0x1F) << 3
            | (self.failover_accepted & 3) << 1
            | u8::from(self.e2e_flow_control);
        d[27] = (self.rnr_retry_count & 7) << 5 | u8::from(self.srq) << 4;
        d.put_be64::<28>(self.local_ca_guid);
        d.put_bytes::<36, { Self::PRIVATE_DATA_LEN }>(self.private_data);
        d
    }
}
