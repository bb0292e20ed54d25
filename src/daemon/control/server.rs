//! [`ControlServer`]: the daemon side of the control socket, a state machine over
//! non-blocking sockets that the event loop drives with the `now` of its turn.
//!
//! Every client is non-blocking and has its own mio token (`first_client + slot`). What one
//! turn does is bounded: at most [`ACCEPTS_PER_TURN`] accepts, at most
//! [`MAX_REQUEST_BYTES`] read and at most [`WRITE_PER_TURN`] written per client. What a client
//! holds is bounded: a slot among [`MAX_CLIENTS`] and [`CLIENT_TIMEOUT`] to send its request
//! and again to read its answer. Credentials are checked at `accept`: a peer that is neither
//! root nor the daemon's user is answered `{"error":"permission denied"}` and closed at once,
//! never holding a slot. With every slot taken, the client that has waited longest without
//! sending anything is closed to make room; only when every client is mid-exchange is a
//! connection answered `{"error":"too many control clients"}` without being read, and closed. The server never reads
//! the clock and never blocks.

use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{UnixListener, UnixStream};
use mio::{Registry, Token};

use super::{
    format_error, format_ok, format_response, parse_request, request_complete, socket_addr, Request,
};
use super::{DIR_MODE, MAX_REQUEST_BYTES, SOCKET_MODE};
use crate::daemon::client_slots::{
    discard_input, write_answer, Admission, ClientSlots, Slot, Step, ACCEPT_RETRY,
};
use crate::daemon::config::os_message;
use crate::daemon::status::Status;
use crate::sys::peercred;

/// Most clients served at once; each has one token.
pub const MAX_CLIENTS: usize = 64;
/// Most connections accepted in one turn.
pub const ACCEPTS_PER_TURN: usize = 32;
/// How long a client has to send its whole request, and again to read its whole answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Most answer bytes written to one client in one turn.
pub const WRITE_PER_TURN: usize = 256 << 10;

/// What the control socket did, since [`ControlServer::bind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlCounters {
    /// Connections given a slot.
    pub accepted: u64,
    /// Connections closed at once because every slot was taken by a client mid-exchange.
    pub over_limit: u64,
    /// Connections from a user that may not talk to the daemon, answered and closed at accept.
    pub denied: u64,
    /// Clients that had sent nothing and gave their slot up to a newcomer.
    pub evicted_idle: u64,
    /// Clients that did not send a whole request, or read their whole answer, in time.
    pub timed_out: u64,
    /// Answers written in full.
    pub answered: u64,
}

/// Where a client is in its one exchange.
#[derive(Debug)]
enum Phase {
    /// Reading the request; `buf` holds what arrived, at most [`MAX_REQUEST_BYTES`].
    Request { buf: Vec<u8> },
    /// Writing `answer`, of which `sent` bytes are written.
    Answer { answer: Arc<[u8]>, sent: usize },
}

/// What the server keeps of one client's exchange (its peer is root or the daemon's user:
/// no one else gets a slot).
#[derive(Debug)]
struct Exchange {
    phase: Phase,
}

/// One accepted connection.
type Client = Slot<UnixStream, Exchange>;

/// The daemon side of the control socket: a non-blocking listener and up to
/// [`MAX_CLIENTS`] non-blocking clients.
///
/// Drive it like the other sources of the event loop: [`ControlServer::register`] it once,
/// pass every readiness event to [`ControlServer::note_readiness`], call
/// [`ControlServer::handle`] with the turn's `now` every turn, and sleep no longer than
/// [`ControlServer::poll_timeout`]. Unregistered (in tests), every client is tried every
/// turn. The socket file is removed on drop (unless something else has replaced it since).
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    /// `(st_dev, st_ino)` of the socket file we created; `None` for an abstract socket.
    id: Option<(u64, u64)>,
    own_euid: u32,
    allow: fn(u32, u32) -> bool,
    clients: ClientSlots<UnixStream, Exchange>,
    counters: ControlCounters,
}

/// Adds the path to an I/O error, keeping its kind: `control socket PATH: message`.
fn with_path(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("control socket {}: {}", path.display(), os_message(e)),
    )
}

