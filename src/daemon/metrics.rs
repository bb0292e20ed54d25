//! [`MetricsServer`]: the opt-in HTTP listener of `--metrics-listen ADDR:PORT`, answering
//! `GET /metrics` with the Prometheus text exposition of the status
//! ([`render_prometheus`](super::status::render_prometheus)), driven by the event loop with
//! the `now` of its turn like the control socket ([`ControlServer`](super::control::ControlServer)).
//!
//! HTTP/1.0, one request per connection: the answer ends with the connection. Every client is
//! non-blocking and has its own mio token (`first_client + slot`). What one turn does is
//! bounded: at most [`ACCEPTS_PER_TURN`] accepts, at most [`MAX_REQUEST_BYTES`] read and at
//! most [`WRITE_PER_TURN`] written per client. What a client holds is bounded: a slot among
//! [`MAX_CLIENTS`] (a connection beyond them is answered `503` without being read, and closed)
//! and [`CLIENT_TIMEOUT`] to send its request head and again to read its answer. The server
//! never reads the clock and never blocks. There is no authentication: whoever reaches the
//! address reads the counters (bind it to loopback unless that is meant).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};

/// Most clients served at once; each has one token.
pub const MAX_CLIENTS: usize = 16;
/// Most connections accepted in one turn.
pub const ACCEPTS_PER_TURN: usize = 16;
/// How long a client has to send its request head, and again to read its whole answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of a request head read; a longer one is answered `431`.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// Most answer bytes written to one client in one turn.
pub const WRITE_PER_TURN: usize = 256 << 10;
/// Most bytes a client sent beyond its request head that are read and discarded before its
/// socket is closed (closing a TCP socket with unread data resets the connection, and the
/// client could lose its answer).
const DISCARD_BYTES: usize = 16 << 10;

