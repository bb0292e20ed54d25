//! Surviving a lost device context (`IBV_EVENT_DEVICE_FATAL`, a CQ or SRQ error): the node
//! forgets every connection, keeps the interface up (packets for peers are read from the TUN
//! device and dropped, counted in `device_down_drops`) and opens the device again with a
//! doubling delay ([`ReopenBackoff`]); once open it builds the CM transport's QP1 and the
//! endpoint anew, with the configuration the old endpoint had. Peers see a node that restarted
//! and reconnect. After [`REOPEN_MAX_FAILURES`] failed tries in a row the node gives up
//! ([`Node::device_gave_up`]): the daemon exits with one line and its own code, for the
//! service manager to restart it. So it does at once with a CM transport or an SA client that
//! belongs to the device (the kernel's CM, umad), which is not reopened in place, and on an
//! interface of several workers (`--workers`: a follower's interface and views, control's MAD
//! routing and the shared RX budget are not rebuilt in place). On the
//! kernel's CM the listener's `RDMA_CM_EVENT_DEVICE_REMOVAL` (`rdma link delete`, a driver
//! unload), and on umad a read that says the port's agents are dead, count as a lost context
//! too: the kernel's removal waits until every id and file on the device is let go, which
//! the daemon's exit does.

use std::io;
use std::time::{Duration, Instant};

use mio::Registry;

use super::{is_interface_gone, Node};
use crate::driver::{KernelCmDriver, ProviderSources};
use crate::ipoib::Endpoint;
use crate::mad::{CmTransport, Gsi};
use crate::verbs::setup::os_seed;
use crate::verbs::{AsyncEvent, Provider};
use crate::wire::WorkerCount;

/// Why the node could not be rebuilt on its reopened device.
#[derive(Debug, thiserror::Error)]
pub(super) enum RebuildError {
    /// The provider could not open the device again.
    #[error(transparent)]
    Reopen(#[from] crate::verbs::ReopenError),
    /// Its descriptors could not be registered with the event loop.
    #[error("event loop registration: {0}")]
    Register(#[source] io::Error),
    /// The reopened device has another number of descriptors.
    #[error("the reopened device has {now} descriptors, not {before}")]
    Descriptors {
        /// Now.
        now: usize,
        /// Before.
        before: usize,
    },
    /// The CM's QP1 could not be set up.
    #[error("QP1: {0}")]
    Qp1(#[source] crate::verbs::VerbsError),
    /// The interface could not be set up.
    #[error("interface set-up: {0}")]
    Endpoint(#[source] crate::verbs::VerbsError),
}

/// The delay before the first reopen.
pub const REOPEN_FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest delay between two reopens (the delay doubles up to it).
pub const REOPEN_MAX_DELAY: Duration = Duration::from_secs(10);
/// Failed reopens in a row after which the node gives up (about ten minutes of tries).
pub const REOPEN_MAX_FAILURES: u32 = 64;

/// What the node counted of its device (in the status's `provider` map).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStats {
    /// Events that lost the device context (`DEVICE_FATAL`, `CQ_ERR`, `SRQ_ERR`, and on the
    /// kernel's CM the listener's `DEVICE_REMOVAL`).
    pub device_fatal_events: u64,
    /// Times the device was opened again and the interface rebuilt on it.
    pub device_reopens: u64,
    /// Reopens (or rebuilds on the reopened device) that failed.
    pub device_reopen_failures: u64,
    /// Packets read from the TUN device and dropped while the device was down.
    pub device_down_drops: u64,
    /// `GID_CHANGE` events (the interface keeps the GID it started with).
    pub gid_changes: u64,
}

/// When to try the next reopen: [`REOPEN_FIRST_DELAY`] after the loss, then a delay that
/// doubles after each failure, up to [`REOPEN_MAX_DELAY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReopenBackoff {
    next_at: Instant,
    delay: Duration,
    failures: u32,
}

impl ReopenBackoff {
    /// The backoff of a context lost at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            next_at: now + REOPEN_FIRST_DELAY,
            delay: REOPEN_FIRST_DELAY,
            failures: 0,
        }
    }

    /// When the next try is due.
    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    /// Failed tries so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A try failed at `now`: the next one is due after twice the delay (at most
    /// [`REOPEN_MAX_DELAY`]). Returns false once [`REOPEN_MAX_FAILURES`] tries failed in a row.
    pub fn failed(&mut self, now: Instant) -> bool {
        self.failures += 1;
        self.delay = (self.delay * 2).min(REOPEN_MAX_DELAY);
        self.next_at = now + self.delay;
        self.failures < REOPEN_MAX_FAILURES
    }
}

impl<P: Provider> Node<P> {
    /// Acts on the device events the endpoint passed on; true when the context was lost (the
    /// rest of the turn is skipped).
    pub(super) fn take_device_events(&mut self, now: Instant) -> bool {
        let removed = self
            .kcm
            .as_ref()
            .is_some_and(KernelCmDriver::device_removed)
            || self.mad.device_gone();
        if removed && self.down.is_none() {
            self.device_stats.device_fatal_events += 1;
            tracing::warn!(
                cm_transport = self.cm_transport.as_str(),
                "the device is being removed; its connections are forgotten"
            );
            self.down = Some(ReopenBackoff::new(now));
        }
        while let Some(ev) = self.ep.take_device_event() {
            if ev == AsyncEvent::PortActive {
                self.port_active = true;
            } else if ev == AsyncEvent::GidChange {
                self.device_stats.gid_changes += 1;
                tracing::warn!(
                    "the port's GID table changed; the interface keeps the GID it started with (restart the daemon if its address changed)"
                );
            } else if ev.loses_context() && self.down.is_none() {
                self.device_stats.device_fatal_events += 1;
                tracing::warn!(
                    event = ?ev,
                    "device context lost; its connections are forgotten and the device is opened again (first try in {REOPEN_FIRST_DELAY:?})"
                );
                self.down = Some(ReopenBackoff::new(now));
            }
        }
        self.down.is_some()
    }

