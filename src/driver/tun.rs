//! The TUN side of a turn: packets between the TUN device and the endpoint's buffers.

use std::io;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use crate::ipoib::{Endpoint, TUN_BUFFER_OFFSET};
use crate::sys::tun::Tun;
use crate::verbs::Verbs;

/// What [`read_tun`] did.
pub(super) enum TunRead {
    /// Read and handled a packet.
    Packet,
    /// Nothing was waiting.
    Empty,
    /// Read nothing: no send buffer is free.
    NoSendBuffer,
}

/// Reads one packet from the TUN device into one of the endpoint's send buffers (a packet for
/// an established connection then leaves from there) and hands it over. With none free,
/// reads nothing, unless `draining` (shutting down: the packet is read into `buf` and handed
/// over, to be dropped or queued as the endpoint sees fit).
pub(super) fn read_tun<V: Verbs>(
    tun: &Tun,
    ep: &mut Endpoint,
    v: &mut V,
    now: Instant,
    buf: &mut [u8],
    draining: bool,
) -> io::Result<TunRead> {
    let Some(b) = ep.tun_buffer() else {
        if !draining {
            return Ok(TunRead::NoSendBuffer);
        }
        let Some(n) = tun.recv(buf)? else {
            return Ok(TunRead::Empty);
        };
        ep.handle_tun_packet(now, v, buf.get(..n).unwrap_or_default());
        return Ok(TunRead::Packet);
    };
    let got = match v
        .pools_mut()
        .get_mut(b)
        .ok()
        .and_then(|room| room.get_mut(TUN_BUFFER_OFFSET..))
    {
        Some(room) => tun.recv(room),
        None => Ok(None),
    };
    match got {
        Ok(Some(n)) => {
            ep.handle_tun_buffer(now, v, b, n);
            Ok(TunRead::Packet)
        }
        Ok(None) => {
            ep.return_tun_buffer(b);
            Ok(TunRead::Empty)
        }
        Err(e) => {
            ep.return_tun_buffer(b);
            Err(e)
        }
    }
}

/// What the TUN device took from the node: the host's receive side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TunStats {
    /// IP packets written to the TUN device.
    pub written: u64,
    /// Their bytes.
    pub written_bytes: u64,
    /// Packets the TUN device refused (its queue was full, or the write failed).
    pub write_drops: u64,
}

/// Writes the packets the endpoint delivered to the TUN device (straight from their receive
/// buffers), at most `max` of them, counting them in `stats`; returns how many it took from
/// the endpoint and whether it wrote any.
pub(super) fn write_tun<V: Verbs>(
    tun: &Tun,
    ep: &mut Endpoint,
    v: &mut V,
    max: usize,
    stats: &mut TunStats,
) -> (usize, bool) {
    let mut wrote = false;
    let taken = ep.drain_tun_at_most(v, max, |p| match tun.send(p) {
        Ok(true) => {
            wrote = true;
            stats.written += 1;
            stats.written_bytes += p.len() as u64;
        }
        Ok(false) => stats.write_drops += 1,
        Err(e) => {
            stats.write_drops += 1;
            tracing::debug!(error = %e, "TUN write failed");
        }
    });
    (taken, wrote)
}

/// A TUN device that takes at most `rate` packets a second (`--fault-tun-rate`, a test
/// fault): a host slower than the fabric. The packets beyond it wait in the endpoint's queue,
/// the RC ones in their receive buffers, as they would behind a busy host.
#[derive(Debug, Clone, Copy)]
pub(super) struct TunThrottle {
    rate: NonZeroU32,
    /// Packets that may be written now: at most [`TunThrottle::BURST`] worth of the rate.
    allowance: f64,
    /// When `allowance` was last brought up to date.
    at: Instant,
}

impl TunThrottle {
    /// The most the allowance saves up while the queue is empty.
    const BURST: Duration = Duration::from_millis(10);

    pub(super) fn new(now: Instant, rate: NonZeroU32) -> Self {
        Self {
            rate,
            allowance: 1.0,
            at: now,
        }
    }

    fn rate(&self) -> f64 {
        f64::from(self.rate.get())
    }

    /// How many packets may be written at `now`.
    pub(super) fn budget(&mut self, now: Instant) -> usize {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * self.rate();
        let most = (Self::BURST.as_secs_f64() * self.rate()).max(1.0);
        self.allowance = (self.allowance + earned).min(most);
        self.at = now;
        self.allowance.max(0.0) as usize
    }

    /// `n` packets of the last [`budget`](Self::budget) were written.
    pub(super) fn spend(&mut self, n: usize) {
        self.allowance -= n as f64;
    }

    /// When the next packet may be written.
    pub(super) fn next_at(&self) -> Instant {
        let short = (1.0 - self.allowance).max(0.0);
        self.at + Duration::from_secs_f64(short / self.rate())
    }
}
