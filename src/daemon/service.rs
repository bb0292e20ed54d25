//! The daemon as a service: the running configuration and what changes it while the loop
//! runs (a reload on SIGHUP or `reload`, the control socket's commands), shutdown requests,
//! and the systemd notifications (`READY=1`, `RELOADING=1`, `STOPPING=1`, `WATCHDOG=1`).
//!
//! Everything here runs inside a turn of the event loop with the turn's `now`. A SIGHUP
//! reload reads and resolves the configuration file on a thread of its own and
//! applies the result in a later turn; SIGHUPs coalesce (one reload reading, at most one more
//! pending) and start at most one reload per [`RELOAD_MIN_INTERVAL`], so a storm of them costs
//! the loop one apply per interval. The control socket's `reload` answers with the outcome, so
//! it reads in the turn, through [`read_config_text`] (non-blocking open, a regular file of at
//! most [`MAX_CONFIG_BYTES`]: a FIFO or a device there cannot stall the loop). Both read
//! `CLOCK_MONOTONIC` for `RELOADING=1`'s `MONOTONIC_USEC`, which systemd's
//! `Type=notify-reload` requires. Notifications go out on a non-blocking datagram socket and
//! are dropped when the manager has no room.

use std::net::IpAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::config::{
    read_config_text, resolve_parsed, Config, ConfigError, ConfigSource, MAX_PEERS,
    MAX_STATIC_NEIGHBOURS,
};
use super::control::{Reply, Request};
use super::logging;
use super::provider::DaemonProvider;
use super::reload::{self, neighbour_changes, ReloadPlan};
use crate::driver::Node;
use crate::ipoib::LiveTimeouts;
use crate::sys::notify::{self, Notifier};
use crate::verbs::Gid;
use crate::wire::ipoib::HwAddr;

pub use super::config::MAX_CONFIG_BYTES;

/// SIGHUP reloads start at most this often; those in between coalesce into one.
pub const RELOAD_MIN_INTERVAL: Duration = Duration::from_millis(500);

/// How often a turn looks for the outcome of a reload being read.
const RELOAD_POLL: Duration = Duration::from_millis(5);

/// Most static-neighbour changes of a reload applied in one turn (the rest wait for the next
/// turns, in order): a file of thousands of neighbours does not hold the loop.
pub const NEIGH_CHANGES_PER_TURN: usize = 256;

/// A static-neighbour change a reload made and the loop has not applied yet.
#[derive(Debug, Clone, Copy)]
enum NeighChange {
    Remove(IpAddr),
    Add(IpAddr, HwAddr),
}

/// A configuration file being read and resolved on a thread of its own.
#[derive(Debug)]
struct ReloadJob {
    outcome: mpsc::Receiver<Result<Config, ConfigError>>,
}

/// The running configuration and the service manager's side of the daemon.
#[derive(Debug)]
pub struct Service {
    running: Config,
    /// The QP budget the endpoint was sized with (a reload cannot go past it).
    sized_qp: u32,
    notifier: Option<Notifier>,
    /// `WATCHDOG=1` every this long, when systemd asked for it.
    watchdog: Option<Duration>,
    next_watchdog: Option<Instant>,
    /// A SIGHUP reload is wanted and not started yet.
    reload_pending: bool,
    /// The SIGHUP reload being read.
    reload_job: Option<ReloadJob>,
    /// When the last SIGHUP reload started.
    reload_started: Option<Instant>,
    /// When the next turn has reload work: the job's next look, or the pending one's start.
    reload_due: Option<Instant>,
    /// Static-neighbour changes of reloads still to apply, oldest first.
    neigh_backlog: std::collections::VecDeque<NeighChange>,
}

