//! The control socket: how `ipoib-cm status` asks a running daemon for its [`Status`], and
//! how `ipoib-cm down|neigh|peer|reload` change it.
//!
//! Protocol: the client connects to the Unix stream socket (default the abstract socket
//! `@ipoib-cm/<ifname>`; a `--control-socket` path names a file), writes one line and the
//! server answers with one JSON document followed by a newline, then closes. `status` or
//! `status json` is answered with a [`Status`]; a command (`down [IFNAME]`, `neigh add IP
//! HWADDR`, `neigh del IP`, `peer add ADDR`, `peer del ADDR`, `reload`) with `{"ok":"..."}`
//! (one line saying what it did); a refused request with `{"error":"..."}`. A request is at
//! most [`MAX_REQUEST_BYTES`] bytes. Commands need the same peer as `status`: root or the
//! daemon's own user.
//!
//! The request and response codecs ([`parse_request`], [`format_response`],
//! [`format_error`], [`format_ok`], [`parse_response`]) are pure. [`ControlServer`] is the
//! event-loop side: a non-blocking listener and non-blocking clients, each on its own mio
//! token, bounded in number, request size and time, driven with the `now` of the loop's turn.
//! [`query`] and [`command`] are the client side.

use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::config::os_message;
use super::status::Status;
use crate::wire::ipoib::HwAddr;

mod server;

pub use server::{
    ControlCounters, ControlServer, Reply, ACCEPTS_PER_TURN, CLIENT_TIMEOUT, MAX_CLIENTS,
    WRITE_PER_TURN,
};

/// Longest request accepted, newline included.
pub const MAX_REQUEST_BYTES: usize = 256;
/// Largest response the client reads.
const MAX_RESPONSE_BYTES: u64 = 64 << 20;
/// Mode of the socket file.
pub const SOCKET_MODE: u32 = 0o600;
/// Mode of a socket directory we create.
pub const DIR_MODE: u32 = 0o700;

/// A control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `status` or `status json`: answer the [`Status`] (always as JSON on the wire; `json`
    /// records what the client asked for).
    Status {
        /// The client asked for `status json`.
        json: bool,
    },
    /// `down [IFNAME]`: shut the daemon down (refused if IFNAME is not its interface).
    Down {
        /// The interface the client means.
        ifname: Option<String>,
    },
    /// `neigh add IP HWADDR`: add (or re-point) a static neighbour.
    NeighAdd {
        /// The neighbour's IP address.
        ip: IpAddr,
        /// Its IPoIB hardware address.
        hw: HwAddr,
    },
    /// `neigh del IP`: remove a static neighbour.
    NeighDel {
        /// The neighbour's IP address.
        ip: IpAddr,
    },
    /// `peer add ADDR`: add an underlay peer (the broadcast group reaches it).
    PeerAdd {
        /// Its underlay address.
        addr: IpAddr,
    },
    /// `peer del ADDR`: remove an underlay peer.
    PeerDel {
        /// Its underlay address.
        addr: IpAddr,
    },
    /// `reload`: read the configuration file again, as SIGHUP does.
    Reload,
}

impl Request {
    /// The request line that asks for this (without the newline).
    pub fn line(&self) -> String {
        match self {
            Self::Status { json: false } => "status".to_owned(),
            Self::Status { json: true } => "status json".to_owned(),
            Self::Down { ifname: None } => "down".to_owned(),
            Self::Down { ifname: Some(n) } => format!("down {n}"),
            Self::NeighAdd { ip, hw } => format!("neigh add {ip} {hw}"),
            Self::NeighDel { ip } => format!("neigh del {ip}"),
            Self::PeerAdd { addr } => format!("peer add {addr}"),
            Self::PeerDel { addr } => format!("peer del {addr}"),
            Self::Reload => "reload".to_owned(),
        }
    }
}

/// True once `buf` holds a whole request: a newline, or [`MAX_REQUEST_BYTES`] bytes.
pub fn request_complete(buf: &[u8]) -> bool {
    buf.contains(&b'\n') || buf.len() >= MAX_REQUEST_BYTES
}

