//! CM MADs over a UDP side channel, for providers where the kernel owns QP1.
//!
//! With kernel verbs (rdma-core on rxe or a real RoCE NIC) QP1 belongs to the kernel's CM, so
//! userspace cannot send or receive CM MADs on it. The daemon then carries each CM MAD as one
//! plain UDP datagram holding the same 256 bytes, sent from the underlay address to the
//! peer's GID taken as an IP address (IPv4-mapped GIDs become IPv4), at port
//! [`DEFAULT_MAD_PORT`] (configurable). The sender is identified by the datagram's source
//! address, the way [`super::Gsi`] identifies it by the GRH's source GID. Datagrams that
//! are not exactly one MAD are counted and dropped.
//!
//! Both ends must use the same transport: a software-provider daemon talking to a
//! kernel-verbs daemon runs with `--cm-transport udp`.
//!
//! The socket is non-blocking; the driver registers it with mio ([`MadUdp::readiness_fd`]) and
//! [`MadUdp::poll`] reads until it would block.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

use super::{count_send, MadStats, MAD_LEN};
use crate::verbs::Gid;

/// Default UDP port of the MAD side channel (the RoCEv2 port plus one).
pub const DEFAULT_MAD_PORT: u16 = 4792;

/// The UDP MAD channel: one non-blocking socket on the underlay address.
#[derive(Debug)]
pub struct MadUdp {
    sock: mio::net::UdpSocket,
    port: u16,
    stats: MadStats,
}

impl MadUdp {
    /// Binds `local:port`.
    ///
    /// # Errors
    /// The bind's I/O error.
    pub fn bind(local: IpAddr, port: u16) -> io::Result<Self> {
        let sock = mio::net::UdpSocket::bind(SocketAddr::new(local, port))?;
        Ok(Self {
            sock,
            port,
            stats: MadStats::default(),
        })
    }

    /// The socket, to register with mio.
    pub fn socket_mut(&mut self) -> &mut mio::net::UdpSocket {
        &mut self.sock
    }

    /// Counters (same meaning as the QP1 transport's).
    pub fn stats(&self) -> MadStats {
        self.stats
    }

    /// Sends one MAD to `to`'s IP at the channel port; a send that would block is dropped
    /// and counted (the CM retransmits).
    pub fn send(&mut self, to: Gid, mad: &[u8; MAD_LEN]) -> io::Result<()> {
        let r = self
            .sock
            .send_to(mad, SocketAddr::new(to.to_ip(), self.port))
            .map(drop);
        count_send(&mut self.stats, r, |e| {
            e.kind() == io::ErrorKind::WouldBlock
        })
    }

    /// The socket's descriptor, for the event loop.
    pub fn readiness_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Never true: [`MadUdp::poll`] reads until the socket would block.
    pub fn has_more(&self) -> bool {
        false
    }

    /// Reads every pending datagram; whole MADs are appended to `out` with the sender's GID.
    pub fn poll(&mut self, out: &mut Vec<(Gid, [u8; MAD_LEN])>) {
        let mut buf = [0u8; MAD_LEN + 1];
        for _ in 0..1024 {
            match self.sock.recv_from(&mut buf) {
                Ok((n, from)) => match buf.get(..n).and_then(|b| <[u8; MAD_LEN]>::try_from(b).ok())
                {
                    Some(mad) => {
                        self.stats.received += 1;
                        out.push((Gid::from_ip(from.ip()), mad));
                    }
                    None => self.stats.recv_malformed += 1,
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    // ICMP errors of earlier sends (port unreachable) surface here.
                    self.stats.errors += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn mads_cross_over_udp() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        // Port 0 is not usable for a fixed peer port; pick a free one by binding first.
        let probe = std::net::UdpSocket::bind((lo, 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let mut a = MadUdp::bind(lo, port).unwrap();
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1;
        mad[255] = 0xAB;
        a.send(Gid::from_ip(lo), &mad).unwrap();
        let mut got = Vec::new();
        for _ in 0..100 {
            a.poll(&mut got);
            if !got.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(got, vec![(Gid::from_ip(lo), mad)]);
        // A short datagram is dropped and counted.
        std::net::UdpSocket::bind((lo, 0))
            .unwrap()
            .send_to(&[1, 2, 3], (lo, port))
            .unwrap();
        let mut none = Vec::new();
        for _ in 0..100 {
            a.poll(&mut none);
            if a.stats().recv_malformed == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(none.is_empty());
        assert_eq!(a.stats().recv_malformed, 1);
        assert_eq!(a.stats().sent, 1);
    }
}
