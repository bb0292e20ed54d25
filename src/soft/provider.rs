//! [`SoftProvider`]: the software engine on a real UDP socket, driven by the driver's event
//! loop.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use std::os::fd::AsRawFd;

mod groups;
mod steering;

use groups::GroupSockets;
pub use groups::MulticastStats;
use steering::Steering;
pub use steering::{ForeignDatagram, SteeringStats, FOREIGN_DATAGRAM_MAX, FOREIGN_SLOTS};

use super::config::{SoftConfig, SoftLink};
use super::engine::SoftVerbs;
use super::ib::IbPortAttr;
use super::sim_port::SimPort;
use super::transport::{TxBatch, UdpTransport};
use crate::sys::udp::RecvBatch;
use crate::verbs::{IoSource, Provider};

/// Datagrams read per [`Provider::handle_io`] call before other sources get a turn.
const MAX_RECV_BATCH: usize = 512;
/// Largest datagram accepted (a 4096-MTU RoCE packet is ~4.2 KB; leave room for jumbo junk).
const RECV_BUF_LEN: usize = 65_536;
/// Datagrams per `recvmmsg` / `sendmmsg`.
const IO_BATCH: usize = 64;
/// Bytes preallocated per send slot without GSO: a 4096-MTU RoCE packet with headers fits
/// (the longest datagram of another worker that is held).
const TX_SLOT_CAPACITY: usize = FOREIGN_DATAGRAM_MAX;
/// Bytes preallocated per send slot with GSO: a whole train.
const TX_TRAIN_CAPACITY: usize = 65_536;

/// How long trains stay off after the kernel first refused one for a reason other than its
/// size; each refusal after a retry doubles it, up to [`GSO_RETRY_MAX`].
const GSO_RETRY_FIRST: Duration = Duration::from_secs(10);
/// The longest trains stay off before they are tried again.
const GSO_RETRY_MAX: Duration = Duration::from_secs(600);

/// Whether the provider's socket uses the kernel's UDP segmentation offloads.
///
/// On: consecutive datagrams to one peer leave as one GSO train (one trip through the stack
/// for up to 64 datagrams; see [`TxBatch`]) and trains or merged datagrams arrive as one
/// buffer (GRO). The datagrams on the wire are the same RoCEv2 packets either way, except
/// that IPv4 segments carry IP IDs 1, 2, ... (ICRCs to match). A capture taken on a veth
/// or on the sending host before segmentation shows the train as one oversized datagram;
/// capture on the receiving side of a real link, turn the device's `tx-udp-segmentation`
/// off, or turn this off to see every packet as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UdpOffload {
    /// GSO and GRO where the kernel has them.
    #[default]
    On,
    /// One datagram per send and per receive.
    Off,
}

/// The software provider bound to a UDP socket.
#[derive(Debug)]
pub struct SoftProvider {
    verbs: SoftVerbs,
    transport: UdpTransport,
    rx: RecvBatch,
    /// Datagrams from the engine not yet taken by the socket: after a `WouldBlock` the unsent
    /// tail waits here and goes first when the socket is writable again.
    tx: TxBatch,
    /// Send errors other than `WouldBlock` (the datagram is dropped; RC retransmits).
    pub send_errors: u64,
    /// Of `send_errors`: datagrams larger than the link carried.
    pub send_too_big: u64,
    /// The `--bind` link's MTU as the driver last read it ([`SoftProvider::set_link_mtu`]).
    link_mtu: Option<u32>,
    /// A datagram was too big for the link since [`SoftProvider::take_link_suspect`]: its MTU
    /// may have changed.
    link_suspect: bool,
    /// UDP offloads were asked for and the kernel has them: trains are built unless a refusal
    /// turned them off until `gso_retry_at`.
    gso_wanted: bool,
    /// When to build trains again after a refusal.
    gso_retry_at: Option<Instant>,
    /// How long the next refusal turns trains off.
    gso_backoff: Duration,
    /// Receive buffers that held two or more datagrams (GRO).
    pub rx_gro_buffers: u64,
    /// The last receive batch hit its bound: more datagrams may be waiting and, the socket
    /// being edge-triggered, no readiness event will say so.
    rx_more: Option<Instant>,
    /// Readiness was reported (or not yet asked for) since the socket was last read empty:
    /// [`Provider::handle_io`] reads only then, saving an empty `recvmmsg` on every turn
    /// that only the TUN side or a timer started.
    rx_ready: bool,
    /// The driver reports readiness ([`Provider::note_readiness`] was called); until then
    /// every `handle_io` reads.
    readiness_driven: bool,
    /// The group sockets, when IP multicast is on.
    groups: Option<GroupSockets>,
    /// Datagrams of other workers, when this is one of several.
    steering: Steering,
    /// The InfiniBand port's SMA, where the port is one of a simulated fabric
    /// ([`attach_sim_port`](Self::attach_sim_port)).
    sim_port: Option<SimPort>,
}

