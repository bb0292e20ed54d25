//! The software provider with the mio poll that wakes a tool's event loop, and the linger
//! that keeps a finished run answering its peer.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use mio::{Events, Poll};

use super::PingpongError;
use crate::driver::ProviderSources;
use crate::soft::provider::{SoftProvider, UdpOffload};
use crate::soft::{FaultConfig, SoftConfig, SoftVerbs};
use crate::verbs::{PathMtu, Provider};
use crate::wire::cm::LocalAckTimeout;

/// Where and how a tool's software provider runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SoftLink {
    /// Local underlay address.
    pub(crate) local: IpAddr,
    /// UDP port of RoCEv2 traffic, both directions.
    pub(crate) udp_port: u16,
    /// Verify the ICRC of IPv4 packets.
    pub(crate) verify_icrc_v4: bool,
    /// Fault injection on what this side sends.
    pub(crate) faults: FaultConfig,
    /// UDP GSO/GRO.
    pub(crate) offload: UdpOffload,
}

/// The software provider with the mio poll that wakes a tool's event loop.
pub(crate) struct SoftLoop {
    /// The provider (its socket is registered with the poll).
    pub(crate) prov: SoftProvider,
    sources: ProviderSources,
    poll: Poll,
    events: Events,
}

impl SoftLoop {
    /// Binds the provider (port MTU 4096) and registers it with a new poll.
    ///
    /// # Errors
    /// [`PingpongError::Bind`] if the socket cannot be bound, or the poll's error.
    pub(crate) fn bind(link: &SoftLink) -> Result<Self, PingpongError> {
        let mut cfg = SoftConfig::new(link.local);
        cfg.src_port = link.udp_port;
        cfg.dst_port = link.udp_port;
        cfg.port_mtu = PathMtu::Mtu4096;
        cfg.verify_icrc_v4 = link.verify_icrc_v4;
        cfg.faults = link.faults;
        let prov = SoftProvider::bind(cfg, link.offload).map_err(|source| PingpongError::Bind {
            local: link.local,
            port: link.udp_port,
            source,
        })?;
        let poll = Poll::new()?;
        let sources = ProviderSources::register(poll.registry(), &prov, 0)?;
        Ok(Self {
            prov,
            sources,
            poll,
            events: Events::with_capacity(64),
        })
    }

    /// Sleeps until the socket is ready, the provider's next timer or `other` is due, or
    /// `cap` has passed, whichever is first.
    ///
    /// # Errors
    /// The poll's error.
    pub(crate) fn wait(
        &mut self,
        cap: Duration,
        other: Option<Instant>,
    ) -> Result<(), PingpongError> {
        let now = Instant::now();
        let timeout = [self.prov.poll_timeout(), other]
            .into_iter()
            .flatten()
            .map(|t| t.saturating_duration_since(now))
            .fold(cap, Duration::min);
        self.sources.sync(self.poll.registry(), &self.prov)?;
        // No readiness is passed on: the provider then reads its socket on every turn.
        self.poll.poll(&mut self.events, Some(timeout))?;
        Ok(())
    }
}

/// Keeps a run's loop turning for a while after its last completion: the peer may still be
/// waiting for an ACK that got lost, and only this side can re-ACK its retransmission. The
/// while is eight local ACK timeouts (`4.096 µs · 2^qp_timeout`) plus 20 ms, at most 2 s;
/// `turn(ctx, now, cap)` does one pass of I/O and sleeps at most `cap`.
///
/// # Errors
/// What `turn` returns.
pub(crate) fn linger<C>(
    ctx: &mut C,
    qp_timeout: u8,
    mut turn: impl FnMut(&mut C, Instant, Duration) -> Result<(), PingpongError>,
) -> Result<(), PingpongError> {
    let interval = LocalAckTimeout::saturating(qp_timeout).duration();
    let linger = (interval * 8 + Duration::from_millis(20)).min(Duration::from_secs(2));
    let end = Instant::now() + linger;
    for _ in 0..100_000 {
        let now = Instant::now();
        if now >= end {
            break;
        }
        turn(ctx, now, (end - now).min(Duration::from_millis(10)))?;
    }
    Ok(())
}

/// The provider's counters, one line, for the end of a run.
pub(crate) fn stats_line(v: &SoftVerbs) -> String {
    let s = v.stats();
    format!(
        "soft-rc: tx_packets={} retransmits={} timeouts={} acks={} seq_naks_tx={} rnr_naks_tx={} rx_datagrams={} rx_bad_icrc={} rx_duplicate={} rx_out_of_sequence={} injected_loss={} injected_dup={} injected_reorder={} injected_corrupt={}",
        s.tx_packets,
        s.tx_retransmits,
        s.retransmit_timeouts,
        s.tx_acks,
        s.tx_seq_naks,
        s.tx_rnr_naks,
        s.rx_datagrams,
        s.rx_bad_icrc,
        s.rx_duplicate,
        s.rx_out_of_sequence,
        s.faults.dropped,
        s.faults.duplicated,
        s.faults.reordered,
        s.faults.corrupted
    )
}
