//! OS glue: OS calls no safe crate exposes. With `hw`, the only module allowed `unsafe`.
//!
//! Everything here is a thin, documented wrapper around one system call. Every `unsafe` block
//! carries a `// SAFETY:` comment; the rest of the crate stays `unsafe`-free (the crate denies
//! `unsafe_code`; this module and `hw` opt back in).
//!
//! - [`sockopt`]: socket options socket2 does not expose (DF / path-MTU discovery, packet info,
//!   zero-checksum IPv6 UDP receive, forced buffer sizes).
//! - [`udp`]: `recvmsg` / `recvmmsg` with the packet-info control message decoded, so a
//!   receiver learns the destination address the datagram was sent to; `sendmmsg` to many
//!   destinations in one call.
//! - [`reuseport`]: the classic BPF program that steers the datagrams of a `SO_REUSEPORT`
//!   group of UDP sockets by the RoCEv2 destination QP, and attaching it.
//! - [`peercred`]: `SO_PEERCRED` of a Unix socket peer, and the process's effective uid.
//! - [`tun`]: the TUN device and the interface ioctls that configure it.
//! - [`ifaddr`]: which interface carries an address; a link's index, MTU and state.
//! - [`ifreq`]: the `struct ifreq` ioctls' plumbing that [`tun`] and [`ifaddr`] share.
//! - [`netlink`]: a route netlink socket that wakes the event loop when links or addresses
//!   change.
//! - [`notify`]: the systemd notification protocol (`$NOTIFY_SOCKET`, `$WATCHDOG_USEC`).
//! - [`caps`]: whether the process holds `CAP_NET_ADMIN`.
//! - [`thread`]: the calling thread's CPU time.
//! - [`rlimit`]: the open-file limit (`RLIMIT_NOFILE`), and raising it to the hard limit.
//! - [`umad`]: a Subnet Administration agent on `/dev/infiniband/umadN` and the port's sysfs
//!   attributes.
#![allow(unsafe_code)]

pub(crate) mod caps;
pub(crate) mod ifaddr;
pub(crate) mod ifreq;
pub(crate) mod netlink;
pub(crate) mod notify;
pub(crate) mod peercred;
pub(crate) mod reuseport;
pub(crate) mod rlimit;
pub(crate) mod sockopt;
pub(crate) mod thread;
pub(crate) mod tun;
pub(crate) mod udp;
pub(crate) mod umad;
