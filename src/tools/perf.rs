//! `ipoib-cm perf`: the software RC provider alone (no TUN, no IPoIB) between two processes
//! over UDP, like perftest's `ib_send_bw` and `ib_send_lat`.
//!
//! The server (`ipoib-cm perf`) waits for one client on the TCP exchange port; the client
//! (`ipoib-cm perf SERVER_IP`) connects. The QPs are connected by the exchange of
//! [`super::rc_pingpong`] (rdma-core's pingpong format, on port [`DEFAULT_TCP_PORT`] by
//! default): it is not perftest's exchange, so this tool does not pair with `ib_send_bw`.
//! Both sides must be given the same mode, `-s` and `-n`.
//!
//! - `--bw` (default): the client streams `-n` RC SENDs of `-s` bytes, up to `--tx-depth`
//!   outstanding; the server keeps `--rx-depth` receives posted. Both report bytes, seconds,
//!   Gbit/s and messages/s. Both clocks start when the exchange ends (the client after it
//!   sent `"done"`, the server after it read it, so the server's clock starts a little
//!   later than the first send, never after it). The server stops at its last receive
//!   completion: the data arrived. The client stops at its last send completion, which the
//!   server's ACK of the last packet triggers, so it also counts that ACK's trip back. The
//!   server's figure is the honest one for what the data did; the client's is a little lower.
//! - `--lat`: ping-pong of `-n` messages of `-s` bytes; the client sends first. Each side
//!   times every round trip from posting its send to the completion of the peer's answer, and
//!   reports half of it (RTT/2) as p50, p99, max and average in microseconds. The client
//!   has `-n` samples, the server `-n - 1` (its last message is answered by nobody).
//!
//! The event loop sleeps in `epoll` between completions, as `ipoib-cm up` does without busy
//! polling; UDP GSO/GRO are on unless `--no-udp-offload`.

use std::time::Instant;

use super::exchange::{exchange_over_tcp, TcpExchange};
use super::rc_qp::connect_rc_qp;
use super::soft_loop::{linger, stats_line};
use super::PingpongError;
use crate::verbs::Provider;

mod args;
mod report;
mod side;
#[cfg(test)]
mod tests;

pub use args::{Mode, Perf, PerfArgs, PerfOptions, DEFAULT_TCP_PORT, MAX_BUFFER_BYTES, MAX_SIZE};
pub use report::{Latency, Report};
use side::{ping_pong, stream, Side};

/// Runs one side.
///
/// # Errors
/// Any [`PingpongError`]; the caller prints it and exits with
/// [`PingpongError::exit_code`].
pub fn run(opts: &PerfOptions) -> Result<Report, PingpongError> {
    let deadline = Instant::now() + opts.deadline;
    let ex = TcpExchange {
        accept_deadline: Some(deadline),
        ..TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline)
    };
    let (mut side, _) = exchange_over_tcp(
        &ex,
        |local| {
            let side = Side::open(opts, local)?;
            let my = side.my;
            Ok((side, my))
        },
        |side, rem| {
            let psns = (rem.psn, side.my.psn);
            connect_rc_qp(side.lp.prov.verbs(), side.qp, rem, &opts.tool.link, psns)
        },
    )?;
    let is_client = opts.peer.is_some();
    let mode = opts.tool.mode;
    let (elapsed, latency) = match (mode, is_client) {
        (Mode::Bw, _) => (stream(&mut side, opts, deadline)?, None),
        (Mode::Lat, _) => {
            let (elapsed, mut round_trips) = ping_pong(&mut side, opts, deadline)?;
            (elapsed, Latency::of_round_trips(&mut round_trips))
        }
    };
    // The streaming client has nothing left to acknowledge; everyone else may have.
    if mode == Mode::Lat || !is_client {
        linger(&mut side, opts.tool.link.qp_timeout, |side, now, cap| {
            side.lp.prov.handle_io(now)?;
            side.idle(now + cap)
        })?;
    }
    Ok(Report {
        mode,
        is_client,
        size: opts.size,
        iters: opts.iters,
        elapsed,
        latency,
        stats: stats_line(side.lp.prov.engine()),
    })
}
