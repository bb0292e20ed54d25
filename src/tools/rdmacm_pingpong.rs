//! `ipoib-cm rc-pingpong --provider verbs --rdma-cm`: the ping-pong on [`HwVerbs`] with the
//! QP connected by the kernel's CM through librdmacm ([`RdmaCm`]), the QP staying ours.
//!
//! It pairs with rdma-core's `rdma_server` / `rdma_client` (`-p 7471 -s 16 -n 1`: one 16-byte
//! SEND each way) and with itself. The service ID is rdma_cm's TCP port space
//! (`0x0000000001060000 | port`), the REQ's private data is empty after the kernel's cma
//! header.
//!
//! - **Client** (a peer given): resolve the address and route, connect with our QPN; on the
//!   REP move the QP to RTR and RTS with `rdma_init_qp_attr` and send the RTU.
//! - **Server** (`--bind ADDR` needed: its GID is the one the device sends from): listen on
//!   the port; on the first REQ move the QP to RTR and RTS and accept; later REQs are
//!   rejected (one connection at a time, like rdma_server).
//!
//! Then the ping-pong; then either side disconnects (DREQ, or the DREP of the peer's DREQ),
//! waits for `DISCONNECTED`, moves the QP to ERR and destroys its ids.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use super::exchange::{print_dest, route_source, Dest};
use super::pingpong::{run_pingpong, PingpongIo, PingpongRun, Summary};
use super::rc_pingpong::RcPingpongOptions;
use super::rc_qp::{open_rc_qp, RcQpSetup};
use super::PingpongError;
use crate::driver::ProviderSources;
use crate::hw::rdmacm::{
    ConnParam, IbAddr, PortSpace, RdmaCm, RdmaCmError, RdmaCmEvent, RdmaCmEventKind, RdmaCmId,
};
use crate::hw::{HwConfig, HwError, HwVerbs};
use crate::verbs::setup::{os_seed, RC_RETRY_CNT, RNR_RETRY_FOREVER};
use crate::verbs::{BufId, CqId, Gid, Provider, QpAttr, QpNum, QpState, Verbs};
use crate::wire::cm::IPOIB_CM_SERVICE_ID_LINUX;

/// The poll token of the CM's event channel (the provider's come first, from 0).
const CM_TOKEN: Token = Token(1 << 16);

/// Ids at a time: the listener, one connection, and REQs awaiting their reject.
const MAX_IDS: usize = 16;

/// How long a step of the address or route resolution may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// After the peer's `DISCONNECTED`, how long the ping-pong may still find completions that
/// were already on the CQ before it gives up.
const DISCONNECT_GRACE: Duration = Duration::from_secs(1);

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RdmaCmPingpongError {
    /// Opening the device failed.
    #[error(transparent)]
    Open(#[from] HwError),
    /// A librdmacm call failed (or there is no RDMA CM).
    #[error("rdma_cm: {0}")]
    Cm(#[from] RdmaCmError),
    /// The peer rejected the connection.
    #[error("rdma_cm: connection rejected (reason {0})")]
    Rejected(i32),
    /// Resolution or set-up failed.
    #[error("rdma_cm: {what} (status {status})")]
    Failed {
        /// The event.
        what: &'static str,
        /// Its status.
        status: i32,
    },
    /// No event of the kind awaited came before the deadline.
    #[error("rdma_cm: timed out waiting for {0}")]
    Timeout(&'static str),
    /// rdma_cm's route sends from another GID than the provider's.
    #[error(
        "rdma_cm chose source GID index {cm}, the provider sends from {ours} (give -g or --bind)"
    )]
    GidMismatch {
        /// rdma_cm's.
        cm: u8,
        /// The provider's.
        ours: u8,
    },
    /// The run failed.
    #[error(transparent)]
    Run(#[from] PingpongError),
}

impl RdmaCmPingpongError {
    /// The process exit status: 2 with no device, no RDMA CM, or options that cannot work;
    /// 1 for a failed run.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Open(_) => 2,
            Self::Cm(e) if e.is_unavailable() => 2,
            Self::Run(e) => e.exit_code(),
            _ => 1,
        }
    }
}

