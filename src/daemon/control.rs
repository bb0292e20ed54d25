//! The control socket: how `ipoib-cm status` asks a running daemon for its [`Status`].
//!
//! Protocol: the client connects to the Unix stream socket (default
//! `/run/ipoib-cm/<ifname>.sock`), writes one line, `status\n` or `status json\n`, and the
//! server answers with one JSON document (a [`Status`], or `{"error":"..."}`) followed by a
//! newline, then closes. A request is at most [`MAX_REQUEST_BYTES`] bytes.
//!
//! The request and response codecs ([`parse_request`], [`format_response`],
//! [`format_error`], [`parse_response`]) are pure. [`ControlServer`] is the event-loop side:
//! a non-blocking listener registered with mio, served by [`ControlServer::accept_and_serve`]
//! within a bounded time. [`query`] is the client side.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;

use super::config::{format_duration, os_message};
use super::status::Status;
use crate::sys::peercred;

/// Longest request accepted, newline included.
pub const MAX_REQUEST_BYTES: usize = 256;
/// Longest [`ControlServer::accept_and_serve`] waits for slow clients, in total per call.
pub const SERVE_BUDGET: Duration = Duration::from_millis(100);
/// Least time given to each client once the budget is spent (so a client that already wrote
/// its request is still answered).
const PER_CLIENT_MIN: Duration = Duration::from_millis(1);
/// Largest response the client reads.
const MAX_RESPONSE_BYTES: u64 = 64 << 20;
/// Mode of the socket file.
pub const SOCKET_MODE: u32 = 0o600;
/// Mode of a socket directory we create.
pub const DIR_MODE: u32 = 0o700;

/// A control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `status` or `status json`: answer the [`Status`] (always as JSON on the wire; `json`
    /// records what the client asked for).
    Status {
        /// The client asked for `status json`.
        json: bool,
    },
}

/// True once `buf` holds a whole request: a newline, or [`MAX_REQUEST_BYTES`] bytes.
pub fn request_complete(buf: &[u8]) -> bool {
    buf.contains(&b'\n') || buf.len() >= MAX_REQUEST_BYTES
}

/// Parses a request line (what the client sent up to EOF or its newline). Pure.
///
/// # Errors
/// A one-line message for the `{"error":...}` answer.
pub fn parse_request(buf: &[u8]) -> Result<Request, String> {
    let line = match buf.iter().position(|&b| b == b'\n') {
        Some(i) if i < MAX_REQUEST_BYTES => &buf[..i],
        Some(_) => return Err(format!("request longer than {MAX_REQUEST_BYTES} bytes")),
        None if buf.len() >= MAX_REQUEST_BYTES => {
            return Err(format!("request longer than {MAX_REQUEST_BYTES} bytes"))
        }
        None => buf,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|_| "request is not UTF-8".to_owned())?;
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    match words.as_slice() {
        [] => Err("empty request".to_owned()),
        ["status"] => Ok(Request::Status { json: false }),
        ["status", "json"] => Ok(Request::Status { json: true }),
        _ => Err(format!(
            "unknown request {text:?} (expected \"status\" or \"status json\")"
        )),
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

/// Adds the path to an I/O error, keeping its kind: `control socket PATH: message`.
fn with_path(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("control socket {}: {}", path.display(), os_message(e)),
    )
}

/// Whether a peer may talk to the daemon: root, or the daemon's own user.
fn default_allow(peer_uid: u32, own_euid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_euid
}

/// The daemon side of the control socket.
///
/// Register it with a `mio::Poll` for `Interest::READABLE` and call
/// [`ControlServer::accept_and_serve`] when it is readable. The socket file is removed on
/// drop (unless something else has replaced it since).
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    /// `(st_dev, st_ino)` of the socket file we created.
    id: (u64, u64),
    own_euid: u32,
    allow: fn(u32, u32) -> bool,
}

