//! The TUN device: created with `tun-tap` (no packet information header, so reads and writes
//! are bare IPv4/IPv6 packets), made non-blocking, and configured with the classic interface
//! ioctls (`SIOCSIFMTU`, `SIOCSIFADDR`/`SIOCSIFNETMASK`, the `in6_ifreq` form of `SIOCSIFADDR`
//! for IPv6, `SIOCSIFFLAGS`), so no shell command and no netlink library is needed.
//!
//! TUN devices are `IFF_NOARP`, so the kernel skips duplicate address detection and IPv6
//! addresses are usable at once. The interface disappears when the [`Tun`] is dropped.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use mio::event::Source;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::ifreq::{ctl_socket, ifreq, ioctl};

/// An open TUN interface.
pub struct Tun {
    iface: tun_tap::Iface,
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun")
            .field("name", &self.iface.name())
            .finish()
    }
}

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux (16 bytes) and both are
    // plain old data; the kernel reads the family field to interpret the rest.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

impl Tun {
    /// Creates a TUN interface named `name` (a pattern such as `ib%d` lets the kernel pick),
    /// non-blocking. Needs `CAP_NET_ADMIN`.
    ///
    /// # Errors
    /// The open or ioctl error, with the interface name.
    pub fn create(name: &str) -> io::Result<Self> {
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tun)
            .map_err(|e| io::Error::new(e.kind(), format!("creating TUN interface {name}: {e}")))?;
        iface.set_non_blocking()?;
        Ok(Self { iface })
    }

    /// The interface name the kernel gave.
    pub fn name(&self) -> &str {
        self.iface.name()
    }

    /// Sets the interface MTU.
    ///
    /// # Errors
    /// The ioctl error (for example an MTU above the TUN maximum of 65535).
    pub fn set_mtu(&self, mtu: u32) -> io::Result<()> {
        let sock = ctl_socket(libc::AF_INET)?;
        let mut req = ifreq(self.name())?;
        req.ifr_ifru.ifru_mtu = libc::c_int::try_from(mtu)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "MTU out of range"))?;
        // SAFETY: SIOCSIFMTU takes a struct ifreq with ifru_mtu set; `req` is one.
        unsafe { ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU, &mut req, "SIOCSIFMTU") }
    }

    /// Adds an IPv4 address with a prefix length (the kernel adds the prefix route when the
    /// interface is up).
    ///
    /// # Errors
    /// The ioctl error, or `InvalidInput` for a prefix above 32.
    pub fn add_ipv4(&self, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        if prefix > 32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "IPv4 prefix > 32",
            ));
        }
        let sock = ctl_socket(libc::AF_INET)?;
        let mut req = ifreq(self.name())?;
        req.ifr_ifru.ifru_addr = sockaddr_in(addr);
        // SAFETY: SIOCSIFADDR takes a struct ifreq whose ifru_addr is a sockaddr_in.
        unsafe { ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR, &mut req, "SIOCSIFADDR")? };
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        let mut req = ifreq(self.name())?;
        req.ifr_ifru.ifru_netmask = sockaddr_in(Ipv4Addr::from(mask));
        // SAFETY: SIOCSIFNETMASK takes a struct ifreq whose ifru_netmask is a sockaddr_in.
        unsafe {
            ioctl(
                sock.as_raw_fd(),
                libc::SIOCSIFNETMASK,
                &mut req,
                "SIOCSIFNETMASK",
            )
        }
    }

    /// Adds an IPv6 address with a prefix length.
    ///
    /// # Errors
    /// The ioctl error, or `InvalidInput` for a prefix above 128.
    pub fn add_ipv6(&self, addr: Ipv6Addr, prefix: u8) -> io::Result<()> {
        if prefix > 128 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "IPv6 prefix > 128",
            ));
        }
        let sock = ctl_socket(libc::AF_INET6)?;
        let mut req = ifreq(self.name())?;
        // SAFETY: SIOCGIFINDEX fills ifru_ifindex of the struct ifreq it is given.
        unsafe {
            ioctl(
                sock.as_raw_fd(),
                libc::SIOCGIFINDEX,
                &mut req,
                "SIOCGIFINDEX",
            )?
        };
        // SAFETY: the ioctl above wrote ifru_ifindex, so reading that union field is valid.
        let ifindex = unsafe { req.ifr_ifru.ifru_ifindex };
        let mut req6 = libc::in6_ifreq {
            ifr6_addr: libc::in6_addr {
                s6_addr: addr.octets(),
            },
            ifr6_prefixlen: u32::from(prefix),
            ifr6_ifindex: ifindex,
        };
        // SAFETY: on an AF_INET6 socket SIOCSIFADDR takes a struct in6_ifreq; `req6` is one.
        unsafe {
            ioctl(
                sock.as_raw_fd(),
                libc::SIOCSIFADDR,
                &mut req6,
                "SIOCSIFADDR (IPv6)",
            )
        }
    }

    /// Brings the interface up.
    ///
    /// # Errors
    /// The ioctl error.
    pub fn set_up(&self) -> io::Result<()> {
        let sock = ctl_socket(libc::AF_INET)?;
        let mut req = ifreq(self.name())?;
        // SAFETY: SIOCGIFFLAGS fills ifru_flags of the struct ifreq it is given.
        unsafe {
            ioctl(
                sock.as_raw_fd(),
                libc::SIOCGIFFLAGS,
                &mut req,
                "SIOCGIFFLAGS",
            )?
        };
        // SAFETY: the ioctl above wrote ifru_flags, so the union field is initialised.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        // SAFETY: SIOCSIFFLAGS takes a struct ifreq with ifru_flags set; `req` is one.
        unsafe {
            ioctl(
                sock.as_raw_fd(),
                libc::SIOCSIFFLAGS,
                &mut req,
                "SIOCSIFFLAGS",
            )
        }
    }

    /// Keeps the interface's IPv6 addresses while it is down (the `keep_addr_on_down` sysctl
    /// of this interface, in this thread's network namespace): without it the kernel deletes
    /// them at `ip link set down`, IPv4 ones staying. `Ok(false)` where the kernel has no
    /// IPv6 for the interface (nothing to keep).
    ///
    /// # Errors
    /// The sysctl could not be written.
    pub fn keep_addresses_on_down(&self) -> io::Result<bool> {
        let path = format!("/proc/sys/net/ipv6/conf/{}/keep_addr_on_down", self.name());
        match std::fs::write(path, b"1") {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads one packet; `Ok(None)` when none is waiting.
    ///
    /// # Errors
    /// The read error.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.iface.recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes one packet; `Ok(false)` when the device queue is full.
    ///
    /// # Errors
    /// The write error (for example `EINVAL` for a malformed packet).
    pub fn send(&self, packet: &[u8]) -> io::Result<bool> {
        match self.iface.send(packet) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Source for Tun {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        SourceFd(&self.iface.as_raw_fd()).register(r, t, i)
    }
    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        SourceFd(&self.iface.as_raw_fd()).reregister(r, t, i)
    }
    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        SourceFd(&self.iface.as_raw_fd()).deregister(r)
    }
}
