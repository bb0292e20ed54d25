//! The reaper: every RX connection leaves the same way, whatever ended it.
//!
//! ```text
//!            REQ accepted
//!                 │
//!               Live ──(stale | DREQ | REJ | evicted | shutdown | QP error)──► Error
//!                                                                             │ QP in ERR,
//!              SRQ: Last WQE Reached ─────────────► Flush                     │ watchdog armed
//!              (one drain WR covers every waiter)    │ drain WR flushed        │
//!                                                   ▼                         │
//!              non-SRQ: receives flushed to zero ─► Drained ──► QP destroyed ◄─┘ watchdog
//! ```
//!
//! Every step is idempotent: a duplicated Last WQE event, a late flush completion or a CM
//! event for a connection that is already going away changes nothing. Whatever the provider
//! does or fails to do, the watchdog destroys the QP `drain_timeout` after it entered ERR.
//! Each connection's [`Phase`] carries its own timer and its place with respect to the drain
//! WR; the [`RxTable`](super::RxTable) keeps the one drain WR in flight.

use std::time::Instant;

use super::table::Phase;
use super::Why;
use crate::ipoib::event::Event;
use crate::ipoib::{begin_error, wr, Endpoint, QpEnd, Timer, WR_DRAIN};
use crate::timer::TimerId;
use crate::verbs::{QpNum, SendWr, Verbs};

impl Endpoint {
    /// One receive of a non-SRQ ring is gone; an errored QP whose ring is empty is drained.
    pub(in crate::ipoib) fn ring_down<V: Verbs>(&mut self, v: &mut V, qpn: QpNum) {
        let Some(mut r) = self.rx.get_mut(&qpn) else {
            return;
        };
        r.ring_posted = r.ring_posted.saturating_sub(1);
        if r.ring_posted == 0 && matches!(r.phase, Phase::Error { .. }) {
            r.phase = Phase::Drained;
            drop(r);
            self.destroy_rx(v, qpn, QpEnd::Drained);
        }
    }

    /// Starts tearing down an RX connection of a peer's previous incarnation (the peer
    /// restarted). Idempotent.
    pub(in crate::ipoib) fn retire_rx<V: Verbs>(&mut self, now: Instant, v: &mut V, qpn: QpNum) {
        self.start_rx_teardown(now, v, qpn, Why::Restarted);
    }

