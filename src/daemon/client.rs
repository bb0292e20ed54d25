//! The client side of the control commands: `ipoib-cm status|down|neigh|peer|reload`, their
//! arguments (clap) and which daemon each talks to.
//!
//! A command names its daemon by interface (its default socket `@ipoib-cm/IFNAME`) or by
//! `--control-socket`; with neither, it finds the daemons of this network namespace (the
//! listening `@ipoib-cm/*` sockets of `/proc/net/unix`, as `wg show` finds its interfaces):
//! `status` shows them all, the others need exactly one.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::default_control_socket;
use super::control::{command, namespace_daemons, query, ControlError, Request};
use super::status::Status;
use crate::wire::ipoib::HwAddr;

/// How long a command waits for the daemon's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Which daemon a command talks to.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Target {
    /// Interface name [default: the only daemon of this network namespace].
    #[arg(long, value_name = "NAME")]
    pub ifname: Option<String>,
    /// Control socket of the daemon: a path, or @NAME for an abstract socket (default:
    /// @ipoib-cm/IFNAME).
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
}

/// `ipoib-cm down`.
#[derive(Debug, Clone, clap::Args)]
pub struct DownArgs {
    /// Interface name [default: the only daemon of this network namespace].
    pub ifname: Option<String>,
    /// Control socket of the daemon (default: @ipoib-cm/IFNAME).
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
}

/// `ipoib-cm neigh`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum NeighCommand {
    /// List the neighbours (IP, hardware address, state).
    Show(Target),
    /// Add a static neighbour, or point one at another hardware address.
    Add {
        /// Its IP address.
        ip: IpAddr,
        /// Its 20-byte IPoIB hardware address, in `ip link` form.
        #[arg(value_parser = parse_hwaddr)]
        hwaddr: HwAddr,
        #[command(flatten)]
        target: Target,
    },
    /// Remove a static neighbour.
    Del {
        /// Its IP address.
        ip: IpAddr,
        #[command(flatten)]
        target: Target,
    },
}

/// `ipoib-cm peer`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PeerCommand {
    /// Add an underlay peer (the broadcast group reaches it).
    Add {
        /// Its underlay address.
        addr: IpAddr,
        #[command(flatten)]
        target: Target,
    },
    /// Remove an underlay peer.
    Del {
        /// Its underlay address.
        addr: IpAddr,
        #[command(flatten)]
        target: Target,
    },
}

fn parse_hwaddr(text: &str) -> Result<HwAddr, String> {
    text.parse()
        .map_err(|_| format!("invalid IPoIB hardware address {text:?}"))
}

/// The control sockets a command with `ifname` and `socket` talks to, each with the interface
/// it must serve (if one was named). Without either: every daemon of the namespace.
///
/// # Errors
/// `/proc/net/unix` unreadable, or no daemon found.
pub fn targets(
    ifname: Option<&str>,
    socket: Option<&Path>,
) -> Result<Vec<(PathBuf, Option<String>)>, ControlError> {
    let named = ifname.map(str::to_owned);
    match (socket, ifname) {
        (Some(path), _) => Ok(vec![(path.to_owned(), named)]),
        (None, Some(name)) => Ok(vec![(default_control_socket(name), named)]),
        (None, None) => {
            let found = namespace_daemons().map_err(|e| ControlError::Io {
                ifname: "?".to_owned(),
                path: PathBuf::from("/proc/net/unix"),
                message: super::config::os_message(&e),
            })?;
            if found.is_empty() {
                return Err(ControlError::NoDaemons);
            }
            Ok(found.into_iter().map(|p| (p, None)).collect())
        }
    }
}

/// The one daemon a command talks to.
fn single(ifname: Option<&str>, socket: Option<&Path>) -> Result<PathBuf, ControlError> {
    let mut all = targets(ifname, socket)?;
    if all.len() > 1 {
        let names = all.iter().map(|(p, _)| p.display().to_string()).collect();
        return Err(ControlError::Ambiguous(names));
    }
    all.pop().map(|(p, _)| p).ok_or(ControlError::NoDaemons)
}

/// Asks `path` for its status and checks that it serves `ifname`, when named.
///
/// # Errors
/// [`query`]'s, or [`ControlError::WrongInterface`].
pub fn status_of(path: &Path, ifname: Option<&str>) -> Result<Status, ControlError> {
    let s = query(path, ANSWER_TIMEOUT)?;
    match ifname {
        Some(name) if name != s.interface.name => Err(ControlError::WrongInterface {
            ifname: name.to_owned(),
            path: path.to_owned(),
            actual: s.interface.name,
        }),
        _ => Ok(s),
    }
}

/// `ipoib-cm down`: the daemon's one-line answer.
///
/// # Errors
/// A one-line [`ControlError`].
pub fn down(a: &DownArgs) -> Result<String, ControlError> {
    let path = single(a.ifname.as_deref(), a.control_socket.as_deref())?;
    let req = Request::Down {
        ifname: a.ifname.clone(),
    };
    command(&path, &req, ANSWER_TIMEOUT)
}

/// `ipoib-cm reload`.
///
/// # Errors
/// A one-line [`ControlError`].
pub fn reload(t: &Target) -> Result<String, ControlError> {
    send(t, &Request::Reload)
}

/// Sends `req` to the daemon `t` names, after checking its interface when one is named.
fn send(t: &Target, req: &Request) -> Result<String, ControlError> {
    let path = single(t.ifname.as_deref(), t.control_socket.as_deref())?;
    if t.ifname.is_some() {
        status_of(&path, t.ifname.as_deref())?;
    }
    command(&path, req, ANSWER_TIMEOUT)
}

/// `ipoib-cm neigh ...`: what to print.
///
/// # Errors
/// A one-line [`ControlError`].
pub fn neigh(c: &NeighCommand) -> Result<String, ControlError> {
    match c {
        NeighCommand::Show(t) => {
            let path = single(t.ifname.as_deref(), t.control_socket.as_deref())?;
            let s = status_of(&path, t.ifname.as_deref())?;
            Ok(neighbour_lines(&s))
        }
        NeighCommand::Add { ip, hwaddr, target } => send(
            target,
            &Request::NeighAdd {
                ip: *ip,
                hw: *hwaddr,
            },
        ),
        NeighCommand::Del { ip, target } => send(target, &Request::NeighDel { ip: *ip }),
    }
}

/// `ipoib-cm peer ...`.
///
/// # Errors
/// A one-line [`ControlError`].
pub fn peer(c: &PeerCommand) -> Result<String, ControlError> {
    match c {
        PeerCommand::Add { addr, target } => send(target, &Request::PeerAdd { addr: *addr }),
        PeerCommand::Del { addr, target } => send(target, &Request::PeerDel { addr: *addr }),
    }
}

/// The neighbours as `ip neigh` prints them: `IP lladdr HWADDR STATE`, one a line (without
/// the last newline).
pub fn neighbour_lines(s: &Status) -> String {
    s.neighbours
        .iter()
        .map(|n| {
            let state = serde_json::to_value(n.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            format!("{} lladdr {} {state}", n.ip, n.hwaddr)
        })
        .collect::<Vec<_>>()
        .join("\n")
}