impl SoftProvider {
    /// Binds `cfg.local_ip:cfg.src_port` and wraps a fresh engine.
    ///
    /// With [`SoftConfig::multicast`] on, the socket also sends to IP multicast groups, and
    /// the groups of the MGIDs that QPs attach are joined on the bind interface (at the next
    /// [`Provider::handle_io`] or [`Provider::flush`]); where that interface carries no
    /// multicast (loopback, a point-to-point tunnel) it is turned off, with an info line, and
    /// [`multicast_active`](Self::multicast_active) says so.
    ///
    /// # Errors
    /// The socket's bind or option errors.
    pub fn bind(cfg: SoftConfig, offload: UdpOffload) -> io::Result<Self> {
        let transport = UdpTransport::bind(SocketAddr::new(cfg.local_ip, cfg.src_port))?;
        Self::with_transport(cfg, transport, offload)
    }

    /// As [`bind`](Self::bind), on a socket bound already: one of the group
    /// [`UdpTransport::bind_steered`] binds, for the worker [`SoftConfig::workers`] names.
    /// `cfg.src_port` becomes the socket's port. Multicast ([`SoftConfig::multicast`]) is
    /// the UD QP's, so the control side's: leave it off for the other workers.
    ///
    /// # Errors
    /// `InvalidInput` when the socket is not bound to `cfg.local_ip`; the socket's option
    /// errors.
    pub fn with_transport(
        cfg: SoftConfig,
        transport: UdpTransport,
        offload: UdpOffload,
    ) -> io::Result<Self> {
        if transport.local_addr().ip() != cfg.local_ip {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the socket is bound to {}, the provider's address is {}",
                    transport.local_addr(),
                    cfg.local_ip
                ),
            ));
        }
        let mut cfg = cfg;
        cfg.src_port = transport.local_addr().port();
        let groups = if cfg.multicast {
            GroupSockets::open(&transport, &cfg)?
        } else {
            None
        };
        cfg.multicast = groups.is_some();
        let steering = Steering::new(cfg.workers, cfg.link.framing());
        // A GSO train's later segments get ICRCs shifted for their IPv4 IDs (RoCEv2's ICRC
        // covers the IP header); an InfiniBand packet's does not, so it travels without.
        let offload = match cfg.link {
            SoftLink::Infiniband => UdpOffload::Off,
            SoftLink::RoceV2 => offload,
        };
        let gso = match offload {
            UdpOffload::On => match transport.enable_gro() {
                Ok(()) => true,
                Err(e) => {
                    tracing::info!(error = %e, "no UDP GRO on this kernel; sending and receiving datagram by datagram");
                    false
                }
            },
            UdpOffload::Off => false,
        };
        let tx = if gso {
            TxBatch::with_gso(IO_BATCH, TX_TRAIN_CAPACITY, true)
        } else {
            TxBatch::new(IO_BATCH, TX_SLOT_CAPACITY)
        };
        Ok(Self {
            verbs: SoftVerbs::new(cfg),
            transport,
            rx: RecvBatch::new(IO_BATCH, RECV_BUF_LEN),
            tx,
            send_errors: 0,
            send_too_big: 0,
            link_mtu: None,
            link_suspect: false,
            gso_wanted: gso,
            gso_retry_at: None,
            gso_backoff: GSO_RETRY_FIRST,
            rx_gro_buffers: 0,
            rx_more: None,
            rx_ready: true,
            readiness_driven: false,
            groups,
            steering,
            sim_port: None,
        })
    }

    /// Makes `sp` this InfiniBand port's SMA: the port is as `attr` (its first read) from
    /// `now` on, and follows what the SM does ([`SimPort`]).
    pub fn attach_sim_port(&mut self, now: Instant, sp: SimPort, attr: IbPortAttr) {
        self.verbs.set_ib_port(now, attr);
        self.sim_port = Some(sp);
    }

    /// The InfiniBand port's SMA, where one is attached.
    pub fn sim_port(&self) -> Option<&SimPort> {
        self.sim_port.as_ref()
    }

    /// The InfiniBand port's SMA (to tell it what the SA showed), where one is attached.
    pub fn sim_port_mut(&mut self) -> Option<&mut SimPort> {
        self.sim_port.as_mut()
    }

    /// Bytes of the provider's own datagram buffers with `offload` (the receive batch, whose
    /// buffers GRO can fill, and the send slots, whole trains with GSO): what
    /// [`commit_io_buffers`](Self::commit_io_buffers) writes through.
    pub const fn io_buffer_bytes(offload: UdpOffload) -> usize {
        let slot = match offload {
            UdpOffload::On => TX_TRAIN_CAPACITY,
            UdpOffload::Off => TX_SLOT_CAPACITY,
        };
        IO_BATCH * (RECV_BUF_LEN + slot)
    }

    /// Writes the datagram buffers through ([`commit`](crate::verbs::pool::commit)): their
    /// memory is the process's from now on, not at the first large batch.
    pub fn commit_io_buffers(&mut self) {
        crate::verbs::pool::commit(self.rx.buffers_mut());
        self.tx.commit();
    }

    /// Descriptors the provider holds: its socket, and with IP multicast on the inner poll
    /// of the group sockets and one socket per group of `groups`.
    pub const fn descriptors(multicast: bool, groups: usize) -> usize {
        if multicast {
            2 + groups
        } else {
            1
        }
    }

    /// True when multicast UD sends leave as IP multicast and groups are joined.
    pub fn multicast_active(&self) -> bool {
        self.groups.is_some()
    }

    /// The IP multicast counters.
    pub fn multicast_stats(&self) -> MulticastStats {
        self.groups
            .as_ref()
            .map_or_else(MulticastStats::default, GroupSockets::stats)
    }

    /// The steering counters (all zero with one worker).
    pub fn steering_stats(&self) -> SteeringStats {
        self.steering.stats
    }

    /// Hands out the datagrams this worker received for other workers' QPs since the last
    /// call (at most [`FOREIGN_SLOTS`]), oldest first, each with the worker it belongs to:
    /// pass each to that worker's [`accept_foreign`](Self::accept_foreign). Taking them
    /// empties the queue: what the iterator is not asked for is dropped. Always empty with
    /// one worker ([`SoftConfig::workers`]).
    pub fn take_foreign(&mut self) -> impl ExactSizeIterator<Item = ForeignDatagram<'_>> {
        let n = std::mem::take(&mut self.steering.held);
        self.steering
            .held_slots
            .get(..n)
            .unwrap_or_default()
            .iter()
            .map(|h| ForeignDatagram {
                worker: h.worker,
                src: h.src,
                datagram: &h.bytes,
            })
    }

    /// Handles a datagram another worker received for one of this worker's QPs
    /// ([`take_foreign`](Self::take_foreign)) as if this worker's socket had received it
    /// from `src`, addressed to the provider's IP (every socket of a steered group is bound
    /// to it). It is not handed on again, whoever owns it. Like
    /// [`Provider::handle_input`], it may leave datagrams to send: flush afterwards.
    pub fn accept_foreign(&mut self, now: Instant, src: SocketAddr, datagram: &[u8]) {
        self.steering.stats.rx_foreign_accepted += 1;
        let local = self.verbs.config().local_ip;
        self.verbs.handle_datagram(now, src, local, datagram);
    }

    /// Brings the group sockets in line with the groups the engine's QPs are attached to.
    fn sync_groups(&mut self) {
        if let Some(g) = self.groups.as_mut() {
            g.sync(&self.verbs, self.transport.local_addr());
        }
    }

    /// Reads the group sockets, at most [`MAX_RECV_BATCH`] datagrams; returns how many.
    fn read_groups(&mut self, now: Instant) -> io::Result<usize> {
        let own = self.transport.local_addr();
        match self.groups.as_mut() {
            Some(g) => g.read(
                now,
                &mut self.rx,
                &mut self.verbs,
                own,
                MAX_RECV_BATCH,
                self.readiness_driven,
            ),
            None => Ok(0),
        }
    }

    /// The engine (read-only).
    pub fn engine(&self) -> &SoftVerbs {
        &self.verbs
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.transport.local_addr()
    }

    /// GSO trains of two or more datagrams sent so far.
    pub fn tx_gso_trains(&self) -> u64 {
        self.tx.trains_sent()
    }

    /// Trains are still being built (on, and no send refused one).
    pub fn gso_enabled(&self) -> bool {
        self.tx.gso_enabled()
    }

    /// The `--bind` link's MTU is `mtu` (the driver read it at start or saw it change): the
    /// port's active MTU follows ([`SoftVerbs::set_port_mtu`]), sends are judged against it,
    /// and trains turned off by a refusal are tried again at once (the refusal may have been
    /// the old MTU's).
    pub fn set_link_mtu(&mut self, mtu: u32) {
        self.link_mtu = Some(mtu);
        self.verbs
            .set_port_mtu(crate::verbs::PathMtu::carried_by_link(mtu));
        if self.gso_wanted {
            self.tx.enable_gso();
            self.gso_retry_at = None;
            self.gso_backoff = GSO_RETRY_FIRST;
        }
    }

    /// Whether a datagram was refused as larger than the link since the last call: the
    /// link's MTU may have dropped, and the driver should read it again.
    pub fn take_link_suspect(&mut self) -> bool {
        std::mem::take(&mut self.link_suspect)
    }

    /// Sends the queued datagrams; false if the socket would block with some still queued.
    /// A refused datagram (or train) is dropped, RC retransmits it. A refusal for size is a
    /// debug line (the link's new MTU is the driver's to log, once); any other is a warning,
    /// the logger's to rate-limit.
    fn drain_tx(&mut self, now: Instant) -> bool {
        loop {
            match self.transport.send_batch(&mut self.tx, self.link_mtu) {
                Ok(done) => return done,
                Err(f) => {
                    self.send_errors += 1;
                    if f.gso_off {
                        self.gso_retry_at = Some(now + self.gso_backoff);
                        self.gso_backoff = (self.gso_backoff * 2).min(GSO_RETRY_MAX);
                    }
                    if f.too_big {
                        self.send_too_big += 1;
                        self.link_suspect = true;
                        // The driver reads the link again and logs its new MTU once.
                        tracing::debug!(error = %f, "soft provider send failed");
                    } else {
                        tracing::warn!(error = %f, "soft provider send failed");
                    }
                }
            }
        }
    }

    /// Transmits until the engine has nothing more or the socket would block, up to
    /// [`IO_BATCH`] datagrams per `sendmmsg`.
    fn transmit(&mut self, now: Instant) {
        if self.gso_retry_at.is_some_and(|t| now >= t) {
            self.gso_retry_at = None;
            self.tx.enable_gso();
        }
        loop {
            if !self.drain_tx(now) {
                return;
            }
            // The engine writes each datagram straight into the batch (onto the end of the
            // newest train when it may join it).
            let verbs = &mut self.verbs;
            while self
                .tx
                .push_appending(|buf| verbs.poll_transmit_append(now, buf))
            {}
            if self.tx.is_empty() {
                return;
            }
        }
    }
}

