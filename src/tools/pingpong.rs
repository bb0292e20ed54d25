//! The ping-pong loop of `rc-pingpong`, written once over any provider: the client sends,
//! the server answers, `iters` times; each side posts its next send once its previous send
//! completed and the peer's message arrived. [`PingpongIo`] is what a provider lends the
//! loop: its verbs, one pass of its I/O, and a way to sleep.

use std::time::{Duration, Instant};

use super::{Options, PingpongError, RECV_WRID, SEND_WRID};
use crate::verbs::{BufId, Completion, CqId, QpNum, SendWr, UdDest, Verbs, WcOpcode, WcStatus};

/// What the loop needs of a provider and its event loop.
pub trait PingpongIo {
    /// The provider's verbs.
    type V: Verbs;

    /// The verbs the QP lives on.
    fn verbs(&mut self) -> &mut Self::V;

    /// One pass over everything that may have work at `now` (the provider's I/O and timers,
    /// a CM); an error ends the run.
    ///
    /// # Errors
    /// What ends the run: an I/O error, or the peer going away.
    fn pump(&mut self, now: Instant) -> Result<(), PingpongError>;

    /// Sleeps until something may be ready, at most `cap`.
    ///
    /// # Errors
    /// The poll's error.
    fn wait(&mut self, cap: Duration) -> Result<(), PingpongError>;
}

/// The QP a ping-pong runs on (connected RC, or UD with the peer's address) and what it
/// moves.
#[derive(Debug, Clone, Copy)]
pub struct PingpongRun {
    /// The QP: a connected RC QP, or a UD QP in RTS.
    pub qp: QpNum,
    /// Where a UD QP's sends go; `None` for RC.
    pub ud: Option<UdDest>,
    /// The CQ of both its queues.
    pub cq: CqId,
    /// The one send buffer (held by the caller, at least `size` bytes).
    pub send_buf: BufId,
    /// Message size in bytes.
    pub size: usize,
    /// Round trips.
    pub iters: u32,
    /// This side sends first; the direction its payload patterns say.
    pub is_client: bool,
    /// Send each message as soon as the last one completed, without waiting for the peer's
    /// (as rdma_cm's `ucmatose` server does; its client answers only once all have arrived).
    pub unpaced: bool,
    /// Check every received payload against the pattern of its message number and direction.
    pub validate: bool,
    /// Give up after this long.
    pub deadline: Duration,
}

impl PingpongRun {
    /// The run `opts` ask for on an RC `qp` with its `cq` and `send_buf`, payloads not
    /// checked (set [`PingpongRun::ud`] for a UD QP, [`PingpongRun::validate`] to check).
    pub fn new<T>(opts: &Options<T>, qp: QpNum, cq: CqId, send_buf: BufId) -> Self {
        Self {
            qp,
            ud: None,
            cq,
            send_buf,
            size: opts.size,
            iters: opts.iters,
            is_client: opts.is_client(),
            unpaced: false,
            validate: false,
            deadline: opts.deadline,
        }
    }
}

/// Figures of a finished run.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Bytes moved (both directions).
    pub bytes: u64,
    /// Wall time of the ping-pong loop.
    pub elapsed: Duration,
    /// Round trips.
    pub iters: u32,
}

impl Summary {
    /// Prints rdma-core's two summary lines.
    pub fn print(&self) {
        let usec = self.elapsed.as_secs_f64() * 1e6;
        println!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
            self.bytes,
            usec / 1e6,
            self.bytes as f64 * 8.0 / usec.max(1.0)
        );
        println!(
            "{} iters in {:.2} seconds = {:.2} usec/iter",
            self.iters,
            usec / 1e6,
            usec / f64::from(self.iters.max(1))
        );
    }
}

/// Fills `buf` with the pattern of message `n` in direction `from_client`.
pub(crate) fn fill_pattern(buf: &mut [u8], n: u32, from_client: bool) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (u64::from(n) << 1) ^ u64::from(from_client);
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Whether `buf` holds the pattern of message `n` in direction `from_client`.
pub(crate) fn pattern_matches(buf: &[u8], n: u32, from_client: bool) -> bool {
    let mut want = vec![0u8; buf.len()];
    fill_pattern(&mut want, n, from_client);
    want == buf
}

