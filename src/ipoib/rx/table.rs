//! The RX table: every passive connection, each with the reaper state that belongs to it, and
//! the one drain WR the table allows in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::RxState;
use crate::cm::CommId;
use crate::ipoib::qp_conns::QpConns;
use crate::timer::TimerId;
use crate::verbs::{Gid, PathMtu, Psn, QpNum};

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
    /// The path MTU its QP runs at (the REQ's, which is never above ours).
    pub(in crate::ipoib) path_mtu: PathMtu,
    pub(in crate::ipoib) established: bool,
    /// Receives posted on the QP's own ring (non-SRQ mode).
    pub(in crate::ipoib) ring_posted: u32,
    /// The QP is still being moved to RTS ([`Verbs::begin_moves`]): the REP goes out, with
    /// these, when it is there.
    ///
    /// [`Verbs::begin_moves`]: crate::verbs::Verbs::begin_moves
    pub(in crate::ipoib) preparing: Option<Preparing>,
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

    /// What the table counts it as.
    fn class(&self) -> Class {
        match (self.is_live(), self.established) {
            (false, _) => Class::Closing,
            (true, true) => Class::Established,
            (true, false) => Class::HalfOpen {
                last_rx: self.last_rx,
            },
        }
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

/// What the REP of a connection whose QP is still moving to RTS will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::ipoib) struct Preparing {
    /// Our starting PSN.
    pub(in crate::ipoib) our_psn: Psn,
    /// The REQ's RNR retry count, echoed.
    pub(in crate::ipoib) rnr_retry_count: u8,
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

/// How the admission limits count a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Receiving and established (counts against `max_conn_qp`).
    Established,
    /// Receiving, REP sent, no RTU (or data) yet (counts against `max_pending_rx`).
    HalfOpen {
        /// Its activity stamp, the half-open index's key.
        last_rx: Instant,
    },
    /// On its way to destruction: counted by neither limit.
    Closing,
}

/// The admission counts of the live connections, kept as they change.
///
/// Invariant: `established` is the number of connections of [`Class::Established`],
/// `established_from` that number per peer GID (no zero entries), and `half_open` holds
/// `(last_rx, qpn)` of exactly the connections of [`Class::HalfOpen`].
#[derive(Debug, Default)]
struct LiveCounts {
    established: usize,
    established_from: BTreeMap<Gid, usize>,
    /// Ordered by activity stamp, then QP number: the first is the oldest.
    half_open: BTreeSet<(Instant, QpNum)>,
    /// The interface's counts when its connections are spread over workers: this table's
    /// share is added in as it changes.
    shared: Option<Arc<InterfaceRxCounts>>,
}

/// The RX connections of every worker of an interface, counted against its one QP budget
/// (`max_conn_qp`) and half-open limit (`max_pending_rx`): each worker's RX table adds its
/// changes as they happen (atomics, no lock), and admits against the totals, so that no
/// worker exceeds a budget by racing another (two that establish at once each see the other's
/// connection and each makes room). Room is made among a worker's own connections; a worker
/// that holds none (the others hold the budget) admits the one it is asked for, so that no
/// peer is locked out of it: the interface holds at most one more per worker.
#[derive(Debug, Default)]
pub struct InterfaceRxCounts {
    established: AtomicUsize,
    half_open: AtomicUsize,
}

impl InterfaceRxCounts {
    /// Established RX connections of every worker.
    pub fn established(&self) -> usize {
        self.established.load(Ordering::Relaxed)
    }

    /// Half-open RX connections of every worker.
    pub fn half_open(&self) -> usize {
        self.half_open.load(Ordering::Relaxed)
    }
}

impl Drop for LiveCounts {
    /// A table that goes away (its endpoint dropped, its worker ended) gives its share of the
    /// interface's counts back.
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared
                .established
                .fetch_sub(self.established, Ordering::Relaxed);
            shared
                .half_open
                .fetch_sub(self.half_open.len(), Ordering::Relaxed);
        }
    }
}

