//! The TUN device: created with `tun-tap` (no packet information header, so reads and writes
//! are bare IPv4/IPv6 packets), made non-blocking, and configured with the classic interface
//! ioctls (`SIOCSIFMTU`, `SIOCSIFADDR`/`SIOCSIFNETMASK`, the `in6_ifreq` form of `SIOCSIFADDR`
//! for IPv6, `SIOCSIFFLAGS`), so no shell command and no netlink library is needed.
//!
//! TUN devices are `IFF_NOARP`, so the kernel skips duplicate address detection and IPv6
//! addresses are usable at once. The interface disappears when the [`Tun`] is dropped.
//!
//! With several workers the interface has several queues ([`Tun::create_queues`]):
//! `/dev/net/tun` opened once per queue with `TUNSETIFF` and
//! `IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE` under one name, one [`Tun`] per queue. The kernel
//! hands each packet the interface sends to one queue, by flow (a flow table of the queue that
//! last wrote a packet of that flow, else its hash); a packet written on any queue enters the
//! stack. The interface disappears when the last queue is dropped.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use mio::event::Source;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::ifreq::{ctl_socket, ifreq, ioctl};

/// An open TUN interface, or one queue of a multi-queue one ([`Tun::create_queues`]).
///
/// Reads, writes and readiness ([`recv`](Self::recv), [`send`](Self::send), the mio
/// [`Source`]) are the queue's. The configuration ([`set_mtu`](Self::set_mtu),
/// [`add_ipv4`](Self::add_ipv4), [`add_ipv6`](Self::add_ipv6), [`set_up`](Self::set_up),
/// [`keep_addresses_on_down`](Self::keep_addresses_on_down)) is the interface's, named by
/// [`name`](Self::name): whichever queue it is called on, it acts on the one interface that
/// all of them share, so an interface with several queues is configured once, on queue 0.
pub struct Tun {
    queue: Queue,
}

/// How a [`Tun`] holds its descriptor.
enum Queue {
    /// The only queue of a single-queue interface, opened by `tun-tap`.
    Single(tun_tap::Iface),
    /// Queue `index` of a multi-queue interface.
    Multi {
        file: File,
        name: String,
        index: usize,
    },
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun")
            .field("name", &self.name())
            .field("queue", &self.queue_index())
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
    /// The most queues one interface may have (the kernel's `MAX_TAP_QUEUES`).
    pub const MAX_QUEUES: usize = 256;

