//! `ipoib-cm rc-pingpong`: rdma-core's `ibv_rc_pingpong` over the software provider.
//!
//! The connection set-up is the one rdma-core's pingpong examples use, so this tool can pair
//! with the real `ibv_rc_pingpong` on a kernel rxe device:
//!
//! 1. the server listens on TCP (default port 18515); the client connects;
//! 2. each side sends `"LLLL:QQQQQQ:PPPPPP:GGGG…"` (LID, QPN and PSN in hex, then the 32 hex
//!    digit GID, NUL-terminated, 52 bytes): the client first, the server after it has moved its
//!    QP to RTR and RTS;
//! 3. the client answers `"done\0"` once its own QP is connected.
//!
//! Each side's PSN is its send PSN; the peer uses it as its expected receive PSN. Then the
//! client sends, the server answers, `iters` times, and both print rdma-core's summary lines.
//!
//! With `--cm` the QPs are connected by the InfiniBand CM instead: REQ, REP and RTU travel as
//! MADs to QP1 (real RoCEv2 CM traffic), the service ID is rdma_cm's TCP port space
//! `0x0000000001060000 | port`, and the run ends with DREQ/DREP. PSNs follow Linux's CM: each
//! side advertises the PSN it expects to receive. Either side may send the DREQ first (the
//! kernel's `rdma_server` does): a peer's DREQ after the last message ends the run cleanly.
//!
//! `--rdma-cm` adds rdma_cm's framing ([`crate::wire::cma`]), so that the kernel's rdma_cm
//! (`rdma_server`, `rdma_client`, `ucmatose`) takes our REQ and we take its: the client puts a
//! `cma_hdr` in front of the REQ's private data; the server refuses a REQ whose header is
//! missing, malformed or names another address, with the REJ the kernel sends then
//! ([`KERNEL_REFUSAL`]), and goes on listening. As rdma_cm's servers do, it sends once the RTU
//! (or the first message) has come, without waiting for the client's messages, and it sends a
//! DREQ at the end too.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use super::exchange::{exchange_over_tcp, print_dest, route_source, Dest, TcpExchange};
use super::pingpong::{run_pingpong, PingpongIo, PingpongRun, Summary};
use super::rc_qp::{connect_rc_qp, open_rc_qp, RcQpSetup};
use super::soft_loop::{linger, stats_line, SoftLink, SoftLoop};
use super::{Options, PingpongError, RcLink};
use crate::cm::{AcceptParams, Cm, CmConfig, CmEvent, CommId, ConnectParams};
use crate::mad::Gsi;
use crate::soft::provider::UdpOffload;
use crate::soft::SoftVerbs;
use crate::verbs::setup::{os_seed, RC_RETRY_CNT, RNR_RETRY_FOREVER};
use crate::verbs::{AsyncEvent, BufId, CqId, Gid, Provider, Psn, QpAttr, QpNum, QpState, Verbs};
use crate::wire::cma::{ephemeral_port, CmaHdr, PortSpace, KERNEL_REFUSAL};

/// The TCP port rdma-core's pingpong examples use.
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// What rc-pingpong takes beyond [`Options`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RcPingpong {
    /// Path MTU, ACK timeout and faults.
    pub link: RcLink,
    /// Check every received payload against the expected pattern.
    pub validate: bool,
    /// Connect through the IB CM (REQ/REP/RTU over QP1) instead of the TCP exchange.
    pub cm: bool,
    /// With `cm`: rdma_cm's framing (a `cma_hdr` in the REQ, checked by the server).
    pub rdma_cm: bool,
}

/// The options of an rc-pingpong run.
pub type RcPingpongOptions = Options<RcPingpong>;

/// The CM and its QP1 transport (with `--cm`).
struct CmCtx {
    cm: Cm,
    gsi: Gsi,
    id: Option<CommId>,
    mads: Vec<(Gid, [u8; crate::mad::MAD_LEN])>,
}