impl ControlServer {
    /// Binds the control socket at `path`: creates its directory (mode 0700) if missing,
    /// replaces a stale socket file nobody listens on, refuses to replace a live one or a
    /// non-socket file, makes the socket mode 0600 and non-blocking.
    ///
    /// # Errors
    /// One-line `control socket PATH: ...` errors: `AddrInUse` when another daemon listens
    /// there, `AlreadyExists` when the path is not a socket, or the OS error.
    pub fn bind(path: &Path) -> io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(DIR_MODE)
                    .create(dir)
                    .map_err(|e| with_path(path, &e))?;
            }
        }
        let listener = match UnixListener::bind(path) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                Self::remove_stale(path)?;
                UnixListener::bind(path).map_err(|e| with_path(path, &e))?
            }
            Err(e) => return Err(with_path(path, &e)),
        };
        let setup = || -> io::Result<(u64, u64)> {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
            listener.set_nonblocking(true)?;
            let meta = std::fs::symlink_metadata(path)?;
            Ok((meta.dev(), meta.ino()))
        };
        let id = match setup() {
            Ok(id) => id,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(with_path(path, &e));
            }
        };
        Ok(Self {
            listener,
            path: path.to_owned(),
            id,
            own_euid: peercred::effective_uid(),
            allow: default_allow,
        })
    }

    /// Removes a socket file at `path` that nobody listens on.
    fn remove_stale(path: &Path) -> io::Result<()> {
        let meta = std::fs::symlink_metadata(path).map_err(|e| with_path(path, &e))?;
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "control socket {}: exists and is not a socket",
                    path.display()
                ),
            ));
        }
        match UnixStream::connect(path) {
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "control socket {}: another daemon is listening on it",
                    path.display()
                ),
            )),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(|e| with_path(path, &e))
            }
            Err(e) => Err(with_path(path, &e)),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts every pending client and answers each: a [`Status`] from `status` (called at
    /// most once per call, only if some client asked), `{"error":"permission denied"}` for a
    /// peer that is neither root nor the daemon's user, or an error for a malformed, oversized
    /// or missing request. Waits for slow clients at most [`SERVE_BUDGET`] in total (then
    /// about a millisecond each). Never panics; per-client failures are logged and dropped.
    pub fn accept_and_serve(&mut self, mut status: impl FnMut() -> Status) {
        let deadline = Instant::now() + SERVE_BUDGET;
        let mut answer: Option<String> = None;
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = self.serve_one(&stream, deadline, &mut answer, &mut status) {
                        tracing::debug!(error = %e, "control client dropped");
                    }
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, path = %self.path.display(), "control socket accept failed");
                    break;
                }
            }
        }
    }

    /// Serves one accepted client.
    fn serve_one(
        &self,
        stream: &UnixStream,
        deadline: Instant,
        answer: &mut Option<String>,
        status: &mut impl FnMut() -> Status,
    ) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        let remaining = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(PER_CLIENT_MIN)
        };
        let allowed = match peercred::peer_cred(stream) {
            Ok(cred) => (self.allow)(cred.uid, self.own_euid),
            Err(_) => false,
        };
        // Read the request even from a refused peer: closing a Unix stream socket with unread
        // data resets the connection, and the client would lose our answer.
        let request = read_request(stream, remaining);
        let reply = if !allowed {
            format_error("permission denied")
        } else {
            match request {
                Ok(buf) => match parse_request(&buf) {
                    Ok(Request::Status { .. }) => answer
                        .get_or_insert_with(|| format_response(&status()))
                        .clone(),
                    Err(msg) => format_error(&msg),
                },
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    format_error(&format!(
                        "no request within {}",
                        format_duration(SERVE_BUDGET)
                    ))
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_write_timeout(Some(remaining().max(Duration::from_millis(10))))?;
        let mut w = stream;
        w.write_all(reply.as_bytes())?;
        // Discard what the client sent beyond its request line, for the same reason.
        stream.shutdown(std::net::Shutdown::Write)?;
        stream.set_nonblocking(true)?;
        let mut sink = [0u8; 1024];
        for _ in 0..16 {
            match w.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// For tests: replace the access policy `(peer_uid, own_euid) -> allowed`.
    #[cfg(test)]
    fn set_policy(&mut self, allow: fn(u32, u32) -> bool) {
        self.allow = allow;
    }
}

/// Reads one request: up to a newline, [`MAX_REQUEST_BYTES`] bytes or EOF, each read bounded
/// by `remaining()`.
fn read_request(stream: &UnixStream, remaining: impl Fn() -> Duration) -> io::Result<Vec<u8>> {
    let mut buf = [0u8; MAX_REQUEST_BYTES];
    let mut n = 0;
    let mut r = stream;
    while n < buf.len() && !request_complete(&buf[..n]) {
        stream.set_read_timeout(Some(remaining()))?;
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf[..n].to_vec())
}

impl mio::event::Source for ControlServer {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        SourceFd(&self.listener.as_raw_fd()).register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        SourceFd(&self.listener.as_raw_fd()).reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        SourceFd(&self.listener.as_raw_fd()).deregister(registry)
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
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
    #[error("the daemon for {ifname} did not answer within {} ({})", format_duration(*timeout), path.display())]
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
    /// The answer was not a status document.
    #[error("malformed answer from the daemon for {ifname}: {message}")]
    Malformed {
        /// Interface name (the socket file's stem).
        ifname: String,
        /// What is wrong.
        message: String,
    },
}

/// Asks the daemon listening at `path` for its status; waits at most about `timeout` for the
/// answer. The interface named in errors is the socket file's stem (`ib0` for
/// `/run/ipoib-cm/ib0.sock`).
///
/// # Errors
/// A one-line [`ControlError`], e.g. `no daemon for ib0: /run/ipoib-cm/ib0.sock: No such
/// file or directory`.
pub fn query(path: &Path, timeout: Duration) -> Result<Status, ControlError> {
    let ifname = path
        .file_stem()
        .map_or_else(|| "?".to_owned(), |s| s.to_string_lossy().into_owned());
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
    let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
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
    (&stream)
        .write_all(b"status json\n")
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
    let text = String::from_utf8_lossy(&answer);
    parse_response(&text).map_err(|e| match e {
        ResponseError::Daemon(message) => ControlError::Daemon { ifname, message },
        ResponseError::Malformed(message) => ControlError::Malformed { ifname, message },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::status::{Counters, InterfaceStatus};
    use crate::daemon::Mode;

    fn status() -> Status {
        Status {
            interface: InterfaceStatus {
                name: "ib0".into(),
                mtu: 2044,
                mode: Mode::Datagram,
                hwaddr: crate::wire::ipoib::HwAddr::from([0; 20]).to_string(),
            },
            neighbours: vec![],
            tx: vec![],
            rx: vec![],
            counters: Counters::default(),
            provider: Default::default(),
        }
    }

    #[test]
    fn requests() {
        assert_eq!(
            parse_request(b"status\n"),
            Ok(Request::Status { json: false })
        );
        assert_eq!(
            parse_request(b"status json\n"),
            Ok(Request::Status { json: true })
        );
        assert_eq!(
            parse_request(b"status json\r\n"),
            Ok(Request::Status { json: true })
        );
        assert_eq!(
            parse_request(b"status"),
            Ok(Request::Status { json: false })
        );
        assert_eq!(
            parse_request(b"status\nsomething else"),
            Ok(Request::Status { json: false })
        );
        assert_eq!(parse_request(b""), Err("empty request".into()));
        assert_eq!(parse_request(b"\n"), Err("empty request".into()));
        assert_eq!(
            parse_request(b"reboot\n"),
            Err("unknown request \"reboot\" (expected \"status\" or \"status json\")".into())
        );
        assert_eq!(
            parse_request(b"status xml\n").unwrap_err(),
            "unknown request \"status xml\" (expected \"status\" or \"status json\")"
        );
        assert_eq!(
            parse_request(b"\xff\xfe\n"),
            Err("request is not UTF-8".into())
        );
        let long = vec![b'a'; MAX_REQUEST_BYTES];
        assert_eq!(
            parse_request(&long),
            Err("request longer than 256 bytes".into())
        );
        let mut long_line = vec![b' '; MAX_REQUEST_BYTES + 10];
        long_line.push(b'\n');
        assert!(parse_request(&long_line).is_err());
        assert!(request_complete(b"x\n"));
        assert!(!request_complete(b"status"));
        assert!(request_complete(&long));
    }

    #[test]
    fn responses() {
        let s = status();
        let text = format_response(&s);
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        assert_eq!(parse_response(&text), Ok(s));
        assert_eq!(
            format_error("permission denied"),
            "{\"error\":\"permission denied\"}\n"
        );
        assert_eq!(
            parse_response("{\"error\":\"permission denied\"}\n"),
            Err(ResponseError::Daemon("permission denied".into()))
        );
        assert!(matches!(
            parse_response("{\"error\":5}"),
            Err(ResponseError::Daemon(m)) if m == "5"
        ));
        assert!(matches!(
            parse_response(""),
            Err(ResponseError::Malformed(_))
        ));
        assert!(matches!(
            parse_response("[1,2]"),
            Err(ResponseError::Malformed(_))
        ));
        assert!(matches!(
            parse_response("{\"interface\":{}}"),
            Err(ResponseError::Malformed(_))
        ));
    }

    #[test]
    fn refused_peer_gets_permission_denied() {
        let dir = std::env::temp_dir().join(format!("ipoib-cm-ctl-unit-{}", std::process::id()));
        let path = dir.join("ib9.sock");
        let mut server = ControlServer::bind(&path).unwrap();
        server.set_policy(|_, _| false);
        let client = std::thread::spawn({
            let path = path.clone();
            move || query(&path, Duration::from_secs(5))
        });
        let t0 = Instant::now();
        while !client.is_finished() && t0.elapsed() < Duration::from_secs(5) {
            server.accept_and_serve(|| unreachable!("status computed for a refused peer"));
            std::thread::sleep(Duration::from_millis(2));
        }
        let err = client.join().unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            "the daemon for ib9 answered: permission denied"
        );
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn access_policy() {
        assert!(default_allow(0, 1000));
        assert!(default_allow(1000, 1000));
        assert!(!default_allow(1001, 1000));
        assert!(default_allow(0, 0));
        assert!(!default_allow(1000, 0));
    }
}