/// Why [`parse_request`] refused a request. `Display` is the one-line message of the
/// `{"error":...}` answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No newline within [`MAX_REQUEST_BYTES`] bytes.
    #[error("request longer than {} bytes", MAX_REQUEST_BYTES)]
    TooLong,
    /// The line is not UTF-8.
    #[error("request is not UTF-8")]
    NotUtf8,
    /// The line holds nothing but white space.
    #[error("empty request")]
    Empty,
    /// A line that is no request this server knows (the line, without its newline).
    #[error(
        "unknown request {0:?} (expected status, status json, down, neigh add|del, peer add|del or reload)"
    )]
    Unknown(String),
    /// A known command with a value that does not parse.
    #[error("{0}")]
    BadValue(String),
}

/// Parses an IP address of a request.
fn request_ip(what: &str, text: &str) -> Result<IpAddr, RequestError> {
    text.parse()
        .map_err(|_| RequestError::BadValue(format!("{what}: invalid IP address {text:?}")))
}

/// Parses a request line (what the client sent up to EOF or its newline). Pure.
///
/// # Errors
/// A [`RequestError`], whose `Display` is the `{"error":...}` answer's message.
pub fn parse_request(buf: &[u8]) -> Result<Request, RequestError> {
    let line = match buf.iter().position(|&b| b == b'\n') {
        Some(i) if i < MAX_REQUEST_BYTES => &buf[..i],
        Some(_) => return Err(RequestError::TooLong),
        None if buf.len() >= MAX_REQUEST_BYTES => return Err(RequestError::TooLong),
        None => buf,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|_| RequestError::NotUtf8)?;
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    match words.as_slice() {
        [] => Err(RequestError::Empty),
        ["status"] => Ok(Request::Status { json: false }),
        ["status", "json"] => Ok(Request::Status { json: true }),
        ["down"] => Ok(Request::Down { ifname: None }),
        ["down", name] => Ok(Request::Down {
            ifname: Some((*name).to_owned()),
        }),
        ["neigh", "add", ip, hw] => Ok(Request::NeighAdd {
            ip: request_ip("neigh add", ip)?,
            hw: hw.parse().map_err(|_| {
                RequestError::BadValue(format!("neigh add: invalid hardware address {hw:?}"))
            })?,
        }),
        ["neigh", "del", ip] => Ok(Request::NeighDel {
            ip: request_ip("neigh del", ip)?,
        }),
        ["peer", "add", ip] => Ok(Request::PeerAdd {
            addr: request_ip("peer add", ip)?,
        }),
        ["peer", "del", ip] => Ok(Request::PeerDel {
            addr: request_ip("peer del", ip)?,
        }),
        ["reload"] => Ok(Request::Reload),
        _ => Err(RequestError::Unknown(text.to_owned())),
    }
}

/// The answer to a status request: the JSON document and a newline.
pub fn format_response(status: &Status) -> String {
    match serde_json::to_string(status) {
        Ok(mut s) => {
            s.push('\n');
            s
        }
        Err(e) => format_error(&format!("cannot serialize status: {e}")),
    }
}

/// A command's answer: `{"ok":"<message>"}` and a newline.
pub fn format_ok(message: &str) -> String {
    let mut s = serde_json::json!({ "ok": message }).to_string();
    s.push('\n');
    s
}

/// An error answer: `{"error":"<message>"}` and a newline.
pub fn format_error(message: &str) -> String {
    let mut s = serde_json::json!({ "error": message }).to_string();
    s.push('\n');
    s
}

/// Why an answer is not a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseError {
    /// The daemon answered `{"error": ...}`.
    Daemon(String),
    /// The answer is not a status document.
    Malformed(String),
}

/// Parses the daemon's answer to a command: the message of `{"ok": ...}`. Pure.
///
/// # Errors
/// [`ResponseError::Daemon`] for an error answer, [`ResponseError::Malformed`] otherwise.
pub fn parse_ok(text: &str) -> Result<String, ResponseError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ResponseError::Malformed(e.to_string()))?;
    let one = |key| {
        v.as_object()
            .filter(|o| o.len() == 1)
            .and_then(|o| o.get(key))
    };
    if let Some(msg) = one("ok").and_then(serde_json::Value::as_str) {
        return Ok(msg.to_owned());
    }
    match one("error") {
        Some(err) => Err(ResponseError::Daemon(
            err.as_str().map_or_else(|| err.to_string(), str::to_owned),
        )),
        None => Err(ResponseError::Malformed(format!("not an answer: {text}"))),
    }
}