/// Whether a peer may talk to the daemon: root, or the daemon's own user.
pub(super) fn default_allow(peer_uid: u32, own_euid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_euid
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
        if path.as_os_str().as_encoded_bytes().starts_with(b"@") {
            let addr = socket_addr(path).map_err(|e| with_path(path, &e))?;
            let listener = UnixListener::bind_addr(&addr).map_err(|e| {
                if e.kind() == io::ErrorKind::AddrInUse {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "control socket {}: another daemon of this network namespace is \
                             listening on it",
                            path.display()
                        ),
                    )
                } else {
                    with_path(path, &e)
                }
            })?;
            return Ok(Self::with_listener(listener, path, None));
        }
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
        Ok(Self::with_listener(listener, path, Some(id)))
    }

    /// The server over a bound listener.
    fn with_listener(listener: UnixListener, path: &Path, id: Option<(u64, u64)>) -> Self {
        Self {
            listener,
            path: path.to_owned(),
            id,
            own_euid: peercred::effective_uid(),
            allow: default_allow,
            clients: ClientSlots::new("control", MAX_CLIENTS),
            counters: ControlCounters::default(),
        }
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
        match std::os::unix::net::UnixStream::connect(path) {
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

    /// What the server did so far.
    pub fn counters(&self) -> ControlCounters {
        self.counters
    }

    /// Clients holding a slot.
    pub fn clients(&self) -> usize {
        self.clients.clients()
    }

    /// Registers the listener with `registry` under `listener`, and every client it accepts
    /// later under `first_client + slot`: the tokens `first_client ..
    /// first_client + MAX_CLIENTS` are the server's. Registering again moves the server (and
    /// closes its clients).
    ///
    /// # Errors
    /// The registry's.
    pub fn register(
        &mut self,
        registry: &Registry,
        listener: Token,
        first_client: Token,
    ) -> io::Result<()> {
        self.clients
            .register(registry, &mut self.listener, listener, first_client)
    }

    /// Takes note of a readiness event; returns whether `token` is one of the server's.
    pub fn note_readiness(&mut self, token: Token) -> bool {
        self.clients.note_readiness(token)
    }

    /// When [`ControlServer::handle`] has work next: at once while connections or answer
    /// bytes wait behind a per-turn bound, else the earliest client deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.clients.poll_timeout()
    }

    /// One turn at `now`: accepts waiting connections (at most [`ACCEPTS_PER_TURN`]), reads
    /// requests, writes answers, and closes clients that are done or out of time. A request
    /// is answered with a [`Status`] from `status` (called at most once per turn, only if a
    /// permitted client asked), `{"error":"permission denied"}` for a peer that is neither root
    /// nor the daemon's user, or an error for a malformed, oversized or missing request.
    /// Never panics, never blocks; per-client failures are logged and the client dropped.
    pub fn handle(&mut self, now: Instant, mut status: impl FnMut() -> Status) {
        self.serve(now, |req| match req {
            Request::Status { .. } => Reply::Status(Box::new(status())),
            _ => Reply::Error("this server answers status only".to_owned()),
        });
    }

    /// [`ControlServer::handle`] for every request: `answer` gives each permitted request's
    /// [`Reply`] (a status request at most once per turn, its answer shared by the turn's
    /// status requests).
    pub fn serve(&mut self, now: Instant, mut answer: impl FnMut(&Request) -> Reply) {
        let listener = &self.listener;
        let mut admission = Admit {
            counters: &mut self.counters,
            own_euid: self.own_euid,
            allow: self.allow,
        };
        let accepted = self.clients.accept(
            now,
            ACCEPTS_PER_TURN,
            CLIENT_TIMEOUT,
            || listener.accept().map(|(stream, _)| stream),
            &mut admission,
        );
        if let Err(e) = accepted {
            tracing::warn!(
                error = %e,
                path = %self.path.display(),
                "control socket accept failed; trying again in {ACCEPT_RETRY:?} (the client waits)"
            );
        }
        let mut status: Option<Arc<[u8]>> = None;
        let counters = &mut self.counters;
        self.clients
            .step_due(now, |c| step(c, now, &mut status, &mut answer, counters));
    }

    /// For tests: replace the access policy `(peer_uid, own_euid) -> allowed`.
    #[cfg(test)]
    pub(super) fn set_policy(&mut self, allow: fn(u32, u32) -> bool) {
        self.allow = allow;
    }
}

/// What a turn's accepting needs of the server: its counters and its access policy.
struct Admit<'a> {
    counters: &'a mut ControlCounters,
    own_euid: u32,
    allow: fn(u32, u32) -> bool,
}

