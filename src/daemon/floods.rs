//! Rate-limited warnings for floods of bad input: at most one line per kind (a drop counter
//! of the status) per [`FLOOD_WARN_INTERVAL`], carrying how many arrived since the last line.

use std::time::{Duration, Instant};

/// Shortest time between two warnings of one kind.
pub(crate) const FLOOD_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// How often the daemon looks at the counters.
pub(crate) const FLOOD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// One kind's state.
#[derive(Debug, Clone)]
struct Kind {
    name: String,
    /// The counter's value at the last warning (or when first seen).
    reported: u64,
    /// When the last warning went out.
    warned_at: Option<Instant>,
}

/// The warner: fed the drop counters by name, it says which deserve a line now.
#[derive(Debug, Default)]
pub(crate) struct FloodWarnings {
    /// One entry per kind ever seen; the kinds are the status's drop counters, a fixed list.
    kinds: Vec<Kind>,
    /// When the counters were last looked at.
    checked_at: Option<Instant>,
}

impl FloodWarnings {
    /// True when [`FLOOD_CHECK_INTERVAL`] has passed since the last [`FloodWarnings::observe`].
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.checked_at
            .is_none_or(|t| now.saturating_duration_since(t) >= FLOOD_CHECK_INTERVAL)
    }

    /// Takes the counters' values at `now`; returns `(kind, count)` for each kind that grew and
    /// was not warned of in the last [`FLOOD_WARN_INTERVAL`]: `count` is what arrived since the
    /// last warning (the lines suppressed meanwhile are in it).
    pub(crate) fn observe<'a>(
        &mut self,
        now: Instant,
        counters: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Vec<(String, u64)> {
        self.checked_at = Some(now);
        let mut out = Vec::new();
        for (name, v) in counters {
            let i = match self.kinds.iter().position(|k| k.name == name) {
                Some(i) => i,
                None => {
                    self.kinds.push(Kind {
                        name: name.to_owned(),
                        reported: 0,
                        warned_at: None,
                    });
                    self.kinds.len() - 1
                }
            };
            let Some(k) = self.kinds.get_mut(i) else {
                continue;
            };
            let quiet = k
                .warned_at
                .is_none_or(|t| now.saturating_duration_since(t) >= FLOOD_WARN_INTERVAL);
            if v > k.reported && quiet {
                out.push((k.name.clone(), v - k.reported));
                k.reported = v;
                k.warned_at = Some(now);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_interval_with_the_count_since_the_last() {
        let t0 = Instant::now();
        let mut w = FloodWarnings::default();
        assert!(w.due(t0));
        assert_eq!(w.observe(t0, [("rx_bad_icrc", 0)]), vec![]);
        // The first drop warns at once.
        let got = w.observe(t0 + Duration::from_secs(1), [("rx_bad_icrc", 3)]);
        assert_eq!(got, vec![("rx_bad_icrc".to_owned(), 3)]);
        assert!(!w.due(t0 + Duration::from_millis(1500)));
        // A flood for the next nine seconds: silent, another kind still warns.
        for s in 2..11 {
            let got = w.observe(
                t0 + Duration::from_secs(s),
                [("rx_bad_icrc", 3 + 1000 * s), ("rx_bad_pkey", 0)],
            );
            assert_eq!(got, vec![], "second {s}");
        }
        let got = w.observe(
            t0 + Duration::from_secs(11),
            [("rx_bad_icrc", 12_003), ("rx_bad_pkey", 1)],
        );
        assert_eq!(
            got,
            vec![
                ("rx_bad_icrc".to_owned(), 12_000),
                ("rx_bad_pkey".to_owned(), 1)
            ]
        );
        // Quiet: no line.
        assert_eq!(
            w.observe(t0 + Duration::from_secs(30), [("rx_bad_icrc", 12_003)]),
            vec![]
        );
    }
}
