//! Socket options that socket2 does not expose, set through `setsockopt(2)`.
//!
//! All helpers take anything that lends a file descriptor ([`AsFd`]): a `socket2::Socket`, a
//! `std::net::UdpSocket` or a `mio::net::UdpSocket`.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use libc::{c_int, socklen_t};

/// Sets an `int`-valued socket option.
fn setsockopt_int(sock: &impl AsFd, level: c_int, name: c_int, value: c_int) -> io::Result<()> {
    let fd = sock.as_fd().as_raw_fd();
    // SAFETY: `fd` is borrowed from a live `AsFd` for the duration of the call; `optval` points
    // to a `c_int` on this stack frame that outlives the call, and `optlen` is its exact size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const c_int).cast(),
            size_of::<c_int>() as socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads an `int`-valued socket option (the tests read back what the setters wrote).
#[cfg(test)]
fn getsockopt_int(sock: &impl AsFd, level: c_int, name: c_int) -> io::Result<c_int> {
    let fd = sock.as_fd().as_raw_fd();
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `fd` is borrowed from a live `AsFd`; `optval` and `optlen` point to locals of the
    // sizes the kernel is told about, and both outlive the call.
    let rc =
        unsafe { libc::getsockopt(fd, level, name, (&mut value as *mut c_int).cast(), &mut len) };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Turns path-MTU discovery to "do": `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) or
/// `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO` (IPv6).
///
/// On IPv4 every datagram then carries DF, and the kernel never fragments locally: a datagram
/// larger than the path MTU fails with `EMSGSIZE`. With DF set, an *unconnected* socket sends
/// IPv4 ID 0, which makes the RoCEv2 ICRC predictable (see `shared/reference/rocev2.md` §6.2).
pub(crate) fn set_pmtudisc_do(sock: &impl AsFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt_int(
            sock,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        setsockopt_int(
            sock,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Reads back the path-MTU discovery mode (`IP_MTU_DISCOVER` / `IPV6_MTU_DISCOVER`); `2`
/// (`*_PMTUDISC_DO`) after [`set_pmtudisc_do`].
#[cfg(test)]
pub(crate) fn pmtudisc(sock: &impl AsFd, ipv6: bool) -> io::Result<c_int> {
    if ipv6 {
        getsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER)
    } else {
        getsockopt_int(sock, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER)
    }
}

/// Asks for a packet-info control message on every received datagram: `IP_PKTINFO` (IPv4) or
/// `IPV6_RECVPKTINFO` (IPv6). [`super::udp::recv_pktinfo`] decodes it.
pub(crate) fn set_pktinfo(sock: &impl AsFd, ipv6: bool) -> io::Result<()> {
    if ipv6 {
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)
    } else {
        setsockopt_int(sock, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)
    }
}

/// Turns UDP GRO on (`UDP_GRO`): the kernel may then deliver several datagrams of one flow,
/// all of one length but the last, as one, with their length in a `UDP_GRO` control message
/// (see [`super::udp::Received::segment_len`]). Without it, a GSO train that reaches the socket
/// unsegmented (over veth, say) is cut apart before queueing. `ENOPROTOOPT` on kernels before
/// 5.0.
pub(crate) fn set_udp_gro(sock: &impl AsFd, on: bool) -> io::Result<()> {
    setsockopt_int(sock, libc::SOL_UDP, libc::UDP_GRO, c_int::from(on))
}

/// Accepts IPv6 UDP datagrams whose checksum field is zero (`UDP_NO_CHECK6_RX`).
///
/// Linux drops such datagrams by default (RFC 8200 forbids them outside tunnels), but rdma_rxe
/// may send RoCEv2 over IPv6 with a zero UDP checksum.
pub(crate) fn set_udp_no_check6_rx(sock: &impl AsFd) -> io::Result<()> {
    setsockopt_int(sock, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)
}

/// Sets the receive and send buffer sizes with `SO_RCVBUFFORCE` / `SO_SNDBUFFORCE`, which
/// ignore `net.core.rmem_max` / `wmem_max` but need `CAP_NET_ADMIN`. Without it (`EPERM`) it
/// falls back to `SO_RCVBUF` / `SO_SNDBUF`, which the kernel silently clamps to the sysctl
/// limits.
///
/// As with the plain options, the kernel doubles the value for bookkeeping overhead, so
/// `SO_RCVBUF` reads back as twice the request. Sizes above `i32::MAX` are `InvalidInput`.
pub(crate) fn set_buffer_force(
    sock: &impl AsFd,
    rcv_bytes: usize,
    snd_bytes: usize,
) -> io::Result<()> {
    for (bytes, force, plain) in [
        (rcv_bytes, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (snd_bytes, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let value = c_int::try_from(bytes).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("socket buffer size {bytes} does not fit a C int"),
            )
        })?;
        match setsockopt_int(sock, libc::SOL_SOCKET, force, value) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                setsockopt_int(sock, libc::SOL_SOCKET, plain, value)?;
            }
            other => other?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Protocol, Socket, Type};

    fn udp(domain: Domain) -> Option<Socket> {
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).ok()
    }

    #[test]
    fn pmtudisc_do_reads_back() {
        let s = udp(Domain::IPV4).expect("IPv4 UDP socket");
        assert_ne!(pmtudisc(&s, false).unwrap(), libc::IP_PMTUDISC_DO);
        set_pmtudisc_do(&s, false).unwrap();
        assert_eq!(pmtudisc(&s, false).unwrap(), libc::IP_PMTUDISC_DO);

        let Some(s6) = udp(Domain::IPV6) else {
            println!("skipped: no IPv6 sockets on this machine");
            return;
        };
        set_pmtudisc_do(&s6, true).unwrap();
        assert_eq!(pmtudisc(&s6, true).unwrap(), libc::IPV6_PMTUDISC_DO);
    }

    #[test]
    fn pktinfo_and_no_check6_are_accepted() {
        let s = udp(Domain::IPV4).expect("IPv4 UDP socket");
        set_pktinfo(&s, false).unwrap();
        assert_eq!(
            getsockopt_int(&s, libc::IPPROTO_IP, libc::IP_PKTINFO).unwrap(),
            1
        );
        let Some(s6) = udp(Domain::IPV6) else {
            println!("skipped: no IPv6 sockets on this machine");
            return;
        };
        set_pktinfo(&s6, true).unwrap();
        assert_eq!(
            getsockopt_int(&s6, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO).unwrap(),
            1
        );
        set_udp_no_check6_rx(&s6).unwrap();
        assert_eq!(
            getsockopt_int(&s6, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX).unwrap(),
            1
        );
    }

    #[test]
    fn buffer_force_sets_the_size_or_falls_back() {
        fn sysctl(name: &str) -> usize {
            std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        }
        const REQ: usize = 24 << 20; // above any sensible rmem_max, so the two paths differ
        let s = udp(Domain::IPV4).expect("IPv4 UDP socket");
        set_buffer_force(&s, REQ, REQ).unwrap();
        let (rcv, snd) = (s.recv_buffer_size().unwrap(), s.send_buffer_size().unwrap());
        // The kernel stores twice the value: the request with CAP_NET_ADMIN (FORCE), the
        // request clamped to rmem_max / wmem_max without it (plain fallback).
        assert!(rcv == 2 * REQ || rcv == 2 * sysctl("rmem_max"), "rcv {rcv}");
        assert!(snd == 2 * REQ || snd == 2 * sysctl("wmem_max"), "snd {snd}");
        assert!(set_buffer_force(&s, usize::MAX, 1).is_err());
    }
}