impl Provider for SoftProvider {
    type Verbs = SoftVerbs;
    type PortView = crate::soft::IbPortView;

    fn port_view_generation(&self) -> u64 {
        self.verbs.ib_port_view_generation()
    }

    fn port_view(&self) -> Option<Self::PortView> {
        self.verbs.ib_port_view()
    }

    fn follow_port_view(&mut self, view: &Self::PortView) {
        self.verbs.follow_ib_port(view);
    }

    fn take_foreign(&mut self, out: &mut dyn FnMut(u8, SocketAddr, &[u8])) {
        for d in Self::take_foreign(self) {
            out(d.worker, d.src, d.datagram);
        }
    }

    fn accept_foreign(&mut self, now: Instant, src: SocketAddr, datagram: &[u8]) {
        Self::accept_foreign(self, now, src, datagram);
    }

    fn verbs(&mut self) -> &mut SoftVerbs {
        &mut self.verbs
    }

    /// One descriptor, the UDP socket; writability is wanted exactly while a datagram waits
    /// for room in it (a UDP socket would otherwise wake the loop after every datagram it
    /// sends).
    ///
    /// With IP multicast on, a second descriptor: the poll that watches the group sockets.
    fn io_source(&self, index: usize) -> Option<IoSource> {
        match index {
            0 => Some(IoSource {
                fd: self.transport.as_raw_fd(),
                writable: !self.tx.is_empty(),
            }),
            1 => self.groups.as_ref().map(|g| IoSource {
                fd: g.poll.as_raw_fd(),
                writable: false,
            }),
            _ => None,
        }
    }

