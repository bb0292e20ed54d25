//! The daemon as a service: the running configuration and what changes it while the loop
//! runs (a reload on SIGHUP or `reload`, the control socket's commands), shutdown requests,
//! and the systemd notifications (`READY=1`, `RELOADING=1`, `STOPPING=1`, `WATCHDOG=1`).
//!
//! Everything here runs inside a turn of the event loop with the turn's `now`. A reload is the
//! one exception to "no blocking call, one clock read per turn": it reads the configuration
//! file (at most [`MAX_CONFIG_BYTES`]) and `CLOCK_MONOTONIC` for `RELOADING=1`'s
//! `MONOTONIC_USEC`, which systemd's `Type=notify-reload` requires. Notifications go out on a
//! non-blocking datagram socket and are dropped when the manager has no room.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::config::{resolve_parsed, Config, MAX_PEERS, MAX_STATIC_NEIGHBOURS};
use super::control::{Reply, Request};
use super::logging;
use super::provider::DaemonProvider;
use super::reload::{self, neighbour_changes, ReloadPlan};
use crate::driver::Node;
use crate::ipoib::LiveTimeouts;
use crate::sys::notify::{self, Notifier};
use crate::verbs::Gid;
use crate::wire::ipoib::HwAddr;

/// Largest configuration file a reload reads.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

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

    /// When [`Service::turn`] has work next: the next `WATCHDOG=1`.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_watchdog
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
    /// can change live; returns the one line that says what it did, or why it did nothing.
    ///
    /// # Errors
    /// No `--config`, or a file that does not read or resolve (the running configuration
    /// stays).
    pub fn reload<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        why: &str,
    ) -> Result<String, String> {
        let Some(source) = self.running.source.clone() else {
            let msg = format!("{why}: no --config file, nothing to reload");
            tracing::info!("{msg}");
            return Err(msg);
        };
        let usec = notify::monotonic_usec();
        self.notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
        let result = read_config(&source.file)
            .and_then(|text| {
                super::config::parse_config_file(&source.file, &text).map_err(|e| e.to_string())
            })
            .and_then(|file| resolve_parsed(&file, &source.flags).map_err(|e| e.to_string()));
        let outcome = match result {
            Err(e) => {
                let msg = format!("{why}: reload failed, keeping the running configuration: {e}");
                tracing::warn!("{msg}");
                Err(msg)
            }
            Ok(mut new) => {
                new.source = Some(source);
                let plan = reload::plan(
                    &self.running,
                    &new,
                    self.sized_qp,
                    logging::filter_is_live(),
                );
                Ok(self.apply(node, now, plan, why))
            }
        };
        self.notify("READY=1");
        outcome
    }

    /// Applies a reload plan; returns its one-line summary.
    fn apply<P: DaemonProvider>(
        &mut self,
        node: &mut Node<P>,
        now: Instant,
        plan: ReloadPlan,
        why: &str,
    ) -> String {
        let ReloadPlan {
            next,
            changed,
            fixed,
        } = plan;
        let (removed, added) = neighbour_changes(&self.running.neigh, &next.neigh);
        let timeouts = LiveTimeouts {
            rx_timeout: next.rx_timeout,
            drain_timeout: next.drain_timeout,
            tx_stall_timeout: next.tx_stall_timeout,
            neigh_timeout: next.neigh_timeout,
        };
        let sized = self.sized_qp as usize;
        node.reconfigure(now, |ep, v| {
            ep.set_timeouts(timeouts);
            ep.set_tx_queue_len(next.tx_queue_len as usize);
            ep.set_qp_budget(next.max_conn_qp as usize, sized, next.qp_budget_policy);
            for ip in removed {
                ep.remove_static_neighbour(now, v, ip);
            }
            for (ip, hw) in added {
                ep.add_static_neighbour(now, v, ip, hw);
            }
        });
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
        if fixed.is_empty() {
            let msg = format!("{why}: configuration reloaded: {what}");
            tracing::info!("{msg}");
            msg
        } else {
            let msg = format!(
                "{why}: configuration reloaded: {what}; cannot change without a restart, kept \
                 as they were: {}",
                fixed.join(", ")
            );
            tracing::warn!("{msg}");
            msg
        }
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
            Request::Reload => self.reload(node, now, "reload request"),
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

/// The endpoint's peers (senders it knows, bindings it may pin) are the provider's.
fn set_endpoint_peers<P: DaemonProvider>(node: &mut Node<P>, peers: &[IpAddr]) {
    let gids: Vec<Gid> = peers.iter().map(|p| Gid::from_ip(*p)).collect();
    node.endpoint_mut().set_peers(&gids);
}

/// Reads a configuration file of at most [`MAX_CONFIG_BYTES`].
fn read_config(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let fail = |e: std::io::Error| {
        format!(
            "config file {}: {}",
            path.display(),
            super::config::os_message(&e)
        )
    };
    let file = std::fs::File::open(path).map_err(fail)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(fail)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "config file {}: longer than {MAX_CONFIG_BYTES} bytes",
            path.display()
        ));
    }
    Ok(text)
}
