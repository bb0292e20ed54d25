//! The RX table: every passive connection, each with the reaper state that belongs to it, and
//! the one drain WR the table allows in flight.

use std::time::Instant;

use super::RxState;
use crate::cm::CommId;
use crate::ipoib::qp_conns::QpConns;
use crate::timer::TimerId;
use crate::verbs::{Gid, QpNum};

/// One passive connection.
#[derive(Debug)]
pub(in crate::ipoib) struct RxConn {
    pub(in crate::ipoib) id: CommId,
    pub(in crate::ipoib) peer: Gid,
    /// The peer's IP address as the neighbour table named it when the REQ was accepted (for
    /// the events; the entry may be gone by the time the connection is).
    pub(in crate::ipoib) peer_ip: Option<std::net::IpAddr>,
    /// The peer's CA GUID, from its REQ.
    pub(in crate::ipoib) remote_ca_guid: u64,
    /// The peer's UD QPN, from its REQ's IPoIB-CM private data.
    pub(in crate::ipoib) remote_ud_qpn: Option<QpNum>,
    /// The REQ came from another incarnation of the node than connections we held for it:
    /// once this connection is established, those are closed (see `restart.rs`).
    pub(in crate::ipoib) announces_restart: bool,
    /// Time of the last receive (the activity stamp).
    pub(in crate::ipoib) last_rx: Instant,
    pub(in crate::ipoib) established: bool,
    /// Receives posted on the QP's own ring (non-SRQ mode).
    pub(in crate::ipoib) ring_posted: u32,
    /// Where the connection is on its way from accepted to destroyed.
    pub(in crate::ipoib) phase: Phase,
}

impl RxConn {
    /// The status view of [`phase`](Self::phase).
    pub(in crate::ipoib) fn state(&self) -> RxState {
        match self.phase {
            Phase::Live { .. } => RxState::Live,
            Phase::Error { .. } => RxState::Error,
            Phase::Flush { .. } => RxState::Flush,
            Phase::Drained => RxState::Drained,
        }
    }

    /// True while receiving.
    pub(in crate::ipoib) fn is_live(&self) -> bool {
        matches!(self.phase, Phase::Live { .. })
    }

    /// The timer this connection holds on the wheel (one per phase).
    pub(in crate::ipoib) fn timer(&self) -> Option<TimerId> {
        match self.phase {
            Phase::Live { stale_timer } => stale_timer,
            Phase::Error { watchdog } | Phase::Flush { watchdog, .. } => watchdog,
            Phase::Drained => None,
        }
    }
}

/// A connection's step on the road to destruction, carrying what belongs to that step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::ipoib) enum Phase {
    /// Receiving; the stale timer checks the activity stamp.
    Live {
        /// The stale check on the wheel (`None` only while it is being re-armed).
        stale_timer: Option<TimerId>,
    },
    /// QP moved to ERR; waiting for Last WQE Reached (SRQ) or the flushed receives.
    Error {
        /// The teardown bound (`None` only while it is being armed).
        watchdog: Option<TimerId>,
    },
    /// Last WQE Reached seen; waiting for a drain WR's flush completion.
    Flush {
        /// The teardown bound.
        watchdog: Option<TimerId>,
        /// Whether the drain WR in flight covers this connection.
        drain: Drain,
    },
    /// Fully drained; destroyed at once.
    Drained,
}

/// A flushing connection's place with respect to the drain WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::ipoib) enum Drain {
    /// Waiting for the next drain WR; `seq` orders the waiters (the earliest carries it).
    Waiting {
        /// Order of arrival among the waiters.
        seq: u64,
    },
    /// Covered by the drain WR in flight: destroyed when it completes.
    Covered {
        /// Order of arrival, kept from `Waiting`.
        seq: u64,
    },
}

/// The passive connections by QP number, and the reaper's drain WR.
///
/// Invariant: at most one drain WR is in flight; `drain_carrier` is `Some` exactly while some
/// connection is [`Drain::Covered`], and the carrier is one of them.
#[derive(Debug, Default)]
pub(in crate::ipoib) struct RxTable {
    conns: QpConns<RxConn>,
    /// The QP carrying the drain WR in flight.
    drain_carrier: Option<QpNum>,
    /// Sequence number of the next connection to wait for a drain WR.
    next_seq: u64,
}