    /// Starts tearing an RX connection down. Idempotent.
    pub(in crate::ipoib) fn start_rx_teardown<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        why: Why,
    ) {
        let Some(mut r) = self.rx.get_mut(&qpn) else {
            return;
        };
        let Phase::Live { stale_timer } = r.phase else {
            return;
        };
        r.phase = Phase::Error { watchdog: None };
        // A REP that was waiting for the QP's moves never goes out.
        r.preparing = None;
        let id = r.id;
        let (peer, peer_ip) = (r.peer, r.peer_ip);
        let ring_empty = r.ring_posted == 0;
        drop(r);
        if let Some(t) = stale_timer {
            self.wheel.cancel(t);
        }
        match why {
            Why::Stale => self.counters.rx_stale_reaped += 1,
            Why::Remote => self.counters.rx_dreq_reaped += 1,
            Why::Evicted => self.counters.rx_evicted += 1,
            Why::HalfOpenEvicted => self.counters.rx_half_open_evicted += 1,
            Why::HalfOpenTimeout => self.counters.rx_half_open_reaped += 1,
            Why::PathMtuChanged => self.counters.mtu_reconnects += 1,
            Why::OverBudget | Why::Shutdown | Why::Error | Why::Restarted => {}
        }
        let mut ev_peer = self.event_peer(peer, qpn);
        ev_peer.ip = ev_peer.ip.or(peer_ip);
        self.push_event(Event::RxReaped {
            peer: ev_peer,
            reason: why.into(),
        });
        if why.tell_peer() {
            // The peer may still be alive: tell it (DREQ, or REJ while still connecting).
            let _ = self.cm.disconnect(now, id);
        }
        begin_error(v, qpn);
        let t = self.arm(now + self.cfg.drain_timeout, Timer::RxWatchdog(qpn));
        if let Some(mut r) = self.rx.get_mut(&qpn) {
            r.phase = Phase::Error { watchdog: Some(t) };
        }
        if self.srq.is_none() && ring_empty {
            self.destroy_rx(v, qpn, QpEnd::Drained);
        }
    }

    pub(in crate::ipoib) fn on_last_wqe<V: Verbs>(&mut self, v: &mut V, qpn: QpNum) {
        self.counters.last_wqe_events += 1;
        // A duplicate or early event (a Live QP is not in ERR yet) changes nothing.
        if self.rx.last_wqe_reached(qpn) {
            self.start_drain(v);
        }
    }

    /// Posts the drain WR if none is outstanding: one WR on the earliest waiter covers every
    /// waiter (`ipoib_cm_start_rx_drain`).
    fn start_drain<V: Verbs>(&mut self, v: &mut V) {
        let Some(carrier) = self.rx.drain_carrier_candidate() else {
            return;
        };
        match v.post_send(carrier, &SendWr::empty(wr(WR_DRAIN))) {
            Ok(()) => self.rx.drain_posted(carrier),
            Err(e) => {
                // The waiters' watchdogs will destroy them.
                tracing::warn!(qp = %carrier, error = %e, "posting the drain WR failed");
            }
        }
    }

    pub(in crate::ipoib) fn on_drain_complete<V: Verbs>(&mut self, v: &mut V, carrier: QpNum) {
        let drained = self.rx.drain_completed(carrier);
        if drained.is_empty() {
            return;
        }
        for qpn in drained {
            self.destroy_rx(v, qpn, QpEnd::Drained);
        }
        self.start_drain(v);
    }

    pub(in crate::ipoib) fn on_rx_stale_timer<V: Verbs>(
        &mut self,
        now: Instant,
        v: &mut V,
        qpn: QpNum,
        id: TimerId,
    ) {
        let Some(mut r) = self.rx.get_mut(&qpn) else {
            return;
        };
        if r.phase
            != (Phase::Live {
                stale_timer: Some(id),
            })
        {
            return;
        }
        let stale_at = r.last_rx + self.cfg.rx_timeout;
        if stale_at > now {
            r.phase = Phase::Live { stale_timer: None };
            drop(r);
            let t = self.arm(stale_at, Timer::RxStale(qpn));
            if let Some(mut r) = self.rx.get_mut(&qpn) {
                r.phase = Phase::Live {
                    stale_timer: Some(t),
                };
            }
            return;
        }
        drop(r);
        self.start_rx_teardown(now, v, qpn, Why::Stale);
    }

    pub(in crate::ipoib) fn on_rx_watchdog<V: Verbs>(
        &mut self,
        v: &mut V,
        qpn: QpNum,
        id: TimerId,
    ) {
        let armed = match self.rx.get(&qpn).map(|r| r.phase) {
            Some(Phase::Error { watchdog } | Phase::Flush { watchdog, .. }) => watchdog == Some(id),
            _ => false,
        };
        if !armed {
            return;
        }
        tracing::info!(qp = %qpn, "RX teardown timed out; destroying anyway");
        self.counters.drain_timeouts += 1;
        self.destroy_rx(v, qpn, QpEnd::Forced);
        self.start_drain(v);
    }

    /// Destroys an RX QP and forgets it. If it carried the outstanding drain WR, the QPs that
    /// WR covered wait for the next one.
    pub(in crate::ipoib) fn destroy_rx<V: Verbs>(&mut self, v: &mut V, qpn: QpNum, end: QpEnd) {
        let Some(r) = self.rx.remove(qpn) else {
            return;
        };
        if let Some(t) = r.timer() {
            self.wheel.cancel(t);
        }
        if self.cm.state(r.id).is_none() {
            self.owners.remove(&r.id);
        }
        self.destroy_qp(v, qpn, end);
    }
}
