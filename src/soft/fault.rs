//! Seeded fault injection and provider quirks.
//!
//! [`FaultInjector`] sits between the engine and the wire, on the transmit side: each datagram
//! the provider emits may be dropped, duplicated, held back behind the next one (reordered) or
//! have one bit flipped (corrupted), with independent percentages and a seeded RNG, so a test
//! that fails replays exactly. [`Quirks`] make the provider break its contract on purpose, the
//! way real providers have, so the layers above can prove they survive it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Fault percentages (0.0..=100.0) applied to transmitted datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Percentage of datagrams dropped.
    pub loss_pct: f64,
    /// Percentage of datagrams sent twice.
    pub dup_pct: f64,
    /// Percentage of datagrams held back and sent after the next one.
    pub reorder_pct: f64,
    /// Percentage of datagrams with one bit flipped (never in the ICRC-masked BTH byte, so every
    /// corruption is detectable).
    pub corrupt_pct: f64,
    /// RNG seed.
    pub seed: u64,
    /// The device context is lost this long after the engine's first timer turn, once
    /// ([`SoftVerbs::fail_device`](super::SoftVerbs::fail_device): the injected
    /// `IBV_EVENT_DEVICE_FATAL`); `None`: never.
    pub device_fatal_after: Option<Duration>,
}

impl FaultConfig {
    /// True when no fault is configured.
    pub fn is_clean(&self) -> bool {
        self.loss_pct <= 0.0
            && self.dup_pct <= 0.0
            && self.reorder_pct <= 0.0
            && self.corrupt_pct <= 0.0
    }

    /// Checks every percentage is within 0..=100; names the bad field.
    ///
    /// # Errors
    /// The name of the first out-of-range field.
    pub fn validate(&self) -> Result<(), &'static str> {
        let fields = [
            (self.loss_pct, "fault-loss"),
            (self.dup_pct, "fault-dup"),
            (self.reorder_pct, "fault-reorder"),
            (self.corrupt_pct, "fault-corrupt"),
        ];
        for (v, name) in fields {
            if !(0.0..=100.0).contains(&v) {
                return Err(name);
            }
        }
        Ok(())
    }
}

/// Deliberate contract violations, modelled on real provider bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quirks {
    /// WRs posted to a QP already in ERR never complete (ehca's missing flush completion, which
    /// leaks IPoIB-CM RX QPs in Linux).
    pub drain_never: bool,
    /// `QpLastWqeReached` is never raised.
    pub no_last_wqe: bool,
    /// `QpLastWqeReached` is raised twice.
    pub dup_last_wqe: bool,
    /// `QpLastWqeReached` is raised again on every later move to ERR (rxe in Linux 6.12).
    pub last_wqe_again: bool,
    /// Destroying a QP removes its completions still queued on its CQs, as mlx5's rdma-core
    /// does (`mlx5_cq_clean`): the receives among them that came from an SRQ go back onto the
    /// SRQ, posted again (`mlx5_free_srq_wqe`), the buffers of the others are freed.
    pub clean_cq_on_destroy: bool,
    /// QP moves started with [`Verbs::begin_moves`](crate::verbs::Verbs::begin_moves) are
    /// done [`MOVES_LATER_BY`](super::MOVES_LATER_BY) later, by the engine's timers, their
    /// results polled then, as the hardware provider's command thread does them (a contract
    /// the trait allows, not a violation: the quirk makes a test take that path).
    pub moves_later: bool,
}

/// Counters of injected faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct FaultStats {
    /// Datagrams dropped.
    pub dropped: u64,
    /// Datagrams duplicated.
    pub duplicated: u64,
    /// Datagrams reordered.
    pub reordered: u64,
    /// Datagrams corrupted.
    pub corrupted: u64,
}

/// Applies [`FaultConfig`] to a stream of outgoing datagrams.
#[derive(Debug)]
pub struct FaultInjector {
    cfg: FaultConfig,
    rng: ChaCha8Rng,
    held: Option<(SocketAddr, Vec<u8>)>,
    ready: VecDeque<(SocketAddr, Vec<u8>)>,
    stats: FaultStats,
}