/// Everything the run needs once the provider exists.
struct Ctx {
    lp: SoftLoop,
    cq: CqId,
    qp: QpNum,
    send_buf: BufId,
    my: Dest,
    cm: Option<CmCtx>,
    /// CM events of the last pump.
    cm_events: Vec<CmEvent>,
    /// The peer's DREQ for our connection has arrived (and been answered).
    peer_disconnected: bool,
}

impl Ctx {
    /// One pass over everything that may have work: the socket, timers, CM MADs and events.
    /// CM events are appended to `out`.
    fn pump_into(&mut self, now: Instant, out: &mut Vec<CmEvent>) -> Result<(), PingpongError> {
        self.lp.prov.handle_io(now)?;
        let Some(c) = &mut self.cm else {
            return Ok(());
        };
        let v = self.lp.prov.verbs();
        c.mads.clear();
        c.gsi.poll(v, &mut c.mads);
        for (from, mad) in &c.mads {
            c.cm.handle_mad(now, *from, mad);
        }
        while let Some(ev) = v.poll_async_event() {
            // A lost RTU: the first data on the passive QP establishes the connection.
            if let (AsyncEvent::CommEst(qp), Some(id)) = (ev, c.id) {
                if qp == self.qp {
                    c.cm.notify_comm_est(now, id);
                }
            }
        }
        c.cm.handle_timeout(now);
        while let Some((to, mad)) = c.cm.poll_transmit() {
            c.gsi
                .send(v, to, &mad)
                .map_err(PingpongError::verbs("sending a CM MAD"))?;
        }
        while let Some(e) = c.cm.poll_event() {
            if matches!(e, CmEvent::DisconnectReceived { id } if Some(id) == c.id) {
                self.peer_disconnected = true;
            }
            out.push(e);
        }
        self.lp.prov.handle_io(now)?;
        Ok(())
    }

    /// Sleeps until something may be ready (at most `cap`).
    fn wait_for(&mut self, cap: Duration) -> Result<(), PingpongError> {
        let cm_timeout = self.cm.as_ref().and_then(|c| c.cm.poll_timeout());
        self.lp.wait(cap, cm_timeout)
    }
}

/// The ping-pong's view: a reject from the peer ends the run; so does its disconnect, one
/// pump later, so that the completions of what arrived before its DREQ (the last message of a
/// peer that disconnects as soon as it is done) are still counted.
impl PingpongIo for Ctx {
    type V = SoftVerbs;

    fn verbs(&mut self) -> &mut SoftVerbs {
        self.lp.prov.verbs()
    }

    fn pump(&mut self, now: Instant) -> Result<(), PingpongError> {
        let mut evs = std::mem::take(&mut self.cm_events);
        if self.peer_disconnected {
            if let Some(id) = self.cm.as_ref().and_then(|c| c.id) {
                return Err(PingpongError::PeerWentAway(Box::new(
                    CmEvent::DisconnectReceived { id },
                )));
            }
        }
        evs.clear();
        let r = self.pump_into(now, &mut evs);
        if let Some(e) = evs.iter().find(|e| matches!(e, CmEvent::Rejected { .. })) {
            return Err(PingpongError::PeerWentAway(Box::new(e.clone())));
        }
        self.cm_events = evs;
        r
    }

    fn wait(&mut self, cap: Duration) -> Result<(), PingpongError> {
        self.wait_for(cap)
    }
}

