//! [`SoftProvider`]: the software engine on a real UDP socket, driven by the driver's event
//! loop.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use std::os::fd::AsRawFd;

use super::transport::{TxBatch, UdpTransport};
use super::{SoftConfig, SoftVerbs};
use crate::sys::udp::RecvBatch;
use crate::verbs::{IoSource, Provider};

/// Datagrams read per [`Provider::handle_io`] call before other sources get a turn.
const MAX_RECV_BATCH: usize = 512;
/// Largest datagram accepted (a 4096-MTU RoCE packet is ~4.2 KB; leave room for jumbo junk).
const RECV_BUF_LEN: usize = 65_536;
/// Datagrams per `recvmmsg` / `sendmmsg`.
const IO_BATCH: usize = 64;
/// Bytes preallocated per send slot without GSO: a 4096-MTU RoCE packet with headers fits.
const TX_SLOT_CAPACITY: usize = 4_352;
/// Bytes preallocated per send slot with GSO: a whole train.
const TX_TRAIN_CAPACITY: usize = 65_536;

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
}

impl SoftProvider {
    /// Binds `cfg.local_ip:cfg.src_port` and wraps a fresh engine.
    ///
    /// # Errors
    /// The socket's bind or option errors.
    pub fn bind(cfg: SoftConfig, offload: UdpOffload) -> io::Result<Self> {
        let transport = UdpTransport::bind(SocketAddr::new(cfg.local_ip, cfg.src_port))?;
        let mut cfg = cfg;
        cfg.src_port = transport.local_addr().port();
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
            rx_gro_buffers: 0,
            rx_more: None,
            rx_ready: true,
            readiness_driven: false,
        })
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

    /// Sends the queued datagrams; false if the socket would block with some still queued.
    fn drain_tx(&mut self) -> bool {
        loop {
            match self.transport.send_batch(&mut self.tx) {
                Ok(done) => return done,
                Err(e) => {
                    // That datagram (or train) is dropped; RC retransmits.
                    self.send_errors += 1;
                    if self.tx.gso_enabled() {
                        tracing::debug!(error = %e, "soft provider send failed");
                    } else {
                        tracing::warn!(error = %e, "soft provider send failed");
                    }
                }
            }
        }
    }

    /// Transmits until the engine has nothing more or the socket would block, up to
    /// [`IO_BATCH`] datagrams per `sendmmsg`.
    fn transmit(&mut self, now: Instant) {
        loop {
            if !self.drain_tx() {
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

    fn verbs(&mut self) -> &mut SoftVerbs {
        &mut self.verbs
    }

    /// One descriptor, the UDP socket; writability is wanted exactly while a datagram waits
    /// for room in it (a UDP socket would otherwise wake the loop after every datagram it
    /// sends).
    fn io_source(&self, index: usize) -> Option<IoSource> {
        (index == 0).then(|| IoSource {
            fd: self.transport.as_raw_fd(),
            writable: !self.tx.is_empty(),
        })
    }

    fn note_readiness(&mut self, index: usize) {
        if index == 0 {
            self.rx_ready = true;
            self.readiness_driven = true;
        }
    }

    fn handle_io(&mut self, now: Instant) -> io::Result<()> {
        self.handle_input(now)?;
        Provider::flush(self, now)
    }

    fn flush(&mut self, now: Instant) -> io::Result<()> {
        self.transmit(now);
        Ok(())
    }

    fn handle_input(&mut self, now: Instant) -> io::Result<usize> {
        if !self.rx_ready && self.rx_more.is_none() {
            self.verbs.handle_timeout(now);
            return Ok(0);
        }
        self.rx_more = Some(now);
        let mut read = 0;
        let mut packets = 0;
        while read < MAX_RECV_BATCH {
            let n = self.transport.recv_batch(&mut self.rx)?;
            for i in 0..n {
                let Some((meta, d)) = self.transport.datagram(&self.rx, i) else {
                    continue;
                };
                match meta.segment_len.map(usize::from) {
                    Some(seg) if d.len() > seg => {
                        self.rx_gro_buffers += 1;
                        for one in d.chunks(seg) {
                            self.verbs.handle_datagram(now, meta.src, meta.dst_ip, one);
                            packets += 1;
                        }
                    }
                    _ => {
                        self.verbs.handle_datagram(now, meta.src, meta.dst_ip, d);
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

    fn poll_timeout(&self) -> Option<Instant> {
        match (self.rx_more, self.verbs.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
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
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(read, 10);
        assert_eq!(p.handle_input(now).expect("handle_input"), 0);
    }
}
