//! What the tools share: rdma-core's QP-info exchange message and the TCP exchange around it,
//! the software provider with its mio event loop, and the RC QP set-up.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::rc_pingpong::PingpongError;
use mio::{Events, Poll};
use rand::{Rng, SeedableRng};

use crate::soft::provider::{SoftProvider, UdpOffload};
use crate::soft::{FaultConfig, SoftConfig};
use crate::verbs::{
    AccessFlags, AddressVector, BufId, CqId, Gid, PathMtu, PdId, Provider, Psn, QpAttr, QpInit,
    QpNum, QpState, QpType, Verbs, VerbsError, WrId,
};

/// A peer's QP info, as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QPN.
    pub qpn: QpNum,
    /// The PSN this side sends from (the peer's expected receive PSN).
    pub psn: Psn,
    /// GID.
    pub gid: Gid,
}

/// Length of the exchange message, with its NUL.
pub const DEST_MSG_LEN: usize = 52;

impl Dest {
    /// The 52-byte exchange message.
    pub fn to_msg(&self) -> [u8; DEST_MSG_LEN] {
        let s = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.get(),
            self.psn.get(),
            self.gid.to_wire_hex()
        );
        let mut out = [0u8; DEST_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses an exchange message (trailing NULs allowed).
    pub fn from_msg(msg: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(msg).ok()?.trim_end_matches('\0');
        let mut parts = text.split(':');
        let lid = u16::from_str_radix(parts.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(parts.next()?, 16).ok()?;
        let psn = u32::from_str_radix(parts.next()?, 16).ok()?;
        let gid = Gid::from_wire_hex(parts.next()?)?;
        if parts.next().is_some() || qpn > 0x00FF_FFFF || psn > 0x00FF_FFFF {
            return None;
        }
        Some(Self {
            lid,
            qpn: QpNum::new(qpn),
            psn: Psn::new(psn),
            gid,
        })
    }
}

/// The local IP the kernel would use to reach `peer` (no packet is sent).
pub(crate) fn route_source(peer: IpAddr) -> io::Result<IpAddr> {
    let any = SocketAddr::new(
        if peer.is_ipv4() {
            IpAddr::from([0u8; 4])
        } else {
            IpAddr::from([0u8; 16])
        },
        0,
    );
    let s = UdpSocket::bind(any)?;
    s.connect(SocketAddr::new(peer, 9))?;
    Ok(s.local_addr()?.ip())
}

/// An exchange error: `what` failed because of `e`.
pub(crate) fn exchange_err(what: &str, e: impl std::fmt::Display) -> PingpongError {
    PingpongError::Exchange(format!("{what}: {e}"))
}

/// A provider error as a pingpong error.
pub(crate) fn provider_err(e: VerbsError) -> PingpongError {
    PingpongError::Provider(e.to_string())
}

/// Prints a QP's info the way rdma-core's pingpong examples do.
pub(crate) fn print_dest(label: &str, d: &Dest) {
    println!(
        "  {label} address:  LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {}",
        d.lid,
        d.qpn.get(),
        d.psn.get(),
        d.gid
    );
}

/// Reads exactly `n` bytes of the exchange.
pub(crate) fn read_msg(s: &mut TcpStream, n: usize) -> Result<Vec<u8>, PingpongError> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)
        .map_err(|e| exchange_err("Couldn't read remote address", e))?;
    Ok(buf)
}

/// Entropy for a run's PSN (and CM ids): the clock and the pid; it need not be secret, only
/// differ between runs.
pub(crate) fn clock_seed() -> u64 {
    u64::from(std::process::id())
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
}

/// The RC QP of a run, as rdma-core's examples build it.
pub(crate) struct RcQpSetup {
    pub(crate) pd: PdId,
    pub(crate) cq: CqId,
    pub(crate) qp: QpNum,
    /// The first send buffer (held).
    pub(crate) send_buf: BufId,
    /// The other `tx_depth - 1` send buffers (held).
    pub(crate) spare_send_bufs: Vec<BufId>,
    /// This side's QP info: the QPN, a random PSN and the port's GID.
    pub(crate) my: Dest,
}