type Result<T> = std::result::Result<T, RdmaCmPingpongError>;

/// The device, the CM and the poll both wake.
struct Ctx {
    v: HwVerbs,
    cm: RdmaCm,
    poll: Poll,
    events: Events,
    cq: CqId,
    qp: QpNum,
    send_buf: BufId,
    my: Dest,
    /// The connection's id, once there is one.
    conn: Option<RdmaCmId>,
    /// When `DISCONNECTED` came for the connection.
    disconnected_at: Option<Instant>,
    /// Events read and not yet looked at by a wait.
    pending: Vec<RdmaCmEvent>,
}

impl Ctx {
    /// Reads every CM event (bounded), noting the connection's end.
    fn pump_cm(&mut self, now: Instant) -> Result<()> {
        for _ in 0..64 {
            let Some(e) = self.cm.poll_event()? else {
                break;
            };
            if Some(e.id) == self.conn && e.kind == RdmaCmEventKind::Disconnected {
                self.disconnected_at.get_or_insert(now);
            }
            self.pending.push(e);
        }
        Ok(())
    }

    fn wait_for(&mut self, cap: Duration) -> std::io::Result<()> {
        self.poll.poll(&mut self.events, Some(cap))
    }

    /// Runs until `f` returns a value for one of the CM events, or the deadline.
    fn until<T>(
        &mut self,
        deadline: Instant,
        what: &'static str,
        mut f: impl FnMut(&mut Self, RdmaCmEvent) -> Result<Option<T>>,
    ) -> Result<T> {
        for _ in 0..100_000u32 {
            let now = Instant::now();
            if now > deadline {
                break;
            }
            self.v.handle_io(now).map_err(PingpongError::Io)?;
            self.pump_cm(now)?;
            for e in std::mem::take(&mut self.pending) {
                if let Some(t) = f(self, e)? {
                    return Ok(t);
                }
            }
            self.wait_for(Duration::from_millis(100))
                .map_err(PingpongError::Io)?;
        }
        Err(RdmaCmPingpongError::Timeout(what))
    }

    /// Moves our QP to `state` with the CM's attributes for `id`.
    fn move_qp(&mut self, id: RdmaCmId, state: QpState) -> Result<QpAttr> {
        let a = self.cm.init_qp_attr(id, state)?;
        if let Some(cm) = a.sgid_index {
            let ours = self.v.gid_index();
            if cm != ours {
                return Err(RdmaCmPingpongError::GidMismatch { cm, ours });
            }
        }
        self.v
            .modify_qp(self.qp, &a.attr)
            .map_err(PingpongError::verbs(match state {
                QpState::Rtr => "INIT->RTR (rdma_init_qp_attr)",
                _ => "RTR->RTS (rdma_init_qp_attr)",
            }))?;
        Ok(a.attr)
    }

    /// RTR then RTS; prints both sides' QP info as rc-pingpong does.
    fn connect_qp(&mut self, id: RdmaCmId, remote_qpn: QpNum) -> Result<()> {
        let rtr = self.move_qp(id, QpState::Rtr)?;
        let rts = self.move_qp(id, QpState::Rts)?;
        let local = Dest {
            psn: rtr.rq_psn.unwrap_or(self.my.psn),
            ..self.my
        };
        print_dest("local", &local);
        let remote = Dest {
            lid: 0,
            qpn: remote_qpn,
            psn: rts.sq_psn.unwrap_or(self.my.psn),
            gid: rtr.av.and_then(|av| av.dgid()).unwrap_or(Gid([0; 16])),
        };
        print_dest("remote", &remote);
        Ok(())
    }

