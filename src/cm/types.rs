//! The CM's vocabulary: communication ids, states, configuration, what the owner passes in and
//! gets out, the counters, and the Linux timing rules the state machine and its MADs share.

use std::time::Duration;

use crate::verbs::{Gid, Lid, Path, PathMtu, Psn, QpNum, Sl};
use crate::wire::cm::CmPath;
use crate::wire::cm::{cm_timeout_ms, RejReason};
use crate::wire::WorkerId;

use super::admission::ReqRateLimit;

#[cfg(doc)]
use super::{Cm, MAX_LIVE_IDS};

/// The upper 32 bits of the transaction IDs this CM starts (REQ, DREQ): Linux's
/// `cm_form_tid` puts the MAD agent's `hi_tid` there.
const TID_HI: u64 = 1;

/// rxe's CA ACK delay exponent (`RXE_LOCAL_CA_ACK_DELAY`), sent as the REP's Target ACK Delay.
pub(super) const CA_ACK_DELAY: u8 = 15;

/// Our local communication id (the Local Communication ID of the MADs we send).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommId(pub u32);

/// IBTA CM states (`enum ib_cm_state`, without the listener and SIDR states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmState {
    /// No connection (an id is never kept in this state: it is freed).
    Idle,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Passive: REQ received, waiting for the owner to accept or reject.
    ReqRcvd,
    /// Passive: MRA sent for the REQ (never entered: this CM sends no MRA).
    MraReqSent,
    /// Active: the peer MRAed our REQ; the REQ's timeout is extended.
    MraReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, waiting for the owner to call [`Cm::rtu`].
    RepRcvd,
    /// Active: MRA sent for the REP (never entered: this CM sends no MRA).
    MraRepSent,
    /// Passive: the peer MRAed our REP; the REP's timeout is extended.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received (transient: the DREP goes out at once and the id enters TimeWait).
    DreqRcvd,
    /// Disconnected; the id (and its peer's comm id and QPN) stay reserved until the
    /// TimeWait timer expires.
    TimeWait,
}

/// Configuration of a [`Cm`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    /// Our port's GID (the Primary Local Port GID of our REQs; a REQ whose Primary Remote
    /// Port GID differs is rejected with [`RejReason::InvalidGid`]).
    pub local_gid: Gid,
    /// Our CA GUID (Local CA GUID of REQ and REP; key of the peers' stale-connection checks).
    pub local_ca_guid: u64,
    /// CM response timeout exponent we advertise (Remote and Local CM Response Timeout of our
    /// REQs). Default 20 (`CMA_CM_RESPONSE_TIMEOUT`, 4096 ms).
    pub cm_response_timeout: u8,
    /// Max CM Retries of our REQs, and how often we resend a REQ or DREQ. Default 15.
    pub max_cm_retries: u8,
    /// Packet life time exponent of the path (`CMA_IBOE_PACKET_LIFETIME`). Default 16.
    pub packet_life_time: u8,
    /// How long an id stays in TimeWait. Default: Linux's `cm_convert_to_ms(av.timeout)` with
    /// `av.timeout = cm_ack_timeout(15, packet_life_time)`, which is 512 ms for the default
    /// packet life time.
    pub timewait: Duration,
    /// XORed into the sequence of local comm ids (Linux XORs a random operand the same way),
    /// so that comm ids differ across restarts. Default 0; the driver should pass a random
    /// value. (Addition to the original API.)
    pub comm_id_seed: u32,
    /// The worker whose connections this CM holds: its index is in the low bits of every
    /// local comm id ([`WorkerId::tag`]), so that a MAD's Remote Communication ID names
    /// the worker it is for ([`mad_owner`](super::mad_owner)). Default
    /// [`WorkerId::SINGLE`] (ids as without workers). (Addition to the original API.)
    pub comm_id_slot: WorkerId,
    /// The token bucket of each source GID's REQs; REQs beyond it are dropped unanswered.
    /// (Addition to the original API.)
    pub req_rate_limit: ReqRateLimit,
    /// The P_Key of our REQs (the path's, full-member bit set as ipoib's). Default `0xffff`.
    pub pkey: u16,
}

