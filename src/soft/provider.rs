//! [`SoftProvider`]: the software engine on a real UDP socket, driven by mio.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use mio::{Interest, Registry, Token};

use super::transport::UdpTransport;
use super::{SoftConfig, SoftVerbs};
use crate::verbs::Provider;

/// Datagrams read per [`Provider::handle_io`] call before other sources get a turn.
const MAX_RECV_BATCH: usize = 512;
/// Largest datagram accepted (a 4096-MTU RoCE packet is ~4.2 KB; leave room for jumbo junk).
const RECV_BUF_LEN: usize = 65_536;

/// The software provider bound to a UDP socket.
#[derive(Debug)]
pub struct SoftProvider {
    verbs: SoftVerbs,
    transport: UdpTransport,
    rx_buf: Vec<u8>,
    tx_buf: Vec<u8>,
    /// A datagram the socket refused with `WouldBlock`, sent first when it is writable again.
    blocked: Option<(SocketAddr, Vec<u8>)>,
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
            rx_buf: vec![0; RECV_BUF_LEN],
            tx_buf: Vec::with_capacity(RECV_BUF_LEN),
            blocked: None,
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

    /// Sends `d` to `dst`; false if the socket would block.
    fn send(&mut self, dst: SocketAddr, d: &[u8]) -> bool {
        match self.transport.send_to(d, dst) {
            Ok(sent) => sent,
            Err(e) => {
                self.send_errors += 1;
                tracing::debug!(%dst, error = %e, "soft provider send failed");
                true
            }
        }
    }

    /// Registers for writability exactly while a datagram waits for room in the socket.
    fn update_interest(&mut self) -> io::Result<()> {
        let want = self.blocked.is_some();
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

    /// Transmits until the engine has nothing more or the socket would block.
    fn flush(&mut self, now: Instant) {
        if let Some((dst, d)) = self.blocked.take() {
            if !self.send(dst, &d) {
                self.blocked = Some((dst, d));
                return;
            }
        }
        let mut buf = std::mem::take(&mut self.tx_buf);
        while let Some(dst) = self.verbs.poll_transmit(now, &mut buf) {
            if !self.send(dst, &buf) {
                self.blocked = Some((dst, buf.clone()));
                break;
            }
        }
        self.tx_buf = buf;
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
        for _ in 0..MAX_RECV_BATCH {
            let Some(meta) = self.transport.recv(&mut self.rx_buf)? else {
                self.rx_more = None;
                break;
            };
            let d = self.rx_buf.get(..meta.len).unwrap_or(&[]);
            self.verbs.handle_datagram(now, meta.src, meta.dst_ip, d);
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
