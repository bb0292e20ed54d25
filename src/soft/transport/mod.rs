//! The soft provider's UDP edge: one non-blocking UDP socket per local address, set up the way
//! RoCEv2 needs it (see `shared/reference/rocev2.md` §6.2).
//!
//! - Bound to the exact local IP, never a wildcard: the source address is part of the ICRC and
//!   of rxe's RC address check, so it must not depend on routing.
//! - Sends are unconnected (`sendto`, or `sendmmsg` for a [`TxBatch`]) with DF set
//!   (`IP_PMTUDISC_DO`): Linux then sends IPv4 ID 0, so the IPv4 header the ICRC covers is
//!   predictable. `sendmmsg` runs the same per-datagram `udp_sendmsg` as `sendto`, so the
//!   headers are identical (the netns capture test checks DF, ID 0 and every ICRC).
//! - Optionally ([`TxBatch::with_gso`]), consecutive datagrams to one address leave as one UDP
//!   GSO train. For IPv4 the kernel numbers the segments' IP IDs 0, 1, 2, ..., which the ICRC
//!   covers, so each ICRC is shifted to its segment's ID
//!   ([`Ipv4IdShift`](crate::wire::icrc::Ipv4IdShift)); receivers accept IDs 0..64
//!   ([`SoftVerbs::handle_datagram`](super::SoftVerbs::handle_datagram)).
//! - Optionally ([`UdpTransport::enable_gro`]), the kernel delivers a train (or datagrams it
//!   merged) as one buffer with its segment length ([`RecvMeta::segment_len`]).
//! - Receives come in batches through `recvmmsg` ([`UdpTransport::recv_batch`]) or one at a
//!   time ([`UdpTransport::recv`]).
//! - Receives report the destination IP from `IP_PKTINFO` / `IPV6_PKTINFO` (needed to verify the
//!   IPv6 ICRC), and IPv6 sockets accept zero UDP checksums (`UDP_NO_CHECK6_RX`), as rxe may
//!   send them.
//!
//! The transport never blocks and never retries: a full send buffer is `Ok(false)` and an empty
//! receive queue is `Ok(None)`; the caller waits for readiness on its descriptor ([`AsRawFd`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::sys::{reuseport, sockopt, udp};
use crate::wire::CONTROL_QPNS;
use crate::wire::{Framing, QpNum, WorkerCount};

#[cfg(doc)]
use crate::wire::WorkerId;

mod batch;
mod group;
mod program;

pub use crate::sys::udp::{Received, RecvBatch};
pub use batch::TxBatch;

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
    /// With GRO on: the buffer holds datagrams of this length back to back (the last one may
    /// be shorter). `None`: it is one datagram.
    pub segment_len: Option<u16>,
}

impl UdpTransport {
    /// Binds a non-blocking, close-on-exec UDP socket to the exact address (not a wildcard; reject
    /// unspecified IPs with InvalidInput), DF set, pktinfo on, large buffers.
    ///
    /// Port 0 picks a free port; [`local_addr`](Self::local_addr) reports it. IPv6 sockets are
    /// `IPV6_V6ONLY` and accept zero UDP checksums. Pass IPv4 addresses as
    /// [`SocketAddr::V4`], not as IPv4-mapped IPv6.
    pub fn bind(local: SocketAddr) -> io::Result<Self> {
        Self::open(local, false)
    }