fn setup(opts: &RcPingpongOptions, local: IpAddr) -> Result<Ctx, PingpongError> {
    let mut lp = SoftLoop::bind(&SoftLink {
        local,
        udp_port: opts.udp_port,
        verify_icrc_v4: opts.verify_icrc_v4,
        faults: opts.tool.link.faults,
        // Datagram by datagram (no GSO trains), so a capture anywhere shows every packet as
        // sent.
        offload: UdpOffload::Off,
    })?;
    let v = lp.prov.verbs();
    let seed = os_seed();
    let RcQpSetup {
        pd,
        cq,
        qp,
        send_buf,
        my,
        ..
    } = open_rc_qp(v, opts.size, (opts.rx_depth, 1), seed)?;
    let gid = my.gid;
    let cm = if opts.tool.cm {
        let gsi = Gsi::open(v, pd, 64, 16).map_err(PingpongError::verbs("opening QP1"))?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.rotate_left(17));
        let mut cfg = CmConfig::new(gid, rng.gen::<u64>() | 1);
        cfg.comm_id_seed = rng.gen();
        // A lost MAD is resent after about a second rather than rdma_cm's 4 s.
        cfg.cm_response_timeout = 17;
        Some(CmCtx {
            cm: Cm::new(cfg),
            gsi,
            id: None,
            mads: Vec::new(),
        })
    } else {
        None
    };
    Ok(Ctx {
        lp,
        cq,
        qp,
        send_buf,
        my,
        cm,
        cm_events: Vec::new(),
        peer_disconnected: false,
    })
}

/// RTR then RTS on `link`: with the TCP exchange each side sends from its own PSN; with the
/// CM each side advertised the PSN it expects.
fn connect_qp(
    ctx: &mut Ctx,
    opts: &RcPingpongOptions,
    link: &RcLink,
    rem: &Dest,
) -> Result<(), PingpongError> {
    let psns: (Psn, Psn) = if opts.tool.cm {
        (ctx.my.psn, rem.psn)
    } else {
        (rem.psn, ctx.my.psn)
    };
    connect_rc_qp(ctx.lp.prov.verbs(), ctx.qp, rem, link, psns)
}

/// What a successful run reports.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// rdma-core's figures.
    pub summary: Summary,
    /// The provider's counters (`soft-rc: tx_packets=… …`, one line).
    pub stats: String,
}

/// Runs the tool.
///
/// # Errors
/// Any [`PingpongError`]; the caller prints it and exits with
/// [`PingpongError::exit_code`].
pub fn run(opts: &RcPingpongOptions) -> Result<Outcome, PingpongError> {
    let mut ctx = if opts.tool.cm {
        connect_with_cm(opts)?
    } else {
        connect_with_tcp(opts)?
    };
    let run = PingpongRun {
        validate: opts.tool.validate,
        // rdma_cm's clients wait for all of the server's messages before they send
        // (`ucmatose`), or post their receive before their send (`rdma_client`): an rdma_cm
        // server sends without waiting.
        unpaced: opts.tool.rdma_cm && !opts.is_client(),
        ..PingpongRun::new(opts, ctx.qp, ctx.cq, ctx.send_buf)
    };
    let summary = run_pingpong(&mut ctx, &run)?;
    linger_pingpong(&mut ctx, opts)?;
    if opts.tool.cm {
        disconnect_with_cm(&mut ctx, opts)?;
    }
    Ok(Outcome {
        summary,
        stats: stats_line(ctx.lp.prov.engine()),
    })
}

/// rdma-core's pingpong set-up: QP info over TCP.
fn connect_with_tcp(opts: &RcPingpongOptions) -> Result<Ctx, PingpongError> {
    let ex = TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline);
    let (ctx, _) = exchange_over_tcp(
        &ex,
        |local| {
            let ctx = setup(opts, local)?;
            let my = ctx.my;
            Ok((ctx, my))
        },
        |ctx, rem| connect_qp(ctx, opts, &opts.tool.link, rem),
    )?;
    Ok(ctx)
}

/// Runs the event loop until `f` returns a value for one of the CM events, or the deadline.
fn until_cm_event<T>(
    ctx: &mut Ctx,
    deadline: Instant,
    what: &'static str,
    mut f: impl FnMut(&mut Ctx, &CmEvent) -> Result<Option<T>, PingpongError>,
) -> Result<T, PingpongError> {
    let mut evs = Vec::new();
    for _ in 0..10_000_000u32 {
        let now = Instant::now();
        if now > deadline {
            break;
        }
        evs.clear();
        ctx.pump_into(now, &mut evs)?;
        for e in &evs {
            if let Some(t) = f(ctx, e)? {
                return Ok(t);
            }
        }
        ctx.wait_for(Duration::from_millis(100))?;
    }
    Err(PingpongError::CmTimeout(what))
}