impl CmConfig {
    /// The defaults (as rdma_cm uses them) for a port with `local_gid` on CA `local_ca_guid`.
    #[must_use]
    pub fn new(local_gid: Gid, local_ca_guid: u64) -> Self {
        let packet_life_time = 16;
        Self {
            local_gid,
            local_ca_guid,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time,
            timewait: ms(cm_timeout_ms(cm_ack_timeout(
                CA_ACK_DELAY,
                packet_life_time,
            ))),
            comm_id_seed: 0,
            comm_id_slot: WorkerId::SINGLE,
            req_rate_limit: ReqRateLimit::default(),
            pkey: crate::wire::DEFAULT_PKEY,
        }
    }

    /// The REQ (and active-side DREQ) retransmit interval: `2 · conv(packet_life_time) +
    /// conv(cm_response_timeout)` (Linux `ib_send_cm_req`).
    #[must_use]
    pub fn req_timeout(&self) -> Duration {
        ms(2 * cm_timeout_ms(self.packet_life_time) + cm_timeout_ms(self.cm_response_timeout))
    }
}

/// What [`Cm::connect`] needs to send a REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The peer port's GID (its QP1 receives the REQ).
    pub peer: Gid,
    /// The service to connect to.
    pub service_id: u64,
    /// Our RC QP.
    pub local_qpn: QpNum,
    /// The PSN we expect to receive (our QP's `rq_psn`); the peer uses it as its `sq_psn`.
    pub starting_psn: Psn,
    /// Path MTU.
    pub path_mtu: PathMtu,
    /// Transport retry count the peer should use (3 bits).
    pub retry_count: u8,
    /// RNR retry count the peer should use (3 bits).
    pub rnr_retry_count: u8,
    /// Whether our QP receives from an SRQ.
    pub srq: bool,
    /// Primary Local ACK Timeout exponent (5 bits).
    pub local_ack_timeout: u8,
    /// REQ private data, at most 92 bytes (zero-padded).
    pub private_data: Vec<u8>,
    /// The primary path's LIDs, SL, rate, flow label, traffic class and hop limit
    /// (`cm_format_req`: the LIDs only where the hop limit is at most 1, else permissive,
    /// and Subnet Local then set). `None`: [`Path::roce`] to `peer`, what Linux's RoCE REQs
    /// carry. The REQ's GIDs are always `CmConfig::local_gid` and `peer`, its MTU
    /// `path_mtu`.
    pub path: Option<Path>,
}

/// How a MAD reached QP1 on a port with LIDs (the receive completion's fields), for a routed
/// REQ's LIDs (Linux `cm_process_routed_req`). RoCE and the UDP side channel have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadRoute {
    /// The sender's LID (`wc.slid`).
    pub slid: Lid,
    /// The SL the MAD came on (`wc.sl`).
    pub sl: Sl,
    /// The destination LID's path bits (`wc.dlid_path_bits`).
    pub dlid_path_bits: u8,
    /// The MAD had a GRH (`IBV_WC_GRH`): the answer and the connection need one.
    pub grh: bool,
}

/// The passive side's primary path from a REQ (Linux `cm_format_paths_from_req`): the REQ's
/// local port is our destination. On a port with LIDs (`route`), a REQ that is not Subnet
/// Local has its permissive LIDs replaced from the MAD's completion (`cm_process_routed_req`:
/// DLID and SL from `slid`/`sl`, SLID from the path bits) and the path is global exactly
/// when the MAD had a GRH (the kernel takes the hop limit from the response's address
/// vector: 0xFF with a GRH, 0 without). On RoCE (`route` `None`) there are no LIDs and the
/// hop limit is [`Path::ROCE_HOP_LIMIT`], as this CM's passive side always used.
pub fn passive_path(p: &CmPath, path_mtu: PathMtu, route: Option<MadRoute>) -> Path {
    let mut dlid = Lid(p.local_lid);
    let mut slid = Lid(p.remote_lid);
    let mut sl = Sl::from_bits(p.sl);
    let hop_limit = match route {
        Some(r) => {
            if !p.subnet_local {
                if dlid == Lid::PERMISSIVE {
                    dlid = r.slid;
                    sl = r.sl;
                }
                if slid == Lid::PERMISSIVE {
                    slid = Lid(u16::from(r.dlid_path_bits));
                }
            }
            if r.grh {
                0xFF
            } else {
                0
            }
        }
        None => {
            // A RoCE port has no LIDs: the REQ's (permissive) ones name nothing.
            dlid = Lid::NONE;
            slid = Lid::NONE;
            Path::ROCE_HOP_LIMIT
        }
    };
    Path {
        dgid: p.local_gid,
        sgid: p.remote_gid,
        dlid,
        slid,
        sl,
        mtu: path_mtu,
        rate: crate::verbs::Rate(p.packet_rate),
        flow_label: p.flow_label,
        hop_limit,
        traffic_class: p.traffic_class,
        packet_life_time: p.local_ack_timeout.saturating_sub(1),
    }
}

