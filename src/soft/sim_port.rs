//! [`SimPort`]: what an HCA's firmware tells its driver about its InfiniBand port, for the
//! software provider's IB port on a simulated fabric (ibsim, reached through `umad2sim`):
//! the port's own SMA is read through umad ([`PortWatch`]) and what the SM changes becomes
//! the port's attributes ([`SoftVerbs::set_ib_port`]) and its async events
//! (`IBV_EVENT_PORT_ACTIVE`, `PORT_ERR`, `LID_CHANGE`, `SM_CHANGE`, `PKEY_CHANGE`,
//! `CLIENT_REREGISTER`), in that order, as a verbs driver reports them.
//!
//! `umad2sim` hands out descriptors epoll refuses, so the port is read on a timer: every
//! [`SMP_POLL`] while an SMP awaits its answer, else at the watch's next read.

use std::io;
use std::time::{Duration, Instant};

use super::ib::IbPortAttr;
use super::SoftVerbs;
use crate::sa::{PortEvent, PortSnapshot, PortWatch, PortWatchConfig, PortWatchCounters};
use crate::sys::umad::{find_umad, AgentSpec, Umad, UmadRecv};
use crate::verbs::{AsyncEvent, Lid, PathMtu, Sl};
use crate::wire::smp::{SMI_CLASS_VERSION, SMI_DIRECTED_ROUTE, SMP_LEN};

/// How often the agent is read while an SMP awaits its answer.
pub const SMP_POLL: Duration = Duration::from_millis(5);

/// Most SMPs read per pump.
const READ_BATCH: usize = 16;