/// PD, a pool of `rx_depth + tx_depth` buffers of `size` bytes, one CQ for both queues, an RC
/// QP with room for `tx_depth` sends moved to INIT with `rx_depth` receives posted
/// (`recv_wr`), `tx_depth` send buffers held, and a random 24-bit PSN drawn from `seed`
/// (in the returned [`Dest`]).
/// rdma-core's pingpong examples use a `tx_depth` of 1.
///
/// # Errors
/// The provider's error, or an exhausted pool.
pub(crate) fn open_rc_qp<V: Verbs>(
    v: &mut V,
    size: usize,
    (rx_depth, tx_depth): (u32, u32),
    recv_wr: WrId,
    seed: u64,
) -> Result<RcQpSetup, PingpongError> {
    let tx_depth = tx_depth.max(1);
    let pd = v.alloc_pd().map_err(provider_err)?;
    let pool = v
        .create_pool(pd, size.max(1), rx_depth as usize + tx_depth as usize)
        .map_err(provider_err)?;
    let cq = v
        .create_cq(rx_depth.saturating_add(tx_depth))
        .map_err(provider_err)?;
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: tx_depth,
            max_recv_wr: rx_depth,
            sq_sig_all: false,
        })
        .map_err(provider_err)?;
    v.modify_qp(
        qp,
        &QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            access: Some(AccessFlags::default()),
            ..QpAttr::to_state(QpState::Init)
        },
    )
    .map_err(provider_err)?;
    let exhausted = || PingpongError::Provider("buffer pool exhausted".into());
    let send_buf = v.pools_mut().alloc(pool).ok_or_else(exhausted)?;
    let spare_send_bufs = (1..tx_depth)
        .map(|_| v.pools_mut().alloc(pool).ok_or_else(exhausted))
        .collect::<Result<Vec<_>, _>>()?;
    for _ in 0..rx_depth {
        let b = v.pools_mut().alloc(pool).ok_or_else(exhausted)?;
        v.post_recv(qp, recv_wr, b).map_err(provider_err)?;
    }
    let psn = Psn::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed).gen::<u32>());
    let my = Dest {
        lid: 0,
        qpn: qp,
        psn,
        gid: v.port_attr().gid,
    };
    Ok(RcQpSetup {
        pd,
        cq,
        qp,
        send_buf,
        spare_send_bufs,
        my,
    })
}

/// The path of an RC connection: what RTR and RTS need beyond the peer's [`Dest`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct RcPath {
    /// Path MTU.
    pub(crate) mtu: PathMtu,
    /// Local ACK timeout exponent (`4.096 µs · 2^n`).
    pub(crate) qp_timeout: u8,
    /// The PSN this side expects to receive first.
    pub(crate) rq_psn: Psn,
    /// The PSN this side sends from.
    pub(crate) sq_psn: Psn,
}

/// RTR then RTS towards `rem`, with rdma-core's pingpong attributes (7 retries, 7 RNR
/// retries, one read/atomic).
///
/// # Errors
/// The provider's error.
pub(crate) fn rc_to_rts<V: Verbs>(
    v: &mut V,
    qp: QpNum,
    rem: &Dest,
    path: &RcPath,
) -> Result<(), PingpongError> {
    v.modify_qp(
        qp,
        &QpAttr {
            av: Some(AddressVector::to_gid(rem.gid)),
            path_mtu: Some(path.mtu),
            dest_qpn: Some(rem.qpn),
            rq_psn: Some(path.rq_psn),
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(12),
            ..QpAttr::to_state(QpState::Rtr)
        },
    )
    .map_err(provider_err)?;
    v.modify_qp(
        qp,
        &QpAttr {
            timeout: Some(path.qp_timeout),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            sq_psn: Some(path.sq_psn),
            max_rd_atomic: Some(1),
            ..QpAttr::to_state(QpState::Rts)
        },
    )
    .map_err(provider_err)
}