/// What [`Cm::accept`] needs to send a REP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our RC QP.
    pub local_qpn: QpNum,
    /// The PSN we expect to receive (our QP's `rq_psn`); the peer uses it as its `sq_psn`.
    pub starting_psn: Psn,
    /// Whether our QP receives from an SRQ.
    pub srq: bool,
    /// RNR retry count the peer should use (3 bits).
    pub rnr_retry_count: u8,
    /// REP private data, at most 196 bytes (zero-padded).
    pub private_data: Vec<u8>,
}

/// What the owner of a [`Cm`] must learn about (from [`Cm::poll_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive side: a REQ for a listened service. Owner creates a QP, brings it to RTR with
    /// the peer's QPN and `remote_psn` as its sq_psn later, then calls `accept` (or `reject`).
    ReqReceived {
        /// The new passive id.
        id: CommId,
        /// The GID the REQ came from.
        peer: Gid,
        /// The sender's CA GUID (the REQ's Local CA GUID): which incarnation of the node at
        /// `peer` this is, where a node draws its CA GUID per start.
        remote_ca_guid: u64,
        /// The REQ's service ID.
        service_id: u64,
        /// The peer's QP.
        remote_qpn: QpNum,
        /// The PSN the peer expects to receive: our `sq_psn`.
        remote_psn: Psn,
        /// Path MTU.
        path_mtu: PathMtu,
        /// Our primary path back to the peer, from the REQ ([`passive_path`]): the address
        /// vector of the RX QP's RTR.
        path: Path,
        /// Transport retry count for our QP.
        retry_count: u8,
        /// RNR retry count for our QP.
        rnr_retry_count: u8,
        /// The REQ's private data.
        private_data: [u8; 92],
    },
    /// Active side: REP arrived. Owner moves the QP to RTR (rq_psn = own starting psn) and RTS
    /// (sq_psn = `remote_psn`), then calls `rtu(id)`.
    RepReceived {
        /// Our active id.
        id: CommId,
        /// The peer's CA GUID (the REP's Local CA GUID).
        remote_ca_guid: u64,
        /// The peer's QP.
        remote_qpn: QpNum,
        /// The PSN the peer expects to receive: our `sq_psn`.
        remote_psn: Psn,
        /// RNR retry count for our QP.
        rnr_retry_count: u8,
        /// The REP's private data.
        private_data: [u8; 196],
    },
    /// Connection usable (active: after `rtu`; passive: RTU received or `notify_comm_est`).
    Established {
        /// The id.
        id: CommId,
    },
    /// Peer rejected (any state). Owner destroys its QP. The id is then either freed at once
    /// ([`Cm::state`] is `None`) or in TimeWait (a [`CmEvent::TimeWaitExit`] follows).
    Rejected {
        /// The id.
        id: CommId,
        /// The REJ's reason.
        reason: RejReason,
        /// With [`RejReason::InvalidMtu`], the largest path MTU the peer accepts, where its
        /// ARI named one ([`Rej::acceptable_mtu`](crate::wire::cm::Rej::acceptable_mtu)).
        acceptable_mtu: Option<PathMtu>,
    },
    /// No answer after all retries (REQ or REP): a clear reason for the owner. `state` is the
    /// state that timed out. A REQ timeout frees the id; a REP timeout sends REJ (Timeout)
    /// and enters TimeWait.
    TimedOut {
        /// The id.
        id: CommId,
        /// ReqSent, MraReqRcvd, RepSent or MraRepRcvd.
        state: CmState,
    },
    /// Peer sent DREQ (the CM already answered DREP and is in TimeWait). Owner moves the QP to
    /// ERR.
    DisconnectReceived {
        /// The id.
        id: CommId,
    },
    /// Our DREQ was answered (by DREP, or by a crossing DREQ) or timed out; in TimeWait.
    Disconnected {
        /// The id.
        id: CommId,
    },
    /// TimeWait over; the id is free. Owner may destroy the QP now if not already.
    TimeWaitExit {
        /// The id.
        id: CommId,
    },
}