impl Service {
    /// The service of `cfg` (as the daemon started with it), notifying `$NOTIFY_SOCKET` if
    /// set. A notification socket that cannot be used is logged and ignored.
    pub fn new(cfg: &Config) -> Self {
        let notifier = match Notifier::from_env() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; not notifying systemd");
                None
            }
        };
        let watchdog = notifier
            .as_ref()
            .and_then(|_| notify::watchdog_interval_from_env());
        Self {
            running: cfg.clone(),
            sized_qp: cfg.max_conn_qp,
            notifier,
            watchdog,
            next_watchdog: None,
            reload_pending: false,
            reload_job: None,
            reload_started: None,
            reload_due: None,
            neigh_backlog: std::collections::VecDeque::new(),
        }
    }

    /// The running configuration.
    pub fn config(&self) -> &Config {
        &self.running
    }

    fn notify(&self, state: &str) {
        if let Some(n) = &self.notifier {
            if !n.notify(state) {
                tracing::debug!(state, "systemd notification not sent");
            }
        }
    }

    /// The interface is up and the control socket listens: `READY=1`, and the watchdog
    /// starts.
    pub fn ready(&mut self, now: Instant) {
        self.notify("READY=1");
        self.next_watchdog = self.watchdog.map(|w| now + w);
    }

    /// When [`Service::turn`] or [`Service::reload_step`] has work next: the next
    /// `WATCHDOG=1`, a look for the reload being read, the start of a pending one.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.next_watchdog, self.reload_due]
            .into_iter()
            .flatten()
            .min()
    }

    /// SIGHUP: a reload is wanted. It starts in [`Service::reload_step`] once no other is
    /// being read and [`RELOAD_MIN_INTERVAL`] has passed since the last started; until then
    /// every further request is the same one.
    pub fn request_reload(&mut self, now: Instant) {
        self.reload_pending = true;
        self.reload_due = Some(self.reload_due.map_or(now, |d| d.min(now)));
    }

    /// The SIGHUP reload's work of a turn: applies the outcome of the one read, and starts the
    /// pending one when it may.
    pub fn reload_step<P: DaemonProvider>(&mut self, node: &mut Node<P>, now: Instant) {
        self.apply_neigh_changes(node, now);
        self.reload_due = self.reload_work(node, now);
        if !self.neigh_backlog.is_empty() {
            // More neighbour changes wait: the next turn at once.
            self.reload_due = Some(now);
        }
    }

    /// [`Service::reload_step`] but the neighbour changes; when it has work next.
    fn reload_work<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
    ) -> Option<Instant> {
        const WHY: &str = "SIGHUP";
        if let Some(job) = &self.reload_job {
            match job.outcome.try_recv() {
                Err(mpsc::TryRecvError::Empty) => return Some(now + RELOAD_POLL),
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.reload_job = None;
                    tracing::warn!(
                        "{WHY}: reload failed, keeping the running configuration: the reading \
                         thread ended"
                    );
                    self.notify("READY=1");
                }
                Ok(outcome) => {
                    self.reload_job = None;
                    // Its outcome is logged.
                    let _ = self.finish_reload(node, now, outcome, WHY);
                }
            }
        }
        if !self.reload_pending {
            return None;
        }
        let may_start = self.reload_started.map_or(now, |t| t + RELOAD_MIN_INTERVAL);
        if now < may_start {
            return Some(may_start);
        }
        self.reload_pending = false;
        restore_addresses(node, WHY);
        let Some(source) = self.running.source.clone() else {
            tracing::info!("{}", ReloadError::NoConfigFile { why: WHY });
            return None;
        };
        self.reload_started = Some(now);
        self.notify_reloading();
        let (tx, outcome) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("ipoib-cm-reload".into())
            .spawn(move || {
                let _ = tx.send(read_and_resolve(&source));
            });
        match spawned {
            Ok(_) => {
                self.reload_job = Some(ReloadJob { outcome });
                Some(now + RELOAD_POLL)
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "{WHY}: reload failed, keeping the running configuration: no thread to read it"
                );
                self.notify("READY=1");
                None
            }
        }
    }

    fn notify_reloading(&self) {
        let usec = notify::monotonic_usec();
        self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
    }

    /// Sends `WATCHDOG=1` when due.
    pub fn turn(&mut self, now: Instant) {
        let (Some(at), Some(every)) = (self.next_watchdog, self.watchdog) else {
            return;
        };
        if now >= at {
            self.notify("WATCHDOG=1");
            self.next_watchdog = Some(now + every);
        }
    }

    /// Starts the orderly shutdown (`STOPPING=1` the first time).
    pub fn stop<P: DaemonProvider>(&mut self, node: &mut Node<P>, now: Instant) {
        if node.is_shutting_down() {
            return;
        }
        self.notify("STOPPING=1");
        self.next_watchdog = None;
        node.begin_shutdown(now);
    }

    /// Reads the configuration file again (on `why`: SIGHUP or a request) and applies what
    /// can change live; returns the one line that says what it did.
    ///
    /// # Errors
    /// No `--config`, or a file that does not read or resolve (the running configuration
    /// stays): the [`ReloadError`] is logged too.
    pub fn reload<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        why: &'static str,
    ) -> Result<String, ReloadError> {
        restore_addresses(node, why);
        let Some(source) = self.running.source.clone() else {
            let e = ReloadError::NoConfigFile { why };
            tracing::info!("{e}");
            return Err(e);
        };
        self.notify_reloading();
        let outcome = read_and_resolve(&source);
        self.finish_reload(node, now, outcome, why)
    }

    /// Applies a reload's `outcome` (or logs why there is none), then `READY=1`.
    fn finish_reload<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        outcome: Result<Config, ConfigError>,
        why: &'static str,
    ) -> Result<String, ReloadError> {
        let outcome = match outcome {
            Err(source) => {
                let e = ReloadError::Unreadable { why, source };
                tracing::warn!("{e}");
                Err(e)
            }
            Ok(new) => {
                let plan = reload::plan(
                    &self.running,
                    &new,
                    self.sized_qp,
                    logging::filter_is_live(),
                );
                if plan.fixed.is_empty() {
                    Ok(self.apply(node, now, plan, why))
                } else {
                    let e = ReloadError::Fixed {
                        why,
                        keys: plan.fixed,
                    };
                    tracing::warn!("{e}");
                    Err(e)
                }
            }
        };
        self.notify("READY=1");
        outcome
    }

    /// Applies up to [`NEIGH_CHANGES_PER_TURN`] of the static-neighbour changes reloads left.
    fn apply_neigh_changes<P: DaemonProvider>(&mut self, node: &mut Node<P>, now: Instant) {
        if self.neigh_backlog.is_empty() {
            return;
        }
        let n = self.neigh_backlog.len().min(NEIGH_CHANGES_PER_TURN);
        let batch: Vec<NeighChange> = self.neigh_backlog.drain(..n).collect();
        node.reconfigure(now, |ep, v| {
            for change in batch {
                match change {
                    NeighChange::Remove(ip) => {
                        ep.remove_static_neighbour(now, v, ip);
                    }
                    NeighChange::Add(ip, hw) => ep.add_static_neighbour(now, v, ip, hw),
                }
            }
        });
    }

    /// Applies a reload plan (its static-neighbour changes [`NEIGH_CHANGES_PER_TURN`] a turn,
    /// from this one on); returns its one-line summary.
    fn apply<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        plan: ReloadPlan,
        why: &str,
    ) -> String {
        let ReloadPlan { next, changed, .. } = plan;
        let (removed, added) = neighbour_changes(&self.running.neigh, &next.neigh);
        let timeouts = LiveTimeouts {
            rx_timeout: next.rx_timeout,
            drain_timeout: next.drain_timeout,
            tx_stall_timeout: next.tx_stall_timeout,
            neigh_timeout: next.neigh_timeout,
        };
        let sized = self.sized_qp as usize;
        node.reconfigure(now, |ep, _| {
            ep.set_timeouts(timeouts);
            ep.set_tx_queue_len(next.tx_queue_len as usize);
            ep.set_qp_budget(next.max_conn_qp as usize, sized, next.qp_budget_policy);
        });
        self.neigh_backlog
            .extend(removed.into_iter().map(NeighChange::Remove));
        self.neigh_backlog
            .extend(added.into_iter().map(|(ip, hw)| NeighChange::Add(ip, hw)));
        self.apply_neigh_changes(node, now);
        if next.peer != self.running.peer {
            set_endpoint_peers(node, &next.peer);
            if !node.provider_mut().set_peers(&next.peer) {
                tracing::warn!("{why}: this provider has no peer list; peer ignored");
            }
        }
        if next.log != self.running.log {
            if let Err(e) = logging::set_filter(&next.log) {
                tracing::warn!("{why}: log filter {:?}: {e}", next.log);
            }
        }
        self.running = next;
        let what = if changed.is_empty() {
            "nothing changed".to_owned()
        } else {
            format!("changed {}", changed.join(", "))
        };
        let msg = format!("{why}: configuration reloaded: {what}");
        tracing::info!("{msg}");
        msg
    }

    /// Answers a control command (`status` is the caller's).
    pub fn command<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        req: &Request,
    ) -> Reply {
        let r = match req {
            Request::Status { .. } => Err("status is answered elsewhere".to_owned()),
            Request::Down { ifname } => match ifname {
                Some(name) if name != node.ifname() => {
                    Err(format!("this daemon runs {}, not {name}", node.ifname()))
                }
                _ => {
                    tracing::info!("down requested on the control socket; shutting down");
                    self.stop(node, now);
                    Ok(format!("{}: shutting down", node.ifname()))
                }
            },
            Request::NeighAdd { ip, hw } => self.neigh_add(node, now, *ip, *hw),
            Request::NeighDel { ip } => self.neigh_del(node, now, *ip),
            Request::PeerAdd { addr } => self.peer_add(node, *addr),
            Request::PeerDel { addr } => self.peer_del(node, *addr),
            Request::Reload => self
                .reload(node, now, "reload request")
                .map_err(|e| e.to_string()),
        };
        match r {
            Ok(m) => Reply::Ok(m),
            Err(m) => Reply::Error(m),
        }
    }

    fn neigh_add<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        ip: IpAddr,
        hw: HwAddr,
    ) -> Result<String, String> {
        let known = self.running.neigh.iter().any(|(i, _)| *i == ip);
        if !known && self.running.neigh.len() >= MAX_STATIC_NEIGHBOURS {
            return Err(format!(
                "neigh add {ip}: already {MAX_STATIC_NEIGHBOURS} static neighbours"
            ));
        }
        node.reconfigure(now, |ep, v| ep.add_static_neighbour(now, v, ip, hw));
        self.running.neigh.retain(|(i, _)| *i != ip);
        self.running.neigh.push((ip, hw));
        tracing::info!(%ip, %hw, "static neighbour added");
        Ok(format!("neighbour {ip} lladdr {hw} added"))
    }

    fn neigh_del<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        ip: IpAddr,
    ) -> Result<String, String> {
        if !node.reconfigure(now, |ep, v| ep.remove_static_neighbour(now, v, ip)) {
            return Err(format!("neigh del {ip}: no static neighbour {ip}"));
        }
        self.running.neigh.retain(|(i, _)| *i != ip);
        tracing::info!(%ip, "static neighbour removed");
        Ok(format!("neighbour {ip} removed"))
    }

    fn peer_add<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        addr: IpAddr,
    ) -> Result<String, String> {
        let bind = self.running.bind;
        if addr.is_ipv4() != bind.is_ipv4() {
            return Err(format!(
                "peer add {addr}: not the same address family as bind address {bind}"
            ));
        }
        if addr == bind {
            return Err(format!("peer add {addr}: the bind address itself"));
        }
        if self.running.peer.contains(&addr) {
            return Ok(format!("peer {addr} already present"));
        }
        if self.running.peer.len() >= MAX_PEERS {
            return Err(format!("peer add {addr}: already {MAX_PEERS} peers"));
        }
        let mut peers = self.running.peer.clone();
        peers.push(addr);
        if !node.provider_mut().set_peers(&peers) {
            return Err("this provider has no peer list".to_owned());
        }
        set_endpoint_peers(node, &peers);
        self.running.peer = peers;
        tracing::info!(%addr, "peer added");
        Ok(format!("peer {addr} added"))
    }

    fn peer_del<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        addr: IpAddr,
    ) -> Result<String, String> {
        if !self.running.peer.contains(&addr) {
            return Err(format!("peer del {addr}: no peer {addr}"));
        }
        let peers: Vec<IpAddr> = self
            .running
            .peer
            .iter()
            .copied()
            .filter(|p| *p != addr)
            .collect();
        if !node.provider_mut().set_peers(&peers) {
            return Err("this provider has no peer list".to_owned());
        }
        set_endpoint_peers(node, &peers);
        self.running.peer = peers;
        tracing::info!(%addr, "peer removed");
        Ok(format!("peer {addr} removed"))
    }
}