    fn conn_param(&self) -> ConnParam<'static> {
        ConnParam {
            qp_num: self.qp,
            srq: false,
            private_data: &[],
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: RC_RETRY_CNT,
            rnr_retry_count: RNR_RETRY_FOREVER,
        }
    }
}

/// The ping-pong's view: the CM's events are read on every pass; the peer's disconnect ends
/// the run once the completions already there are taken.
impl PingpongIo for Ctx {
    type V = HwVerbs;

    fn verbs(&mut self) -> &mut HwVerbs {
        &mut self.v
    }

    fn pump(&mut self, now: Instant) -> std::result::Result<(), PingpongError> {
        self.v.handle_io(now)?;
        self.pump_cm(now)
            .map_err(|e| PingpongError::Io(std::io::Error::other(e.to_string())))?;
        // Only the disconnect (noted by pump_cm) matters during the run.
        self.pending.clear();
        if let Some(at) = self.disconnected_at {
            if now.duration_since(at) > DISCONNECT_GRACE {
                return Err(PingpongError::Io(std::io::Error::other(
                    "rdma_cm: the peer disconnected during the run",
                )));
            }
        }
        Ok(())
    }

    fn wait(&mut self, cap: Duration) -> std::result::Result<(), PingpongError> {
        self.wait_for(cap)?;
        Ok(())
    }
}

fn setup(opts: &RcPingpongOptions, cfg: &HwConfig) -> Result<Ctx> {
    let mut v = HwVerbs::open(cfg)?;
    let cm = RdmaCm::open(MAX_IDS)?;
    let RcQpSetup {
        cq,
        qp,
        send_buf,
        my,
        ..
    } = open_rc_qp(&mut v, opts.size, (opts.rx_depth, 1), os_seed())?;
    let poll = Poll::new().map_err(PingpongError::Io)?;
    ProviderSources::register(poll.registry(), &v, 0).map_err(PingpongError::Io)?;
    let fd = cm.io_source().fd;
    poll.registry()
        .register(&mut SourceFd(&fd), CM_TOKEN, Interest::READABLE)
        .map_err(PingpongError::Io)?;
    Ok(Ctx {
        v,
        cm,
        poll,
        events: Events::with_capacity(16),
        cq,
        qp,
        send_buf,
        my,
        conn: None,
        disconnected_at: None,
        pending: Vec::new(),
    })
}

/// Runs rc-pingpong over the kernel's CM on the device `cfg` names.
///
/// # Errors
/// [`RdmaCmPingpongError::Open`] without a device, [`RdmaCmPingpongError::Cm`] without an
/// RDMA CM, else the run's error.
pub fn run(opts: &RcPingpongOptions, cfg: &HwConfig) -> Result<Summary> {
    if opts.tool.cm || opts.tool.validate {
        return Err(PingpongError::Usage("--rdma-cm: --cm and -c need the soft provider").into());
    }
    let deadline = Instant::now() + opts.deadline;
    let local = match (opts.bind, opts.peer) {
        (Some(ip), _) => ip,
        (None, Some(peer)) => {
            route_source(peer).map_err(PingpongError::exchange("route to peer"))?
        }
        (None, None) => {
            return Err(PingpongError::Usage(
                "--rdma-cm: the server needs --bind ADDR (its device address)",
            )
            .into())
        }
    };
    let cfg = HwConfig {
        local_ip: Some(local),
        ..cfg.clone()
    };
    let mut ctx = setup(opts, &cfg)?;
    if opts.tool.aids.af_ib {
        af_ib(&mut ctx, opts.peer, local, deadline)?;
        return Ok(Summary {
            bytes: 0,
            elapsed: Duration::ZERO,
            iters: 0,
        });
    }
    match opts.peer {
        Some(peer) => connect(&mut ctx, opts, local, peer, deadline)?,
        None => accept(&mut ctx, opts, local, deadline)?,
    }
    let run = PingpongRun::new(opts, ctx.qp, ctx.cq, ctx.send_buf);
    let summary = run_pingpong(&mut ctx, &run)?;
    disconnect(&mut ctx, deadline)?;
    Ok(summary)
}

