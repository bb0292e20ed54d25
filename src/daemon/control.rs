//! The control socket: how `ipoib-cm status` asks a running daemon for its [`Status`].
//!
//! Protocol: the client connects to the Unix stream socket (default
//! `/run/ipoib-cm/<ifname>.sock`), writes one line, `status\n` or `status json\n`, and the
//! server answers with one JSON document (a [`Status`], or `{"error":"..."}`) followed by a
//! newline, then closes. A request is at most [`MAX_REQUEST_BYTES`] bytes.
//!
//! The request and response codecs ([`parse_request`], [`format_response`],
//! [`format_error`], [`parse_response`]) are pure. [`ControlServer`] is the event-loop side:
//! a non-blocking listener and non-blocking clients, each on its own mio token, bounded in
//! number, request size and time, driven with the `now` of the loop's turn. [`query`] is the
//! client side.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::config::os_message;
use super::status::Status;

mod server;

pub use server::{
    ControlCounters, ControlServer, ACCEPTS_PER_TURN, CLIENT_TIMEOUT, MAX_CLIENTS, WRITE_PER_TURN,
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
    #[error("unknown request {0:?} (expected \"status\" or \"status json\")")]
    Unknown(String),
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
mod tests;