/// Why a reload changed nothing. Its `Display` is the one line logged and answered to
/// `ipoib-cm reload`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReloadError {
    /// The daemon was started without `--config`.
    #[error("{why}: no --config file, nothing to reload")]
    NoConfigFile {
        /// What asked for the reload (`SIGHUP`, `reload request`).
        why: &'static str,
    },
    /// The file changes settings fixed at start: nothing of it was applied.
    #[error(
        "{why}: reload refused, nothing applied: {} cannot change without a restart (restart \
         the daemon for them, or put them back in the file)",
        keys.join(", ")
    )]
    Fixed {
        /// What asked for the reload.
        why: &'static str,
        /// The settings' config keys.
        keys: Vec<&'static str>,
    },
    /// The file did not read, parse or validate.
    #[error("{why}: reload failed, keeping the running configuration: {source}")]
    Unreadable {
        /// What asked for the reload.
        why: &'static str,
        /// Why.
        #[source]
        source: ConfigError,
    },
}

/// A reload (on `why`) puts back the configured addresses the interface lacks, whatever else
/// it does: one line naming them.
fn restore_addresses<P: DaemonProvider>(node: &mut Node<P>, why: &str) {
    let restored = node.restore_addresses();
    if !restored.is_empty() {
        tracing::info!(
            "{why}: addresses put back on {}: {}",
            node.ifname(),
            crate::driver::addr_list(&restored)
        );
    }
}

/// Reads the configuration file of `source` and resolves it with its flags; the
/// [`Config`] (with `source` kept) or the one-line reason why not.
fn read_and_resolve(source: &ConfigSource) -> Result<Config, ConfigError> {
    let text = read_config_text(&source.file)?;
    let file = super::config::parse_config_file(&source.file, &text)?;
    let mut new = resolve_parsed(&file, &source.flags)?;
    new.source = Some(source.clone());
    Ok(new)
}

/// The endpoint's peers (senders it knows, bindings it may pin) are the provider's.
fn set_endpoint_peers<P: DaemonProvider>(node: &mut Node<P>, peers: &[IpAddr]) {
    let gids: Vec<Gid> = peers.iter().map(|p| Gid::from_ip(*p)).collect();
    node.endpoint_mut().set_peers(&gids);
}