/// Where the TCP QP-info exchange runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpExchange {
    /// The server to connect to; `None`: this side is the server.
    pub(crate) peer: Option<IpAddr>,
    /// Local underlay address (default: the route to the peer, or the address the client
    /// reached).
    pub(crate) bind: Option<IpAddr>,
    /// TCP port.
    pub(crate) tcp_port: u16,
    /// Bound on the connect and on each read.
    pub(crate) io_timeout: Duration,
    /// When the server stops waiting for a client; `None` waits forever, as rdma-core does.
    pub(crate) accept_deadline: Option<Instant>,
}

impl TcpExchange {
    /// As rdma-core's examples: the server waits for its client forever.
    pub(crate) fn rdma_core(
        peer: Option<IpAddr>,
        bind: Option<IpAddr>,
        tcp_port: u16,
        io_timeout: Duration,
    ) -> Self {
        Self {
            peer,
            bind,
            tcp_port,
            io_timeout,
            accept_deadline: None,
        }
    }
}

/// rdma-core's pingpong exchange over TCP. The client connects and sends its [`Dest`], the
/// server answers with its own once its QP is connected, and the client sends `"done\0"`
/// once its QP is connected too. `open(local)` builds this side's QP on the local underlay
/// address and returns it with its [`Dest`]; `connect(ctx, remote)` moves it to RTS.
/// Returns the context and the peer's [`Dest`]; the server returns once `"done"` arrived,
/// the client once it was sent.
///
/// # Errors
/// [`PingpongError::Exchange`] for the TCP side, or what `open` and `connect` return.
pub(crate) fn exchange_over_tcp<C>(
    ex: &TcpExchange,
    open: impl FnOnce(IpAddr) -> Result<(C, Dest), PingpongError>,
    connect: impl FnOnce(&mut C, &Dest) -> Result<(), PingpongError>,
) -> Result<(C, Dest), PingpongError> {
    let remote = |s: &mut TcpStream| -> Result<Dest, PingpongError> {
        let rem = Dest::from_msg(&read_msg(s, DEST_MSG_LEN)?)
            .ok_or_else(|| exchange_err("bad remote address", "unparseable"))?;
        print_dest("remote", &rem);
        Ok(rem)
    };
    let sock_err = |e| exchange_err("socket", e);
    if let Some(peer) = ex.peer {
        let local = match ex.bind {
            Some(ip) => ip,
            None => route_source(peer).map_err(|e| exchange_err("route to peer", e))?,
        };
        let (mut ctx, my) = open(local)?;
        print_dest("local", &my);
        let mut s = TcpStream::connect_timeout(&SocketAddr::new(peer, ex.tcp_port), ex.io_timeout)
            .map_err(|e| exchange_err(&format!("Couldn't connect to {peer}:{}", ex.tcp_port), e))?;
        s.set_read_timeout(Some(ex.io_timeout)).map_err(sock_err)?;
        s.write_all(&my.to_msg())
            .map_err(|e| exchange_err("Couldn't send local address", e))?;
        let rem = remote(&mut s)?;
        connect(&mut ctx, &rem)?;
        s.write_all(b"done\0")
            .map_err(|e| exchange_err("Couldn't send done", e))?;
        Ok((ctx, rem))
    } else {
        let any = ex.bind.unwrap_or(IpAddr::from([0u8; 4]));
        let l = TcpListener::bind(SocketAddr::new(any, ex.tcp_port))
            .map_err(|e| exchange_err(&format!("Couldn't listen to port {}", ex.tcp_port), e))?;
        let mut s = accept_until(&l, ex.accept_deadline)?;
        s.set_read_timeout(Some(ex.io_timeout)).map_err(sock_err)?;
        let local = s.local_addr().map_err(sock_err)?.ip();
        let local = match local {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(local, IpAddr::V4),
            v4 => v4,
        };
        let (mut ctx, my) = open(ex.bind.unwrap_or(local))?;
        print_dest("local", &my);
        let rem = remote(&mut s)?;
        connect(&mut ctx, &rem)?;
        s.write_all(&my.to_msg())
            .map_err(|e| exchange_err("Couldn't send local address", e))?;
        let _done = read_msg(&mut s, 5)?;
        Ok((ctx, rem))
    }
}