/// Why the port could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SimPortError {
    /// No umad port (the process does not run under `umad2sim`, or the port is not there).
    #[error("no umad port to read the InfiniBand port from: {0}")]
    NoPort(#[source] io::Error),
    /// The subnet management agent could not be registered.
    #[error("umad{umad}: {step}: {source}")]
    Agent {
        /// The umad device's index.
        umad: u32,
        /// The step that failed.
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An SMP could not be sent or read.
    #[error("umad: {0}")]
    Io(#[source] io::Error),
    /// The port's SMA did not answer a whole read in time.
    #[error("the port's SMA answered no read within {0:?}")]
    NoAnswer(Duration),
}

/// The port's SMA, watched; see the [module docs](self).
#[derive(Debug)]
pub struct SimPort {
    umad: Umad,
    watch: PortWatch,
    ca: String,
    port: u8,
    /// The watch's complete reads handed on.
    reads_seen: u64,
    /// When [`pump`](Self::pump) last ran.
    last_pump: Option<Instant>,
    /// Send or read failures.
    pub io_errors: u64,
}

impl SimPort {
    /// [`open_with`](Self::open_with) the watch's defaults (a read every 250 ms).
    ///
    /// # Errors
    /// [`SimPortError`] as it says.
    pub fn open(
        ca: Option<&str>,
        port: Option<u8>,
        within: Duration,
    ) -> Result<(Self, IbPortAttr), SimPortError> {
        Self::open_with(ca, port, PortWatchConfig::default(), within)
    }

    /// Opens the SMA agent on the umad port of `ca` and `port` (the first of each if `None`)
    /// and reads the port once (`cfg`: how often and how patiently), waiting up to
    /// `within`; returns the port as found.
    ///
    /// # Errors
    /// [`SimPortError`] as it says.
    pub fn open_with(
        ca: Option<&str>,
        port: Option<u8>,
        cfg: PortWatchConfig,
        within: Duration,
    ) -> Result<(Self, IbPortAttr), SimPortError> {
        let (umad, ca, port) = find_umad(ca, port).map_err(SimPortError::NoPort)?;
        let spec = AgentSpec::smi(SMI_DIRECTED_ROUTE, SMI_CLASS_VERSION);
        let agent = Umad::open_agent(umad, &spec).map_err(|e| {
            let (step, source) = e.into_step();
            SimPortError::Agent { umad, step, source }
        })?;
        let start = Instant::now();
        let mut me = Self {
            umad: agent,
            watch: PortWatch::new(cfg, start),
            ca,
            port,
            reads_seen: 0,
            last_pump: None,
            io_errors: 0,
        };
        loop {
            let now = Instant::now();
            if let Some(a) = me.watch.port().map(attr_of) {
                me.reads_seen = me.watch.counters().reads;
                return Ok((me, a));
            }
            if now.duration_since(start) > within {
                return Err(SimPortError::NoAnswer(within));
            }
            me.watch.poll_timeout(now);
            me.send().map_err(SimPortError::Io)?;
            if me.umad.wait_readable(SMP_POLL).map_err(SimPortError::Io)? {
                me.read(Instant::now()).map_err(SimPortError::Io)?;
            }
        }
    }

    /// The device and port, as umad names them.
    #[must_use]
    pub fn device(&self) -> (String, u8) {
        (self.ca.clone(), self.port)
    }

    /// The watch's counters.
    #[must_use]
    pub fn counters(&self) -> PortWatchCounters {
        self.watch.counters()
    }

    /// When [`pump`](Self::pump) has work next.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        let next = self.watch.next_deadline();
        match self.last_pump {
            Some(t) if self.watch.is_waiting() => next.min(t + SMP_POLL),
            _ => next,
        }
    }

    /// Reads what the SMA answered, runs the watch's timers and sends its SMPs; returns
    /// whether a read of the port completed. Never blocks.
    pub fn turn(&mut self, now: Instant) -> bool {
        self.last_pump = Some(now);
        if let Err(e) = self.read(now) {
            self.io_errors += 1;
            tracing::debug!(error = %e, "reading the port's SMA");
        }
        self.watch.poll_timeout(now);
        if let Err(e) = self.send() {
            self.io_errors += 1;
            tracing::debug!(error = %e, "asking the port's SMA");
        }
        let reads = self.watch.counters().reads;
        let read = reads != self.reads_seen;
        self.reads_seen = reads;
        read
    }

    /// Waits up to `max` (and no longer than the next [`turn`](Self::turn) is due) for an
    /// answer of the SMA.
    ///
    /// # Errors
    /// `poll(2)` failed.
    pub fn wait(&self, now: Instant, max: Duration) -> io::Result<bool> {
        let until = self.poll_timeout().saturating_duration_since(now);
        self.umad.wait_readable(until.min(max))
    }

    /// The port as last read.
    #[must_use]
    pub fn port(&self) -> Option<&PortSnapshot> {
        self.watch.port()
    }

    /// The watch itself: its events, and what the caller infers for it.
    pub fn watch_mut(&mut self) -> &mut PortWatch {
        &mut self.watch
    }

    /// A [`turn`](Self::turn) for the software provider: a change of the port goes to `v`
    /// as its attributes (what the events' consumers read), then as its events.
    pub fn pump(&mut self, now: Instant, v: &mut SoftVerbs) {
        if self.turn(now) {
            if let Some(p) = self.watch.port() {
                v.set_ib_port(now, attr_of(p));
            }
        }
        while let Some(ev) = self.watch.pop_event() {
            tracing::info!(event = ?ev, "InfiniBand port event");
            v.raise_port_event(async_event(ev));
        }
    }

    fn send(&mut self) -> io::Result<()> {
        while let Some(smp) = self.watch.pop_transmit() {
            let mad: &[u8; SMP_LEN] = &smp;
            self.umad.send_smp_local(mad)?;
        }
        Ok(())
    }

    fn read(&mut self, now: Instant) -> io::Result<()> {
        let mut m = [0u8; SMP_LEN];
        for _ in 0..READ_BATCH {
            match self.umad.recv(&mut m)? {
                Some(UmadRecv::Mad(_)) => self.watch.handle_mad(now, &m),
                Some(UmadRecv::SendFailed(_)) => {}
                None => break,
            }
        }
        Ok(())
    }
}

/// The port's attributes as its SMA describes it.
fn attr_of(p: &PortSnapshot) -> IbPortAttr {
    IbPortAttr {
        active: p.is_active(),
        lid: Lid(p.info.lid),
        lmc: p.info.lmc,
        sm_lid: Lid(p.info.sm_lid),
        sm_sl: Sl::from_bits(p.info.sm_sl),
        gid: p.gid(),
        pkeys: p.pkey_table.clone(),
        mtu: p.mtu().unwrap_or(PathMtu::Mtu2048),
    }
}

/// The verbs async event of a port event.
fn async_event(ev: PortEvent) -> AsyncEvent {
    match ev {
        PortEvent::LidChange => AsyncEvent::LidChange,
        PortEvent::SmChange(_) => AsyncEvent::SmChange,
        PortEvent::ClientReregister => AsyncEvent::ClientReregister,
        PortEvent::PkeyChange => AsyncEvent::PkeyChange,
        PortEvent::PortDown => AsyncEvent::PortErr,
        PortEvent::PortUp(_) => AsyncEvent::PortActive,
    }
}