/// The active side: address, route, REQ, REP, RTU.
fn connect(
    ctx: &mut Ctx,
    opts: &RcPingpongOptions,
    local: IpAddr,
    peer: IpAddr,
    deadline: Instant,
) -> Result<()> {
    let id = ctx.cm.create_id(PortSpace::Tcp)?;
    ctx.conn = Some(id);
    let dst = SocketAddr::new(peer, opts.tcp_port);
    ctx.cm
        .resolve_addr(id, Some(SocketAddr::new(local, 0)), dst, RESOLVE_TIMEOUT)?;
    ctx.until(deadline, "ADDR_RESOLVED", |_, e| {
        step(e, id, &RdmaCmEventKind::AddrResolved)
    })?;
    ctx.cm.resolve_route(id, RESOLVE_TIMEOUT)?;
    ctx.until(deadline, "ROUTE_RESOLVED", |_, e| {
        step(e, id, &RdmaCmEventKind::RouteResolved)
    })?;
    let p = ctx.conn_param();
    ctx.cm.connect(id, &p)?;
    ctx.until(deadline, "the REP", |ctx, e| {
        if e.id != id {
            return Ok(None);
        }
        match e.kind {
            RdmaCmEventKind::ConnectResponse { remote_qpn, .. } => {
                ctx.connect_qp(id, remote_qpn)?;
                ctx.cm.establish(id)?;
                Ok(Some(()))
            }
            other => unexpected(other),
        }
    })
}

/// Waits for `want` on `id`; any failure event of `id` ends the run.
fn step(e: RdmaCmEvent, id: RdmaCmId, want: &RdmaCmEventKind) -> Result<Option<()>> {
    if e.id != id {
        return Ok(None);
    }
    if e.kind == *want {
        return Ok(Some(()));
    }
    unexpected(e.kind)
}

fn unexpected<T>(kind: RdmaCmEventKind) -> Result<Option<T>> {
    match kind {
        RdmaCmEventKind::Rejected { reason, .. } => Err(RdmaCmPingpongError::Rejected(reason)),
        RdmaCmEventKind::Failed { what, status } => {
            Err(RdmaCmPingpongError::Failed { what, status })
        }
        RdmaCmEventKind::DeviceRemoval => Err(RdmaCmPingpongError::Failed {
            what: "DEVICE_REMOVAL",
            status: 0,
        }),
        _ => Ok(None),
    }
}

/// The passive side: listen, take the first REQ, RTR/RTS, REP.
fn accept(ctx: &mut Ctx, opts: &RcPingpongOptions, local: IpAddr, deadline: Instant) -> Result<()> {
    let listener = ctx.cm.create_id(PortSpace::Tcp)?;
    ctx.cm
        .bind_addr(listener, SocketAddr::new(local, opts.tcp_port))?;
    ctx.cm.listen(listener, 4)?;
    println!(
        "listening on {} (rdma_cm service ID {:#018x})",
        SocketAddr::new(local, opts.tcp_port),
        PortSpace::Tcp.service_id(opts.tcp_port)
    );
    let (id, remote_qpn) = ctx.until(deadline, "a REQ", |ctx, e| match e.kind {
        RdmaCmEventKind::ConnectRequest(req) if ctx.conn.is_none() => {
            ctx.conn = Some(e.id);
            Ok(Some((e.id, req.remote_qpn)))
        }
        _ => refuse_more(ctx, e),
    })?;
    let delay = opts.tool.aids.accept_delay;
    if !delay.is_zero() {
        // The kernel's rdma_cm has armed its delayed MRA (no accept when the CONNECT_REQUEST
        // handler returned); a retransmitted REQ from the peer now draws it.
        println!("accepting in {delay:?} (--accept-delay)");
        match ctx.until(
            Instant::now() + delay,
            "the accept delay",
            refuse_more::<()>,
        ) {
            Err(RdmaCmPingpongError::Timeout(_)) | Ok(()) => {}
            Err(e) => return Err(e),
        }
    }
    ctx.connect_qp(id, remote_qpn)?;
    let p = ctx.conn_param();
    ctx.cm.accept(id, &p)?;
    // No more REQs: the listener goes now (the connection's id lives on).
    ctx.cm.destroy(listener)?;
    Ok(())
}