impl Admission<UnixStream, Exchange> for Admit<'_> {
    fn allowed(&mut self, stream: &UnixStream) -> bool {
        match peercred::peer_cred(stream) {
            Ok(cred) => (self.allow)(cred.uid, self.own_euid),
            Err(_) => false,
        }
    }

    fn admit(&mut self, _: &UnixStream) -> Exchange {
        self.counters.accepted += 1;
        Exchange {
            phase: Phase::Request {
                buf: Vec::with_capacity(MAX_REQUEST_BYTES),
            },
        }
    }

    fn deny(&mut self, stream: UnixStream) {
        self.counters.denied += 1;
        tracing::debug!("control socket: peer is neither root nor the daemon's user, closed");
        answer_and_close(stream, "permission denied");
    }

    fn refuse(&mut self, stream: UnixStream) {
        self.counters.over_limit += 1;
        tracing::debug!(
            clients = MAX_CLIENTS,
            "control socket: too many clients mid-exchange, connection closed"
        );
        answer_and_close(stream, "too many control clients");
    }

    fn evicted(&mut self) {
        self.counters.evicted_idle += 1;
    }

    fn idle(exchange: &Exchange) -> bool {
        matches!(&exchange.phase, Phase::Request { buf } if buf.is_empty())
    }
}

/// Writes one error line into a connection's empty socket buffer and closes it; best effort,
/// never waited for.
fn answer_and_close(mut stream: UnixStream, error: &str) {
    let _ = stream.write(format_error(error).as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
    discard_input(&mut stream);
}

/// Moves client `c`'s exchange on as far as the socket allows without blocking.
fn step(
    c: &mut Client,
    now: Instant,
    status: &mut Option<Arc<[u8]>>,
    answer: &mut impl FnMut(&Request) -> Reply,
    counters: &mut ControlCounters,
) -> io::Result<Step> {
    if let Phase::Request { buf } = &mut c.exchange.phase {
        let reply = match read_request(&mut c.stream, buf)? {
            Some(()) => match parse_request(buf) {
                Ok(req @ Request::Status { .. }) => match status {
                    Some(shared) => shared.clone(),
                    None => status.insert(reply_bytes(answer(&req))).clone(),
                },
                Ok(req) => reply_bytes(answer(&req)),
                Err(e) => Arc::from(format_error(&e.to_string()).into_bytes()),
            },
            None if now < c.deadline => return Ok(Step::Reading),
            None => {
                counters.timed_out += 1;
                Arc::from(
                    format_error(&format!("no request within {CLIENT_TIMEOUT:?}")).into_bytes(),
                )
            }
        };
        c.exchange.phase = Phase::Answer {
            answer: reply,
            sent: 0,
        };
        c.deadline = now + CLIENT_TIMEOUT;
    }
    let Phase::Answer { answer, sent } = &mut c.exchange.phase else {
        return Ok(Step::Reading);
    };
    if now >= c.deadline {
        counters.timed_out += 1;
        return Ok(Step::Close);
    }
    if !write_answer(&mut c.stream, &mut c.ready, answer, sent, WRITE_PER_TURN)? {
        return Ok(Step::Writing);
    }
    counters.answered += 1;
    c.stream.shutdown(std::net::Shutdown::Write)?;
    discard_input(&mut c.stream);
    Ok(Step::Close)
}

/// The answer to one request.
#[derive(Debug)]
pub enum Reply {
    /// The status document.
    Status(Box<Status>),
    /// A command done: one line saying what it did.
    Ok(String),
    /// A command refused: one line saying why.
    Error(String),
}

/// The bytes of a reply on the wire.
fn reply_bytes(reply: Reply) -> Arc<[u8]> {
    let text = match reply {
        Reply::Status(s) => format_response(&s),
        Reply::Ok(m) => format_ok(&m),
        Reply::Error(m) => format_error(&m),
    };
    Arc::from(text.into_bytes())
}

/// Reads what is waiting of a request into `buf` (never past [`MAX_REQUEST_BYTES`]):
/// `Some(())` once it is whole (a newline, the size bound or EOF), `None` if more is to come.
fn read_request(stream: &mut UnixStream, buf: &mut Vec<u8>) -> io::Result<Option<()>> {
    let mut chunk = [0u8; MAX_REQUEST_BYTES];
    while !request_complete(buf) {
        let room = MAX_REQUEST_BYTES.saturating_sub(buf.len());
        let into = chunk.get_mut(..room).unwrap_or_default();
        match stream.read(into) {
            Ok(0) => return Ok(Some(())),
            Ok(k) => buf.extend_from_slice(into.get(..k).unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(()))
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == id {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}
