//! `ipoib-cm ud-pingpong`: rdma-core's `ibv_ud_pingpong` over the software provider.
//!
//! Same TCP exchange as [`super::rc_pingpong`] (the client sends `LID:QPN:PSN:GID`, the
//! server answers with its own, the client sends `"done"`), then UD sends with Q_Key
//! `0x11111111` to the peer's QPN. Receive buffers hold `size + 40` bytes (the GRH area), as
//! in rdma-core. Each side sends its next message once its previous send completed and the
//! peer's message arrived; the client starts.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::rc_pingpong::{Dest, PingpongError, Summary};
use crate::soft::provider::UdpOffload;
use crate::soft::FaultConfig;
use crate::tools::exchange::{
    clock_seed, exchange_over_tcp, provider_err as perr, SoftLink, SoftLoop, TcpExchange,
};
use crate::verbs::{
    AddressVector, Completion, PathMtu, Provider, Psn, QKey, QpAttr, QpInit, QpState, QpType,
    SendWr, UdDest, Verbs, WcOpcode, WcStatus, WrId,
};

/// The Q_Key `ibv_ud_pingpong` uses.
pub const UD_PINGPONG_QKEY: QKey = QKey(0x1111_1111);

/// Bytes of the GRH area at the start of every UD receive buffer.
const GRH: usize = 40;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Peer host (client mode); `None` makes this the server.
    pub peer: Option<IpAddr>,
    /// Local underlay address (default: the route to the peer, or the address the client
    /// reached).
    pub bind: Option<IpAddr>,
    /// TCP port of the QP-info exchange.
    pub tcp_port: u16,
    /// UDP port of RoCEv2 traffic.
    pub udp_port: u16,
    /// Message size (at most the path MTU).
    pub size: usize,
    /// Round trips.
    pub iters: u32,
    /// Receive WRs kept posted.
    pub rx_depth: u32,
    /// Verify the ICRC of IPv4 packets (off for rxe peers).
    pub verify_icrc_v4: bool,
    /// Give up after this long.
    pub deadline: Duration,
}

struct Ctx {
    lp: SoftLoop,
    qp: crate::verbs::QpNum,
    cq: crate::verbs::CqId,
    send_buf: crate::verbs::BufId,
    my: Dest,
}

fn setup(opts: &Options, local: IpAddr) -> Result<Ctx, PingpongError> {
    let mut lp = SoftLoop::bind(&SoftLink {
        local,
        udp_port: opts.udp_port,
        verify_icrc_v4: opts.verify_icrc_v4,
        faults: FaultConfig::default(),
        // Datagram by datagram (no GSO trains), so a capture anywhere shows every packet as
        // sent.
        offload: UdpOffload::Off,
    })?;
    let v = lp.prov.verbs();
    let pd = v.alloc_pd().map_err(perr)?;
    let count = opts.rx_depth as usize + 1;
    let pool = v.create_pool(pd, opts.size + GRH, count).map_err(perr)?;
    let cq = v.create_cq(opts.rx_depth + 1).map_err(perr)?;
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 1,
            max_recv_wr: opts.rx_depth,
            sq_sig_all: false,
        })
        .map_err(perr)?;
    let init = QpAttr {
        pkey_index: Some(0),
        port: Some(1),
        qkey: Some(UD_PINGPONG_QKEY),
        ..QpAttr::to_state(QpState::Init)
    };
    v.modify_qp(qp, &init).map_err(perr)?;
    let send_buf = v
        .pools_mut()
        .alloc(pool)
        .ok_or_else(|| PingpongError::Provider("buffer pool exhausted".into()))?;
    for _ in 0..opts.rx_depth {
        let b = v
            .pools_mut()
            .alloc(pool)
            .ok_or_else(|| PingpongError::Provider("buffer pool exhausted".into()))?;
        v.post_recv(qp, WrId(RECV_WRID), b).map_err(perr)?;
    }
    let psn =
        Psn::new(rand_chacha::ChaCha8Rng::seed_from_u64(clock_seed()).gen::<u32>() & 0xFF_FFFF);
    v.modify_qp(qp, &QpAttr::to_state(QpState::Rtr))
        .map_err(perr)?;
    v.modify_qp(
        qp,
        &QpAttr {
            sq_psn: Some(psn),
            ..QpAttr::to_state(QpState::Rts)
        },
    )
    .map_err(perr)?;
    let my = Dest {
        lid: 0,
        qpn: qp,
        psn,
        gid: v.port_attr().gid,
    };
    Ok(Ctx {
        lp,
        qp,
        cq,
        send_buf,
        my,
    })
}