/// A connection request while one is taken: rejected, like rdma_server does.
fn refuse_more<T>(ctx: &mut Ctx, e: RdmaCmEvent) -> Result<Option<T>> {
    if matches!(e.kind, RdmaCmEventKind::ConnectRequest(_)) {
        ctx.cm.reject(e.id, &[])?;
        ctx.cm.destroy(e.id)?;
    }
    Ok(None)
}

/// `--af-ib` (a test aid): an `AF_IB` id where rdma_cm's IP ids work. Client: resolve the
/// peer's GID (its IPv4-mapped or IPv6 address) with IPoIB-CM's service ID of our QPN, then
/// the route; server: bind to our GID at that service ID and listen. Prints each step; the
/// first call or event that fails is the error (its errno in the text).
fn af_ib(ctx: &mut Ctx, peer: Option<IpAddr>, local: IpAddr, deadline: Instant) -> Result<()> {
    // IPoIB-CM's service ID of our QPN, as kernel ipoib listens on.
    let service_id = IPOIB_CM_SERVICE_ID_LINUX | u64::from(ctx.qp.get());
    let id = ctx.cm.create_id(PortSpace::Ib)?;
    ctx.conn = Some(id);
    let step_ok = |what: &str| println!("af_ib: {what}: ok");
    match peer {
        Some(peer) => {
            let dst = IbAddr {
                gid: Gid::from_ip(peer),
                service_id,
                pkey: 0xffff,
            };
            println!("af_ib: active, sib_addr {peer} sib_sid {service_id:#018x}");
            ctx.cm.resolve_addr_ib(id, dst, RESOLVE_TIMEOUT)?;
            ctx.until(deadline, "ADDR_RESOLVED", |_, e| {
                step(e, id, &RdmaCmEventKind::AddrResolved)
            })?;
            step_ok("rdma_resolve_addr, ADDR_RESOLVED");
            ctx.cm.resolve_route(id, RESOLVE_TIMEOUT)?;
            ctx.until(deadline, "ROUTE_RESOLVED", |_, e| {
                step(e, id, &RdmaCmEventKind::RouteResolved)
            })?;
            step_ok("rdma_resolve_route, ROUTE_RESOLVED");
        }
        None => {
            let addr = IbAddr {
                gid: Gid::from_ip(local),
                service_id,
                pkey: 0xffff,
            };
            println!("af_ib: passive, sib_addr {local} sib_sid {service_id:#018x}");
            ctx.cm.bind_addr_ib(id, addr)?;
            step_ok("rdma_bind_addr");
            ctx.cm.listen(id, 4)?;
            step_ok("rdma_listen");
        }
    }
    ctx.cm.destroy(id)?;
    ctx.conn = None;
    Ok(())
}

/// DREQ (or the DREP of the peer's), `DISCONNECTED`, QP to ERR, ids destroyed.
fn disconnect(ctx: &mut Ctx, deadline: Instant) -> Result<()> {
    let Some(id) = ctx.conn else {
        return Ok(());
    };
    ctx.cm.disconnect(id)?;
    if ctx.disconnected_at.is_none() {
        ctx.until(deadline, "DISCONNECTED", |ctx, _| {
            Ok(ctx.disconnected_at.map(drop))
        })?;
    }
    let qp = ctx.qp;
    ctx.v
        .modify_qp(qp, &QpAttr::to_state(QpState::Err))
        .map_err(PingpongError::verbs("moving the QP to ERR"))?;
    ctx.cm.destroy(id)?;
    ctx.conn = None;
    Ok(())
}
