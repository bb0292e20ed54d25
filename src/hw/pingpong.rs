//! `ipoib-cm rc-pingpong --provider verbs`: the rc-pingpong tool on [`HwVerbs`].
//!
//! The TCP QP-info exchange and the ping-pong loop are those of
//! [`crate::tools::rc_pingpong`] (compatible with rdma-core's `ibv_rc_pingpong`); only the
//! provider differs. The CM mode (`--cm`) and payload checks (`-c`) need the soft provider.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use mio::{Events, Poll};

use super::{HwConfig, HwError, HwVerbs};
use crate::tools::exchange::{
    clock_seed, exchange_err as xerr, open_rc_qp, print_dest, provider_err as perr, read_msg,
    RcQpSetup,
};
use crate::tools::rc_pingpong::{Dest, Options, PingpongError, Summary, DEST_MSG_LEN};
use crate::verbs::{
    AddressVector, BufId, Completion, CqId, Provider, QpAttr, QpNum, QpState, SendWr, Verbs,
    WcOpcode, WcStatus, WrId,
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
        psn,
        ..
    } = open_rc_qp(
        &mut v,
        opts.size,
        opts.rx_depth,
        WrId(RECV_WRID),
        clock_seed(),
    )?;
    let my = Dest {
        lid: 0,
        qpn: qp,
        psn,
        gid: v.port_attr().gid,
    };
    Ok(Ctx {
        v,
        cq,
        qp,
        send_buf,
        my,
    })
}

fn connect_qp(ctx: &mut Ctx, opts: &Options, rem: &Dest) -> Result<(), PingpongError> {
    ctx.v
        .modify_qp(
            ctx.qp,
            &QpAttr {
                av: Some(AddressVector::to_gid(rem.gid)),
                path_mtu: Some(opts.mtu),
                dest_qpn: Some(rem.qpn),
                rq_psn: Some(rem.psn),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(12),
                ..QpAttr::to_state(QpState::Rtr)
            },
        )
        .map_err(perr)?;
    ctx.v
        .modify_qp(
            ctx.qp,
            &QpAttr {
                timeout: Some(opts.qp_timeout),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                sq_psn: Some(ctx.my.psn),
                max_rd_atomic: Some(1),
                ..QpAttr::to_state(QpState::Rts)
            },
        )
        .map_err(perr)
}

fn remote(s: &mut TcpStream) -> Result<Dest, PingpongError> {
    let rem = Dest::from_msg(&read_msg(s, DEST_MSG_LEN)?)
        .ok_or_else(|| xerr("bad remote address", "unparseable"))?;
    print_dest("remote", &rem);
    Ok(rem)
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
    let mut ctx = setup(opts, v)?;
    print_dest("local", &ctx.my);
    let to = Some(opts.deadline);
    let stream = if let Some(peer) = opts.peer {
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::new(peer, opts.tcp_port), opts.deadline)
                .map_err(|e| xerr(&format!("Couldn't connect to {peer}:{}", opts.tcp_port), e))?;
        s.set_read_timeout(to).map_err(|e| xerr("socket", e))?;
        s.write_all(&ctx.my.to_msg())
            .map_err(|e| xerr("Couldn't send local address", e))?;
        let rem = remote(&mut s)?;
        connect_qp(&mut ctx, opts, &rem)?;
        s.write_all(b"done\0")
            .map_err(|e| xerr("Couldn't send done", e))?;
        s
    } else {
        let any = opts.bind.unwrap_or(IpAddr::from([0u8; 4]));
        let l = TcpListener::bind(SocketAddr::new(any, opts.tcp_port))
            .map_err(|e| xerr(&format!("Couldn't listen to port {}", opts.tcp_port), e))?;
        let (mut s, _) = l.accept().map_err(|e| xerr("accept", e))?;
        s.set_read_timeout(to).map_err(|e| xerr("socket", e))?;
        let rem = remote(&mut s)?;
        connect_qp(&mut ctx, opts, &rem)?;
        s.write_all(&ctx.my.to_msg())
            .map_err(|e| xerr("Couldn't send local address", e))?;
        let _done = read_msg(&mut s, 5)?;
        s
    };
    let summary = pingpong(&mut ctx, opts)?;
    drop(stream);
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
