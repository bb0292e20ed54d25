//! rdma-core's QP-info exchange: the message ([`Dest`]) and the TCP exchange around it
//! (`exchange_over_tcp`), as its pingpong examples do it, so the tools pair with them.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::PingpongError;
use crate::verbs::{Gid, Psn, QpNum};

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
fn read_msg(s: &mut TcpStream, n: usize) -> Result<Vec<u8>, PingpongError> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)
        .map_err(PingpongError::exchange("Couldn't read remote address"))?;
    Ok(buf)
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
    /// rdma-core's exchange, with the tool's deadline (`deadline` from now) bounding the
    /// connect, each read and the server's wait for its client.
    pub(crate) fn rdma_core(
        peer: Option<IpAddr>,
        bind: Option<IpAddr>,
        tcp_port: u16,
        deadline: Duration,
    ) -> Self {
        Self {
            peer,
            bind,
            tcp_port,
            io_timeout: deadline,
            accept_deadline: Some(Instant::now() + deadline),
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
/// [`PingpongError::Exchange`], [`PingpongError::BadRemoteAddress`] or
/// [`PingpongError::NoClient`] for the TCP side, or what `open` and `connect` return.
pub(crate) fn exchange_over_tcp<C>(
    ex: &TcpExchange,
    open: impl FnOnce(IpAddr) -> Result<(C, Dest), PingpongError>,
    connect: impl FnOnce(&mut C, &Dest) -> Result<(), PingpongError>,
) -> Result<(C, Dest), PingpongError> {
    let remote = |s: &mut TcpStream| -> Result<Dest, PingpongError> {
        let rem =
            Dest::from_msg(&read_msg(s, DEST_MSG_LEN)?).ok_or(PingpongError::BadRemoteAddress)?;
        print_dest("remote", &rem);
        Ok(rem)
    };
    if let Some(peer) = ex.peer {
        let local = match ex.bind {
            Some(ip) => ip,
            None => route_source(peer).map_err(PingpongError::exchange("route to peer"))?,
        };
        let (mut ctx, my) = open(local)?;
        print_dest("local", &my);
        let mut s = TcpStream::connect_timeout(&SocketAddr::new(peer, ex.tcp_port), ex.io_timeout)
            .map_err(PingpongError::exchange(format!(
                "Couldn't connect to {peer}:{}",
                ex.tcp_port
            )))?;
        s.set_read_timeout(Some(ex.io_timeout))
            .map_err(PingpongError::exchange("socket"))?;
        s.write_all(&my.to_msg())
            .map_err(PingpongError::exchange("Couldn't send local address"))?;
        let rem = remote(&mut s)?;
        connect(&mut ctx, &rem)?;
        s.write_all(b"done\0")
            .map_err(PingpongError::exchange("Couldn't send done"))?;
        Ok((ctx, rem))
    } else {
        let any = ex.bind.unwrap_or(IpAddr::from([0u8; 4]));
        let l = TcpListener::bind(SocketAddr::new(any, ex.tcp_port)).map_err(
            PingpongError::exchange(format!("Couldn't listen to port {}", ex.tcp_port)),
        )?;
        let mut s = accept_until(&l, ex.accept_deadline)?;
        s.set_read_timeout(Some(ex.io_timeout))
            .map_err(PingpongError::exchange("socket"))?;
        let local = s
            .local_addr()
            .map_err(PingpongError::exchange("socket"))?
            .ip();
        let local = match local {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(local, IpAddr::V4),
            v4 => v4,
        };
        let (mut ctx, my) = open(ex.bind.unwrap_or(local))?;
        print_dest("local", &my);
        let rem = remote(&mut s)?;
        connect(&mut ctx, &rem)?;
        s.write_all(&my.to_msg())
            .map_err(PingpongError::exchange("Couldn't send local address"))?;
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
            .map_err(PingpongError::exchange("accept"));
    };
    l.set_nonblocking(true)
        .map_err(PingpongError::exchange("accept"))?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(PingpongError::exchange("accept"))?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(PingpongError::NoClient);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(PingpongError::exchange("accept")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