    /// One socket per worker, bound as [`bind`](Self::bind) binds, all to `local` with
    /// `SO_REUSEPORT`, in worker order (socket `i` is worker `i`'s), and the kernel steering
    /// each datagram to the socket of the worker that owns its destination QP
    /// ([`Framing::owner`]: the BTH found where `framing` says): a classic BPF program
    /// (`SO_ATTACH_REUSEPORT_CBPF`, `program.rs`) sends QP1 (the CM's MADs), the multicast QPN
    /// (the UD QP's groups) and datagrams that name no QP to socket 0, the control side's, and
    /// every other datagram to socket `dest_qpn & (workers - 1)`, the worker in the QPN's low
    /// bits ([`WorkerId::tag`]). One worker: exactly
    /// [`bind`](Self::bind), no `SO_REUSEPORT`, no program.
    ///
    /// The address must be free: a plain socket is bound to it first and closed again (so
    /// another daemon's group on it is `AddrInUse`, as a second [`bind`](Self::bind) is, and
    /// port 0 is resolved to a free port the whole group then binds). A group bound in the
    /// moment between that probe and the first socket of this one is not caught; its
    /// sockets (same user) would join this group.
    ///
    /// Keep the sockets together: the kernel numbers them in bind order, and closing one
    /// moves the last into its slot, so they are dropped together, never one by one. The
    /// program runs once per buffer: GSO trains must hold one destination QP
    /// ([`TxBatch`]), and a buffer merged by GRO, steered by hash, may hold another
    /// worker's datagrams ([`SoftProvider`](crate::soft::provider::SoftProvider) hands them
    /// out).
    ///
    /// # Errors
    /// As [`bind`](Self::bind); `AddrInUse` when something is bound to `local` already.
    pub fn bind_steered(
        local: SocketAddr,
        workers: WorkerCount,
        framing: Framing,
    ) -> io::Result<Vec<Self>> {
        if workers == WorkerCount::ONE {
            return Ok(vec![Self::bind(local)?]);
        }
        let port = Self::open(local, false)?.local.port();
        let mut local = local;
        local.set_port(port);
        let program = program::qpn_steering(framing, workers.mask(), &CONTROL_QPNS.map(QpNum::get))
            .ok_or_else(|| io::Error::other("the steering program lists too many QPNs"))?;
        let mut group = Vec::with_capacity(usize::from(workers.get()));
        for index in 0..workers.get() {
            let sock = Self::open(local, true)
                .map_err(|e| io::Error::new(e.kind(), format!("worker {index}'s socket: {e}")))?;
            if index == 0 {
                reuseport::attach_reuseport_cbpf(&sock.sock, &program)?;
            }
            group.push(sock);
        }
        Ok(group)
    }

