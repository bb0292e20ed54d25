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
use mio::{Registry, Token};

use super::client_slots::{
    discard_input, write_answer, Admission, ClientSlots, Slot, Step, ACCEPT_RETRY,
};

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

/// The exposition's content type (text format 0.0.4).
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the metrics listener did, since [`MetricsServer::bind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsCounters {
    /// Connections given a slot.
    pub accepted: u64,
    /// Connections closed at once because every slot was taken by a client mid-exchange.
    pub over_limit: u64,
    /// Clients that had sent nothing and gave their slot up to a newcomer.
    pub evicted_idle: u64,
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
type Client = Slot<TcpStream, Phase>;

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
    clients: ClientSlots<TcpStream, Phase>,
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
            clients: ClientSlots::new("metrics", MAX_CLIENTS),
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

    /// When [`MetricsServer::handle`] has work next: at once while connections or answer
    /// bytes wait behind a per-turn bound, else the earliest client deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.clients.poll_timeout()
    }

    /// One turn at `now`: accepts waiting connections (at most [`ACCEPTS_PER_TURN`]), reads
    /// request heads, writes answers, and closes clients that are done or out of time.
    /// `exposition` gives the body of `GET /metrics`; it is called at most once per turn, only
    /// if a client asked, and its text is shared by the turn's answers. Never panics, never
    /// blocks; per-client failures are logged at debug and the client dropped.
    pub fn handle(&mut self, now: Instant, mut exposition: impl FnMut() -> String) {
        let listener = &self.listener;
        let accepted = self.clients.accept(
            now,
            ACCEPTS_PER_TURN,
            CLIENT_TIMEOUT,
            || listener.accept().map(|(stream, _)| stream),
            &mut self.counters,
        );
        if let Err(e) = accepted {
            tracing::warn!(
                error = %e,
                addr = %self.addr,
                "metrics listener accept failed; trying again in {ACCEPT_RETRY:?} (the client waits)"
            );
        }
        let mut body: Option<String> = None;
        let mut get_body = || -> String { body.get_or_insert_with(&mut exposition).clone() };
        let counters = &mut self.counters;
        self.clients
            .step_due(now, |c| step(c, now, &mut get_body, counters));
    }
}

impl Admission<TcpStream, Phase> for MetricsCounters {
    fn refuse(&mut self, mut stream: TcpStream) {
        self.over_limit += 1;
        tracing::debug!(
            clients = MAX_CLIENTS,
            "metrics listener: too many clients, connection closed"
        );
        // One short answer into an empty socket buffer; best effort, never waited for.
        let _ = stream.write(&error_response("503 Service Unavailable"));
        let _ = stream.shutdown(std::net::Shutdown::Write);
        discard_input(&mut stream);
    }

    fn allowed(&mut self, _: &TcpStream) -> bool {
        true
    }

    fn admit(&mut self, _: &TcpStream) -> Phase {
        self.accepted += 1;
        Phase::Request {
            buf: Vec::with_capacity(MAX_REQUEST_BYTES),
        }
    }

    fn deny(&mut self, _: TcpStream) {}

    fn evicted(&mut self) {
        self.evicted_idle += 1;
    }

    fn idle(phase: &Phase) -> bool {
        matches!(phase, Phase::Request { buf } if buf.is_empty())
    }
}

/// Moves client `c`'s exchange on as far as the socket allows without blocking.
fn step(
    c: &mut Client,
    now: Instant,
    body: &mut impl FnMut() -> String,
    counters: &mut MetricsCounters,
) -> io::Result<Step> {
    if let Phase::Request { buf } = &mut c.exchange {
        let answer = match read_head(&mut c.stream, buf)? {
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
            None if now < c.deadline => return Ok(Step::Reading),
            None => {
                counters.timed_out += 1;
                error_response("408 Request Timeout")
            }
        };
        c.exchange = Phase::Answer { answer, sent: 0 };
        c.deadline = now + CLIENT_TIMEOUT;
    }
    let Phase::Answer { answer, sent } = &mut c.exchange else {
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

#[cfg(test)]
mod tests;