impl RxTable {
    /// The connection on `qpn`, to change (reading goes through [`QpConns`]).
    pub(in crate::ipoib) fn get_mut(&mut self, qpn: &QpNum) -> Option<&mut RxConn> {
        self.conns.get_mut(qpn)
    }

    pub(in crate::ipoib) fn insert(&mut self, qpn: QpNum, conn: RxConn) {
        self.conns.insert(qpn, conn);
    }

    /// Established connections receiving now (what counts against `max_conn_qp`).
    pub(in crate::ipoib) fn established_count(&self) -> usize {
        self.conns
            .values()
            .filter(|r| r.is_live() && r.established)
            .count()
    }

    /// Half-open connections: REP sent, no RTU (or data) yet (what counts against
    /// `max_pending_rx`).
    pub(in crate::ipoib) fn half_open_count(&self) -> usize {
        self.conns
            .values()
            .filter(|r| r.is_live() && !r.established)
            .count()
    }

    /// The half-open connection accepted first (the victim when a REQ finds
    /// `max_pending_rx` of them).
    pub(in crate::ipoib) fn oldest_half_open(&self) -> Option<QpNum> {
        self.conns
            .iter()
            .filter(|(_, r)| r.is_live() && !r.established)
            .min_by_key(|(_, r)| r.last_rx)
            .map(|(q, _)| *q)
    }

    /// The established connection other than `keep` that received least recently (the
    /// eviction victim).
    pub(in crate::ipoib) fn least_recently_active_except(&self, keep: QpNum) -> Option<QpNum> {
        self.conns
            .iter()
            .filter(|(q, r)| r.is_live() && r.established && **q != keep)
            .min_by_key(|(_, r)| r.last_rx)
            .map(|(q, _)| *q)
    }

    /// Last WQE Reached on `qpn`: an errored connection now waits for a drain WR. False (and
    /// nothing changes) for any other phase: a duplicate or early event.
    pub(in crate::ipoib) fn last_wqe_reached(&mut self, qpn: QpNum) -> bool {
        let Some(r) = self.conns.get_mut(&qpn) else {
            return false;
        };
        let Phase::Error { watchdog } = r.phase else {
            return false;
        };
        r.phase = Phase::Flush {
            watchdog,
            drain: Drain::Waiting { seq: self.next_seq },
        };
        self.next_seq += 1;
        true
    }

    /// The QP to post the next drain WR on: the earliest waiter, if none is in flight.
    pub(in crate::ipoib) fn drain_carrier_candidate(&self) -> Option<QpNum> {
        if self.drain_carrier.is_some() {
            return None;
        }
        self.conns
            .iter()
            .filter_map(|(q, r)| match r.phase {
                Phase::Flush {
                    drain: Drain::Waiting { seq },
                    ..
                } => Some((seq, *q)),
                _ => None,
            })
            .min()
            .map(|(_, q)| q)
    }

    /// The drain WR went out on `carrier`: it covers every connection waiting now.
    pub(in crate::ipoib) fn drain_posted(&mut self, carrier: QpNum) {
        debug_assert!(self.drain_carrier.is_none(), "a second drain WR in flight");
        self.drain_carrier = Some(carrier);
        for r in self.conns.values_mut() {
            if let Phase::Flush { drain, .. } = &mut r.phase {
                if let Drain::Waiting { seq } = *drain {
                    *drain = Drain::Covered { seq };
                }
            }
        }
        self.check_drain();
    }

    /// The drain WR on `carrier` completed: the connections it covered, in order, now
    /// [`Phase::Drained`] and to be destroyed. Empty for a completion of no WR in flight.
    pub(in crate::ipoib) fn drain_completed(&mut self, carrier: QpNum) -> Vec<QpNum> {
        if self.drain_carrier != Some(carrier) {
            return Vec::new();
        }
        self.drain_carrier = None;
        let mut covered: Vec<(u64, QpNum)> = self
            .conns
            .iter_mut()
            .filter_map(|(q, r)| match r.phase {
                Phase::Flush {
                    drain: Drain::Covered { seq },
                    ..
                } => {
                    r.phase = Phase::Drained;
                    Some((seq, *q))
                }
                _ => None,
            })
            .collect();
        covered.sort_unstable();
        covered.into_iter().map(|(_, q)| q).collect()
    }

