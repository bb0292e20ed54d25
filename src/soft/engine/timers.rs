//! The engine's timers: the deadline of the next one, and firing those that are due.

use std::time::Instant;

use super::SoftVerbs;
use crate::soft::sched::{timer_slots, TimerKind};

impl SoftVerbs {
    /// The earliest instant [`SoftVerbs::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.lost {
            return None;
        }
        [
            self.dev.sched.next_timeout(),
            self.fatal_at,
            self.later.next_at(),
            self.dev.ib.as_ref().and_then(|ib| ib.beacon_at),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Fires every timer due at `now`. Idempotent; spurious calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.lost {
            return;
        }
        self.later.tick(now);
        self.do_due_moves(now);
        if let Some(after) = self.faults.config().device_fatal_after {
            let at = *self.fatal_at.get_or_insert(now + after);
            if now >= at {
                self.fatal_at = None;
                self.fail_device();
                return;
            }
        }
        while let Some((at, qpn, kind)) = self.dev.sched.pop_due(now) {
            let Some(qp) = self.qps.get_mut(qpn) else {
                continue;
            };
            let (deadline, queued) = timer_slots(qp, kind);
            if *queued != Some(at) {
                // Stale: an earlier deadline superseded this entry, or the QP was reset.
                continue;
            }
            *queued = None;
            match *deadline {
                Some(d) if d <= now => match kind {
                    TimerKind::Retransmit => self.dev.on_retransmit_timeout(qp, now),
                    TimerKind::Rnr => {
                        qp.req.rnr_at = None;
                        let to = qp.req.comp_psn;
                        qp.req.rewind(to);
                    }
                    TimerKind::NakWait => self.dev.on_nak_wait(qp, now),
                },
                // Re-armed later: this entry moves to the new deadline.
                Some(d) => {
                    *queued = Some(d);
                    self.dev.sched.requeue(d, qpn, kind);
                }
                None => {}
            }
            if qp.has_work() {
                self.dev.sched.mark_ready(qp);
            }
        }
    }
}