/// The IB CM set-up: REQ/REP/RTU over QP1.
fn connect_with_cm(opts: &RcPingpongOptions) -> Result<Ctx, PingpongError> {
    let deadline = Instant::now() + opts.deadline;
    let service_id = PortSpace::Tcp.service_id(opts.tcp_port);
    let link = &opts.tool.link;
    match opts.peer {
        Some(peer) => {
            let local = match opts.bind {
                Some(ip) => ip,
                None => route_source(peer).map_err(PingpongError::exchange("route to peer"))?,
            };
            let mut ctx = setup(opts, local)?;
            print_dest("local", &ctx.my);
            let private_data = if opts.tool.rdma_cm {
                let hdr = CmaHdr {
                    src_port: ephemeral_port(os_seed()),
                    src: local,
                    dst: peer,
                };
                hdr.req_private_data(&[]).map_err(|_| {
                    PingpongError::Usage("--rdma-cm: --bind and the peer differ in IP version")
                })?
            } else {
                Vec::new()
            };
            let params = ConnectParams {
                peer: Gid::from_ip(peer),
                service_id,
                local_qpn: ctx.qp,
                starting_psn: ctx.my.psn,
                path_mtu: link.mtu,
                retry_count: RC_RETRY_CNT,
                rnr_retry_count: RNR_RETRY_FOREVER,
                srq: false,
                local_ack_timeout: link.qp_timeout,
                private_data,
            };
            let c = ctx.cm.as_mut().ok_or(PingpongError::Usage("no CM"))?;
            let id =
                c.cm.connect(Instant::now(), params)
                    .map_err(PingpongError::cm("connect"))?;
            c.id = Some(id);
            until_cm_event(&mut ctx, deadline, "the REP", |ctx, e| match *e {
                CmEvent::RepReceived {
                    id: got,
                    remote_qpn,
                    remote_psn,
                    ..
                } if got == id => {
                    let rem = Dest {
                        lid: 0,
                        qpn: remote_qpn,
                        psn: remote_psn,
                        gid: Gid::from_ip(peer),
                    };
                    print_dest("remote", &rem);
                    connect_qp(ctx, opts, link, &rem)?;
                    if let Some(c) = ctx.cm.as_mut() {
                        c.cm.rtu(Instant::now(), id)
                            .map_err(PingpongError::cm("rtu"))?;
                    }
                    Ok(Some(()))
                }
                CmEvent::Rejected { reason, .. } => Err(PingpongError::Rejected(reason)),
                CmEvent::TimedOut { .. } => Err(PingpongError::NoAnswer(peer)),
                _ => Ok(None),
            })?;
            Ok(ctx)
        }
        None => {
            let local = opts.bind.ok_or(PingpongError::Usage(
                "--cm: the server needs --bind ADDR (its underlay address)",
            ))?;
            let mut ctx = setup(opts, local)?;
            print_dest("local", &ctx.my);
            if let Some(c) = ctx.cm.as_mut() {
                c.cm.listen(service_id, u64::MAX);
            }
            until_cm_event(&mut ctx, deadline, "a REQ", |ctx, e| match *e {
                CmEvent::ReqReceived {
                    id,
                    peer,
                    remote_qpn,
                    remote_psn,
                    path_mtu,
                    ref private_data,
                    ..
                } => {
                    let c = ctx.cm.as_mut().ok_or(PingpongError::Usage("no CM"))?;
                    if opts.tool.rdma_cm {
                        if let Err(why) = CmaHdr::accept_req(private_data, local) {
                            eprintln!("rc-pingpong: REQ from {peer} refused ({why}): REJ {KERNEL_REFUSAL:?}");
                            let _ = c.cm.reject(Instant::now(), id, KERNEL_REFUSAL);
                            return Ok(None);
                        }
                    }
                    if c.id.is_some() {
                        // One connection at a time, like ibv_rc_pingpong.
                        let _ = c.cm.reject(
                            Instant::now(),
                            id,
                            crate::wire::cm::RejReason::NoResources,
                        );
                        return Ok(None);
                    }
                    c.id = Some(id);
                    let rem = Dest {
                        lid: 0,
                        qpn: remote_qpn,
                        psn: remote_psn,
                        gid: peer,
                    };
                    print_dest("remote", &rem);
                    let path = RcLink {
                        mtu: link.mtu.min(path_mtu),
                        ..*link
                    };
                    connect_qp(ctx, opts, &path, &rem)?;
                    let params = AcceptParams {
                        local_qpn: ctx.qp,
                        starting_psn: ctx.my.psn,
                        srq: false,
                        rnr_retry_count: RNR_RETRY_FOREVER,
                        private_data: Vec::new(),
                    };
                    if let Some(c) = ctx.cm.as_mut() {
                        c.cm.accept(Instant::now(), id, params)
                            .map_err(PingpongError::cm("accept"))?;
                    }
                    Ok(Some(()))
                }
                _ => Ok(None),
            })?;
            if opts.tool.rdma_cm {
                // An rdma_cm server sends first (see `run`), so it waits for the RTU (or the
                // first message) as rdma_cm's do: before it the client's QP may not be ready.
                let id = ctx.cm.as_ref().and_then(|c| c.id);
                until_cm_event(&mut ctx, deadline, "the RTU", |_, e| match *e {
                    CmEvent::Established { id: got } if Some(got) == id => Ok(Some(())),
                    CmEvent::Rejected { reason, .. } => Err(PingpongError::Rejected(reason)),
                    CmEvent::TimedOut { .. } => Err(PingpongError::CmTimeout("the RTU")),
                    _ => Ok(None),
                })?;
            }
            Ok(ctx)
        }
    }
}

