//! Connection events: what the endpoint did with a peer, for the driver to log.
//!
//! The endpoint pushes an [`Event`] where a connection opens, fails or closes and where a
//! neighbour resolves or fails; the driver takes them with [`Endpoint::poll_event`] every turn.
//! The queue holds at most [`EVENT_QUEUE_CAP`] events: when it is full the oldest is dropped
//! and counted in [`Counters::events_dropped`](super::Counters::events_dropped), so a driver
//! that never drains it (the simulator) costs a bounded amount of memory.

use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;

use super::Endpoint;
use crate::verbs::{Gid, QpNum};
use crate::wire::ipoib::HwAddr;

/// Most events held; the oldest goes when a new one arrives at the cap.
pub const EVENT_QUEUE_CAP: usize = 256;

/// Who an event is about: the peer's IP address where a neighbour entry names it, its GID,
/// and a QP number (what the [`Event`] variant says it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventPeer {
    /// The peer's IP address, where the neighbour table knows it.
    pub ip: Option<IpAddr>,
    /// The peer's GID.
    pub gid: Gid,
    /// For a connection, our QP of it; for a neighbour, the peer's UD QPN.
    pub qpn: QpNum,
}

/// Why a TX connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxFailure {
    /// The peer rejected the REQ.
    Rejected,
    /// The CM gave up waiting for the peer.
    TimedOut,
    /// The peer disconnected (DREQ).
    Disconnected,
    /// A send completed with an error, or the QP hit an async error.
    SendError,
    /// Sends in flight and none completed for `tx_stall_timeout`.
    Stalled,
    /// The REP could not be used (bad private data, the QP would not connect).
    BadReply,
}

impl TxFailure {
    /// The `reason=` of the log line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::TimedOut => "timeout",
            Self::Disconnected => "disconnected",
            Self::SendError => "send-error",
            Self::Stalled => "stalled",
            Self::BadReply => "bad-reply",
        }
    }
}

/// Why a TX connection was closed by this side (not failed: see [`TxFailure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxCloseReason {
    /// The neighbour entries that used it aged out.
    AgedOut,
    /// The peer restarted: the connection was to its previous incarnation.
    PeerRestarted,
    /// The interface is shutting down.
    Shutdown,
    /// The static neighbour that used it was removed or moved (a reload or a control
    /// request).
    NeighbourChanged,
    /// The peer disconnected it (its DREQ came first, or crossed ours): an orderly close.
    PeerDisconnected,
    /// The path MTU changed (the underlay link's MTU did): the next packet opens a
    /// connection at the new one.
    PathMtuChanged,
    /// The SA gave the peer a path to another LID (the SM moved it): the next packet opens
    /// a connection on the new path.
    PathMoved,
    /// Our port's LID changed (the SM moved it): the next packet opens a connection from
    /// the new one.
    LidChanged,
}

impl TxCloseReason {
    /// The `reason=` of the log line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AgedOut => "aged-out",
            Self::PeerRestarted => "peer-restarted",
            Self::Shutdown => "shutdown",
            Self::NeighbourChanged => "neighbour-changed",
            Self::PeerDisconnected => "peer-disconnected",
            Self::PathMtuChanged => "path-mtu-changed",
            Self::PathMoved => "path-moved",
            Self::LidChanged => "lid-changed",
        }
    }
}

/// Why an RX connection was torn down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxReapReason {
    /// Idle for `rx_timeout`.
    Stale,
    /// The peer disconnected or rejected, or the CM gave up.
    Remote,
    /// Evicted to admit a new connection under the QP budget.
    Evicted,
    /// The interface is shutting down.
    Shutdown,
    /// The QP hit an error.
    Error,
    /// The peer restarted: this connection was its previous incarnation's.
    Restarted,
    /// Established beyond `max_conn_qp` under the reject policy.
    OverBudget,
    /// Half-open (REP sent, no RTU), and the oldest when a REQ found `max_pending_rx` of them.
    HalfOpenEvicted,
    /// Half-open until the CM gave up resending the REP.
    HalfOpenTimeout,
    /// The path MTU changed (the underlay link's MTU did): the peer connects again, at an
    /// MTU both ends carry.
    PathMtuChanged,
}

impl RxReapReason {
    /// The `reason=` of the log line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stale => "stale",
            Self::Remote => "peer-disconnected",
            Self::Evicted => "evicted",
            Self::Shutdown => "shutdown",
            Self::Restarted => "peer-restarted",
            Self::OverBudget => "over-budget",
            Self::HalfOpenEvicted => "half-open-evicted",
            Self::HalfOpenTimeout => "half-open-timeout",
            Self::Error => "qp-error",
            Self::PathMtuChanged => "path-mtu-changed",
        }
    }
}

/// Why a REQ was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxRejectReason {
    /// `max_conn_qp` RX connections are live and the policy is `reject`.
    QpBudget,
    /// The receive QP could not be built.
    NoResources,
    /// The interface is shutting down.
    ShuttingDown,
    /// A REQ at the rdma_cm service without a `cma_hdr` rdma_cm would take.
    BadCmaHdr,
    /// The REQ's path MTU is above ours (REJ 26 names ours, and the peer asks again at it).
    PathMtu,
}

