//! Scheduling: which QP `poll_transmit` serves next, and the QP timers (retransmit, RNR
//! back-off, the responder's NAK wait) in one lazily cancelled heap. The engine fires them (`SoftVerbs::handle_timeout`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use super::qp::Qp;
use crate::verbs::QpNum;

/// Request packets that may leave ahead of a QP waiting with only responses to send (see
/// [`Scheduler::ready_responses`]).
pub(super) const REQUESTS_PER_RESPONSE: u32 = 16;

/// Which timer of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum TimerKind {
    /// Requester retransmit timer.
    Retransmit,
    /// Requester RNR back-off.
    Rnr,
    /// Responder: the NAK of a gap that did not fill in time.
    NakWait,
}

/// The QPs with something to send, in the order they are served, and the timer heap.
#[derive(Debug)]
pub(super) struct Scheduler {
    /// QPs with requests to transmit (and perhaps responses), in turn.
    ready: VecDeque<QpNum>,
    /// QPs that had only responses (ACKs, NAKs) to send when queued, served after
    /// [`Self::ready`]: in one flush the ACK of a request then leaves after the reply to it,
    /// so the peer wakes to both at once instead of to the ACK first. At most
    /// [`REQUESTS_PER_RESPONSE`] request packets go ahead of a waiting response, so that a
    /// stream one way does not hold back the ACKs of the other.
    ready_responses: VecDeque<QpNum>,
    /// Request packets sent since a response QP was last served.
    requests_since_response: u32,
    /// Lazily cancelled timers: an entry is acted on only if the QP's deadline still matches.
    timers: BinaryHeap<Reverse<(Instant, QpNum, TimerKind)>>,
}

impl Scheduler {
    pub(super) fn new() -> Self {
        Self {
            ready: VecDeque::new(),
            ready_responses: VecDeque::new(),
            requests_since_response: 0,
            timers: BinaryHeap::new(),
        }
    }

    /// The next QP to serve: requests first, but a waiting response QP after at most
    /// [`REQUESTS_PER_RESPONSE`] of them.
    pub(super) fn next_ready(&mut self) -> Option<QpNum> {
        if self.requests_since_response < REQUESTS_PER_RESPONSE {
            if let Some(q) = self.ready.pop_front() {
                self.requests_since_response += 1;
                return Some(q);
            }
        }
        self.requests_since_response = 0;
        self.ready_responses
            .pop_front()
            .or_else(|| self.ready.pop_front())
    }

    /// Queues `qp` to be served, unless it is queued already.
    pub(super) fn mark_ready(&mut self, qp: &mut Qp) {
        if !qp.ready_queued {
            qp.ready_queued = true;
            if qp.may_send() {
                self.ready.push_back(qp.num);
            } else {
                self.ready_responses.push_back(qp.num);
            }
        }
    }

    /// Sets `qp`'s `kind` timer to fire at `at`.
    pub(super) fn arm(&mut self, qp: &mut Qp, kind: TimerKind, at: Instant) {
        let (slot, queued) = timer_slots(qp, kind);
        *slot = Some(at);
        // Each QP timer has at most one live heap entry, whose instant `queued` records. It
        // stays valid while the deadline moves later (it re-queues itself for the new one
        // when it pops) and even while the timer is cancelled; only an earlier deadline
        // needs a new entry, and the superseded one is dropped when it pops. So the heap
        // holds at most two entries per QP timer however often a busy QP cancels and re-arms.
        if !matches!(*queued, Some(q) if q <= at) {
            *queued = Some(at);
            self.timers.push(Reverse((at, qp.num, kind)));
        }
    }

    /// The instant of the earliest heap entry.
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Removes and returns the earliest heap entry if it is due at `now`.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(Instant, QpNum, TimerKind)> {
        let Reverse(entry) = self.timers.peek().copied()?;
        if entry.0 > now {
            return None;
        }
        self.timers.pop();
        Some(entry)
    }

    /// Queues a heap entry for `qpn`'s `kind` timer at `at` (an entry that popped before its
    /// timer's deadline, which has moved later, moves to the new deadline).
    pub(super) fn requeue(&mut self, at: Instant, qpn: QpNum, kind: TimerKind) {
        self.timers.push(Reverse((at, qpn, kind)));
    }

    /// The number of timer heap entries, stale ones included.
    #[cfg(test)]
    pub(super) fn timer_entries(&self) -> usize {
        self.timers.len()
    }
}

/// The deadline of one of `qp`'s timers, and the instant of its live timer-heap entry.
pub(super) fn timer_slots(
    qp: &mut Qp,
    kind: TimerKind,
) -> (&mut Option<Instant>, &mut Option<Instant>) {
    let r = &mut qp.req;
    match kind {
        TimerKind::Retransmit => (&mut r.retransmit_at, &mut r.retransmit_queued),
        TimerKind::Rnr => (&mut r.rnr_at, &mut r.rnr_queued),
        TimerKind::NakWait => (&mut qp.resp.nak_at, &mut qp.resp.nak_queued),
    }
}
