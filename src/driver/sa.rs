//! [`SaDriver`]: the SA client of a native InfiniBand port driven by the event loop, between
//! the umad device (`sys::umad`), the sans-IO [`SaClient`] and an [`Endpoint`] that holds its
//! multicast groups through it ([`Endpoint::use_sa_groups`]).
//!
//! Each turn, [`SaDriver::pump`] hands the endpoint's requests (joins, leaves, path queries,
//! port events) to the client, reads the MADs that arrived, runs the client's timers, hands
//! its answers back to the endpoint (records to attach and send with, paths) and sends what
//! the client queued. Nothing blocks: the umad descriptor is non-blocking and registered with
//! mio where it is a kernel descriptor; where it is not (ibsim's `umad2sim` hands out
//! descriptors of its own, which epoll refuses) the driver asks to be turned every
//! [`POLL_INTERVAL`] instead.
//!
//! # Invariants
//! - Reads per pump are bounded ([`READ_BATCH`]; more pending brings the next turn at once),
//!   as are the endpoint's requests ([`MAX_SA_REQUESTS`]) and the client's tables.
//! - Where a kernel ipoib interface runs on the same port and partition, every group is
//!   joined `shared`: its leave sends no DELETE (SA membership is per port, and ours would
//!   remove the kernel's).
//! - The SM's LID and SL are read from the port's sysfs attributes at start and again on
//!   every port event.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::ipoib::{Endpoint, PortChange, SaRequest, MAX_SA_REQUESTS};
use crate::sa::{
    GroupOptions, PathLookup, PortEvent, SaClient, SaConfig, SaCounters, SaEvent, SmAddress,
};
use crate::sys::umad::{kernel_ipoib_on, Umad, UmadPort, UmadRecv};
use crate::verbs::{PortAttr, Verbs};
use crate::wire::cm::MAD_LEN;
use crate::wire::sa::{SA_CLASS_VERSION, SA_MGMT_CLASS};
use crate::wire::{Gid, GSI_QKEY};

/// MADs read per pump at most.
pub const READ_BATCH: usize = 64;

/// How often an unregistered descriptor (under `umad2sim`) is read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// What the driver counts besides the client's [`SaCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SaDriverStats {
    /// Sends the umad device refused.
    pub send_errors: u64,
    /// Reads that failed (not counting an empty queue).
    pub recv_errors: u64,
    /// Sends the kernel reported failed (no response in its time).
    pub send_timeouts: u64,
}

/// The port the driver runs on, as its start-up line names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaPort {
    /// The device.
    pub ca: String,
    /// The port number.
    pub port: u8,
    /// The port's LID.
    pub lid: u16,
    /// The SM's LID.
    pub sm_lid: u16,
    /// The port's GID.
    pub gid: Gid,
    /// Kernel ipoib holds memberships on this port and partition: leaves send no DELETE.
    pub kernel_ipoib: bool,
}

/// The SA client of one port in the event loop: the umad agent and an [`SaClient`].
#[derive(Debug)]
pub struct SaDriver {
    /// Paths a request found in the client's cache this turn (at most one per request,
    /// handed out and cleared in the same [`SaDriver::pump`]).
    cached: Vec<(Gid, crate::wire::sa::PathRecord)>,
    port: UmadPort,
    umad: Umad,
    client: SaClient,
    kernel_ipoib: bool,
    /// The mio token, where the descriptor could be registered.
    token: Option<Token>,
    /// Unregistered: when to read next.
    next_read: Option<Instant>,
    /// The last pump stopped at [`READ_BATCH`].
    more: bool,
    /// The last pump's `now`.
    last_now: Option<Instant>,
    /// Groups whose leave is not answered yet.
    leaving: BTreeSet<Gid>,
    stats: SaDriverStats,
}

impl SaDriver {
    /// Opens the umad port of `ca` (and `port`; the first one of each if `None`), registers
    /// an SA agent and sets the client up for partition `pkey` (with its membership bit, as
    /// `--pkey` gives it).
    ///
    /// # Errors
    /// No such umad port, its attributes unreadable, or the agent refused.
    pub fn open(ca: Option<&str>, port: Option<u8>, pkey: u16) -> io::Result<Self> {
        Self::open_with(ca, port, pkey, "/sys/class/net")
    }