impl RxRejectReason {
    /// The `reason=` of the log line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::QpBudget => "qp-budget",
            Self::NoResources => "no-resources",
            Self::ShuttingDown => "shutting-down",
            Self::BadCmaHdr => "bad-cma-hdr",
            Self::PathMtu => "path-mtu",
        }
    }
}

/// A connection or neighbour event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A TX connection is established (`qpn`: ours); `mtu` is its largest IP packet.
    TxEstablished {
        /// The peer.
        peer: EventPeer,
        /// Largest IP packet on it.
        mtu: u32,
    },
    /// A TX connection failed (`qpn`: ours).
    TxFailed {
        /// The peer.
        peer: EventPeer,
        /// Why.
        reason: TxFailure,
    },
    /// The peer refused a TX connection's REQ for its path MTU (REJ 26) and named a smaller
    /// one it accepts: the REQ goes again at `path_mtu` from the same QP (`qpn`: ours).
    TxMtuLowered {
        /// The peer.
        peer: EventPeer,
        /// The path MTU in bytes the REQ goes again at.
        path_mtu: u32,
    },
    /// A TX connection is being closed by this side (`qpn`: ours).
    TxClosed {
        /// The peer.
        peer: EventPeer,
        /// Why.
        reason: TxCloseReason,
    },
    /// A REQ was accepted: a new RX connection (`qpn`: ours).
    RxAccepted {
        /// The peer.
        peer: EventPeer,
    },
    /// A REQ was rejected (`qpn`: the peer's QP of the REQ).
    RxRejected {
        /// The peer.
        peer: EventPeer,
        /// Why.
        reason: RxRejectReason,
    },
    /// An RX connection is being torn down (`qpn`: ours).
    RxReaped {
        /// The peer.
        peer: EventPeer,
        /// Why.
        reason: RxReapReason,
    },
    /// A neighbour's address was resolved (`qpn`: its UD QPN).
    NeighResolved {
        /// The neighbour.
        peer: EventPeer,
    },
    /// A neighbour's resolution got no answer; `dropped` packets waited for it.
    NeighFailed {
        /// The address that was being resolved.
        ip: IpAddr,
        /// Packets dropped with it.
        dropped: u64,
    },
    /// A peer came back with another UD QPN (`qpn`: the new one); `old_qpn` was its UD QPN.
    PeerRestarted {
        /// The peer, as it is now.
        peer: EventPeer,
        /// Its UD QPN before, where one of its old connections knew it.
        old_qpn: Option<QpNum>,
    },
}

impl Event {
    /// What happened, the message of the log line (`tx connected`, `rx reaped`, ...).
    pub const fn what(&self) -> &'static str {
        match self {
            Self::TxEstablished { .. } => "tx connected",
            Self::TxFailed {
                reason: TxFailure::Stalled,
                ..
            } => "tx stalled",
            Self::TxFailed { .. } => "tx failed",
            Self::TxClosed { .. } => "tx closed",
            Self::TxMtuLowered { .. } => "tx mtu lowered",
            Self::RxAccepted { .. } => "rx accepted",
            Self::RxRejected { .. } => "rx rejected",
            Self::RxReaped {
                reason: RxReapReason::Evicted,
                ..
            } => "rx evicted",
            Self::RxReaped { .. } => "rx reaped",
            Self::NeighResolved { .. } => "neighbour resolved",
            Self::NeighFailed { .. } => "neighbour failed",
            Self::PeerRestarted { .. } => "peer restarted",
        }
    }

    /// The peer, where the event has one (all but [`Event::NeighFailed`]).
    pub const fn peer(&self) -> Option<&EventPeer> {
        match self {
            Self::TxEstablished { peer, .. }
            | Self::TxFailed { peer, .. }
            | Self::TxClosed { peer, .. }
            | Self::TxMtuLowered { peer, .. }
            | Self::RxAccepted { peer }
            | Self::RxRejected { peer, .. }
            | Self::RxReaped { peer, .. }
            | Self::NeighResolved { peer }
            | Self::PeerRestarted { peer, .. } => Some(peer),
            Self::NeighFailed { .. } => None,
        }
    }

    /// The `reason=` of the log line, where the event has one.
    pub const fn reason(&self) -> Option<&'static str> {
        match self {
            Self::TxFailed { reason, .. } => Some(reason.as_str()),
            Self::TxClosed { reason, .. } => Some(reason.as_str()),
            Self::RxRejected { reason, .. } => Some(reason.as_str()),
            Self::RxReaped { reason, .. } => Some(reason.as_str()),
            _ => None,
        }
    }
}