fn exchange(opts: &Options) -> Result<(Ctx, Dest), PingpongError> {
    let ex = TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline);
    // UD needs no connecting: the peer's QPN and GID go into every send.
    exchange_over_tcp(
        &ex,
        |local| {
            let ctx = setup(opts, local)?;
            let my = ctx.my;
            Ok((ctx, my))
        },
        |_, _| Ok(()),
    )
}

/// Runs the tool.
///
/// # Errors
/// Any [`PingpongError`]; the caller prints it and exits non-zero.
pub fn run(opts: &Options) -> Result<Summary, PingpongError> {
    if opts.size == 0 || opts.size > PathMtu::Mtu4096.bytes() {
        return Err(PingpongError::Usage(
            "size must be 1..=4096 (at most the path MTU)",
        ));
    }
    let (mut ctx, rem) = exchange(opts)?;
    let dest = UdDest {
        av: AddressVector {
            hop_limit: 1,
            ..AddressVector::to_gid(rem.gid)
        },
        remote_qpn: rem.qpn,
        remote_qkey: UD_PINGPONG_QKEY,
    };
    let client = opts.peer.is_some();
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut pending_send = false;
    let mut pending_recv = true;
    let start = Instant::now();
    let deadline = start + opts.deadline;
    let send = |ctx: &mut Ctx| -> Result<(), PingpongError> {
        let wr = SendWr {
            ud: Some(dest),
            ..SendWr::send(WrId(SEND_WRID), ctx.send_buf, opts.size)
        };
        ctx.lp
            .prov
            .verbs()
            .post_send(ctx.qp, &wr)
            .map_err(|e| PingpongError::Provider(format!("Couldn't post send: {e}")))
    };
    if client {
        send(&mut ctx)?;
        pending_send = true;
    }
    let mut cs: Vec<Completion> = Vec::new();
    while rcnt < opts.iters || scnt < opts.iters {
        let now = Instant::now();
        if now >= deadline {
            return Err(PingpongError::Timeout(opts.deadline, scnt, rcnt));
        }
        ctx.lp.prov.handle_io(now)?;
        cs.clear();
        let cq = ctx.cq;
        if ctx.lp.prov.verbs().poll_cq(cq, &mut cs, 64) == 0 {
            // Nothing to do: sleep until the socket or a timer wakes us.
            ctx.lp.wait(Duration::from_millis(100), None)?;
            continue;
        }
        // Completions were handled: loop straight back so handle_io transmits what they
        // posted.
        for c in cs.drain(..) {
            if c.status != WcStatus::Success {
                return Err(PingpongError::Completion(c));
            }
            match c.opcode {
                WcOpcode::Send => {
                    ctx.send_buf = c.buf.unwrap_or(ctx.send_buf);
                    scnt += 1;
                    pending_send = false;
                }
                WcOpcode::Recv => {
                    let b = c
                        .buf
                        .ok_or_else(|| PingpongError::Provider("recv without buffer".into()))?;
                    ctx.lp
                        .prov
                        .verbs()
                        .post_recv(ctx.qp, WrId(RECV_WRID), b)
                        .map_err(|e| {
                            PingpongError::Provider(format!("Couldn't post receive: {e}"))
                        })?;
                    rcnt += 1;
                    pending_recv = false;
                }
            }
            if scnt < opts.iters && !pending_send && !pending_recv {
                send(&mut ctx)?;
                pending_send = true;
                pending_recv = true;
            }
        }
    }
    Ok(Summary {
        bytes: opts.size as u64 * u64::from(opts.iters) * 2,
        elapsed: start.elapsed(),
        iters: opts.iters,
    })
}
