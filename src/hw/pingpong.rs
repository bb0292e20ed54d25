//! `ipoib-cm rc-pingpong --provider verbs`: the rc-pingpong tool on [`HwVerbs`].
//!
//! The TCP QP-info exchange and the ping-pong loop are those of
//! [`crate::tools::rc_pingpong`] (compatible with rdma-core's `ibv_rc_pingpong`); only the
//! provider differs. The CM mode (`--cm`) and payload checks (`-c`) need the soft provider.

use std::time::{Duration, Instant};

use mio::{Events, Poll};

use super::{HwConfig, HwError, HwVerbs};
use crate::tools::exchange::{
    clock_seed, exchange_over_tcp, open_rc_qp, rc_to_rts, RcPath, RcQpSetup, TcpExchange,
};
use crate::tools::rc_pingpong::{Dest, Options, PingpongError, Summary};
use crate::verbs::{
    BufId, Completion, CqId, Provider, QpNum, SendWr, Verbs, WcOpcode, WcStatus, WrId,
};

const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;

/// Why a run failed: the device could not be opened, or the run itself failed.
#[derive(Debug, thiserror::Error)]
pub enum HwPingpongError {
    /// Opening the device failed.
    #[error(transparent)]
    Open(#[from] HwError),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] PingpongError),
}

struct Ctx {
    v: HwVerbs,
    cq: CqId,
    qp: QpNum,
    send_buf: BufId,
    my: Dest,
}

fn setup(opts: &Options, mut v: HwVerbs) -> Result<Ctx, PingpongError> {
    let RcQpSetup {
        cq,
        qp,
        send_buf,
        my,
        ..
    } = open_rc_qp(
        &mut v,
        opts.size,
        (opts.rx_depth, 1),
        WrId(RECV_WRID),
        clock_seed(),
    )?;
    Ok(Ctx {
        v,
        cq,
        qp,
        send_buf,
        my,
    })
}

fn connect_qp(ctx: &mut Ctx, opts: &Options, rem: &Dest) -> Result<(), PingpongError> {
    let path = RcPath {
        mtu: opts.mtu,
        qp_timeout: opts.qp_timeout,
        rq_psn: rem.psn,
        sq_psn: ctx.my.psn,
    };
    rc_to_rts(&mut ctx.v, ctx.qp, rem, &path)
}

/// Runs rc-pingpong on the device `cfg` names.
///
/// # Errors
/// [`HwPingpongError::Open`] if the device cannot be opened, else the run's error.
pub fn run(opts: &Options, cfg: &HwConfig) -> Result<Summary, HwPingpongError> {
    if opts.cm || opts.validate {
        return Err(
            PingpongError::Usage("--provider verbs: --cm and -c need the soft provider").into(),
        );
    }
    let v = HwVerbs::open(cfg)?;
    let ctx = setup(opts, v)?;
    let ex = TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline);
    // The device's GID is this side's address; the exchange's local address is not needed.
    let (mut ctx, _) = exchange_over_tcp(
        &ex,
        |_| {
            let my = ctx.my;
            Ok((ctx, my))
        },
        |ctx, rem| connect_qp(ctx, opts, rem),
    )?;
    let summary = pingpong(&mut ctx, opts)?;
    Ok(summary)
}

fn pingpong(ctx: &mut Ctx, opts: &Options) -> Result<Summary, PingpongError> {
    let mut poll = Poll::new()?;
    let mut events = Events::with_capacity(16);
    ctx.v.register(poll.registry(), 0)?;
    let client = opts.peer.is_some();
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let (mut send_pending, mut recv_pending) = (false, true);
    let start = Instant::now();
    let deadline = start + opts.deadline;
    let post_send = |ctx: &mut Ctx| {
        let wr = SendWr::send(WrId(SEND_WRID), ctx.send_buf, opts.size);
        ctx.v
            .post_send(ctx.qp, &wr)
            .map_err(|e| PingpongError::Provider(format!("Couldn't post send: {e}")))
    };
    if client {
        post_send(ctx)?;
        send_pending = true;
    }
    let mut wcs: Vec<Completion> = Vec::with_capacity(64);
    while rcnt < opts.iters || scnt < opts.iters {
        let now = Instant::now();
        if now > deadline {
            return Err(PingpongError::Timeout(opts.deadline, scnt, rcnt));
        }
        ctx.v.handle_io(now)?;
        wcs.clear();
        if ctx.v.poll_cq(ctx.cq, &mut wcs, 64) == 0 {
            // The CQ is armed (handle_io re-arms after every event): sleep until it fires.
            poll.poll(&mut events, Some(Duration::from_millis(100)))?;
            continue;
        }
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
                    let buf = wc
                        .buf
                        .ok_or_else(|| PingpongError::Provider("recv without buffer".into()))?;
                    rcnt += 1;
                    recv_pending = false;
                    ctx.v.post_recv(ctx.qp, WrId(RECV_WRID), buf).map_err(|e| {
                        PingpongError::Provider(format!("Couldn't post receive: {e}"))
                    })?;
                }
            }
            if scnt < opts.iters && !send_pending && !recv_pending {
                post_send(ctx)?;
                send_pending = true;
                recv_pending = true;
            }
        }
    }
    Ok(Summary {
        bytes: opts.size as u64 * u64::from(opts.iters) * 2,
        elapsed: start.elapsed(),
        iters: opts.iters,
    })
}