    fn note_readiness(&mut self, index: usize) {
        match index {
            0 => {
                self.rx_ready = true;
                self.readiness_driven = true;
            }
            1 => {
                if let Some(g) = self.groups.as_mut() {
                    g.ready = true;
                }
                self.readiness_driven = true;
            }
            _ => {}
        }
    }

    fn handle_io(&mut self, now: Instant) -> io::Result<()> {
        self.handle_input(now)?;
        Provider::flush(self, now)
    }

    fn flush(&mut self, now: Instant) -> io::Result<()> {
        self.sync_groups();
        self.transmit(now);
        Ok(())
    }

    fn handle_input(&mut self, now: Instant) -> io::Result<usize> {
        if let Some(sp) = self.sim_port.as_mut() {
            sp.pump(now, &mut self.verbs);
        }
        self.sync_groups();
        let mut packets = self.read_groups(now)?;
        if !self.rx_ready && self.rx_more.is_none() {
            self.verbs.handle_timeout(now);
            return Ok(packets);
        }
        self.rx_more = Some(now);
        let mut read = 0;
        while read < MAX_RECV_BATCH {
            let n = self.transport.recv_batch(&mut self.rx)?;
            for i in 0..n {
                let Some((meta, d)) = self.transport.datagram(&self.rx, i) else {
                    continue;
                };
                // A GRO buffer may hold datagrams of several QPs, so of several workers.
                match meta.segment_len.map(usize::from) {
                    Some(seg) if d.len() > seg => {
                        self.rx_gro_buffers += 1;
                        for one in d.chunks(seg) {
                            if !self.steering.divert(meta.src, one) {
                                self.verbs.handle_datagram(now, meta.src, meta.dst_ip, one);
                            }
                            packets += 1;
                        }
                    }
                    _ => {
                        if !self.steering.divert(meta.src, d) {
                            self.verbs.handle_datagram(now, meta.src, meta.dst_ip, d);
                        }
                        packets += 1;
                    }
                }
            }
            read += n;
            if n < self.rx.capacity() {
                // A short batch: the queue was empty when the kernel looked; with edge
                // triggering, anything that arrived since brings a fresh readiness event.
                self.rx_more = None;
                self.rx_ready = !self.readiness_driven;
                break;
            }
        }
        self.verbs.handle_timeout(now);
        Ok(packets)
    }

