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
//! side advertises the PSN it expects to receive.

use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::cm::{AcceptParams, Cm, CmConfig, CmEvent, CommId, ConnectParams};
use crate::mad::Gsi;
use crate::soft::provider::UdpOffload;
use crate::soft::{FaultConfig, SoftVerbs};
use crate::verbs::{
    AsyncEvent, BufId, Completion, CqId, Gid, PathMtu, PdId, Provider, QpAttr, QpNum, QpState,
    SendWr, Verbs, WcOpcode, WcStatus, WrId,
};

/// rdma_cm's service ID prefix for the TCP port space (`RDMA_PS_TCP`).
pub const RDMA_CM_TCP_SERVICE: u64 = 0x0000_0000_0106_0000;

/// The TCP port rdma-core's pingpong examples use.
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Peer host (client mode); `None` makes this the server.
    pub peer: Option<IpAddr>,
    /// Local underlay address; derived from the route to the peer (client) or the accepted TCP
    /// connection (server) when absent.
    pub bind: Option<IpAddr>,
    /// TCP port of the QP-info exchange.
    pub tcp_port: u16,
    /// UDP port of RoCEv2 traffic, both directions.
    pub udp_port: u16,
    /// Message size in bytes.
    pub size: usize,
    /// Round trips.
    pub iters: u32,
    /// Path MTU.
    pub mtu: PathMtu,
    /// Receive WRs kept posted.
    pub rx_depth: u32,
    /// Check every received payload against the expected pattern.
    pub validate: bool,
    /// Local ACK timeout exponent (`4.096 µs · 2^n`); rdma-core uses 14.
    pub qp_timeout: u8,
    /// Verify the ICRC of IPv4 packets (off for peers with random IP IDs, such as rxe).
    pub verify_icrc_v4: bool,
    /// Fault injection on what this side sends.
    pub faults: FaultConfig,
    /// Connect through the IB CM (REQ/REP/RTU over QP1) instead of the TCP exchange.
    pub cm: bool,
    /// Give up after this long.
    pub deadline: Duration,
}

/// What went wrong, for a one-line message and a non-zero exit.
#[derive(Debug, thiserror::Error)]
pub enum PingpongError {
    /// The TCP exchange failed.
    #[error("QP info exchange: {0}")]
    Exchange(String),
    /// The provider could not be set up.
    #[error("provider: {0}")]
    Provider(String),
    /// A work completion failed.
    #[error("Failed status {status} for wr_id {wr_id}", status = .0.status.as_str(), wr_id = .0.wr_id.0)]
    Completion(Completion),
    /// A received payload differed from what was sent.
    #[error("payload mismatch in message {0}")]
    Mismatch(u32),
    /// The run did not finish in time.
    #[error("timed out after {0:?} ({1} sends and {2} receives completed)")]
    Timeout(Duration, u32, u32),
    /// An I/O error of the event loop.
    #[error("event loop: {0}")]
    Io(#[from] io::Error),
    /// The CM could not connect or disconnect.
    #[error("CM: {0}")]
    Cm(String),
    /// A command-line combination that cannot work.
    #[error("{0}")]
    Usage(&'static str),
}

use super::exchange::{
    clock_seed, exchange_err, exchange_over_tcp, linger, open_rc_qp, print_dest, rc_to_rts,
    route_source, RcPath, RcQpSetup, SoftLink, SoftLoop, TcpExchange,
};
pub use super::exchange::{Dest, DEST_MSG_LEN};

const SEND_WRID: u64 = 1;
const RECV_WRID: u64 = 2;

/// Fills `buf` with the pattern of message `n` in direction `from_client`.
fn fill_pattern(buf: &mut [u8], n: u32, from_client: bool) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (u64::from(n) << 1) ^ u64::from(from_client);
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn pattern_matches(buf: &[u8], n: u32, from_client: bool) -> bool {
    let mut want = vec![0u8; buf.len()];
    fill_pattern(&mut want, n, from_client);
    want == buf
}

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
    pd: PdId,
    cq: CqId,
    qp: QpNum,
    send_buf: BufId,
    my: Dest,
    cm: Option<CmCtx>,
}

impl Ctx {
    /// One pass over everything that may have work: the socket, timers, CM MADs and events.
    /// CM events are appended to `out`.
    fn pump(&mut self, now: Instant, out: &mut Vec<CmEvent>) -> Result<(), PingpongError> {
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
                .map_err(|e| PingpongError::Provider(format!("sending a CM MAD: {e}")))?;
        }
        while let Some(e) = c.cm.poll_event() {
            out.push(e);
        }
        self.lp.prov.handle_io(now)?;
        Ok(())
    }