impl LiveCounts {
    /// Connection `qpn` from `peer` went from class `from` to `to` (`None`: not in the
    /// table).
    fn moved(&mut self, qpn: QpNum, peer: Gid, from: Option<Class>, to: Option<Class>) {
        if from == to {
            return;
        }
        if let Some(shared) = &self.shared {
            let (e, h) = (&shared.established, &shared.half_open);
            match from {
                Some(Class::Established) => _ = e.fetch_sub(1, Ordering::Relaxed),
                Some(Class::HalfOpen { .. }) => _ = h.fetch_sub(1, Ordering::Relaxed),
                Some(Class::Closing) | None => {}
            }
            match to {
                Some(Class::Established) => _ = e.fetch_add(1, Ordering::Relaxed),
                Some(Class::HalfOpen { .. }) => _ = h.fetch_add(1, Ordering::Relaxed),
                Some(Class::Closing) | None => {}
            }
        }
        match from {
            Some(Class::Established) => {
                self.established -= 1;
                if let Some(n) = self.established_from.get_mut(&peer) {
                    *n -= 1;
                    if *n == 0 {
                        self.established_from.remove(&peer);
                    }
                }
            }
            Some(Class::HalfOpen { last_rx }) => {
                self.half_open.remove(&(last_rx, qpn));
            }
            Some(Class::Closing) | None => {}
        }
        match to {
            Some(Class::Established) => {
                self.established += 1;
                *self.established_from.entry(peer).or_default() += 1;
            }
            Some(Class::HalfOpen { last_rx }) => {
                self.half_open.insert((last_rx, qpn));
            }
            Some(Class::Closing) | None => {}
        }
    }
}

/// A connection of the table borrowed to change; dropping it updates the table's counts.
#[derive(Debug)]
pub(in crate::ipoib) struct RxConnMut<'a> {
    qpn: QpNum,
    conn: &'a mut RxConn,
    counts: &'a mut LiveCounts,
    before: Class,
}

impl Deref for RxConnMut<'_> {
    type Target = RxConn;

    fn deref(&self) -> &RxConn {
        self.conn
    }
}

impl DerefMut for RxConnMut<'_> {
    fn deref_mut(&mut self) -> &mut RxConn {
        self.conn
    }
}

impl Drop for RxConnMut<'_> {
    fn drop(&mut self) {
        let after = self.conn.class();
        self.counts
            .moved(self.qpn, self.conn.peer, Some(self.before), Some(after));
    }
}

/// The passive connections by QP number, their admission counts, and the reaper's drain WR.
///
/// Invariants: at most one drain WR is in flight; `drain_carrier` is `Some` exactly while some
/// connection is [`Drain::Covered`], and the carrier is one of them. `counts` describes
/// `conns` (see [`LiveCounts`]): every change of a connection goes through [`RxConnMut`],
/// [`RxTable::insert`] or [`RxTable::remove`]; the drain steps only move connections between
/// closing phases.
#[derive(Debug, Default)]
pub(in crate::ipoib) struct RxTable {
    conns: QpConns<RxConn>,
    counts: LiveCounts,
    /// The QP carrying the drain WR in flight.
    drain_carrier: Option<QpNum>,
    /// Sequence number of the next connection to wait for a drain WR.
    next_seq: u64,
}