impl fmt::Display for Event {
    /// The log line: `what` then `key=value` pairs, e.g.
    /// `tx connected peer=198.19.0.2 gid=::ffff:198.18.0.2 qpn=0x000013 mtu=65516`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what())?;
        if let Some(p) = self.peer() {
            match p.ip {
                Some(ip) => write!(f, " peer={ip}")?,
                None => f.write_str(" peer=-")?,
            }
            write!(f, " gid={} qpn={}", p.gid, p.qpn)?;
        }
        match self {
            Self::TxEstablished { mtu, .. } => write!(f, " mtu={mtu}")?,
            Self::TxMtuLowered { path_mtu, .. } => write!(f, " path_mtu={path_mtu}")?,
            Self::NeighFailed { ip, dropped } => write!(f, " peer={ip} dropped={dropped}")?,
            Self::PeerRestarted {
                old_qpn: Some(old_qpn),
                ..
            } => write!(f, " old_qpn={old_qpn}")?,
            _ => {}
        }
        if let Some(r) = self.reason() {
            write!(f, " reason={r}")?;
        }
        Ok(())
    }
}

/// The bounded queue of events.
#[derive(Debug, Default)]
pub(super) struct EventQueue {
    q: VecDeque<Event>,
}

impl EventQueue {
    /// Queues `e`; at [`EVENT_QUEUE_CAP`] the oldest is dropped first. Returns whether one was.
    pub(super) fn push(&mut self, e: Event) -> bool {
        let dropped = self.q.len() >= EVENT_QUEUE_CAP;
        if dropped {
            self.q.pop_front();
        }
        self.q.push_back(e);
        dropped
    }

    fn pop(&mut self) -> Option<Event> {
        self.q.pop_front()
    }
}

impl Endpoint {
    /// The oldest connection event not yet taken. Call it every turn until `None` (or up to
    /// [`EVENT_QUEUE_CAP`]): events left behind are dropped, oldest first, once the queue is
    /// full.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop()
    }

    /// Queues an event, counting one dropped at the cap.
    pub(super) fn push_event(&mut self, e: Event) {
        if self.events.push(e) {
            self.counters.events_dropped += 1;
        }
    }

    /// The peer at `gid` with QP number `qpn`, its IP address from the neighbour table (a
    /// learned entry through the per-GID index, else the static entries).
    pub(super) fn event_peer(&self, gid: Gid, qpn: QpNum) -> EventPeer {
        let ip = self.neigh.learned_ip_at(&gid).or_else(|| {
            self.cfg
                .static_neighbours
                .iter()
                .find(|(_, hw)| hw.gid == gid)
                .map(|(ip, _)| *ip)
        });
        EventPeer { ip, gid, qpn }
    }

    /// The neighbour at `hw` (its UD QPN as the QP number).
    pub(super) fn neigh_peer(&self, ip: IpAddr, hw: HwAddr) -> EventPeer {
        EventPeer {
            ip: Some(ip),
            gid: hw.gid,
            qpn: hw.qpn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn peer(q: u32) -> EventPeer {
        EventPeer {
            ip: Some(IpAddr::V4(Ipv4Addr::new(198, 19, 0, 2))),
            gid: Gid::from(Ipv4Addr::new(198, 18, 0, 2)),
            qpn: QpNum::new(q),
        }
    }

    #[test]
    fn the_queue_keeps_the_newest_cap_events_and_says_when_it_dropped_one() {
        let mut q = EventQueue::default();
        let total = EVENT_QUEUE_CAP as u32 + 10;
        let dropped = (0..total)
            .filter(|&i| q.push(Event::RxAccepted { peer: peer(i) }))
            .count();
        assert_eq!(dropped, 10);
        let mut got = Vec::new();
        while let Some(e) = q.pop() {
            got.push(e.peer().map(|p| p.qpn.get()));
        }
        assert_eq!(got.len(), EVENT_QUEUE_CAP);
        assert_eq!(got.first(), Some(&Some(10)));
        assert_eq!(got.last(), Some(&Some(total - 1)));
    }

    #[test]
    fn an_event_displays_as_one_key_value_line() {
        let e = Event::TxEstablished {
            peer: peer(0x13),
            mtu: 65516,
        };
        assert_eq!(
            e.to_string(),
            "tx connected peer=198.19.0.2 gid=::ffff:198.18.0.2 qpn=0x000013 mtu=65516"
        );
        let e = Event::RxReaped {
            peer: EventPeer {
                ip: None,
                ..peer(7)
            },
            reason: RxReapReason::Stale,
        };
        assert_eq!(
            e.to_string(),
            "rx reaped peer=- gid=::ffff:198.18.0.2 qpn=0x000007 reason=stale"
        );
        let e = Event::TxClosed {
            peer: peer(0x13),
            reason: TxCloseReason::AgedOut,
        };
        assert_eq!(
            e.to_string(),
            "tx closed peer=198.19.0.2 gid=::ffff:198.18.0.2 qpn=0x000013 reason=aged-out"
        );
        let e = Event::NeighFailed {
            ip: IpAddr::V4(Ipv4Addr::new(198, 19, 0, 9)),
            dropped: 3,
        };
        assert_eq!(e.to_string(), "neighbour failed peer=198.19.0.9 dropped=3");
    }
}
