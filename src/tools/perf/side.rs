//! One side of a perf run: its provider, QP and send buffers, one turn of its event loop,
//! and the two measurements driven over it (the bandwidth stream and the latency ping-pong).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::args::PerfOptions;
use crate::tools::exchange::Dest;
use crate::tools::rc_qp::{open_rc_qp, RcQpSetup};
use crate::tools::soft_loop::{SoftLink, SoftLoop};
use crate::tools::{PingpongError, RECV_WRID, SEND_WRID};
use crate::verbs::setup::os_seed;
use crate::verbs::{BufId, Completion, CqId, Provider, QpNum, SendWr, Verbs, WcOpcode, WcStatus};

/// Longest sleep of the event loop without a timer or readiness.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// Completions taken per poll.
const CQ_BATCH: usize = 256;

/// What one turn of the loop completed.
#[derive(Debug, Default, Clone, Copy)]
struct Turn {
    sends: u32,
    recvs: u32,
}

impl Turn {
    fn is_idle(self) -> bool {
        self.sends == 0 && self.recvs == 0
    }
}

/// One side's provider, QP and buffers.
pub(super) struct Side {
    pub(super) lp: SoftLoop,
    cq: CqId,
    pub(super) qp: QpNum,
    pub(super) my: Dest,
    /// Send buffers not posted.
    free_send: Vec<BufId>,
    wcs: Vec<Completion>,
    /// Receives completed so far (to name a bad one).
    received: u32,
}

impl Side {
    pub(super) fn open(opts: &PerfOptions, local: IpAddr) -> Result<Self, PingpongError> {
        let mut lp = SoftLoop::bind(&SoftLink {
            local,
            udp_port: opts.udp_port,
            verify_icrc_v4: opts.verify_icrc_v4,
            faults: opts.tool.link.faults,
            offload: opts.tool.offload,
        })?;
        let v = lp.prov.verbs();
        let RcQpSetup {
            cq,
            qp,
            send_buf,
            spare_send_bufs,
            my,
            ..
        } = open_rc_qp(v, opts.size, (opts.rx_depth, opts.tool.tx_depth), os_seed())?;
        let mut free_send = spare_send_bufs;
        free_send.push(send_buf);
        Ok(Self {
            lp,
            cq,
            qp,
            my,
            free_send,
            wcs: Vec::with_capacity(CQ_BATCH),
            received: 0,
        })
    }

    /// Posts one SEND of `size` bytes if a send buffer is free; false if none is.
    fn post_send(&mut self, size: usize) -> Result<bool, PingpongError> {
        let Some(buf) = self.free_send.pop() else {
            return Ok(false);
        };
        self.lp
            .prov
            .verbs()
            .post_send(self.qp, &SendWr::send(SEND_WRID, buf, size))
            .map_err(PingpongError::verbs("Couldn't post send"))?;
        Ok(true)
    }

    /// Does the pending I/O, then takes the completions: send buffers go back to the free
    /// list, receives are checked (length) and posted again.
    fn turn(&mut self, size: usize) -> Result<Turn, PingpongError> {
        self.lp.prov.handle_io(Instant::now())?;
        self.wcs.clear();
        let v = self.lp.prov.verbs();
        v.poll_cq(self.cq, &mut self.wcs, CQ_BATCH);
        let mut t = Turn::default();
        for wc in &self.wcs {
            if wc.status != WcStatus::Success {
                return Err(PingpongError::Completion(*wc));
            }
            let buf = wc.buf.ok_or(PingpongError::NoBuffer(*wc))?;
            match wc.opcode {
                WcOpcode::Send => {
                    self.free_send.push(buf);
                    t.sends += 1;
                }
                WcOpcode::Recv => {
                    if wc.byte_len as usize != size {
                        return Err(PingpongError::Mismatch(self.received));
                    }
                    self.received += 1;
                    t.recvs += 1;
                    v.post_recv(self.qp, RECV_WRID, buf)
                        .map_err(PingpongError::verbs("Couldn't post receive"))?;
                }
            }
        }
        Ok(t)
    }

    /// Sleeps until something may be ready, at most until `deadline`.
    pub(super) fn idle(&mut self, deadline: Instant) -> Result<(), PingpongError> {
        self.lp.wait(IDLE_WAIT, Some(deadline))
    }
}

/// Counts of a run, to say how far it got when it timed out.
fn check_deadline(
    deadline: Instant,
    opts: &PerfOptions,
    sends: u32,
    recvs: u32,
) -> Result<(), PingpongError> {
    if Instant::now() > deadline {
        return Err(PingpongError::Timeout {
            after: opts.deadline,
            sends,
            recvs,
        });
    }
    Ok(())
}

/// `--bw`: the client keeps up to `tx_depth` sends posted until `iters` have completed; the
/// server takes `iters` receives.
pub(super) fn stream(
    side: &mut Side,
    opts: &PerfOptions,
    deadline: Instant,
) -> Result<Duration, PingpongError> {
    let is_client = opts.peer.is_some();
    let start = Instant::now();
    let (mut posted, mut sends, mut recvs) = (0u32, 0u32, 0u32);
    while (if is_client { sends } else { recvs }) < opts.iters {
        check_deadline(deadline, opts, sends, recvs)?;
        while is_client && posted < opts.iters && side.post_send(opts.size)? {
            posted += 1;
        }
        let t = side.turn(opts.size)?;
        sends += t.sends;
        recvs += t.recvs;
        if t.is_idle() {
            side.idle(deadline)?;
        }
    }
    Ok(start.elapsed())
}

/// `--lat`: each side sends when the peer's message arrived (the client first) and times
/// the round trip from its send to the answer. Returns the loop's time and the round trips.
pub(super) fn ping_pong(
    side: &mut Side,
    opts: &PerfOptions,
    deadline: Instant,
) -> Result<(Duration, Vec<Duration>), PingpongError> {
    let start = Instant::now();
    let mut round_trips = Vec::with_capacity(opts.iters as usize);
    let (mut sent, mut sends_done, mut received) = (0u32, 0u32, 0u32);
    let mut my_turn = opts.peer.is_some();
    let mut sent_at: Option<Instant> = None;
    while received < opts.iters || sends_done < opts.iters {
        check_deadline(deadline, opts, sends_done, received)?;
        if my_turn && sent < opts.iters && side.post_send(opts.size)? {
            sent += 1;
            my_turn = false;
            sent_at = Some(Instant::now());
        }
        let t = side.turn(opts.size)?;
        sends_done += t.sends;
        if t.recvs > 0 {
            let now = Instant::now();
            received += t.recvs;
            if let Some(at) = sent_at.take() {
                round_trips.push(now - at);
            }
            my_turn = true;
        }
        if t.is_idle() {
            side.idle(deadline)?;
        }
    }
    Ok((start.elapsed(), round_trips))
}
