//! What the pingpong tools share: rdma-core's QP-info exchange message and the helpers around
//! the TCP exchange.

use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};

use super::rc_pingpong::PingpongError;
use rand::{Rng, SeedableRng};

use crate::verbs::{
    AccessFlags, BufId, CqId, Gid, PdId, Psn, QpAttr, QpInit, QpNum, QpState, QpType, Verbs,
    VerbsError, WrId,
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

/// The RC QP of a pingpong run, as rdma-core's examples build it.
pub(crate) struct RcQpSetup {
    pub(crate) pd: PdId,
    pub(crate) cq: CqId,
    pub(crate) qp: QpNum,
    /// The one send buffer (held).
    pub(crate) send_buf: BufId,
    /// This side's random PSN.
    pub(crate) psn: Psn,
}

/// PD, a pool of `rx_depth + 1` buffers of `size` bytes, one CQ for both queues, an RC QP
/// moved to INIT with `rx_depth` receives posted (`recv_wr`), one send buffer held, and a
/// random 24-bit PSN drawn from `seed`.
///
/// # Errors
/// The provider's error, or an exhausted pool.
pub(crate) fn open_rc_qp<V: Verbs>(
    v: &mut V,
    size: usize,
    rx_depth: u32,
    recv_wr: WrId,
    seed: u64,
) -> Result<RcQpSetup, PingpongError> {
    let pd = v.alloc_pd().map_err(provider_err)?;
    let pool = v
        .create_pool(pd, size.max(1), rx_depth as usize + 1)
        .map_err(provider_err)?;
    let cq = v.create_cq(rx_depth + 1).map_err(provider_err)?;
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 1,
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
    for _ in 0..rx_depth {
        let b = v.pools_mut().alloc(pool).ok_or_else(exhausted)?;
        v.post_recv(qp, recv_wr, b).map_err(provider_err)?;
    }
    let psn = Psn::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed).gen::<u32>());
    Ok(RcQpSetup {
        pd,
        cq,
        qp,
        send_buf,
        psn,
    })
}