    /// A new engine for the same socket ([`SoftVerbs::reopened`]: no objects, new QPNs);
    /// the multicast groups are joined again as the new QPs attach.
    fn reopen(&mut self) -> Result<(), crate::verbs::ReopenError> {
        self.verbs = self.verbs.reopened(crate::verbs::setup::os_seed());
        if let Some(g) = self.groups.as_mut() {
            g.synced = None;
        }
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let group_more = self.groups.as_ref().and_then(|g| g.more);
        let port = self.sim_port.as_ref().map(SimPort::poll_timeout);
        [self.rx_more, group_more, self.verbs.poll_timeout(), port]
            .into_iter()
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::steering::tests::for_qp;
    use super::*;
    use crate::soft::SoftConfig;
    use std::net::{IpAddr, Ipv4Addr, UdpSocket};

    /// `handle_input` reports how many packets it read (each segment of a GRO buffer counts),
    /// which the daemon uses to acknowledge large batches early. Loopback only.
    #[test]
    fn handle_input_counts_packets_read() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut cfg = SoftConfig::new(lo);
        cfg.src_port = 0;
        let mut p = SoftProvider::bind(cfg, UdpOffload::On).expect("bind on loopback");
        let to = p.local_addr();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("sender");
        for _ in 0..10 {
            // Not RoCE: dropped and counted as malformed, but read all the same.
            tx.send_to(&[0xAB; 100], to).expect("send");
        }
        let now = Instant::now();
        let mut read = 0;
        for _ in 0..100 {
            read += p.handle_input(now).expect("handle_input");
            if read >= 10 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(read, 10);
        assert_eq!(p.handle_input(now).expect("handle_input"), 0);
    }

    /// A datagram of `len` bytes for destination QP `qpn` (a BTH, then `fill`).
    /// A GRO buffer holding segments of both workers' QPs reaches worker 1 of 2 (its first
    /// segment's QP is worker 1's, and the kernel's reuseport program steers the whole train
    /// by it): worker 1 handles its own two, counts the other four as misrouted and hands
    /// them out, QP1 and the multicast QPN as worker 0's; worker 0 accepts them. Loopback
    /// only.
    #[test]
    fn a_gro_buffer_of_two_workers_is_split_between_them() {
        use crate::sys::udp::{send_batch, Outgoing};
        use crate::wire::{Framing, WorkerCount};
        use socket2::{Domain, Protocol, SockAddr, Socket, Type};

        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let two = WorkerCount::new(2).unwrap();
        let group = UdpTransport::bind_steered(SocketAddr::new(lo, 0), two, Framing::Bth).unwrap();
        let at = group[0].local_addr();
        let mut workers: Vec<SoftProvider> = group
            .into_iter()
            .zip(two.slots())
            .map(|(t, slot)| {
                let mut cfg = SoftConfig::new(lo);
                cfg.workers = slot;
                SoftProvider::with_transport(cfg, t, UdpOffload::On).unwrap()
            })
            .collect();
        assert_eq!(workers[1].local_addr(), at);

        let qpns = [0x101, 0x200, 0x103, 0x1, 0xFF_FFFF, 0x204];
        let segments: Vec<Vec<u8>> = qpns
            .iter()
            .enumerate()
            .map(|(i, &q)| for_qp(q, if i == 5 { 60 } else { 100 }, i as u8))
            .collect();
        let sender = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        sender
            .bind(&SockAddr::from(SocketAddr::new(lo, 0)))
            .unwrap();
        let from = sender.local_addr().unwrap().as_socket().unwrap();
        let train = Outgoing {
            dst: SockAddr::from(at),
            data: segments.concat(),
            segment_len: 100,
        };
        assert_eq!(send_batch(&sender, &[train]).unwrap(), 1);

        let now = Instant::now();
        let mut read = 0;
        for _ in 0..1000 {
            read += workers[1].handle_input(now).unwrap();
            if read >= qpns.len() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(read, qpns.len());
        assert_eq!(workers[1].rx_gro_buffers, 1, "one buffer, GRO'd");
        assert_eq!(workers[1].engine().stats().rx_datagrams, 2, "its own two");
        let st = workers[1].steering_stats();
        assert_eq!(st.rx_misrouted, 4);
        assert_eq!(st.rx_foreign_dropped, 0);
        let foreign: Vec<(u8, SocketAddr, Vec<u8>)> = workers[1]
            .take_foreign()
            .map(|f| (f.worker, f.src, f.datagram.to_vec()))
            .collect();
        let want: Vec<(u8, SocketAddr, Vec<u8>)> = [1, 3, 4, 5]
            .iter()
            .map(|&i| (0, from, segments[i].clone()))
            .collect();
        assert_eq!(foreign, want);
        assert_eq!(workers[1].take_foreign().len(), 0, "taken once");

        assert_eq!(
            workers[0].handle_input(now).unwrap(),
            0,
            "nothing by socket 0"
        );
        for (_, src, d) in &foreign {
            workers[0].accept_foreign(now, *src, d);
        }
        assert_eq!(workers[0].engine().stats().rx_datagrams, 4);
        assert_eq!(workers[0].steering_stats().rx_foreign_accepted, 4);
        assert_eq!(workers[0].steering_stats().rx_misrouted, 0);
    }
}