/// The exposition's content type (text format 0.0.4).
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the metrics listener did, since [`MetricsServer::bind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsCounters {
    /// Connections given a slot.
    pub accepted: u64,
    /// Connections closed at once because every slot was taken.
    pub over_limit: u64,
    /// Clients that did not send a whole request head, or read their whole answer, in time.
    pub timed_out: u64,
    /// Answers written in full (`200` and errors alike).
    pub answered: u64,
}

/// What a request head asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpRequest {
    /// `GET /metrics` (or `HEAD`): the exposition.
    Metrics {
        /// `HEAD`: the header only.
        head_only: bool,
    },
    /// A well-formed request for another path (`404`).
    NotFound,
    /// A method other than `GET` and `HEAD` (`405`).
    BadMethod,
    /// Not an HTTP request line (`400`).
    Malformed,
}

/// Whether `buf` holds a whole request head (it ends in an empty line).
fn head_complete(buf: &[u8]) -> bool {
    buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n")
}

/// Parses the request line of a request head: `METHOD TARGET HTTP/1.x`. The target may have
/// a query (`/metrics?x=1`); headers are not looked at.
pub fn parse_request(head: &[u8]) -> HttpRequest {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Some(line) = head
        .get(..line_end)
        .and_then(|l| std::str::from_utf8(l).ok())
    else {
        return HttpRequest::Malformed;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return HttpRequest::Malformed;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return HttpRequest::Malformed;
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return HttpRequest::BadMethod,
    };
    let path = target.split('?').next().unwrap_or_default();
    if path == "/metrics" {
        HttpRequest::Metrics { head_only }
    } else {
        HttpRequest::NotFound
    }
}

/// A whole HTTP/1.0 response: status line, headers, `body` (left out for `HEAD`).
fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> Arc<[u8]> {
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    Arc::from(out.into_bytes())
}

/// A short plain-text error response.
fn error_response(status: &str) -> Arc<[u8]> {
    response(
        status,
        "text/plain; charset=utf-8",
        &format!("{status}\n"),
        false,
    )
}

/// Where a client is in its one exchange.
#[derive(Debug)]
enum Phase {
    /// Reading the request head; `buf` holds what arrived, at most [`MAX_REQUEST_BYTES`].
    Request { buf: Vec<u8> },
    /// Writing `answer`, of which `sent` bytes are written.
    Answer { answer: Arc<[u8]>, sent: usize },
}

/// One accepted connection.
#[derive(Debug)]
struct Client {
    stream: TcpStream,
    /// When the current phase times out.
    deadline: Instant,
    /// The socket may make progress: readiness was reported, or the last turn stopped at a
    /// bound rather than at `WouldBlock`.
    ready: bool,
    /// WRITABLE (instead of READABLE) is registered: the answer is being written.
    writable: bool,
    phase: Phase,
}

/// The metrics listener: a non-blocking TCP listener and up to [`MAX_CLIENTS`] non-blocking
/// clients.
///
/// Drive it like the other sources of the event loop: [`MetricsServer::register`] it once,
/// pass every readiness event to [`MetricsServer::note_readiness`], call
/// [`MetricsServer::handle`] with the turn's `now` every turn, and sleep no longer than
/// [`MetricsServer::poll_timeout`]. Unregistered (in tests), every client is tried every turn.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    addr: SocketAddr,
    /// The registry, the listener's token and the first client token.
    registration: Option<(Registry, Token, usize)>,
    /// The listener may have connections waiting (reported, or the accept bound was hit).
    listener_ready: bool,
    /// Slot `i` is the client with token `first_client + i`.
    clients: Vec<Option<Client>>,
    /// The `now` of the last [`MetricsServer::handle`].
    now: Option<Instant>,
    counters: MetricsCounters,
}

impl MetricsServer {
    /// Binds a non-blocking listener at `addr` (port 0: one the system picks, see
    /// [`MetricsServer::local_addr`]).
    ///
    /// # Errors
    /// The OS error of binding.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        Ok(Self {
            listener,
            addr,
            registration: None,
            listener_ready: true,
            clients: (0..MAX_CLIENTS).map(|_| None).collect(),
            now: None,
            counters: MetricsCounters::default(),
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server did so far.
    pub fn counters(&self) -> MetricsCounters {
        self.counters
    }

    /// Clients holding a slot.
    pub fn clients(&self) -> usize {
        self.clients.iter().flatten().count()
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
        for slot in 0..MAX_CLIENTS {
            self.close(slot);
        }
        if let Some((old, _, _)) = self.registration.take() {
            old.deregister(&mut self.listener)?;
        }
        registry.register(&mut self.listener, listener, Interest::READABLE)?;
        self.listener_ready = true;
        self.registration = Some((registry.try_clone()?, listener, first_client.0));
        Ok(())
    }

    /// Takes note of a readiness event; returns whether `token` is one of the server's.
    pub fn note_readiness(&mut self, token: Token) -> bool {
        let Some((_, listener, first)) = &self.registration else {
            return false;
        };
        if token == *listener {
            self.listener_ready = true;
            return true;
        }
        let Some(slot) = token.0.checked_sub(*first).filter(|&s| s < MAX_CLIENTS) else {
            return false;
        };
        if let Some(c) = self.clients.get_mut(slot).and_then(Option::as_mut) {
            c.ready = true;
        }
        true
    }

    /// When [`MetricsServer::handle`] has work next: at once while connections or answer
    /// bytes wait behind a per-turn bound, else the earliest client deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let registered = self.registration.is_some();
        let mut next: Option<Instant> = None;
        for c in self.clients.iter().flatten() {
            let t = if c.ready && registered {
                self.now.unwrap_or(c.deadline)
            } else {
                c.deadline
            };
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        match self.now {
            Some(now) if registered && self.listener_ready => Some(now),
            _ => next,
        }
    }

    /// One turn at `now`: accepts waiting connections (at most [`ACCEPTS_PER_TURN`]), reads
    /// request heads, writes answers, and closes clients that are done or out of time.
    /// `exposition` gives the body of `GET /metrics`; it is called at most once per turn, only
    /// if a client asked, and its text is shared by the turn's answers. Never panics, never
    /// blocks; per-client failures are logged at debug and the client dropped.
    pub fn handle(&mut self, now: Instant, mut exposition: impl FnMut() -> String) {
        self.now = Some(now);
        if self.listener_ready || self.registration.is_none() {
            self.accept(now);
        }
        let poll_all = self.registration.is_none();
        let mut body: Option<String> = None;
        let mut get_body = || -> String { body.get_or_insert_with(&mut exposition).clone() };
        for slot in 0..MAX_CLIENTS {
            let Some(c) = self.clients.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if !(c.ready || poll_all || now >= c.deadline) {
                continue;
            }
            c.ready = false;
            let closing = match c.step(now, &mut get_body, &mut self.counters) {
                Ok(done) => done,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics client dropped");
                    true
                }
            };
            if closing {
                self.close(slot);
            } else if matches!(c.phase, Phase::Answer { .. }) && !c.writable {
                self.want_writable(slot);
            }
        }
    }

    /// Accepts up to [`ACCEPTS_PER_TURN`] connections; `listener_ready` stays set if the
    /// bound stopped it.
    fn accept(&mut self, now: Instant) {
        for _ in 0..ACCEPTS_PER_TURN {
            match self.listener.accept() {
                Ok((stream, _)) => self.admit(stream, now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.listener_ready = false;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, addr = %self.addr, "metrics listener accept failed");
                    self.listener_ready = false;
                    return;
                }
            }
        }
    }

    /// Gives an accepted connection a slot and a token, or answers `503` and closes it if
    /// none is free.
    fn admit(&mut self, mut stream: TcpStream, now: Instant) {
        let Some(slot) = self.clients.iter().position(Option::is_none) else {
            self.counters.over_limit += 1;
            tracing::debug!(
                clients = MAX_CLIENTS,
                "metrics listener: too many clients, connection closed"
            );
            // One short answer into an empty socket buffer; best effort, never waited for.
            let _ = stream.write(&error_response("503 Service Unavailable"));
            let _ = stream.shutdown(std::net::Shutdown::Write);
            discard_input(&mut stream);
            return;
        };
        if let Some((registry, _, first)) = &self.registration {
            if let Err(e) = registry.register(&mut stream, Token(first + slot), Interest::READABLE)
            {
                tracing::debug!(error = %e, "metrics client dropped");
                return;
            }
        }
        self.counters.accepted += 1;
        if let Some(s) = self.clients.get_mut(slot) {
            *s = Some(Client {
                stream,
                deadline: now + CLIENT_TIMEOUT,
                // The request may have arrived before the accept.
                ready: true,
                writable: false,
                phase: Phase::Request {
                    buf: Vec::with_capacity(MAX_REQUEST_BYTES),
                },
            });
        }
    }

    /// Asks for WRITABLE on a client writing its answer (it only waits for that then).
    fn want_writable(&mut self, slot: usize) {
        let Some((registry, _, first)) = &self.registration else {
            return;
        };
        if let Some(c) = self.clients.get_mut(slot).and_then(Option::as_mut) {
            match registry.reregister(&mut c.stream, Token(first + slot), Interest::WRITABLE) {
                Ok(()) => c.writable = true,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics client dropped");
                    self.close(slot);
                }
            }
        }
    }

    /// Deregisters and closes the client in `slot`.
    fn close(&mut self, slot: usize) {
        let Some(mut c) = self.clients.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if let Some((registry, _, _)) = &self.registration {
            let _ = registry.deregister(&mut c.stream);
        }
    }
}

impl Client {
    /// Moves the exchange on as far as the socket allows without blocking; `Ok(true)` when
    /// the client is done with (answered or out of time).
    fn step(
        &mut self,
        now: Instant,
        body: &mut impl FnMut() -> String,
        counters: &mut MetricsCounters,
    ) -> io::Result<bool> {
        if let Phase::Request { buf } = &mut self.phase {
            let answer = match read_head(&mut self.stream, buf)? {
                Some(()) if !head_complete(buf) && buf.len() >= MAX_REQUEST_BYTES => {
                    error_response("431 Request Header Fields Too Large")
                }
                Some(()) => match parse_request(buf) {
                    HttpRequest::Metrics { head_only } => {
                        response("200 OK", CONTENT_TYPE, &body(), head_only)
                    }
                    HttpRequest::NotFound => error_response("404 Not Found"),
                    HttpRequest::BadMethod => error_response("405 Method Not Allowed"),
                    HttpRequest::Malformed => error_response("400 Bad Request"),
                },
                None if now < self.deadline => return Ok(false),
                None => {
                    counters.timed_out += 1;
                    error_response("408 Request Timeout")
                }
            };
            self.phase = Phase::Answer { answer, sent: 0 };
            self.deadline = now + CLIENT_TIMEOUT;
        }
        let Phase::Answer { answer, sent } = &mut self.phase else {
            return Ok(false);
        };
        if now >= self.deadline {
            counters.timed_out += 1;
            return Ok(true);
        }
        let budget_end = (*sent + WRITE_PER_TURN).min(answer.len());
        while *sent < answer.len() {
            if *sent >= budget_end {
                // More to write and the socket did not say no: carry on next turn.
                self.ready = true;
                return Ok(false);
            }
            let chunk = answer.get(*sent..budget_end).unwrap_or_default();
            match self.stream.write(chunk) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => *sent += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        counters.answered += 1;
        self.stream.shutdown(std::net::Shutdown::Write)?;
        discard_input(&mut self.stream);
        Ok(true)
    }
}

/// Reads what is waiting of a request head into `buf` (never past [`MAX_REQUEST_BYTES`]):
/// `Some(())` once it is whole (an empty line, the size bound or EOF), `None` if more is to
/// come.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Option<()>> {
    let mut chunk = [0u8; 1024];
    while !head_complete(buf) && buf.len() < MAX_REQUEST_BYTES {
        let room = (MAX_REQUEST_BYTES - buf.len()).min(chunk.len());
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

/// Reads and drops what the client sent beyond its request head, up to [`DISCARD_BYTES`] and
/// without waiting.
fn discard_input(stream: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    let mut left = DISCARD_BYTES;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(k) => left = left.saturating_sub(k),
        }
    }
}

#[cfg(test)]
mod tests;
