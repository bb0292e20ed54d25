//! The soft provider's UDP edge: one non-blocking UDP socket per local address, set up the way
//! RoCEv2 needs it (see `shared/reference/rocev2.md` §6.2).
//!
//! - Bound to the exact local IP, never a wildcard: the source address is part of the ICRC and
//!   of rxe's RC address check, so it must not depend on routing.
//! - Sends are unconnected `sendto` with DF set (`IP_PMTUDISC_DO`): Linux then sends IPv4 ID 0,
//!   so the IPv4 header the ICRC covers is predictable.
//! - Receives report the destination IP from `IP_PKTINFO` / `IPV6_PKTINFO` (needed to verify the
//!   IPv6 ICRC), and IPv6 sockets accept zero UDP checksums (`UDP_NO_CHECK6_RX`), as rxe may
//!   send them.
//!
//! The transport never blocks and never retries: a full send buffer is `Ok(false)` and an empty
//! receive queue is `Ok(None)`; the caller waits for readiness through [`mio`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use mio::event::Source;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::sys::{sockopt, udp};

/// Receive and send buffer size requested at bind time. The kernel doubles it; without
/// `CAP_NET_ADMIN` it is clamped to `net.core.rmem_max` / `wmem_max`.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// How many truncated datagrams one [`UdpTransport::recv`] call discards before giving up with
/// `InvalidData`, so that a flood of oversized datagrams cannot keep it looping.
const MAX_TRUNCATED_PER_RECV: usize = 64;

/// A bound, non-blocking UDP socket for RoCEv2 traffic.
#[derive(Debug)]
pub struct UdpTransport {
    sock: Socket,
    local: SocketAddr,
    truncated: AtomicU64,
}

/// What [`UdpTransport::recv`] learned about one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Datagram length; the datagram is `buf[..len]`.
    pub len: usize,
    /// The sender's address and port.
    pub src: SocketAddr,
    /// The IP the datagram was addressed to (from packet info; the bound IP if the kernel gave
    /// none).
    pub dst_ip: IpAddr,
}

impl UdpTransport {
    /// Binds a non-blocking, close-on-exec UDP socket to the exact address (not a wildcard; reject
    /// unspecified IPs with InvalidInput), DF set, pktinfo on, large buffers.
    ///
    /// Port 0 picks a free port; [`local_addr`](Self::local_addr) reports it. IPv6 sockets are
    /// `IPV6_V6ONLY` and accept zero UDP checksums. Pass IPv4 addresses as
    /// [`SocketAddr::V4`], not as IPv4-mapped IPv6.
    pub fn bind(local: SocketAddr) -> io::Result<Self> {
        if local.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("UdpTransport must bind an exact address, not {local}"),
            ));
        }
        let ipv6 = local.is_ipv6();
        let sock = Socket::new(
            Domain::for_address(local),
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?;
        if ipv6 {
            sock.set_only_v6(true)?;
            sockopt::set_udp_no_check6_rx(&sock)?;
        }
        sockopt::set_pmtudisc_do(&sock, ipv6)?;
        sockopt::set_pktinfo(&sock, ipv6)?;
        sockopt::set_buffer_force(&sock, SOCKET_BUFFER_BYTES, SOCKET_BUFFER_BYTES)?;
        sock.bind(&SockAddr::from(local))?;
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound UDP socket has no IP address"))?;
        Ok(Self {
            sock,
            local,
            truncated: AtomicU64::new(0),
        })
    }

    /// The bound address, with the actual port when bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// One datagram; Ok(None) on WouldBlock. dst_ip from IP_PKTINFO/IPV6_PKTINFO (fall back to
    /// the bound IP).
    ///
    /// A datagram longer than `buf` is discarded (and counted, see
    /// [`truncated_drops`](Self::truncated_drops)) and the next one is read instead, so a
    /// returned datagram is always complete. Give it a buffer of at least the largest expected
    /// datagram (65,535 bytes covers everything).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<RecvMeta>> {
        for _ in 0..MAX_TRUNCATED_PER_RECV {
            let got = match udp::recv_pktinfo(&self.sock, buf) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            };
            if got.truncated {
                self.truncated.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    src = %got.src,
                    buf = buf.len(),
                    "dropped a UDP datagram longer than the receive buffer"
                );
                continue;
            }
            return Ok(Some(RecvMeta {
                len: got.len,
                src: got.src,
                dst_ip: got.dst_ip.unwrap_or(self.local.ip()),
            }));
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{MAX_TRUNCATED_PER_RECV} datagrams in a row were longer than the {}-byte buffer",
                buf.len()
            ),
        ))
    }

    /// Unconnected sendto. Ok(false) on WouldBlock (caller keeps the datagram and retries when
    /// writable).
    ///
    /// Other errors are returned as they are, among them `EMSGSIZE` when the datagram exceeds
    /// the path MTU (DF is set, so the kernel does not fragment).
    pub fn send_to(&self, datagram: &[u8], dst: SocketAddr) -> io::Result<bool> {
        match self.sock.send_to(datagram, &SockAddr::from(dst)) {
            Ok(n) if n == datagram.len() => Ok(true),
            Ok(n) => Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("UDP sendto wrote {n} of {} bytes", datagram.len()),
            )),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Datagrams [`recv`](Self::recv) discarded because they did not fit its buffer.
    pub fn truncated_drops(&self) -> u64 {
        self.truncated.load(Ordering::Relaxed)
    }
}