/// Posts message `n` from `r.send_buf` (filled with its pattern when validating).
fn post_send<I: PingpongIo>(io: &mut I, r: &PingpongRun, n: u32) -> Result<(), PingpongError> {
    let v = io.verbs();
    if r.validate {
        if let Ok(b) = v.pools_mut().get_mut(r.send_buf) {
            fill_pattern(&mut b[..r.size], n, r.is_client);
        }
    }
    let wr = SendWr {
        ud: r.ud,
        ..SendWr::send(SEND_WRID, r.send_buf, r.size)
    };
    v.post_send(r.qp, &wr)
        .map_err(PingpongError::verbs("Couldn't post send"))
}

/// Checks a received message `n` (when validating) and posts its buffer again.
fn on_recv<I: PingpongIo>(
    io: &mut I,
    r: &PingpongRun,
    wc: &Completion,
    n: u32,
) -> Result<(), PingpongError> {
    let buf = wc.buf.ok_or(PingpongError::NoBuffer(*wc))?;
    let v = io.verbs();
    if r.validate {
        let data = v
            .pools()
            .get(buf)
            .map_err(PingpongError::verbs("reading a receive buffer"))?;
        let len = wc.byte_len as usize;
        if len != r.size || !pattern_matches(&data[..len], n, !r.is_client) {
            return Err(PingpongError::Mismatch(n));
        }
    }
    v.post_recv(r.qp, RECV_WRID, buf)
        .map_err(PingpongError::verbs("Couldn't post receive"))
}

/// Runs the ping-pong on `io` until both sides did `r.iters` sends and receives.
///
/// # Errors
/// [`PingpongError::Timeout`] at the deadline, a failed completion, a payload mismatch, or
/// what [`PingpongIo::pump`] returns.
pub fn run_pingpong<I: PingpongIo>(io: &mut I, r: &PingpongRun) -> Result<Summary, PingpongError> {
    let mut wcs: Vec<Completion> = Vec::with_capacity(64);
    let start = Instant::now();
    let deadline = start + r.deadline;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut send_pending = false;
    // The next send goes once the last one completed and (unless unpaced) the peer's message
    // it answers has arrived: the client's send `k` answers message `k` (its first answers
    // nothing), the server's message `k + 1`. Counting rather than alternating also keeps
    // pace with a peer that sends all its messages at once (rdma_cm's `ucmatose`).
    let answered = u32::from(r.is_client);
    if r.is_client || r.unpaced {
        post_send(io, r, 0)?;
        send_pending = true;
    }
    while rcnt < r.iters || scnt < r.iters {
        let now = Instant::now();
        if now > deadline {
            return Err(PingpongError::Timeout {
                after: r.deadline,
                sends: scnt,
                recvs: rcnt,
            });
        }
        io.pump(now)?;
        wcs.clear();
        if io.verbs().poll_cq(r.cq, &mut wcs, 64) == 0 {
            io.wait(Duration::from_millis(100))?;
            continue;
        }
        // Completions were handled: loop straight back so the pump transmits what they
        // posted.
        for wc in &wcs {
            if wc.status != WcStatus::Success {
                return Err(PingpongError::Completion(*wc));
            }
            match wc.opcode {
                WcOpcode::Send => {
                    scnt += 1;
                    send_pending = false;
                }
                WcOpcode::Recv => {
                    on_recv(io, r, wc, rcnt)?;
                    rcnt += 1;
                }
            }
            if scnt < r.iters && !send_pending && (r.unpaced || rcnt + answered > scnt) {
                post_send(io, r, scnt)?;
                send_pending = true;
            }
        }
    }
    Ok(Summary {
        bytes: r.size as u64 * u64::from(r.iters) * 2,
        elapsed: start.elapsed(),
        iters: r.iters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_message_and_direction() {
        let mut a = vec![0u8; 100];
        let mut b = vec![0u8; 100];
        fill_pattern(&mut a, 3, true);
        fill_pattern(&mut b, 3, false);
        assert_ne!(a, b);
        assert!(pattern_matches(&a, 3, true));
        assert!(!pattern_matches(&a, 4, true));
    }
}
