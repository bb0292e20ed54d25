//! [`SoftStats`]: the counters of everything the provider did and dropped.

use super::fault::FaultStats;

/// Counters of everything the provider did and dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct SoftStats {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Dropped: not parseable as RoCEv2.
    pub rx_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub rx_bad_icrc: u64,
    /// Dropped: TVer not 0.
    pub rx_bad_tver: u64,
    /// Dropped: P_Key does not match.
    pub rx_bad_pkey: u64,
    /// InfiniBand link: dropped as a P_Key violation (the port's P_Key table holds no
    /// entry that admits the packet's P_Key).
    pub rx_pkey_violations: u64,
    /// InfiniBand link: dropped, addressed to a LID that is not the port's, or to an MLID
    /// no QP is attached with.
    pub rx_wrong_dlid: u64,
    /// InfiniBand link: dropped, the port is not active.
    pub rx_port_down: u64,
    /// InfiniBand link: beacons heard (routes learnt or refreshed).
    pub rx_beacons: u64,
    /// InfiniBand link: sends dropped, the port is not active.
    pub tx_port_down: u64,
    /// InfiniBand link: sends dropped, no route to their DLID (no port beacons it).
    pub tx_no_route: u64,
    /// InfiniBand link: beacons sent.
    pub tx_beacons: u64,
    /// InfiniBand link: beacons not taken, the route table full.
    pub routes_full: u64,
    /// Dropped: no QP with the destination QPN.
    pub rx_unknown_qpn: u64,
    /// Dropped: source address is not the QP's peer.
    pub rx_bad_src: u64,
    /// Dropped: an RC packet from the peer's address but not from the UDP source port its
    /// QP sends from (pinned by the first packet the QP accepted).
    pub rx_bad_src_port: u64,
    /// Dropped: Q_Key mismatch on a UD QP.
    pub rx_bad_qkey: u64,
    /// Dropped: the QP's state or type does not accept the packet.
    pub rx_bad_state: u64,
    /// Dropped: a UD message that did not fit the receive buffer, or found no receive WQE.
    pub rx_ud_dropped: u64,
    /// Dropped: the second copy of a multicast packet, which arrived both as IP multicast and
    /// as a unicast fan-out copy.
    pub rx_mcast_duplicates: u64,
    /// Duplicate requests (re-ACKed and dropped).
    pub rx_duplicate: u64,
    /// Out-of-sequence requests (held until the gap before them fills, or dropped; the gap
    /// NAKed once).
    pub rx_out_of_sequence: u64,
    /// Of those, requests held until the gap before them filled (or the QP stopped
    /// receiving).
    pub rx_held: u64,
    /// Of the held requests, those delivered in sequence when the gap filled.
    pub rx_held_delivered: u64,
    /// Of the held requests, those dropped when the gap filled because they did not follow
    /// what came before them (an opcode out of the message's order, a wrong length): having
    /// come early, they may be made up by a blind sender, so they do not break the
    /// connection as an invalid request in sequence does; the peer's own copy comes again.
    pub rx_held_invalid: u64,
    /// Requests that arrived for a PSN held already with other bytes: both copies dropped,
    /// since one was made up by someone other than the peer.
    pub rx_hold_conflicts: u64,
    /// A gauge, not a counter: requests held now, all QPs together.
    pub rx_held_now: u64,
    /// Out-of-sequence requests not held for want of room (too far ahead, or
    /// [`SoftConfig::reorder_hold_packets`](super::SoftConfig::reorder_hold_packets) held
    /// already): dropped, the gap NAKed at once.
    pub rx_hold_full: u64,
    /// PSN-sequence NAKs shown spurious: the request they named arrived twice, first late
    /// (the path reordered it) and then resent. Each widens the time a gap may stay open
    /// before its NAK.
    pub naks_spurious: u64,
    /// Gaps that filled before their NAK went out, whose requests the requester resent all
    /// the same (its timer ran out first): each halves the time a gap may stay open.
    pub nak_waits_too_long: u64,
    /// A gauge, not a counter: how long a gap may stay open before its NAK, as the last RC
    /// QP to learn it from the path learnt it, in microseconds (0: NAK at once).
    pub nak_wait_us: u64,
    /// IPv4 datagrams whose ICRC is right for an IP ID of 1..64 rather than 0: segments of a
    /// UDP GSO train, which the kernel numbers 0, 1, 2, ... (accepted; see [`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)).
    pub rx_gso_segments: u64,
    /// IPv4 datagrams whose ICRC is right only for an IP ID of 64 or more, solved for from the
    /// ICRC (a sender that picks its own IDs, such as Linux `rdma_rxe`; accepted, with a
    /// 2^-16 false-accept chance per corrupted packet: see
    /// [`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)).
    pub rx_icrc_id_solved: u64,
    /// Datagrams of [`rx_icrc_id_solved`](Self::rx_icrc_id_solved) from a peer that was not
    /// remembered for [`SoftVerbs::take_id_solved_peers`](super::SoftVerbs::take_id_solved_peers)
    /// because 64 others were.
    pub icrc_id_peers_untracked: u64,
    /// ACKs with a PSN outside the outstanding window (ignored).
    pub rx_bad_ack: u64,
    /// Packets sent (all kinds).
    pub tx_packets: u64,
    /// Request packets sent again by go-back-N.
    pub tx_retransmits: u64,
    /// ACKs sent.
    pub tx_acks: u64,
    /// PSN-sequence NAKs sent.
    pub tx_seq_naks: u64,
    /// RNR NAKs sent.
    pub tx_rnr_naks: u64,
    /// Other NAKs sent.
    pub tx_other_naks: u64,
    /// RNR NAKs received.
    pub rx_rnr_naks: u64,
    /// PSN-sequence NAKs received.
    pub rx_seq_naks: u64,
    /// Retransmit timer expiries.
    pub retransmit_timeouts: u64,
    /// Request packets the peer acknowledged (explicitly, or implicitly by a NAK), each PSN
    /// once: what was delivered, against which [`tx_retransmits`](Self::tx_retransmits) reads.
    pub tx_delivered: u64,
    /// PSN-sequence NAKs for a PSN that the go-back-N begun less than an RTT before was
    /// resending already (they answer a packet sent before it): no second go-back-N.
    pub naks_ignored_in_recovery: u64,
    /// Send-window halvings: a retransmit timeout, or a NAK that started a go-back-N.
    pub window_shrinks: u64,
    /// A gauge, not a counter: the smoothed round-trip time the last RC QP to measure one
    /// measured, in microseconds (0 before any).
    pub srtt_us: u64,
    /// QPs destroyed through [`Verbs::retire_qp`] (drained, the caller says).
    ///
    /// [`Verbs::retire_qp`]: crate::verbs::Verbs::retire_qp
    pub qps_retired: u64,
    /// Of those, QPs that were not drained: work of theirs was outstanding (see
    /// [`SoftVerbs::retire_qp`](super::SoftVerbs)). Always 0 for a correct caller.
    pub retired_undrained: u64,
    /// QP moves started to be done later ([`Quirks::moves_later`](super::Quirks::moves_later)).
    pub moves_started: u64,
    /// Of those, moves done early because a verb on their QP came first.
    pub moves_settled: u64,
    /// Completions pushed onto a CQ already at its depth.
    pub cq_overflows: u64,
    /// Datagrams dropped because the device context was lost (until it is opened again).
    pub rx_device_lost: u64,
    /// Injected faults.
    pub faults: FaultStats,
}

impl SoftStats {
    /// The fields that are gauges (a value now), not counters.
    pub const GAUGES: &'static [&'static str] = &["rx_held_now", "srtt_us", "nak_wait_us"];
}