    fn open_with(ca: Option<&str>, port: Option<u8>, pkey: u16, net: &str) -> io::Result<Self> {
        let p = UmadPort::find(ca, port)?;
        let umad = Umad::open(p.umad, SA_MGMT_CLASS, SA_CLASS_VERSION)?;
        let sm = SmAddress {
            lid: if p.active { p.sm_lid } else { 0 },
            sl: p.sm_sl,
        };
        let kernel_ipoib = kernel_ipoib_on(net, &p.ca, p.port, pkey);
        let client = SaClient::new(SaConfig::new(Gid(p.gid), pkey), sm);
        Ok(Self {
            cached: Vec::new(),
            port: p,
            umad,
            client,
            kernel_ipoib,
            token: None,
            next_read: None,
            more: false,
            last_now: None,
            leaving: BTreeSet::new(),
            stats: SaDriverStats::default(),
        })
    }

    /// The port, for the start-up line.
    #[must_use]
    pub fn port(&self) -> SaPort {
        SaPort {
            ca: self.port.ca.clone(),
            port: self.port.port,
            lid: self.port.lid,
            sm_lid: self.port.sm_lid,
            gid: Gid(self.port.gid),
            kernel_ipoib: self.kernel_ipoib,
        }
    }

    /// Registers the umad descriptor on `token`; returns `false` where it is no kernel
    /// descriptor (then the driver is read every [`POLL_INTERVAL`]).
    pub fn register(&mut self, registry: &Registry, token: Token) -> bool {
        let fd = self.umad.as_raw_fd();
        match registry.register(&mut SourceFd(&fd), token, Interest::READABLE) {
            Ok(()) => {
                self.token = Some(token);
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "umad descriptor not pollable by epoll; reading it every {:?}", POLL_INTERVAL);
                self.token = None;
                false
            }
        }
    }

    /// Whether `token` is the driver's (its readiness needs no more than the next pump).
    #[must_use]
    pub fn note_readiness(&self, token: Token) -> bool {
        self.token == Some(token)
    }

    /// When the next pump is due without readiness: the client's next retransmission or
    /// rejoin, the next read of an unregistered descriptor, or at once after a full batch.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        // After a full batch, the next turn at once (the last pump's `now` has passed).
        let read = if self.more {
            self.last_now
        } else {
            self.next_read
        };
        [self.client.next_deadline(), read]
            .into_iter()
            .flatten()
            .min()
    }

    /// True when no leave awaits its answer.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.leaving.is_empty()
    }

    /// Asks the SA every `every` whether it still lists the port in the broadcast group, and
    /// takes a membership it lost for the port's `CLIENT_REREGISTER`: for a port whose SMA
    /// cannot tell it (a simulated one).
    pub fn check_memberships(&mut self, now: Instant, every: Duration) {
        self.client.set_membership_check(now, Some(every));
    }

    /// The partition the client joins and asks paths in.
    #[must_use]
    pub fn pkey(&self) -> u16 {
        self.client.config().pkey
    }

    /// The client's counters.
    #[must_use]
    pub fn counters(&self) -> SaCounters {
        self.client.counters()
    }

    /// The driver's own counters.
    #[must_use]
    pub fn stats(&self) -> SaDriverStats {
        self.stats
    }

    /// One turn: the endpoint's requests to the client, the MADs that arrived to the client,
    /// the client's timers, its answers to the endpoint (each also to `on_event`, to log),
    /// and its MADs to the SM.
    pub fn pump<V: Verbs>(
        &mut self,
        now: Instant,
        ep: &mut Endpoint,
        v: &mut V,
        mut on_event: impl FnMut(&SaEvent),
    ) {
        for _ in 0..MAX_SA_REQUESTS {
            let Some(r) = ep.poll_sa_request() else {
                break;
            };
            self.request(now, ep, v, r);
        }
        // Paths answered from the cache are handed out like answered queries.
        for (dgid, path) in self.cached.drain(..) {
            on_event(&SaEvent::PathResolved { dgid, path });
        }
        self.read(now);
        if self.client.next_deadline().is_some_and(|d| d <= now) {
            self.client.poll_timeout(now);
        }
        while let Some(ev) = self.client.pop_event() {
            match ev {
                SaEvent::Joined { mgid, params } => ep.set_group_joined(v, mgid, params),
                SaEvent::PathResolved { dgid, path } => ep.set_sa_path(now, v, dgid, &path),
                SaEvent::PathFailed { dgid, .. } => ep.path_failed(dgid),
                SaEvent::Left { mgid, .. } => {
                    self.leaving.remove(&mgid);
                }
                SaEvent::JoinFailed { .. } => {}
                // What the SM would have said with ClientReregister: the endpoint's light
                // flush, whose rejoins reach the client on the next pump.
                SaEvent::MembershipLost { .. } => ep.port_changed(v, PortChange::ClientReregister),
            }
            on_event(&ev);
        }
        self.transmit();
        self.next_read = self.token.is_none().then(|| now + POLL_INTERVAL);
        self.last_now = Some(now);
    }

    fn request<V: Verbs>(&mut self, now: Instant, ep: &mut Endpoint, v: &mut V, r: SaRequest) {
        let bcast = self.client.broadcast_mgid();
        match r {
            SaRequest::Join { mgid, send_only } => {
                let opts = GroupOptions {
                    create: mgid != bcast,
                    shared: self.kernel_ipoib,
                    send_only,
                };
                if !self.client.join(now, mgid, opts) {
                    tracing::warn!(group = %mgid, "SA client: too many groups; not joined");
                }
            }
            SaRequest::Leave { mgid } => {
                self.leaving.insert(mgid);
                self.client.leave(now, mgid);
            }
            SaRequest::Path { dgid } => match self.client.path(now, dgid) {
                PathLookup::Known(p) => {
                    ep.set_sa_path(now, v, dgid, &p);
                    self.cached.push((dgid, p));
                }
                PathLookup::Pending => {}
                PathLookup::Negative | PathLookup::Unavailable => ep.path_failed(dgid),
            },
            SaRequest::Port(change) => self.port_event(now, change, &v.port_attr()),
        }
    }

    /// A port event: the SM's address is read again (from the provider where it reports
    /// the port's LIDs, `attr`, else from the umad port's sysfs) and the client flushes its
    /// paths and rejoins.
    fn port_event(&mut self, now: Instant, change: PortChange, attr: &PortAttr) {
        if let Some(l) = attr.lids {
            self.port.lid = l.lid.0;
            self.port.sm_lid = l.sm_lid.0;
            self.port.sm_sl = l.sm_sl.get();
            self.port.active = attr.active;
        } else {
            match UmadPort::find(Some(&self.port.ca), Some(self.port.port)) {
                Ok(p) => self.port = p,
                Err(e) => {
                    tracing::warn!(error = %e, "umad port attributes unreadable after a port event")
                }
            }
        }
        let sm = SmAddress {
            lid: if self.port.active {
                self.port.sm_lid
            } else {
                0
            },
            sl: self.port.sm_sl,
        };
        let ev = match change {
            PortChange::Active => PortEvent::PortUp(sm),
            PortChange::Down => PortEvent::PortDown,
            PortChange::SmChange => PortEvent::SmChange(sm),
            PortChange::LidChange => PortEvent::LidChange,
            PortChange::ClientReregister => PortEvent::ClientReregister,
            PortChange::PkeyChange => PortEvent::PkeyChange,
        };
        tracing::info!(event = ?change, sm_lid = sm.lid, "port event: SA paths flushed, groups rejoined");
        self.client.port_event(now, ev);
    }

    fn read(&mut self, now: Instant) {
        self.more = false;
        let mut m = [0u8; MAD_LEN];
        for i in 0..READ_BATCH {
            match self.umad.recv(&mut m) {
                Ok(Some(UmadRecv::Mad(_))) => self.client.handle_mad(now, &m),
                Ok(Some(UmadRecv::SendFailed(status))) => {
                    // The client retransmits on its own timer.
                    self.stats.send_timeouts += 1;
                    tracing::debug!(status, "umad: send reported failed");
                }
                Ok(None) => return,
                Err(e) => {
                    self.stats.recv_errors += 1;
                    tracing::debug!(error = %e, "umad read failed");
                    return;
                }
            }
            if i + 1 == READ_BATCH {
                self.more = true;
            }
        }
    }

    fn transmit(&mut self) {
        while let Some(o) = self.client.pop_transmit() {
            if let Err(e) = self.umad.send_request(&o.mad, o.to.lid, o.to.sl, GSI_QKEY) {
                // Lost like a dropped MAD: the client's retransmission covers it.
                self.stats.send_errors += 1;
                tracing::debug!(error = %e, "umad send failed");
            }
        }
    }
}