/// DREQ/DREP: the client disconnects (with `--rdma-cm` the server too), the server waits for
/// it.
fn disconnect_with_cm(ctx: &mut Ctx, opts: &RcPingpongOptions) -> Result<(), PingpongError> {
    let deadline = Instant::now() + opts.deadline;
    let c = ctx.cm.as_mut().ok_or(PingpongError::Usage("no CM"))?;
    let id = c.id.ok_or(PingpongError::Usage("no connection"))?;
    // The client disconnects; so does an rdma_cm server (`ucmatose`'s client waits for the
    // server's DREQ). The peer's DREQ may have come first (the kernel's rdma_server sends it
    // as soon as its last message is acknowledged): its DREP is sent, the connection is over.
    let initiates = opts.is_client() || opts.tool.rdma_cm;
    let already = ctx.peer_disconnected
        || (!initiates && matches!(c.cm.state(id), Some(crate::cm::CmState::TimeWait) | None));
    if initiates && !already {
        c.cm.disconnect(Instant::now(), id)
            .map_err(PingpongError::cm("disconnect"))?;
    }
    if !already {
        until_cm_event(ctx, deadline, "the disconnect", |_, e| match *e {
            CmEvent::Disconnected { id: got } | CmEvent::DisconnectReceived { id: got }
                if got == id =>
            {
                Ok(Some(()))
            }
            _ => Ok(None),
        })?;
    }
    // Move the QP to ERR as the CM's owner must; the process exits right after.
    let qp = ctx.qp;
    ctx.lp
        .prov
        .verbs()
        .modify_qp(qp, &QpAttr::to_state(QpState::Err))
        .map_err(PingpongError::verbs("moving the QP to ERR"))?;
    Ok(())
}

/// Keeps answering for a while after the last completion (see [`linger`]).
fn linger_pingpong(ctx: &mut Ctx, opts: &RcPingpongOptions) -> Result<(), PingpongError> {
    let mut evs = Vec::new();
    linger(ctx, opts.tool.link.qp_timeout, |ctx, now, cap| {
        evs.clear();
        ctx.pump_into(now, &mut evs)?;
        ctx.wait_for(cap)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_service_id_is_rdma_cm_tcp_port_space() {
        assert_eq!(PortSpace::Tcp.service_id(DEFAULT_TCP_PORT), 0x0106_4853);
    }
}