    /// Creates a TUN interface named `name` (a pattern such as `ib%d` lets the kernel pick),
    /// non-blocking. Needs `CAP_NET_ADMIN`.
    ///
    /// # Errors
    /// The open or ioctl error, with the interface name.
    pub fn create(name: &str) -> io::Result<Self> {
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tun)
            .map_err(|e| io::Error::new(e.kind(), format!("creating TUN interface {name}: {e}")))?;
        iface.set_non_blocking()?;
        Ok(Self {
            queue: Queue::Single(iface),
        })
    }

    /// Creates a TUN interface named `name` (a pattern such as `ib%d` lets the kernel pick)
    /// with `queues` queues (`IFF_MULTI_QUEUE`), each non-blocking and close-on-exec; returns
    /// them in order, queue 0 first. Configure the interface once, on queue 0 (see [`Tun`]).
    /// Needs `CAP_NET_ADMIN`.
    ///
    /// An exact `name` that an interface has already is refused rather than joined: the
    /// kernel would attach the new queues to another process's multi-queue interface of that
    /// name. (The check and the creation are two steps: a process creating the same name in
    /// between is not caught.)
    ///
    /// # Errors
    /// `InvalidInput` for 0 or more than [`Tun::MAX_QUEUES`] queues or an invalid name,
    /// `AlreadyExists` for an exact name in use, else the open or ioctl error, with the
    /// interface name. Queues opened before an error are closed again (the interface goes
    /// with the last).
    pub fn create_queues(name: &str, queues: usize) -> io::Result<Vec<Self>> {
        if !(1..=Self::MAX_QUEUES).contains(&queues) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{queues} TUN queues: 1 to {}", Self::MAX_QUEUES),
            ));
        }
        // Validates the name before anything is opened.
        ifreq(name)?;
        if !name.contains('%') && interface_exists(name)? {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("creating TUN interface {name}: an interface of that name exists"),
            ));
        }
        let mut out: Vec<Self> = Vec::with_capacity(queues);
        for index in 0..queues {
            // Queue 0 may carry a pattern; the others attach to the name the kernel gave it.
            let want = out.first().map_or(name, Self::name);
            let (file, given) = open_queue(want).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("creating queue {index} of TUN interface {want}: {e}"),
                )
            })?;
            out.push(Self {
                queue: Queue::Multi {
                    file,
                    name: given,
                    index,
                },
            });
        }
        Ok(out)
    }

    /// The interface name the kernel gave.
    pub fn name(&self) -> &str {
        match &self.queue {
            Queue::Single(iface) => iface.name(),
            Queue::Multi { name, .. } => name,
        }
    }

    /// Which queue of the interface this is: 0 for a single-queue interface.
    pub fn queue_index(&self) -> usize {
        match &self.queue {
            Queue::Single(_) => 0,
            Queue::Multi { index, .. } => *index,
        }
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
        let got = match &self.queue {
            Queue::Single(iface) => iface.recv(buf),
            Queue::Multi { file, .. } => (&*file).read(buf),
        };
        match got {
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
        let sent = match &self.queue {
            Queue::Single(iface) => iface.send(packet),
            Queue::Multi { file, .. } => (&*file).write(packet),
        };
        match sent {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match &self.queue {
            Queue::Single(iface) => iface.as_raw_fd(),
            Queue::Multi { file, .. } => file.as_raw_fd(),
        }
    }
}

impl Source for Tun {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        SourceFd(&self.as_raw_fd()).register(r, t, i)
    }
    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        SourceFd(&self.as_raw_fd()).reregister(r, t, i)
    }
    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        SourceFd(&self.as_raw_fd()).deregister(r)
    }
}

/// Whether an interface called `name` exists in this thread's network namespace.
fn interface_exists(name: &str) -> io::Result<bool> {
    let sock = ctl_socket(libc::AF_INET)?;
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFINDEX fills ifru_ifindex of the struct ifreq it is given; `req` is one
    // and outlives the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX, &mut req) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENODEV) {
        Ok(false)
    } else {
        Err(io::Error::new(
            e.kind(),
            format!("SIOCGIFINDEX {name}: {e}"),
        ))
    }
}

/// Opens `/dev/net/tun` (non-blocking, close-on-exec) as one queue of the multi-queue TUN
/// interface `name`, creating the interface if it does not exist; returns the queue and the
/// interface's name as the kernel gave it.
fn open_queue(name: &str) -> io::Result<(File, String)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        // std adds O_CLOEXEC itself; naming it keeps the intent visible.
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_flags =
        (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_MULTI_QUEUE) as libc::c_short;
    // SAFETY: TUNSETIFF takes a struct ifreq naming the interface, with ifru_flags set; `req`
    // is one, and the kernel writes the name it gave back into ifr_name.
    unsafe { ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req, "TUNSETIFF")? };
    let given: Vec<u8> = req
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let given = String::from_utf8(given).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "TUNSETIFF returned a name that is not UTF-8",
        )
    })?;
    Ok((file, given))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue count out of range is refused before anything is opened (no privilege needed).
    #[test]
    fn queue_counts_out_of_range_are_refused() {
        for n in [0, Tun::MAX_QUEUES + 1] {
            let e = Tun::create_queues("ibq%d", n).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{n}: {e}");
        }
        let e = Tun::create_queues("a-name-that-is-far-too-long", 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}