impl RxTable {
    /// The connection on `qpn`, to change (reading goes through [`QpConns`]). The table's
    /// counts follow the change when the returned borrow ends.
    pub(in crate::ipoib) fn get_mut(&mut self, qpn: &QpNum) -> Option<RxConnMut<'_>> {
        let conn = self.conns.get_mut(qpn)?;
        let before = conn.class();
        Some(RxConnMut {
            qpn: *qpn,
            conn,
            counts: &mut self.counts,
            before,
        })
    }

    /// Adds (or replaces) the connection on `qpn`.
    pub(in crate::ipoib) fn insert(&mut self, qpn: QpNum, conn: RxConn) {
        let to = conn.class();
        let peer = conn.peer;
        if let Some(old) = self.conns.get(&qpn) {
            let (old_peer, old_class) = (old.peer, old.class());
            self.counts.moved(qpn, old_peer, Some(old_class), None);
        }
        self.conns.insert(qpn, conn);
        self.counts.moved(qpn, peer, None, Some(to));
    }

    /// Counts this table's connections into `share` from now on (with what it holds now).
    pub(in crate::ipoib) fn share_budget(&mut self, share: Arc<InterfaceRxCounts>) {
        if let Some(old) = self.counts.shared.take() {
            old.established
                .fetch_sub(self.counts.established, Ordering::Relaxed);
            old.half_open
                .fetch_sub(self.counts.half_open.len(), Ordering::Relaxed);
        }
        share
            .established
            .fetch_add(self.counts.established, Ordering::Relaxed);
        share
            .half_open
            .fetch_add(self.counts.half_open.len(), Ordering::Relaxed);
        self.counts.shared = Some(share);
    }

    /// Established connections of the interface: this table's, with every other worker's
    /// where they share a budget ([`RxTable::share_budget`]). O(1).
    pub(in crate::ipoib) fn established_total(&self) -> usize {
        match &self.counts.shared {
            Some(s) => s.established().max(self.counts.established),
            None => self.established_count(),
        }
    }

    /// Half-open connections of the interface, as [`RxTable::established_total`]. O(1).
    pub(in crate::ipoib) fn half_open_total(&self) -> usize {
        match &self.counts.shared {
            Some(s) => s.half_open().max(self.counts.half_open.len()),
            None => self.half_open_count(),
        }
    }

    /// Established connections receiving now (what counts against `max_conn_qp`). O(1).
    pub(in crate::ipoib) fn established_count(&self) -> usize {
        self.check_counts();
        self.counts.established
    }

    /// Established connections receiving now from `peer` (what counts against
    /// [`MAX_CONN_QP_PER_SOURCE`](crate::ipoib::MAX_CONN_QP_PER_SOURCE)). O(1).
    pub(in crate::ipoib) fn established_from(&self, peer: Gid) -> usize {
        self.counts
            .established_from
            .get(&peer)
            .copied()
            .unwrap_or(0)
    }

    /// Half-open connections: REP sent, no RTU (or data) yet (what counts against
    /// `max_pending_rx`). O(1).
    pub(in crate::ipoib) fn half_open_count(&self) -> usize {
        self.check_counts();
        self.counts.half_open.len()
    }

    /// The half-open connection that received least recently, which is the one accepted
    /// first (a half-open connection that receives becomes established), the lowest QP
    /// number among equals: the victim when a REQ finds `max_pending_rx` of them.
    /// O(log n).
    pub(in crate::ipoib) fn oldest_half_open(&self) -> Option<QpNum> {
        self.check_counts();
        self.counts.half_open.first().map(|&(_, q)| q)
    }

    /// The counts by a scan of every connection: `(established, half-open, oldest
    /// half-open)`, what [`LiveCounts`] must equal.
    fn scan_counts(&self) -> (usize, usize, Option<QpNum>) {
        let mut established = 0;
        let mut half_open = 0;
        let mut oldest: Option<(Instant, QpNum)> = None;
        for (q, r) in self.conns.iter() {
            match r.class() {
                Class::Established => established += 1,
                Class::HalfOpen { last_rx } => {
                    half_open += 1;
                    oldest = Some(oldest.map_or((last_rx, *q), |o| o.min((last_rx, *q))));
                }
                Class::Closing => {}
            }
        }
        (established, half_open, oldest.map(|(_, q)| q))
    }

    /// Checks the counts against a scan (debug builds; the scan is what the counts replace).
    fn check_counts(&self) {
        if cfg!(debug_assertions) {
            debug_assert_eq!(
                (
                    self.counts.established,
                    self.counts.half_open.len(),
                    self.counts.half_open.first().map(|&(_, q)| q)
                ),
                self.scan_counts(),
                "the RX table's counts differ from its connections"
            );
            debug_assert_eq!(
                self.counts.established_from.values().sum::<usize>(),
                self.counts.established,
                "the per-source counts differ from the established count"
            );
        }
    }

    /// The established connection other than `keep` (and from `peer`, if given) that
    /// received least recently: the eviction victim. O(n).
    pub(in crate::ipoib) fn least_recently_active_except(
        &self,
        keep: QpNum,
        peer: Option<Gid>,
    ) -> Option<QpNum> {
        self.conns
            .iter()
            .filter(|(q, r)| {
                r.is_live() && r.established && **q != keep && peer.is_none_or(|p| p == r.peer)
            })
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
        self.counts.moved(qpn, r.peer, Some(r.class()), None);
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

impl Deref for RxTable {
    type Target = QpConns<RxConn>;

    fn deref(&self) -> &QpConns<RxConn> {
        &self.conns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

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
                path_mtu: PathMtu::Mtu1024,
                established: true,
                ring_posted: 0,
                preparing: None,
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

    /// A table that goes away (a worker that ended, an endpoint rebuilt) gives its share of
    /// the interface's counts back: the other workers' admission no longer counts its
    /// connections.
    #[test]
    fn a_table_that_goes_away_gives_its_share_back() {
        let t0 = Instant::now();
        let share = Arc::new(InterfaceRxCounts::default());
        let mut keeps = RxTable::default();
        keeps.share_budget(Arc::clone(&share));
        let mut goes = RxTable::default();
        goes.share_budget(Arc::clone(&share));
        let live = |t: &mut RxTable, q: u32, established: bool| {
            let qpn = errored(t, q, t0);
            if let Some(mut r) = t.get_mut(&qpn) {
                r.established = established;
                r.phase = Phase::Live { stale_timer: None };
            }
        };
        live(&mut keeps, 0x10, true);
        live(&mut goes, 0x11, true);
        live(&mut goes, 0x12, false);
        assert_eq!((share.established(), share.half_open()), (2, 1));
        drop(goes);
        assert_eq!((share.established(), share.half_open()), (1, 0));
        assert_eq!(keeps.established_total(), 1);
    }

    /// One change a connection of the table can go through.
    #[derive(Debug, Clone)]
    enum Op {
        Accept { q: u32, at_ms: u64 },
        Establish { q: u32 },
        Receive { q: u32, at_ms: u64 },
        Teardown { q: u32 },
        LastWqe { q: u32 },
        PostDrain,
        CompleteDrain { q: u32 },
        Remove { q: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let q = 0x10u32..0x18;
        prop_oneof![
            (q.clone(), 0u64..4).prop_map(|(q, at_ms)| Op::Accept { q, at_ms }),
            q.clone().prop_map(|q| Op::Establish { q }),
            (q.clone(), 0u64..4).prop_map(|(q, at_ms)| Op::Receive { q, at_ms }),
            q.clone().prop_map(|q| Op::Teardown { q }),
            q.clone().prop_map(|q| Op::LastWqe { q }),
            Just(Op::PostDrain),
            q.clone().prop_map(|q| Op::CompleteDrain { q }),
            q.prop_map(|q| Op::Remove { q }),
        ]
    }

    proptest! {
        /// Whatever the connections go through, the kept counts and the oldest half-open
        /// connection are what a scan of every connection finds.
        #[test]
        fn the_counts_are_what_a_scan_finds(ops in prop::collection::vec(op(), 1..60)) {
            let t0 = Instant::now();
            let mut t = RxTable::default();
            for op in ops {
                match op {
                    // A QP number is not reused while its connection is in the table.
                    Op::Accept { q, .. } if t.contains(&QpNum::new(q)) => {}
                    Op::Accept { q, at_ms } => {
                        let qpn = errored(&mut t, q, t0 + Duration::from_millis(at_ms));
                        if let Some(mut r) = t.get_mut(&qpn) {
                            r.established = false;
                            r.phase = Phase::Live { stale_timer: None };
                        }
                    }
                    Op::Establish { q } => {
                        if let Some(mut r) = t.get_mut(&QpNum::new(q)) {
                            r.established = true;
                        }
                    }
                    Op::Receive { q, at_ms } => {
                        if let Some(mut r) = t.get_mut(&QpNum::new(q)) {
                            r.last_rx = t0 + Duration::from_millis(at_ms);
                        }
                    }
                    Op::Teardown { q } => {
                        if let Some(mut r) = t.get_mut(&QpNum::new(q)) {
                            if r.is_live() {
                                r.phase = Phase::Error { watchdog: None };
                            }
                        }
                    }
                    Op::LastWqe { q } => {
                        t.last_wqe_reached(QpNum::new(q));
                    }
                    Op::PostDrain => {
                        if let Some(c) = t.drain_carrier_candidate() {
                            t.drain_posted(c);
                        }
                    }
                    Op::CompleteDrain { q } => {
                        t.drain_completed(QpNum::new(q));
                    }
                    Op::Remove { q } => {
                        t.remove(QpNum::new(q));
                    }
                }
                let kept = (
                    t.counts.established,
                    t.counts.half_open.len(),
                    t.counts.half_open.first().map(|&(_, q)| q),
                );
                prop_assert_eq!(kept, t.scan_counts());
            }
        }
    }
}
