//! What one side of a perf run measured, and how it is printed: the text line and the JSON
//! object (both parsed by the netns tests; keep their shape).

use std::time::Duration;

use super::args::Mode;

/// One-way latency figures: half of each round trip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
    /// Mean.
    pub avg: Duration,
    /// Round trips timed.
    pub samples: usize,
}

impl Latency {
    /// The figures of `round_trips` (sorted in place); `None` without any.
    pub fn of_round_trips(round_trips: &mut [Duration]) -> Option<Self> {
        round_trips.sort_unstable();
        let n = round_trips.len();
        let max = *round_trips.last()?;
        // Nearest rank: the smallest sample with at least p% of them at or below it.
        let rank = |pct: usize| round_trips[(n * pct).div_ceil(100).clamp(1, n) - 1];
        let total: Duration = round_trips.iter().sum();
        Some(Self {
            p50: rank(50) / 2,
            p99: rank(99) / 2,
            max: max / 2,
            avg: total / (2 * n as u32).max(1),
            samples: n,
        })
    }
}

/// What one side measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Bandwidth or latency.
    pub mode: Mode,
    /// This side connected (the client) rather than waited.
    pub is_client: bool,
    /// Message size in bytes.
    pub size: usize,
    /// Messages (bw) or round trips (lat).
    pub iters: u32,
    /// The measured time (see the module docs for what it spans).
    pub elapsed: Duration,
    /// With `--lat`, and at least one round trip timed.
    pub latency: Option<Latency>,
    /// The provider's counters (`soft-rc: tx_packets=… …`, one line).
    pub stats: String,
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Report {
    /// Bytes this side sent (client) or received (server): size × iters.
    pub fn bytes(&self) -> u64 {
        self.size as u64 * u64::from(self.iters)
    }

    fn side(&self) -> &'static str {
        if self.is_client {
            "client"
        } else {
            "server"
        }
    }

    /// Gbit/s over [`Report::elapsed`] (bw only).
    pub fn gbit_per_s(&self) -> Option<f64> {
        (self.mode == Mode::Bw)
            .then(|| self.bytes() as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9)
    }

    /// Messages per second over [`Report::elapsed`] (bw only).
    pub fn msg_per_s(&self) -> Option<f64> {
        (self.mode == Mode::Bw)
            .then(|| f64::from(self.iters) / self.elapsed.as_secs_f64().max(1e-9))
    }

    /// The human-readable result line.
    pub fn text(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        match (self.mode, &self.latency) {
            (Mode::Bw, _) => format!(
                "bw {side}: {bytes} bytes in {secs:.4} seconds = {gbit:.2} Gbit/s, {mps:.0} msg/s ({iters} x {size} B; {what})",
                side = self.side(),
                bytes = self.bytes(),
                gbit = self.gbit_per_s().unwrap_or(0.0),
                mps = self.msg_per_s().unwrap_or(0.0),
                iters = self.iters,
                size = self.size,
                what = if self.is_client {
                    "until the last send completed"
                } else {
                    "until the last receive completed"
                },
            ),
            (Mode::Lat, Some(l)) => format!(
                "lat {side}: {iters} x {size} B round trips in {secs:.4} seconds; one-way (RTT/2) p50 {p50:.2} us, p99 {p99:.2} us, max {max:.2} us, avg {avg:.2} us ({n} samples)",
                side = self.side(),
                iters = self.iters,
                size = self.size,
                p50 = us(l.p50),
                p99 = us(l.p99),
                max = us(l.max),
                avg = us(l.avg),
                n = l.samples,
            ),
            (Mode::Lat, None) => format!(
                "lat {side}: {iters} x {size} B round trips in {secs:.4} seconds; no round trip timed on this side",
                side = self.side(),
                iters = self.iters,
                size = self.size,
            ),
        }
    }

    /// One JSON object (one line): mode, side, size, iters, bytes, seconds, gbit_s,
    /// msg_per_s and lat_{p50,p99,max,avg}_us (null where they do not apply).
    pub fn json(&self) -> String {
        let lat = |f: fn(&Latency) -> Duration| self.latency.as_ref().map(|l| us(f(l)));
        serde_json::json!({
            "mode": self.mode.name(),
            "side": self.side(),
            "size": self.size,
            "iters": self.iters,
            "bytes": self.bytes(),
            "seconds": self.elapsed.as_secs_f64(),
            "gbit_s": self.gbit_per_s(),
            "msg_per_s": self.msg_per_s(),
            "lat_p50_us": lat(|l| l.p50),
            "lat_p99_us": lat(|l| l.p99),
            "lat_max_us": lat(|l| l.max),
            "lat_avg_us": lat(|l| l.avg),
            "lat_samples": self.latency.as_ref().map(|l| l.samples),
        })
        .to_string()
    }
}
