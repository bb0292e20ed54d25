//! [`EventLog`]: log lines by kind, each kind at most [`EVENT_LINES_PER_WINDOW`] lines per
//! [`EVENT_LOG_WINDOW`]; what a kind had beyond that is one line with its count when the
//! window ends. The endpoint's connection events go through one, by event name (`what`): a
//! flood of forged neighbour announcements (each one an evict and a relearn) writes a few
//! lines per window, not one per packet, and the events of other kinds keep their own budget.
//! The daemon's logger holds one for every warning and error, by the line's place in the code
//! (`daemon::logging`). Pure: `now` comes in with every call.

use std::time::{Duration, Instant};

/// How long one budget of lines lasts.
pub(crate) const EVENT_LOG_WINDOW: Duration = Duration::from_secs(10);

/// Lines of one kind logged per [`EVENT_LOG_WINDOW`].
pub(crate) const EVENT_LINES_PER_WINDOW: u32 = 20;

/// One kind's window.
#[derive(Debug, Clone, Copy)]
struct Kind<K> {
    what: K,
    started: Instant,
    logged: u32,
    suppressed: u64,
}

/// The per-kind budgets. The kinds must be a fixed set (event names, places in the code): one
/// window is kept per kind ever seen.
#[derive(Debug)]
pub(crate) struct EventLog<K = &'static str> {
    kinds: Vec<Kind<K>>,
}

impl<K> Default for EventLog<K> {
    fn default() -> Self {
        Self { kinds: Vec::new() }
    }
}

/// What to do with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Log it.
    Log,
    /// Do not: its kind spent its lines of this window (it is counted).
    Suppress,
}

impl<K: Copy + PartialEq> EventLog<K> {
    /// An event of kind `what` at `now`: whether to log it, and before it, the kinds whose
    /// window ended with events suppressed (`(what, count)`, through `ended`).
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        what: K,
        mut ended: impl FnMut(K, u64),
    ) -> Verdict {
        self.roll(now, &mut ended);
        let k = match self.kinds.iter_mut().position(|k| k.what == what) {
            Some(i) => &mut self.kinds[i],
            None => {
                self.kinds.push(Kind {
                    what,
                    started: now,
                    logged: 0,
                    suppressed: 0,
                });
                let last = self.kinds.len() - 1;
                &mut self.kinds[last]
            }
        };
        if k.logged < EVENT_LINES_PER_WINDOW {
            k.logged += 1;
            Verdict::Log
        } else {
            k.suppressed += 1;
            Verdict::Suppress
        }
    }

    /// Ends the windows that are over at `now`, reporting each one's suppressed count.
    pub(crate) fn roll(&mut self, now: Instant, mut ended: impl FnMut(K, u64)) {
        for k in &mut self.kinds {
            if now.saturating_duration_since(k.started) >= EVENT_LOG_WINDOW {
                if k.suppressed > 0 {
                    ended(k.what, k.suppressed);
                }
                k.started = now;
                k.logged = 0;
                k.suppressed = 0;
            }
        }
    }

    /// When the earliest window with suppressed events ends (its count is due then).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.kinds
            .iter()
            .filter(|k| k.suppressed > 0)
            .map(|k| k.started + EVENT_LOG_WINDOW)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_logs_its_budget_per_window_then_one_count() {
        let mut log = EventLog::default();
        let t0 = Instant::now();
        let mut ended = Vec::new();
        let mut verdicts = Vec::new();
        for i in 0..10_000u64 {
            let now = t0 + Duration::from_micros(100 * i);
            verdicts.push(log.admit(now, "neighbour resolved", |w, n| ended.push((w, n))));
        }
        let logged = verdicts.iter().filter(|v| **v == Verdict::Log).count();
        assert_eq!(logged, EVENT_LINES_PER_WINDOW as usize);
        assert!(ended.is_empty());
        assert_eq!(log.poll_timeout(), Some(t0 + EVENT_LOG_WINDOW));
        // Another kind has its own budget.
        assert_eq!(
            log.admit(t0 + Duration::from_secs(1), "tx failed", |_, _| {}),
            Verdict::Log
        );
        log.roll(t0 + EVENT_LOG_WINDOW, |w, n| ended.push((w, n)));
        assert_eq!(
            ended,
            vec![(
                "neighbour resolved",
                10_000 - u64::from(EVENT_LINES_PER_WINDOW)
            )]
        );
        assert_eq!(log.poll_timeout(), None);
        assert_eq!(
            log.admit(t0 + EVENT_LOG_WINDOW, "neighbour resolved", |_, _| {}),
            Verdict::Log
        );
    }
}
