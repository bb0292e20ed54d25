//! The CM's clock: one timer per comm id on the crate's timer wheel, carrying the
//! retransmission of an unanswered REQ, REP or DREQ and the end of TimeWait.

use std::time::{Duration, Instant};

use crate::timer::TimerWheel;
use crate::wire::cm::{RejReason, MAD_LEN};

use super::types::{CmEvent, CmState, CommId};
use super::Cm;

/// Resolution of the CM's timers: deadlines round up to it (never early).
const TIMER_TICK: Duration = Duration::from_millis(1);

impl Cm {
    /// Retransmits what timed out, gives up after the retries, and ends expired TimeWaits.
    /// Idempotent: calling it again with the same `now` does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.start_clock(now);
        // A fired timer may re-arm (a resend) but never at or before `now` (intervals are at
        // least 1 ms), except a zero TimeWait, which the next pass takes: bounded passes.
        for _ in 0..4 {
            let mut fired = std::mem::take(&mut self.fired);
            fired.clear();
            if let Some(w) = self.wheel.as_mut() {
                w.expire(now, &mut fired);
            }
            let any = !fired.is_empty();
            for (tid, raw) in fired.drain(..) {
                let due = self.conns.get(&raw).is_some_and(|c| c.timer == Some(tid));
                if due {
                    if let Some(c) = self.conns.get_mut(&raw) {
                        c.timer = None;
                    }
                    self.fire(now, CommId(raw));
                }
            }
            self.fired = fired;
            if !any {
                return;
            }
        }
    }

    /// When [`Cm::handle_timeout`] next has work to do.
    #[must_use]
    ///
    /// Like every [`TimerWheel`] deadline this may be earlier than the exact deadline (never
    /// later): a call at that time can find nothing due yet.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.wheel.as_ref().and_then(TimerWheel::poll_timeout)
    }

    /// The exact earliest deadline (O(n); for tests). It checks that [`Cm::poll_timeout`] is
    /// never later.
    #[cfg(test)]
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let exact = self.conns.values().filter_map(|c| c.deadline).min();
        if let (Some(e), Some(p)) = (exact, self.poll_timeout()) {
            assert!(
                p <= e,
                "poll_timeout {p:?} is later than the deadline {e:?}"
            );
        }
        assert_eq!(exact.is_some(), self.poll_timeout().is_some());
        exact
    }

    /// Creates the timer wheel at the first call that knows the time.
    pub(super) fn start_clock(&mut self, now: Instant) {
        if self.wheel.is_none() {
            self.wheel = Some(TimerWheel::new(now, TIMER_TICK));
        }
    }

    /// Sets (or clears) the one timer of `id`.
    pub(super) fn set_deadline(&mut self, id: CommId, at: Option<Instant>) {
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        c.deadline = None;
        if let (Some(old), Some(w)) = (c.timer.take(), self.wheel.as_mut()) {
            w.cancel(old);
        }
        if let (Some(at), Some(w)) = (at, self.wheel.as_mut()) {
            c.deadline = Some(at);
            c.timer = Some(w.insert(at, id.0));
        }
    }

    /// Enters TimeWait: no retransmission; the id is freed after [`CmConfig::timewait`].
    pub(super) fn enter_timewait(&mut self, now: Instant, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.state = CmState::TimeWait;
            c.retx = None;
            // No reply is resent in TimeWait (a duplicate REQ gets a REJ, a duplicate REP
            // nothing).
            c.reply = None;
            let tw = self.cfg.timewait;
            self.set_deadline(id, Some(now + tw));
        }
    }

    /// The timer of `id` expired at `now`.
    fn fire(&mut self, now: Instant, id: CommId) {
        /// What the expired timer asks for (a local value; its size does not matter).
        #[allow(clippy::large_enum_variant)]
        enum Fire {
            Resend([u8; MAD_LEN], Duration),
            Exhausted,
            TimeWaitExit,
            Spurious,
        }
        let Some(c) = self.conns.get_mut(&id.0) else {
            return;
        };
        let (state, peer) = (c.state, c.peer);
        let what = match c.retx.as_mut() {
            Some(r) if r.retries_left > 0 => {
                r.retries_left -= 1;
                Fire::Resend(*r.mad, r.interval)
            }
            Some(_) => Fire::Exhausted,
            None if state == CmState::TimeWait => Fire::TimeWaitExit,
            None => Fire::Spurious,
        };
        match what {
            Fire::Resend(mad, interval) => {
                self.stats.retransmits += 1;
                self.send(peer, mad);
                self.set_deadline(id, Some(now + interval));
            }
            Fire::Exhausted => {
                self.stats.timeouts += 1;
                match state {
                    CmState::ReqSent | CmState::MraReqRcvd => {
                        // Linux sends nothing when a REQ times out (IB_CM_REQ_ERROR).
                        self.free(id);
                        self.events.push_back(CmEvent::TimedOut { id, state });
                    }
                    CmState::RepSent | CmState::MraRepRcvd => {
                        // IBTA 12.9.6: REJ (Timeout), so that a peer that did get the REP
                        // stops too. Our QPN was announced: TimeWait.
                        let guid = self.cfg.local_ca_guid.to_be_bytes();
                        self.send_rej_locked(now, id, RejReason::Timeout, &guid);
                        self.events.push_back(CmEvent::TimedOut { id, state });
                    }
                    CmState::DreqSent => {
                        self.enter_timewait(now, id);
                        self.events.push_back(CmEvent::Disconnected { id });
                    }
                    _ => self.stop_retx(id),
                }
            }
            Fire::TimeWaitExit => {
                self.free(id);
                self.events.push_back(CmEvent::TimeWaitExit { id });
            }
            Fire::Spurious => self.set_deadline(id, None),
        }
    }

    /// Stops the retransmission of `id` (its MAD was answered).
    pub(super) fn stop_retx(&mut self, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.retx = None;
        }
        self.set_deadline(id, None);
    }
}