    /// [`bind`](Self::bind), with `SO_REUSEPORT` when `reuse_port`.
    fn open(local: SocketAddr, reuse_port: bool) -> io::Result<Self> {
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
        if reuse_port {
            sock.set_reuse_port(true)?;
        }
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

    /// Asks the kernel for UDP GRO (`UDP_GRO`): received buffers may then hold
    /// several datagrams ([`RecvMeta::segment_len`]); give them room for 65,535 bytes.
    ///
    /// # Errors
    /// The kernel's, e.g. `ENOPROTOOPT` where UDP GRO does not exist.
    pub fn enable_gro(&self) -> io::Result<()> {
        sockopt::set_udp_gro(&self.sock, true)
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
                segment_len: got.segment_len,
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

    /// Receives up to a batch of datagrams with one `recvmmsg`; returns how many arrived
    /// (0 on WouldBlock), truncated ones included: read them with
    /// [`datagram`](Self::datagram), which skips those (they are counted in
    /// [`truncated_drops`](Self::truncated_drops) here).
    ///
    /// Fewer than the batch's slot count means the socket's queue was empty when the kernel
    /// looked, so an edge-triggered caller need not call again before the next readiness event.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let n = match udp::recv_batch(&self.sock, batch) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) => return Err(e),
        };
        for i in 0..n {
            if let Some((got, _)) = batch.get(i) {
                if got.truncated {
                    self.truncated.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        src = %got.src,
                        "dropped a UDP datagram longer than the receive buffer"
                    );
                }
            }
        }
        Ok(n)
    }

    /// The `i`th datagram of the last [`recv_batch`](Self::recv_batch), or `None` when it was
    /// truncated (dropped) or `i` is past the end. `dst_ip` falls back to the bound IP.
    pub fn datagram<'b>(&self, batch: &'b RecvBatch, i: usize) -> Option<(RecvMeta, &'b [u8])> {
        let (got, bytes) = batch.get(i)?;
        if got.truncated {
            return None;
        }
        Some((
            RecvMeta {
                len: got.len,
                src: got.src,
                dst_ip: got.dst_ip.unwrap_or(self.local.ip()),
                segment_len: got.segment_len,
            },
            bytes,
        ))
    }

    /// Sends the queued datagrams of `batch` with `sendmmsg`, oldest first, until it is empty
    /// (`Ok(true)`) or the socket would block (`Ok(false)`: the unsent tail stays queued, to be
    /// sent when writable).
    ///
    /// `Err(f)`: the oldest unsent datagram (or train) failed and was dropped from the batch;
    /// the ones before it were sent. Call again for the rest. A datagram larger than the link
    /// carries ([`SendFailure::too_big`]: `EMSGSIZE`, or a train refused with `EINVAL` whose
    /// segments do not fit `link_mtu`) says nothing of GSO; any other refused train turns GSO
    /// off in `batch` ([`SendFailure::gso_off`]), the caller deciding when to try it again.
    pub fn send_batch(
        &self,
        batch: &mut TxBatch,
        link_mtu: Option<u32>,
    ) -> Result<bool, SendFailure> {
        while !batch.is_empty() {
            match udp::send_batch(&self.sock, batch.pending()) {
                Ok(0) => {
                    // The kernel took none without an error: treat as a full buffer.
                    return Ok(false);
                }
                Ok(n) => batch.consume(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(error) => {
                    let train = batch.front_is_train();
                    let too_big = exceeds_link(
                        &error,
                        train,
                        batch.front_segment_len(),
                        self.local.is_ipv6(),
                        link_mtu,
                    );
                    let gso_off = train && batch.gso_enabled() && !too_big;
                    if gso_off {
                        // The kernel or the route refuses GSO (no checksum offload, ...):
                        // datagram by datagram until the caller tries trains again.
                        batch.disable_gso();
                    }
                    batch.consume(1);
                    return Err(SendFailure {
                        error,
                        too_big,
                        gso_off,
                    });
                }
            }
        }
        Ok(true)
    }

    /// Datagrams [`recv`](Self::recv) discarded because they did not fit its buffer.
    pub fn truncated_drops(&self) -> u64 {
        self.truncated.load(Ordering::Relaxed)
    }
}

/// A datagram (or train) the kernel refused; it was dropped (RC retransmits).
#[derive(Debug)]
pub struct SendFailure {
    /// The kernel's error.
    pub error: io::Error,
    /// It was larger than the link carries (the link's MTU may have dropped).
    pub too_big: bool,
    /// A train was refused for another reason: the batch builds no more trains.
    pub gso_off: bool,
}

impl std::fmt::Display for SendFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.gso_off {
            write!(f, "UDP GSO send failed, GSO off for now: {}", self.error)
        } else if self.too_big {
            write!(f, "larger than the link carries: {}", self.error)
        } else {
            write!(f, "{}", self.error)
        }
    }
}

/// Bytes of IP and UDP header in front of a datagram.
const fn udp_ip_headers(ipv6: bool) -> usize {
    if ipv6 {
        48
    } else {
        28
    }
}

/// Whether `error`, refusing a datagram (or a `train` of segments) of `len` bytes, says it is
/// larger than the link carries: `EMSGSIZE` (DF is set), or for a train `EINVAL` with
/// segments whose packets exceed `link_mtu` (the kernel refuses a GSO size above the MTU with
/// `EINVAL`).
fn exceeds_link(
    error: &io::Error,
    train: bool,
    len: usize,
    ipv6: bool,
    link_mtu: Option<u32>,
) -> bool {
    match error.raw_os_error() {
        Some(libc::EMSGSIZE) => true,
        Some(libc::EINVAL) if train => link_mtu
            .and_then(|m| usize::try_from(m).ok())
            .is_some_and(|m| len + udp_ip_headers(ipv6) > m),
        _ => false,
    }
}

impl AsRawFd for UdpTransport {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

#[cfg(test)]
mod tests;