    /// Sleeps until something may be ready (at most `cap`).
    fn wait(&mut self, cap: Duration) -> Result<(), PingpongError> {
        let cm_timeout = self.cm.as_ref().and_then(|c| c.cm.poll_timeout());
        self.lp.wait(cap, cm_timeout)
    }
}

fn setup(opts: &Options, local: IpAddr) -> Result<Ctx, PingpongError> {
    let perr = |e: crate::verbs::VerbsError| PingpongError::Provider(e.to_string());
    let mut lp = SoftLoop::bind(&SoftLink {
        local,
        udp_port: opts.udp_port,
        verify_icrc_v4: opts.verify_icrc_v4,
        faults: opts.faults,
        // Datagram by datagram (no GSO trains), so a capture anywhere shows every packet as
        // sent.
        offload: UdpOffload::Off,
    })?;
    let v = lp.prov.verbs();
    let seed = clock_seed();
    let RcQpSetup {
        pd,
        cq,
        qp,
        send_buf,
        my,
        ..
    } = open_rc_qp(v, opts.size, (opts.rx_depth, 1), WrId(RECV_WRID), seed)?;
    let gid = my.gid;
    let cm = if opts.cm {
        let gsi = Gsi::open(v, pd, 64, 16).map_err(perr)?;
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
        pd,
        cq,
        qp,
        send_buf,
        my,
        cm,
    })
}

/// RTR then RTS: with the TCP exchange each side sends from its own PSN; with the CM each
/// side advertised the PSN it expects.
fn connect_qp(ctx: &mut Ctx, opts: &Options, rem: &Dest) -> Result<(), PingpongError> {
    let (rq_psn, sq_psn) = if opts.cm {
        (ctx.my.psn, rem.psn)
    } else {
        (rem.psn, ctx.my.psn)
    };
    let path = RcPath {
        mtu: opts.mtu,
        qp_timeout: opts.qp_timeout,
        rq_psn,
        sq_psn,
    };
    rc_to_rts(ctx.lp.prov.verbs(), ctx.qp, rem, &path)
}

/// What a successful run reports.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// rdma-core's figures.
    pub summary: Summary,
    /// The provider's counters ([`stats_line`]).
    pub stats: String,
}

/// Runs the tool.
///
/// # Errors
/// Any [`PingpongError`]; the caller prints it and exits non-zero.
pub fn run(opts: &Options) -> Result<Outcome, PingpongError> {
    let mut ctx = if opts.cm {
        connect_with_cm(opts)?
    } else {
        connect_with_tcp(opts)?
    };
    let summary = pingpong(&mut ctx, opts)?;
    if opts.cm {
        disconnect_with_cm(&mut ctx, opts)?;
    }
    Ok(Outcome {
        summary,
        stats: stats_line(ctx.lp.prov.engine()),
    })
}

/// rdma-core's pingpong set-up: QP info over TCP.
fn connect_with_tcp(opts: &Options) -> Result<Ctx, PingpongError> {
    let ex = TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline);
    let (ctx, _) = exchange_over_tcp(
        &ex,
        |local| {
            let ctx = setup(opts, local)?;
            let my = ctx.my;
            Ok((ctx, my))
        },
        |ctx, rem| connect_qp(ctx, opts, rem),
    )?;
    Ok(ctx)
}

/// Runs the event loop until `f` returns a value for one of the CM events, or the deadline.
fn until_cm_event<T>(
    ctx: &mut Ctx,
    deadline: Instant,
    what: &str,
    mut f: impl FnMut(&mut Ctx, &CmEvent) -> Result<Option<T>, PingpongError>,
) -> Result<T, PingpongError> {
    let mut evs = Vec::new();
    for _ in 0..10_000_000u32 {
        let now = Instant::now();
        if now > deadline {
            break;
        }
        evs.clear();
        ctx.pump(now, &mut evs)?;
        for e in &evs {
            if let Some(t) = f(ctx, e)? {
                return Ok(t);
            }
        }
        ctx.wait(Duration::from_millis(100))?;
    }
    Err(PingpongError::Cm(format!("timed out waiting for {what}")))
}