/// Misuse of the [`Cm`] API by its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmUseError {
    /// No live id with that number.
    #[error("no such communication id")]
    NoSuchId,
    /// The id is in a state that does not allow the call.
    #[error("communication id is in state {0:?}")]
    WrongState(CmState),
    /// Private data longer than the message carries (92 bytes in a REQ, 196 in a REP).
    #[error("private data too long")]
    PrivateDataTooLong,
    /// [`MAX_LIVE_IDS`] ids are live. (Addition to the original API.)
    #[error("too many live communication ids")]
    NoResources,
}

/// Counters of a [`Cm`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CmStats {
    /// MADs queued for sending (retransmits included).
    pub mads_sent: u64,
    /// MADs given to [`Cm::handle_mad`].
    pub mads_received: u64,
    /// REQ, REP and DREQ retransmissions after a timeout.
    pub retransmits: u64,
    /// MRAs that extended the wait for a REP (of our REQ) or an RTU (of our REP).
    pub mra_received: u64,
    /// MADs that did not parse as a CM MAD we decode.
    pub dropped_malformed: u64,
    /// MADs naming no live id of ours.
    pub dropped_unknown: u64,
    /// MADs naming one of our ids from the wrong GID, or with the wrong peer comm id or QPN.
    pub dropped_spoofed: u64,
    /// MADs for a live id in a state that has no use for them (not duplicates).
    pub dropped_unexpected: u64,
    /// Duplicates: a retransmitted REQ/REP/DREQ/DREP/RTU (some are answered again).
    pub duplicates: u64,
    /// REJs sent.
    pub rej_sent: u64,
    /// REJs received (parsed).
    pub rej_received: u64,
    /// REQs rejected as stale: a duplicate of an id in TimeWait, or naming a (CA GUID, QPN)
    /// that a connection here still uses (which then gets a DREQ if established).
    pub stale_rejected: u64,
    /// REQs dropped unanswered because their source GID exceeded
    /// [`CmConfig::req_rate_limit`].
    pub req_rate_limited: u64,
    /// Source GIDs forgotten by the REQ rate limiter to make room for a new one
    /// ([`admission::MAX_REQ_SOURCES`](super::admission::MAX_REQ_SOURCES)).
    pub req_sources_evicted: u64,
    /// Passive ids whose REQ asked for more REP retries, or a shorter or longer REP timeout,
    /// than [`admission`](super::admission) allows (the id uses the clamped values).
    pub req_retx_clamped: u64,
    /// REQs rejected and connects refused because [`MAX_LIVE_IDS`] ids were live.
    pub ids_exhausted: u64,
    /// DREQs for unknown ids, answered with a DREP anyway.
    pub unknown_dreq_answered: u64,
    /// REQ, REP and DREQ retries exhausted.
    pub timeouts: u64,
    /// MADs dropped because the transmit queue was full.
    pub tx_queue_overflow: u64,
}

/// `n` milliseconds.
pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The transaction ID of a REQ or DREQ we start (Linux `cm_form_tid`).
pub(super) fn own_tid(id: CommId) -> u64 {
    TID_HI << 32 | u64::from(id.0)
}

/// Linux `cm_ack_timeout`: the ACK timeout exponent from the CA ACK delay and the packet
/// life time.
pub(super) fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let mut t = packet_life_time.saturating_add(1);
    if t >= ca_ack_delay {
        t = t.saturating_add(u8::from(ca_ack_delay >= t - 1));
    } else {
        t = ca_ack_delay.saturating_add(u8::from(t >= ca_ack_delay - 1));
    }
    t.min(31)
}
