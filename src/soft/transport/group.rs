//! IP multicast on the underlay: the options of the unicast socket that sends to groups, and
//! one receive socket per joined group.
//!
//! A socket bound to an exact unicast address does not receive multicast (Linux delivers a
//! group's datagrams only to sockets bound to the group or to the wildcard), and a wildcard
//! bind on the RoCEv2 port would collide with the unicast socket, so each group has its own
//! socket bound to the group address itself (`SO_REUSEADDR`, so that several daemons of one
//! host can join it) that joins it on the bind interface. Closing that socket leaves the group.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::UdpTransport;
use crate::sys::sockopt;

/// Receive buffer requested for a group socket: multicast carries neighbour discovery, not
/// data.
const GROUP_BUFFER_BYTES: usize = 1 << 20;

impl UdpTransport {
    /// Lets this (unicast) socket send to IP multicast groups: out of interface `ifindex`
    /// (the bind address's), with TTL / hop limit `ttl`, and without a copy looped back to
    /// this host's own sockets.
    ///
    /// # Errors
    /// The socket options' errors.
    pub fn enable_multicast_send(&self, ifindex: u32, ttl: u8) -> io::Result<()> {
        match self.local.ip() {
            IpAddr::V4(local) => {
                self.sock.set_multicast_if_v4(&local)?;
                self.sock.set_multicast_ttl_v4(u32::from(ttl))?;
                self.sock.set_multicast_loop_v4(false)
            }
            IpAddr::V6(_) => {
                self.sock.set_multicast_if_v6(ifindex)?;
                self.sock.set_multicast_hops_v6(u32::from(ttl))?;
                self.sock.set_multicast_loop_v6(false)
            }
        }
    }

    /// A non-blocking receive socket for the IP multicast group `group` on `port`, bound to
    /// the group address and joined on interface `ifindex`, which has the address `local`
    /// (IPv4 joins name the interface by an address of it). Packet info is on, so receives
    /// report the group as the destination; IPv6 accepts zero UDP checksums.
    ///
    /// # Errors
    /// `InvalidInput` when `group` is not multicast or not of `local`'s family; else the
    /// socket's.
    pub fn bind_group(group: IpAddr, port: u16, ifindex: u32, local: IpAddr) -> io::Result<Self> {
        if !group.is_multicast() || group.is_ipv4() != local.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{group} is not an IP multicast group of {local}'s family"),
            ));
        }
        let addr = match group {
            IpAddr::V4(_) => SocketAddr::new(group, port),
            // Link- and interface-local groups (ff12:...) need the interface as scope.
            IpAddr::V6(g) => SocketAddr::V6(SocketAddrV6::new(g, port, 0, ifindex)),
        };
        let sock = Socket::new(
            Domain::for_address(addr),
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?;
        sock.set_reuse_address(true)?;
        if group.is_ipv6() {
            sock.set_only_v6(true)?;
            sockopt::set_udp_no_check6_rx(&sock)?;
        }
        sockopt::set_pktinfo(&sock, group.is_ipv6())?;
        // Best effort: the kernel clamps it without CAP_NET_ADMIN.
        let _ = sockopt::set_buffer_force(&sock, GROUP_BUFFER_BYTES, GROUP_BUFFER_BYTES);
        sock.bind(&SockAddr::from(addr))?;
        match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => sock.join_multicast_v4(&g, &l)?,
            (IpAddr::V6(g), IpAddr::V6(_)) => sock.join_multicast_v6(&g, ifindex)?,
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
        Ok(Self {
            sock,
            local: addr,
            truncated: std::sync::atomic::AtomicU64::new(0),
        })
    }
}