/// Parses the daemon's answer. Pure.
///
/// # Errors
/// [`ResponseError::Daemon`] for an error answer, [`ResponseError::Malformed`] otherwise.
pub fn parse_response(text: &str) -> Result<Status, ResponseError> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| ResponseError::Malformed(e.to_string()))?;
    if let Some(obj) = v.as_object() {
        if obj.len() == 1 {
            if let Some(err) = obj.get("error") {
                let msg = err.as_str().map_or_else(|| err.to_string(), str::to_owned);
                return Err(ResponseError::Daemon(msg));
            }
        }
    }
    serde_json::from_value(v).map_err(|e| ResponseError::Malformed(e.to_string()))
}

/// Why [`query`] failed. `Display` is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Nothing listens at the socket (missing file, or refused).
    #[error("no daemon for {ifname}: {}: {message}", path.display())]
    NoDaemon {
        /// Interface name (the socket file's stem).
        ifname: String,
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// Connecting, writing or reading failed otherwise.
    #[error("cannot talk to the daemon for {ifname}: {}: {message}", path.display())]
    Io {
        /// Interface name (the socket file's stem).
        ifname: String,
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// The daemon did not answer in time.
    #[error("the daemon for {ifname} did not answer within {timeout:?} ({})", path.display())]
    Timeout {
        /// Interface name (the socket file's stem).
        ifname: String,
        /// The socket path.
        path: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// The daemon answered with an error.
    #[error("the daemon for {ifname} answered: {message}")]
    Daemon {
        /// Interface name (the socket file's stem).
        ifname: String,
        /// Its error message.
        message: String,
    },
    /// The daemon at the socket runs another interface than the one asked for.
    #[error("{} serves {actual}, not {ifname}", path.display())]
    WrongInterface {
        /// The interface asked for.
        ifname: String,
        /// The socket path.
        path: PathBuf,
        /// The interface the daemon runs.
        actual: String,
    },
    /// No interface was named and no daemon of this network namespace listens on a default
    /// socket.
    #[error(
        "no ipoib-cm daemon in this network namespace (name an interface or --control-socket)"
    )]
    NoDaemons,
    /// No interface was named and several daemons listen.
    #[error("several daemons in this network namespace ({}): name the interface", .0.join(", "))]
    Ambiguous(Vec<String>),
    /// The answer was not a status document.
    #[error("malformed answer from the daemon for {ifname}: {message}")]
    Malformed {
        /// Interface name (the socket file's stem).
        ifname: String,
        /// What is wrong.
        message: String,
    },
}

impl ControlError {
    /// The process exit code: 2 when the request does not fit (the daemon refused it, or it
    /// names no single daemon), 1 when the daemon could not be reached or answered nonsense.
    pub const fn exit_code(&self) -> u8 {
        match self {
            Self::Daemon { .. } | Self::WrongInterface { .. } | Self::Ambiguous(_) => 2,
            _ => 1,
        }
    }
}

/// The socket address a control socket path names: `@name` is the abstract socket `name`,
/// anything else a file.
///
/// # Errors
/// The name is too long for a Unix socket address.
pub fn socket_addr(path: &Path) -> io::Result<SocketAddr> {
    let text = path.as_os_str().as_encoded_bytes();
    match text.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(path),
    }
}

/// The interface a control socket serves by its name (`ib0` for `@ipoib-cm/ib0` and for
/// `/run/ipoib-cm/ib0.sock`).
fn ifname_of(path: &Path) -> String {
    path.file_stem()
        .map_or_else(|| "?".to_owned(), |s| s.to_string_lossy().into_owned())
}

/// Asks the daemon listening at `path` for its status; waits at most about `timeout` for the
/// answer. The interface named in errors is the socket's stem (`ib0` for `@ipoib-cm/ib0`).
///
/// # Errors
/// A one-line [`ControlError`], e.g. `no daemon for ib0: @ipoib-cm/ib0: Connection refused`.
pub fn query(path: &Path, timeout: Duration) -> Result<Status, ControlError> {
    let text = exchange(path, &Request::Status { json: true }, timeout)?;
    let ifname = ifname_of(path);
    parse_response(&text).map_err(|e| match e {
        ResponseError::Daemon(message) => ControlError::Daemon { ifname, message },
        ResponseError::Malformed(message) => ControlError::Malformed { ifname, message },
    })
}