    /// A turn while the device is down: the provider's input is read and dropped by it, the
    /// TUN device's packets are read and dropped (counted).
    pub(super) fn turn_down(&mut self, now: Instant) {
        if let Err(e) = self.prov.handle_input(now) {
            tracing::debug!(error = %e, "provider input while the device is down");
        }
        self.tun_more = false;
        if self.interface_removed || !self.tun_ready {
            return;
        }
        for i in 0..super::TUN_BATCH {
            match self.tun.recv(&mut self.drain_buf) {
                Ok(Some(_)) => self.device_stats.device_down_drops += 1,
                Ok(None) => {
                    self.tun_ready = false;
                    return;
                }
                Err(e) if is_interface_gone(&e) => {
                    self.interface_removed = true;
                    self.tun_ready = false;
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "TUN read while the device is down");
                    return;
                }
            }
            if i + 1 == super::TUN_BATCH {
                self.tun_more = true;
            }
        }
    }

    /// Tries to open the device again when the backoff says so, and on success builds the
    /// CM transport's QP1 (where the CM uses it) and a new endpoint with the old one's
    /// configuration and counters.
    pub(super) fn try_reopen(&mut self, now: Instant, registry: &Registry) {
        let Some(mut backoff) = self.down else {
            return;
        };
        if now < backoff.next_at() || self.gave_up.is_some() || self.stop_deadline.is_some() {
            return;
        }
        if matches!(self.cm_transport, CmTransport::RdmaCm | CmTransport::Umad) {
            // The kernel's CM ids, or the umad agent, belong to the lost device and are not
            // opened again in place: the service manager's restart opens everything anew.
            self.gave_up = Some(format!(
                "device context lost; --cm-transport {} is not reopened in place",
                self.cm_transport.as_str()
            ));
            return;
        }
        if self.sa.is_some() {
            // So does the SA client's umad agent.
            self.gave_up =
                Some("device context lost; the SA client is not reopened in place".into());
            return;
        }
        let workers = self.ep.worker_slot().count();
        if workers != WorkerCount::ONE {
            // A follower is rebuilt from control's interface and views, control's QP1 with
            // the workers' MAD routing, and their shared RX budget: none of which a reopen in
            // place gives back. The service manager's restart opens everything anew.
            self.gave_up = Some(format!(
                "device context lost; an interface of {workers} workers is not reopened in place"
            ));
            return;
        }
        let result = self.reopen(now, registry);
        match result {
            Ok(()) => {
                self.device_stats.device_reopens += 1;
                self.down = None;
                self.tun_ready = true;
                tracing::info!(
                    tries = backoff.failures() + 1,
                    hwaddr = %self.ep.hwaddr(),
                    "device opened again; the interface is rebuilt on it and peers reconnect"
                );
            }
            Err(why) => {
                self.device_stats.device_reopen_failures += 1;
                let again = backoff.failed(now);
                tracing::warn!(
                    tries = backoff.failures(),
                    error = %why,
                    "could not open the device again; next try in {:?}",
                    backoff.next_at().saturating_duration_since(now)
                );
                if !again {
                    self.gave_up = Some(format!(
                        "device context lost and {} reopens failed; last: {why}",
                        backoff.failures()
                    ));
                }
                self.down = Some(backoff);
            }
        }
    }

    fn reopen(&mut self, now: Instant, registry: &Registry) -> Result<(), RebuildError> {
        self.sources.deregister(registry);
        let reopened = self.prov.reopen();
        self.sources = ProviderSources::register(registry, &self.prov, self.first_token)
            .map_err(RebuildError::Register)?;
        reopened?;
        if self.sources.len() != self.source_count {
            // The tokens after the provider's are the node's others.
            return Err(RebuildError::Descriptors {
                now: self.sources.len(),
                before: self.source_count,
            });
        }
        if self.cm_transport == CmTransport::Qp1 {
            let gsi = Gsi::open_for_cm(self.prov.verbs()).map_err(RebuildError::Qp1)?;
            self.mad = Box::new(gsi);
        }
        let mut cfg = self.ep.config().clone();
        // New CM ids and PSNs: the peers must not take them for the old connections'.
        cfg.seed = os_seed();
        let mut ep = Endpoint::new(now, self.prov.verbs(), cfg, self.mad.provider_qp())
            .map_err(RebuildError::Endpoint)?;
        self.log_events(now);
        ep.carry_counters(self.ep.counters());
        self.ep = ep;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_to_its_bound_and_the_node_gives_up_after_the_last_failure() {
        let t0 = Instant::now();
        let mut b = ReopenBackoff::new(t0);
        assert_eq!(b.next_at(), t0 + REOPEN_FIRST_DELAY);
        let mut delays = Vec::new();
        let mut now = b.next_at();
        for _ in 0..8 {
            assert!(b.failed(now));
            delays.push(b.next_at() - now);
            now = b.next_at();
        }
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        while b.failures() < REOPEN_MAX_FAILURES - 1 {
            assert!(b.failed(now));
        }
        assert!(!b.failed(now), "gives up after {REOPEN_MAX_FAILURES}");
    }
}