    /// Forgets `qpn`. If it carried the drain WR in flight, the connections that WR covered
    /// wait for the next one, after those already waiting, in their order.
    pub(in crate::ipoib) fn remove(&mut self, qpn: QpNum) -> Option<RxConn> {
        let r = self.conns.remove(&qpn)?;
        if self.drain_carrier == Some(qpn) {
            self.drain_carrier = None;
            let mut orphans: Vec<(u64, QpNum)> = self
                .conns
                .iter()
                .filter_map(|(q, r)| match r.phase {
                    Phase::Flush {
                        drain: Drain::Covered { seq },
                        ..
                    } => Some((seq, *q)),
                    _ => None,
                })
                .collect();
            orphans.sort_unstable();
            for (_, q) in orphans {
                if let Some(Phase::Flush { drain, .. }) =
                    self.conns.get_mut(&q).map(|r| &mut r.phase)
                {
                    *drain = Drain::Waiting { seq: self.next_seq };
                    self.next_seq += 1;
                }
            }
        }
        self.check_drain();
        Some(r)
    }

    /// Checks the drain invariant (debug builds).
    fn check_drain(&self) {
        if cfg!(debug_assertions) {
            let covered = self.conns.values().any(|r| {
                matches!(
                    r.phase,
                    Phase::Flush {
                        drain: Drain::Covered { .. },
                        ..
                    }
                )
            });
            debug_assert_eq!(
                covered,
                self.drain_carrier.is_some(),
                "covered connections without a drain WR in flight, or the reverse"
            );
            if let Some(c) = self.drain_carrier {
                debug_assert!(
                    self.conns.get(&c).is_some_and(|r| matches!(
                        r.phase,
                        Phase::Flush {
                            drain: Drain::Covered { .. },
                            ..
                        }
                    )),
                    "the drain carrier is not a covered connection"
                );
            }
        }
    }
}

impl std::ops::Deref for RxTable {
    type Target = QpConns<RxConn>;

    fn deref(&self) -> &QpConns<RxConn> {
        &self.conns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errored(t: &mut RxTable, q: u32, now: Instant) -> QpNum {
        let qpn = QpNum::new(q);
        t.insert(
            qpn,
            RxConn {
                id: CommId(q),
                peer: Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2)),
                peer_ip: None,
                remote_ca_guid: 1,
                remote_ud_qpn: None,
                announces_restart: false,
                last_rx: now,
                established: true,
                ring_posted: 0,
                phase: Phase::Error { watchdog: None },
            },
        );
        qpn
    }

    #[test]
    fn one_drain_wr_at_a_time_and_orphans_wait_after_the_waiters() {
        let now = Instant::now();
        let mut t = RxTable::default();
        let [a, b, c] = [0x11, 0x12, 0x13].map(|q| errored(&mut t, q, now));
        assert!(t.last_wqe_reached(a));
        assert!(t.last_wqe_reached(b));
        assert!(
            !t.last_wqe_reached(b),
            "a duplicate Last WQE changes nothing"
        );
        assert_eq!(
            t.drain_carrier_candidate(),
            Some(a),
            "the earliest waiter carries it"
        );
        t.drain_posted(a);
        assert!(t.last_wqe_reached(c));
        assert_eq!(
            t.drain_carrier_candidate(),
            None,
            "one drain WR in flight at most"
        );
        // The carrier goes away (its watchdog fired): what its WR covered waits again, after c.
        assert!(t.remove(a).is_some());
        assert_eq!(t.get(&b).map(RxConn::state), Some(RxState::Flush));
        assert_eq!(
            t.drain_completed(a),
            Vec::new(),
            "a late completion of a gone carrier"
        );
        assert_eq!(t.drain_carrier_candidate(), Some(c));
        t.drain_posted(c);
        assert_eq!(t.drain_completed(c), vec![c, b]);
        assert_eq!(t.get(&b).map(RxConn::state), Some(RxState::Drained));
        assert_eq!(t.drain_carrier_candidate(), None);
    }
}
