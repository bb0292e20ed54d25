//! [`SoftProvider`]: the software engine on a real UDP socket, driven by mio.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use mio::{Interest, Registry, Token};

use super::transport::{TxBatch, UdpTransport};
use super::{SoftConfig, SoftVerbs};
use crate::sys::udp::RecvBatch;
use crate::verbs::Provider;

/// Datagrams read per [`Provider::handle_io`] call before other sources get a turn.
const MAX_RECV_BATCH: usize = 512;
/// Largest datagram accepted (a 4096-MTU RoCE packet is ~4.2 KB; leave room for jumbo junk).
const RECV_BUF_LEN: usize = 65_536;
/// Datagrams per `recvmmsg` / `sendmmsg`.
const IO_BATCH: usize = 64;
/// Bytes preallocated per send slot: a 4096-MTU RoCE packet with headers fits.
const TX_SLOT_CAPACITY: usize = 4_352;

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
    /// Where the socket is registered, to ask for writability only while a send is blocked
    /// (a UDP socket would otherwise wake the loop after every datagram it sends).
    registration: Option<(Registry, Token)>,
    /// WRITABLE interest is currently registered.
    want_writable: bool,
    /// The last receive batch hit its bound: more datagrams may be waiting and, the socket
    /// being edge-triggered, no readiness event will say so.
    rx_more: Option<Instant>,
}

impl SoftProvider {
    /// Binds `cfg.local_ip:cfg.src_port` and wraps a fresh engine.
    ///
    /// # Errors
    /// The socket's bind or option errors.
    pub fn bind(cfg: SoftConfig) -> io::Result<Self> {
        let transport = UdpTransport::bind(SocketAddr::new(cfg.local_ip, cfg.src_port))?;
        let mut cfg = cfg;
        cfg.src_port = transport.local_addr().port();
        Ok(Self {
            verbs: SoftVerbs::new(cfg),
            transport,
            rx: RecvBatch::new(IO_BATCH, RECV_BUF_LEN),
            tx: TxBatch::new(IO_BATCH, TX_SLOT_CAPACITY),
            send_errors: 0,
            rx_more: None,
            registration: None,
            want_writable: false,
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

    /// Sends the queued datagrams; false if the socket would block with some still queued.
    fn drain_tx(&mut self) -> bool {
        loop {
            match self.transport.send_batch(&mut self.tx) {
                Ok(done) => return done,
                Err(e) => {
                    // That datagram is dropped; RC retransmits.
                    self.send_errors += 1;
                    tracing::debug!(error = %e, "soft provider send failed");
                }
            }
        }
    }

    /// Registers for writability exactly while a datagram waits for room in the socket.
    fn update_interest(&mut self) -> io::Result<()> {
        let want = !self.tx.is_empty();
        if want == self.want_writable {
            return Ok(());
        }
        if let Some((registry, token)) = &self.registration {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            registry.reregister(&mut self.transport, *token, interest)?;
        }
        self.want_writable = want;
        Ok(())
    }

    /// Transmits until the engine has nothing more or the socket would block, up to
    /// [`IO_BATCH`] datagrams per `sendmmsg`.
    fn flush(&mut self, now: Instant) {
        loop {
            if !self.drain_tx() {
                return;
            }
            let verbs = &mut self.verbs;
            while self.tx.push_with(|buf| verbs.poll_transmit(now, buf)) {}
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

    fn register(&mut self, registry: &Registry, first_token: usize) -> io::Result<usize> {
        registry.register(&mut self.transport, Token(first_token), Interest::READABLE)?;
        self.registration = Some((registry.try_clone()?, Token(first_token)));
        self.want_writable = false;
        Ok(1)
    }

    fn handle_io(&mut self, now: Instant) -> io::Result<()> {
        self.rx_more = Some(now);
        let mut read = 0;
        while read < MAX_RECV_BATCH {
            let n = self.transport.recv_batch(&mut self.rx)?;
            for i in 0..n {
                if let Some((meta, d)) = self.transport.datagram(&self.rx, i) {
                    self.verbs.handle_datagram(now, meta.src, meta.dst_ip, d);
                }
            }
            read += n;
            if n < self.rx.capacity() {
                // A short batch: the queue was empty when the kernel looked; with edge
                // triggering, anything that arrived since brings a fresh readiness event.
                self.rx_more = None;
                break;
            }
        }
        self.verbs.handle_timeout(now);
        self.flush(now);
        self.update_interest()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match (self.rx_more, self.verbs.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
