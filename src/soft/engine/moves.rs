//! QP moves done later ([`Quirks::moves_later`](crate::soft::Quirks::moves_later)): what
//! [`Verbs::begin_moves`](crate::verbs::Verbs::begin_moves) started waits [`MOVES_LATER_BY`]
//! here, to be done by the engine's timers, as the hardware provider's command thread does
//! it; a later verb on the QP has its moves done first.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::verbs::{Moved, QpAttr, QpNum};

/// How long after [`Verbs::begin_moves`](crate::verbs::Verbs::begin_moves) the quirk does the
/// moves: about what two firmware commands take on a ConnectX.
pub const MOVES_LATER_BY: Duration = Duration::from_millis(1);

/// Moves started and not done, oldest first, and the results not polled.
#[derive(Debug, Default)]
pub(super) struct LaterMoves {
    started: VecDeque<Started>,
    done: VecDeque<Moved>,
    /// The engine's time, as its last timer or datagram told it ([`LaterMoves::tick`]).
    clock: Option<Instant>,
}

#[derive(Debug)]
struct Started {
    qp: QpNum,
    attrs: Vec<QpAttr>,
    /// When they are due; `None` when started before the engine knew the time, and set when
    /// it learns it ([`LaterMoves::tick`]).
    at: Option<Instant>,
}

impl LaterMoves {
    /// Queues `attrs` for `qp`, due [`MOVES_LATER_BY`] after the engine's time.
    pub(super) fn start(&mut self, qp: QpNum, attrs: &[QpAttr]) {
        self.started.push_back(Started {
            qp,
            attrs: attrs.to_vec(),
            at: self.clock.map(|now| now + MOVES_LATER_BY),
        });
    }

    /// When the oldest moves are due (moves started before the engine knew the time wait
    /// for its next timer call, whenever that comes).
    pub(super) fn next_at(&self) -> Option<Instant> {
        self.started.front().and_then(|s| s.at)
    }

    /// The engine's time is `now`: moves started before it knew the time are due
    /// [`MOVES_LATER_BY`] from now.
    pub(super) fn tick(&mut self, now: Instant) {
        if self.clock.is_none() {
            for s in &mut self.started {
                s.at = Some(now + MOVES_LATER_BY);
            }
        }
        self.clock = Some(now);
    }

    /// The oldest moves, if due at `now`.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(QpNum, Vec<QpAttr>)> {
        if self.started.front()?.at? > now {
            return None;
        }
        self.started.pop_front().map(|s| (s.qp, s.attrs))
    }

    /// Takes `qp`'s moves that wait, oldest first.
    pub(super) fn take_waiting(&mut self, qp: QpNum) -> Vec<Vec<QpAttr>> {
        if !self.started.iter().any(|s| s.qp == qp) {
            return Vec::new();
        }
        let (mine, others): (VecDeque<_>, _) = std::mem::take(&mut self.started)
            .into_iter()
            .partition(|s| s.qp == qp);
        self.started = others;
        mine.into_iter().map(|s| s.attrs).collect()
    }

    /// Forgets `qp`'s moves and results (it is being destroyed).
    pub(super) fn forget(&mut self, qp: QpNum) {
        self.started.retain(|s| s.qp != qp);
        self.done.retain(|m| m.qp != qp);
    }

    /// A result, for [`LaterMoves::next_done`].
    pub(super) fn push_done(&mut self, m: Moved) {
        self.done.push_back(m);
    }

    /// The next result.
    pub(super) fn next_done(&mut self) -> Option<Moved> {
        self.done.pop_front()
    }
}