/// Accepts one connection, giving up at `deadline` (`None`: waits forever).
fn accept_until(l: &TcpListener, deadline: Option<Instant>) -> Result<TcpStream, PingpongError> {
    let Some(deadline) = deadline else {
        return l
            .accept()
            .map(|(s, _)| s)
            .map_err(|e| exchange_err("accept", e));
    };
    l.set_nonblocking(true)
        .map_err(|e| exchange_err("accept", e))?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| exchange_err("accept", e))?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(exchange_err("accept", "no client before the deadline"));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(exchange_err("accept", e)),
        }
    }
}

/// Where and how a tool's software provider runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SoftLink {
    /// Local underlay address.
    pub(crate) local: IpAddr,
    /// UDP port of RoCEv2 traffic, both directions.
    pub(crate) udp_port: u16,
    /// Verify the ICRC of IPv4 packets.
    pub(crate) verify_icrc_v4: bool,
    /// Fault injection on what this side sends.
    pub(crate) faults: FaultConfig,
    /// UDP GSO/GRO.
    pub(crate) offload: UdpOffload,
}

/// The software provider with the mio poll that wakes a tool's event loop.
pub(crate) struct SoftLoop {
    /// The provider (its socket is registered with the poll).
    pub(crate) prov: SoftProvider,
    poll: Poll,
    events: Events,
}

impl SoftLoop {
    /// Binds the provider (port MTU 4096) and registers it with a new poll.
    ///
    /// # Errors
    /// [`PingpongError::Provider`] if the socket cannot be bound, or the poll's error.
    pub(crate) fn bind(link: &SoftLink) -> Result<Self, PingpongError> {
        let mut cfg = SoftConfig::new(link.local);
        cfg.src_port = link.udp_port;
        cfg.dst_port = link.udp_port;
        cfg.port_mtu = PathMtu::Mtu4096;
        cfg.verify_icrc_v4 = link.verify_icrc_v4;
        cfg.faults = link.faults;
        let mut prov = SoftProvider::bind(cfg, link.offload).map_err(|e| {
            PingpongError::Provider(format!("bind {} udp {}: {e}", link.local, link.udp_port))
        })?;
        let poll = Poll::new()?;
        prov.register(poll.registry(), 0)?;
        Ok(Self {
            prov,
            poll,
            events: Events::with_capacity(64),
        })
    }

    /// Sleeps until the socket is ready, the provider's next timer or `other` is due, or
    /// `cap` has passed, whichever is first.
    ///
    /// # Errors
    /// The poll's error.
    pub(crate) fn wait(
        &mut self,
        cap: Duration,
        other: Option<Instant>,
    ) -> Result<(), PingpongError> {
        let now = Instant::now();
        let timeout = [self.prov.poll_timeout(), other]
            .into_iter()
            .flatten()
            .map(|t| t.saturating_duration_since(now))
            .fold(cap, Duration::min);
        self.poll.poll(&mut self.events, Some(timeout))?;
        Ok(())
    }
}

/// Keeps a run's loop turning for a while after its last completion: the peer may still be
/// waiting for an ACK that got lost, and only this side can re-ACK its retransmission. The
/// while is eight local ACK timeouts (`4.096 µs · 2^qp_timeout`) plus 20 ms, at most 2 s;
/// `turn(ctx, now, cap)` does one pass of I/O and sleeps at most `cap`.
///
/// # Errors
/// What `turn` returns.
pub(crate) fn linger<C>(
    ctx: &mut C,
    qp_timeout: u8,
    mut turn: impl FnMut(&mut C, Instant, Duration) -> Result<(), PingpongError>,
) -> Result<(), PingpongError> {
    let interval = Duration::from_nanos(4096u64 << qp_timeout.min(31));
    let linger = (interval * 8 + Duration::from_millis(20)).min(Duration::from_secs(2));
    let end = Instant::now() + linger;
    for _ in 0..100_000 {
        let now = Instant::now();
        if now >= end {
            break;
        }
        turn(ctx, now, (end - now).min(Duration::from_millis(10)))?;
    }
    Ok(())
}