/// Byte offset of the ICRC-masked BTH byte (FECN/BECN/resv6a) within a RoCEv2 datagram.
const MASKED_BTH_BYTE: usize = 4;

impl FaultInjector {
    /// An injector with the given configuration.
    pub fn new(cfg: FaultConfig) -> Self {
        Self {
            cfg,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            held: None,
            ready: VecDeque::new(),
            stats: FaultStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Starts from `old`'s counters (an injector that replaces it).
    pub fn carry_stats(&mut self, old: &Self) {
        self.stats = old.stats;
    }

    fn roll(&mut self, pct: f64) -> bool {
        pct > 0.0 && self.rng.gen::<f64>() * 100.0 < pct
    }

    /// Feeds one datagram in; what should go out is read with [`FaultInjector::pop`].
    pub fn push(&mut self, dst: SocketAddr, mut datagram: Vec<u8>) {
        if self.roll(self.cfg.loss_pct) {
            self.stats.dropped += 1;
            return;
        }
        if self.roll(self.cfg.corrupt_pct) && datagram.len() > 1 {
            let mut at = self.rng.gen_range(0..datagram.len());
            if at == MASKED_BTH_BYTE {
                at += 1;
            }
            let bit = self.rng.gen_range(0..8);
            if let Some(b) = datagram.get_mut(at) {
                *b ^= 1 << bit;
                self.stats.corrupted += 1;
            }
        }
        if self.roll(self.cfg.dup_pct) {
            self.stats.duplicated += 1;
            self.ready.push_back((dst, datagram.clone()));
        }
        if self.held.is_none() && self.roll(self.cfg.reorder_pct) {
            self.stats.reordered += 1;
            self.held = Some((dst, datagram));
            return;
        }
        self.ready.push_back((dst, datagram));
        if let Some(h) = self.held.take() {
            self.ready.push_back(h);
        }
    }

    /// The next datagram to put on the wire.
    pub fn pop(&mut self) -> Option<(SocketAddr, Vec<u8>)> {
        self.ready.pop_front()
    }

    /// Releases a datagram held for reordering when nothing else is coming.
    pub fn flush_held(&mut self) {
        if let Some(h) = self.held.take() {
            self.ready.push_back(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "198.18.0.2:4791".parse().unwrap()
    }

    #[test]
    fn clean_config_passes_everything_in_order() {
        let mut f = FaultInjector::new(FaultConfig::default());
        for i in 0..10u8 {
            f.push(addr(), vec![i; 20]);
        }
        let out: Vec<u8> = std::iter::from_fn(|| f.pop()).map(|(_, d)| d[0]).collect();
        assert_eq!(out, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn rates_are_roughly_honoured_and_seeded() {
        let cfg = FaultConfig {
            loss_pct: 10.0,
            dup_pct: 5.0,
            reorder_pct: 5.0,
            corrupt_pct: 5.0,
            seed: 7,
            device_fatal_after: None,
        };
        let run = || {
            let mut f = FaultInjector::new(cfg);
            let mut out = Vec::new();
            for i in 0..10_000u32 {
                f.push(addr(), i.to_be_bytes().repeat(8));
                while let Some((_, d)) = f.pop() {
                    out.push(d);
                }
            }
            f.flush_held();
            while let Some((_, d)) = f.pop() {
                out.push(d);
            }
            (f.stats(), out)
        };
        let (s, out) = run();
        assert!((800..1200).contains(&s.dropped), "{s:?}");
        assert!((300..700).contains(&s.duplicated), "{s:?}");
        assert!((300..700).contains(&s.corrupted), "{s:?}");
        assert_eq!(out.len() as u64, 10_000 - s.dropped + s.duplicated);
        assert_eq!(run(), (s, out), "same seed, same faults");
    }

    #[test]
    fn validate_names_the_field() {
        let cfg = FaultConfig {
            reorder_pct: 101.0,
            ..FaultConfig::default()
        };
        assert_eq!(cfg.validate(), Err("fault-reorder"));
    }
}