/// The IB CM set-up: REQ/REP/RTU over QP1.
fn connect_with_cm(opts: &Options) -> Result<Ctx, PingpongError> {
    let deadline = Instant::now() + opts.deadline;
    let service_id = RDMA_CM_TCP_SERVICE | u64::from(opts.tcp_port);
    match opts.peer {
        Some(peer) => {
            let local = match opts.bind {
                Some(ip) => ip,
                None => route_source(peer).map_err(|e| exchange_err("route to peer", e))?,
            };
            let mut ctx = setup(opts, local)?;
            print_dest("local", &ctx.my);
            let params = ConnectParams {
                peer: Gid::from_ip(peer),
                service_id,
                local_qpn: ctx.qp,
                starting_psn: ctx.my.psn,
                path_mtu: opts.mtu,
                retry_count: 7,
                rnr_retry_count: 7,
                srq: false,
                local_ack_timeout: opts.qp_timeout,
                private_data: Vec::new(),
            };
            let c = ctx.cm.as_mut().ok_or(PingpongError::Usage("no CM"))?;
            let id =
                c.cm.connect(Instant::now(), params)
                    .map_err(|e| PingpongError::Cm(e.to_string()))?;
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
                    connect_qp(ctx, opts, &rem)?;
                    if let Some(c) = ctx.cm.as_mut() {
                        c.cm.rtu(Instant::now(), id)
                            .map_err(|e| PingpongError::Cm(e.to_string()))?;
                    }
                    Ok(Some(()))
                }
                CmEvent::Rejected { reason, .. } => Err(PingpongError::Cm(format!(
                    "connection rejected: {reason:?}"
                ))),
                CmEvent::TimedOut { .. } => Err(PingpongError::Cm(format!(
                    "no answer from {peer} after all REQ retries"
                ))),
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
                    ..
                } => {
                    let c = ctx.cm.as_mut().ok_or(PingpongError::Usage("no CM"))?;
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
                    let mut o = opts.clone();
                    o.mtu = o.mtu.min(path_mtu);
                    connect_qp(ctx, &o, &rem)?;
                    let params = AcceptParams {
                        local_qpn: ctx.qp,
                        starting_psn: ctx.my.psn,
                        srq: false,
                        rnr_retry_count: 7,
                        private_data: Vec::new(),
                    };
                    if let Some(c) = ctx.cm.as_mut() {
                        c.cm.accept(Instant::now(), id, params)
                            .map_err(|e| PingpongError::Cm(e.to_string()))?;
                    }
                    Ok(Some(()))
                }
                _ => Ok(None),
            })?;
            Ok(ctx)
        }
    }
}

