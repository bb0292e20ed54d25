//! The requester's round-trip time estimate (RFC 6298's SRTT and RTTVAR), from which its
//! retransmit timeout follows the path.
//!
//! Samples are taken as TCP takes them under Karn's rule: one PSN at a time is timed from its
//! first transmission to the acknowledgement that covers it, and a go-back-N over it cancels
//! the measurement (an acknowledgement of a resent PSN does not say which copy it answers).

use std::time::Duration;

/// The clock granularity term of RFC 6298's RTO: the event loop's timers fire to the
/// millisecond.
const GRANULARITY: Duration = Duration::from_millis(1);
/// The timeout derived from the estimate never exceeds this (the QP's local ACK timeout may).
pub(super) const MAX_RTT_TIMEOUT: Duration = Duration::from_secs(1);

/// SRTT and RTTVAR of one QP's path.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RttEstimator {
    /// Smoothed round-trip time; `None` before the first sample.
    srtt: Option<Duration>,
    /// Round-trip time variation.
    rttvar: Duration,
}

impl RttEstimator {
    /// Folds in one round-trip measurement (RFC 6298 2.2 and 2.3: gains 1/8 and 1/4).
    pub(super) fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let err = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    /// The smoothed round-trip time, once measured.
    pub(super) fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// RFC 6298's RTO, `SRTT + max(G, 4 · RTTVAR)`, at most [`MAX_RTT_TIMEOUT`]; `None`
    /// before the first sample.
    pub(super) fn timeout(&self) -> Option<Duration> {
        self.srtt
            .map(|s| (s + GRANULARITY.max(self.rttvar * 4)).min(MAX_RTT_TIMEOUT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn first_sample_sets_srtt_and_half_of_it_as_variation() {
        let mut e = RttEstimator::default();
        assert_eq!(e.timeout(), None);
        e.sample(40 * MS);
        assert_eq!(e.srtt(), Some(40 * MS));
        assert_eq!(e.timeout(), Some(120 * MS));
    }

    #[test]
    fn a_steady_path_converges_and_the_floor_is_the_granularity() {
        let mut e = RttEstimator::default();
        for _ in 0..200 {
            e.sample(Duration::from_micros(100));
        }
        assert_eq!(e.srtt(), Some(Duration::from_micros(100)));
        assert_eq!(e.timeout(), Some(Duration::from_micros(1100)));
    }

    #[test]
    fn jitter_widens_the_timeout_and_it_is_capped() {
        let mut e = RttEstimator::default();
        for i in 0..100u32 {
            e.sample(if i % 2 == 0 { 10 * MS } else { 30 * MS });
        }
        let t = e.timeout().unwrap();
        assert!(t > 50 * MS && t < 100 * MS, "{t:?}");
        e.sample(Duration::from_secs(30));
        assert_eq!(e.timeout(), Some(MAX_RTT_TIMEOUT));
    }
}