impl Source for UdpTransport {
    fn register(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> io::Result<()> {
        SourceFd(&self.sock.as_raw_fd()).register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &Registry,
        token: Token,
        interests: Interest,
    ) -> io::Result<()> {
        SourceFd(&self.sock.as_raw_fd()).reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        SourceFd(&self.sock.as_raw_fd()).deregister(registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::{Duration, Instant};

    use mio::{Events, Poll};

    const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

    /// Receives one datagram, waiting up to a second for it to arrive.
    fn recv_within(t: &UdpTransport, buf: &mut [u8]) -> RecvMeta {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            if let Some(meta) = t.recv(buf).unwrap() {
                return meta;
            }
            assert!(Instant::now() < deadline, "no datagram within 1 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn ping_pong(ip: IpAddr) {
        let a = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
        let b = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
        assert_eq!(a.local_addr().ip(), ip);
        assert_ne!(a.local_addr().port(), 0);
        let mut buf = [0u8; 2048];

        // Empty queue: Ok(None), not an error.
        assert_eq!(a.recv(&mut buf).unwrap(), None);

        assert!(a.send_to(b"ping", b.local_addr()).unwrap());
        let meta = recv_within(&b, &mut buf);
        assert_eq!(&buf[..meta.len], b"ping");
        assert_eq!(meta.src, a.local_addr());
        assert_eq!(meta.dst_ip, ip);

        let big = vec![0xa5u8; 1500];
        assert!(b.send_to(&big, a.local_addr()).unwrap());
        let meta = recv_within(&a, &mut buf);
        assert_eq!(&buf[..meta.len], &big[..]);
        assert_eq!(meta.src, b.local_addr());
        assert_eq!(meta.dst_ip, ip);

        assert_eq!(a.recv(&mut buf).unwrap(), None);
        assert_eq!(b.recv(&mut buf).unwrap(), None);
    }

    #[test]
    fn ipv4_loopback_both_ways() {
        ping_pong(V4);
    }

    #[test]
    fn ipv6_loopback_both_ways() {
        match UdpTransport::bind(SocketAddr::new(V6, 0)) {
            Ok(_) => ping_pong(V6),
            Err(e) => println!("skipped: cannot bind [::1]:0 ({e}); no IPv6 loopback"),
        }
    }

    #[test]
    fn refuses_wildcard_addresses() {
        for ip in [
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        ] {
            let err = UdpTransport::bind(SocketAddr::new(ip, 4791)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{ip}");
        }
    }

    #[test]
    fn socket_options_are_set() {
        let t = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
        assert_eq!(
            sockopt::pmtudisc(&t.sock, false).unwrap(),
            libc::IP_PMTUDISC_DO
        );
        assert!(t.sock.nonblocking().unwrap());
        // close-on-exec shows up in the octal `flags:` line of /proc/self/fdinfo.
        let fdinfo =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", t.sock.as_raw_fd())).unwrap();
        let flags = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|f| i64::from_str_radix(f.trim(), 8).unwrap())
            .unwrap();
        assert_ne!(flags & i64::from(libc::O_CLOEXEC), 0, "{fdinfo}");
        assert!(t.sock.recv_buffer_size().unwrap() > 0);
    }

    #[test]
    fn oversized_datagram_is_dropped_not_truncated() {
        let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
        let b = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
        assert!(a.send_to(&[7u8; 100], b.local_addr()).unwrap());
        assert!(a.send_to(&[8u8; 10], b.local_addr()).unwrap());
        let mut small = [0u8; 16];
        let meta = recv_within(&b, &mut small);
        assert_eq!(&small[..meta.len], &[8u8; 10]);
        assert_eq!(b.truncated_drops(), 1);
    }

    #[test]
    fn send_errors_surface_unchanged() {
        // One byte over the largest IPv4 UDP payload (65507). Loopback's MTU is 65536, so DF
        // itself cannot be exercised here; the netns test checks DF on the wire.
        let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
        let err = a
            .send_to(&vec![0u8; 65_508], SocketAddr::new(V4, 9))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EMSGSIZE), "{err}");
    }

    #[test]
    fn readable_through_mio() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let mut rx = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
        let tx = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
        poll.registry()
            .register(&mut rx, Token(7), Interest::READABLE)
            .unwrap();
        assert!(tx.send_to(b"wake", rx.local_addr()).unwrap());
        poll.poll(&mut events, Some(Duration::from_secs(2)))
            .unwrap();
        assert!(events
            .iter()
            .any(|e| e.token() == Token(7) && e.is_readable()));
        let mut buf = [0u8; 64];
        let meta = rx.recv(&mut buf).unwrap().expect("readable, so a datagram");
        assert_eq!(&buf[..meta.len], b"wake");
        poll.registry().deregister(&mut rx).unwrap();
    }
}