/// DREQ/DREP: the client disconnects, the server waits for it.
fn disconnect_with_cm(ctx: &mut Ctx, opts: &Options) -> Result<(), PingpongError> {
    let deadline = Instant::now() + opts.deadline;
    let c = ctx.cm.as_mut().ok_or(PingpongError::Usage("no CM"))?;
    let id = c.id.ok_or(PingpongError::Usage("no connection"))?;
    if opts.peer.is_some() {
        c.cm.disconnect(Instant::now(), id)
            .map_err(|e| PingpongError::Cm(e.to_string()))?;
    }
    let already =
        matches!(c.cm.state(id), Some(crate::cm::CmState::TimeWait) | None) && opts.peer.is_none();
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
        .map_err(|e| PingpongError::Provider(e.to_string()))?;
    let _ = ctx.pd;
    Ok(())
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

fn pingpong(ctx: &mut Ctx, opts: &Options) -> Result<Summary, PingpongError> {
    let is_client = opts.peer.is_some();
    let mut wcs: Vec<Completion> = Vec::with_capacity(64);
    let mut cm_events = Vec::new();
    let start = Instant::now();
    let deadline = start + opts.deadline;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut send_pending = false;
    let mut recv_pending = true;
    let post_send = |ctx: &mut Ctx, n: u32| -> Result<(), PingpongError> {
        let v = ctx.lp.prov.verbs();
        if opts.validate {
            if let Ok(b) = v.pools_mut().get_mut(ctx.send_buf) {
                fill_pattern(&mut b[..opts.size], n, is_client);
            }
        }
        let wr = SendWr::send(WrId(SEND_WRID), ctx.send_buf, opts.size);
        v.post_send(ctx.qp, &wr)
            .map_err(|e| PingpongError::Provider(format!("Couldn't post send: {e}")))
    };
    if is_client {
        post_send(ctx, 0)?;
        send_pending = true;
    }
    while rcnt < opts.iters || scnt < opts.iters {
        let now = Instant::now();
        if now > deadline {
            return Err(PingpongError::Timeout(opts.deadline, scnt, rcnt));
        }
        cm_events.clear();
        ctx.pump(now, &mut cm_events)?;
        for e in &cm_events {
            match e {
                CmEvent::DisconnectReceived { .. } | CmEvent::Rejected { .. } => {
                    return Err(PingpongError::Cm(format!("peer went away: {e:?}")));
                }
                _ => {}
            }
        }
        wcs.clear();
        ctx.lp.prov.verbs().poll_cq(ctx.cq, &mut wcs, 64);
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
                    if opts.validate {
                        let v = ctx.lp.prov.verbs();
                        let data = v
                            .pools()
                            .get(buf)
                            .map_err(|e| PingpongError::Provider(e.to_string()))?;
                        let len = wc.byte_len as usize;
                        if len != opts.size || !pattern_matches(&data[..len], rcnt, !is_client) {
                            return Err(PingpongError::Mismatch(rcnt));
                        }
                    }
                    rcnt += 1;
                    recv_pending = false;
                    ctx.lp
                        .prov
                        .verbs()
                        .post_recv(ctx.qp, WrId(RECV_WRID), buf)
                        .map_err(|e| {
                            PingpongError::Provider(format!("Couldn't post receive: {e}"))
                        })?;
                }
            }
            if scnt < opts.iters && !send_pending && !recv_pending {
                post_send(ctx, scnt)?;
                send_pending = true;
                recv_pending = true;
            }
        }
        if !wcs.is_empty() {
            ctx.lp.prov.handle_io(Instant::now())?;
            continue;
        }
        ctx.wait(Duration::from_millis(100))?;
    }
    let elapsed = start.elapsed();
    linger_pingpong(ctx, opts)?;
    Ok(Summary {
        bytes: opts.size as u64 * u64::from(opts.iters) * 2,
        elapsed,
        iters: opts.iters,
    })
}

/// Keeps answering for a while after the last completion (see [`linger`]).
fn linger_pingpong(ctx: &mut Ctx, opts: &Options) -> Result<(), PingpongError> {
    let mut evs = Vec::new();
    linger(ctx, opts.qp_timeout, |ctx, now, cap| {
        evs.clear();
        ctx.pump(now, &mut evs)?;
        ctx.wait(cap)
    })
}

/// The provider's counters, one line, for the end of a run.
pub fn stats_line(v: &SoftVerbs) -> String {
    let s = v.stats();
    format!(
        "soft-rc: tx_packets={} retransmits={} timeouts={} acks={} seq_naks_tx={} rnr_naks_tx={} rx_datagrams={} rx_bad_icrc={} rx_duplicate={} rx_out_of_sequence={} injected_loss={} injected_dup={} injected_reorder={} injected_corrupt={}",
        s.tx_packets,
        s.tx_retransmits,
        s.retransmit_timeouts,
        s.tx_acks,
        s.tx_seq_naks,
        s.tx_rnr_naks,
        s.rx_datagrams,
        s.rx_bad_icrc,
        s.rx_duplicate,
        s.rx_out_of_sequence,
        s.faults.dropped,
        s.faults.duplicated,
        s.faults.reordered,
        s.faults.corrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Psn;

    #[test]
    fn dest_message_matches_rdma_core_format() {
        let d = Dest {
            lid: 0,
            qpn: QpNum::new(0x11),
            psn: Psn::new(0xabcdef),
            gid: Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 1)),
        };
        let msg = d.to_msg();
        assert_eq!(
            &msg[..51],
            b"0000:000011:abcdef:00000000000000000000ffffc6120001".as_slice()
        );
        assert_eq!(msg[51], 0);
        assert_eq!(Dest::from_msg(&msg), Some(d));
        assert_eq!(Dest::from_msg(b"0000:1000000:000000:00"), None);
        assert_eq!(Dest::from_msg(b"\xff\xfe"), None);
    }

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