/// Sends a command to the daemon listening at `path` and returns its one-line answer;
/// waits at most about `timeout`.
///
/// # Errors
/// As [`query`]; the daemon's refusal is [`ControlError::Daemon`].
pub fn command(path: &Path, request: &Request, timeout: Duration) -> Result<String, ControlError> {
    let text = exchange(path, request, timeout)?;
    let ifname = ifname_of(path);
    parse_ok(&text).map_err(|e| match e {
        ResponseError::Daemon(message) => ControlError::Daemon { ifname, message },
        ResponseError::Malformed(message) => ControlError::Malformed { ifname, message },
    })
}

/// One exchange: connects, writes the request line, reads the answer to EOF.
fn exchange(path: &Path, request: &Request, timeout: Duration) -> Result<String, ControlError> {
    let ifname = ifname_of(path);
    let io_err = |e: &io::Error| {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            ControlError::Timeout {
                ifname: ifname.clone(),
                path: path.to_owned(),
                timeout,
            }
        } else {
            ControlError::Io {
                ifname: ifname.clone(),
                path: path.to_owned(),
                message: os_message(e),
            }
        }
    };
    let addr = socket_addr(path).map_err(|e| io_err(&e))?;
    let stream = UnixStream::connect_addr(&addr).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ControlError::NoDaemon {
            ifname: ifname.clone(),
            path: path.to_owned(),
            message: os_message(&e),
        },
        _ => io_err(&e),
    })?;
    let deadline = Instant::now() + timeout;
    let remaining = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    stream
        .set_write_timeout(Some(remaining()))
        .map_err(|e| io_err(&e))?;
    let mut line = request.line();
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .map_err(|e| io_err(&e))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if Instant::now() >= deadline {
            return Err(io_err(&io::ErrorKind::TimedOut.into()));
        }
        stream
            .set_read_timeout(Some(remaining()))
            .map_err(|e| io_err(&e))?;
        match (&stream).read(&mut chunk) {
            Ok(0) => break,
            Ok(k) => {
                answer.extend_from_slice(&chunk[..k]);
                if answer.len() as u64 > MAX_RESPONSE_BYTES {
                    return Err(ControlError::Malformed {
                        ifname,
                        message: format!("answer longer than {MAX_RESPONSE_BYTES} bytes"),
                    });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A server that closes with our bytes unread resets the connection after its
            // answer; what arrived before the reset is the answer.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !answer.is_empty() => break,
            Err(e) => return Err(io_err(&e)),
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Most control sockets [`listening_sockets`] returns.
pub const MAX_LISTED_SOCKETS: usize = 1024;

/// The listening abstract Unix sockets of `/proc/net/unix` text whose names start with
/// `prefix` (`@ipoib-cm/`), as `@name` paths, sorted, without duplicates, at most
/// [`MAX_LISTED_SOCKETS`]. Pure.
pub fn listening_sockets(proc_net_unix: &str, prefix: &str) -> Vec<PathBuf> {
    /// `__SO_ACCEPTCON`: the socket listens.
    const ACCEPTCON: u32 = 1 << 16;
    let mut found: Vec<PathBuf> = proc_net_unix
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(cols.get(3)?, 16).ok()?;
            let path = cols.get(7)?;
            (flags & ACCEPTCON != 0 && path.starts_with(prefix)).then(|| PathBuf::from(path))
        })
        .take(MAX_LISTED_SOCKETS)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The control sockets of every daemon in this network namespace that listens on a default
/// (abstract) socket: `/proc/net/unix` shows the namespace's sockets.
///
/// # Errors
/// `/proc/net/unix` cannot be read.
pub fn namespace_daemons() -> io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/net/unix")?;
    Ok(listening_sockets(
        &text,
        super::config::CONTROL_SOCKET_PREFIX,
    ))
}

#[cfg(test)]
mod tests;
