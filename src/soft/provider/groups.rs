//! The receive side of the software provider's IP multicast: a socket per joined group, all
//! behind one inner poll, brought in line with the groups the engine's QPs are attached to.

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::soft::config::SoftConfig;
use crate::soft::engine::SoftVerbs;
use crate::soft::transport::UdpTransport;
use crate::sys::ifaddr;
use crate::sys::udp::RecvBatch;

/// Readiness events taken from the group sockets' poll per read (they only say "read again").
const GROUP_EVENTS: usize = 16;

/// The receive side of IP multicast ([`SoftConfig::multicast`]): one socket per joined group
/// ([`UdpTransport::bind_group`]), all watched by one inner poll whose descriptor is the
/// provider's second [`IoSource`], so that groups can be joined and left while the driver's
/// set of descriptors stays fixed.
#[derive(Debug)]
pub(super) struct GroupSockets {
    /// The bind interface (the groups are joined there).
    pub(super) ifindex: u32,
    /// Watches every socket of `sockets` (edge-triggered, readable).
    pub(super) poll: Poll,
    pub(super) events: Events,
    /// The joined groups and their sockets, by group.
    pub(super) sockets: Vec<(IpAddr, UdpTransport)>,
    /// The engine's [`SoftVerbs::multicast_generation`] the sockets were last brought in line
    /// with (`None`: never).
    pub(super) synced: Option<u64>,
    /// The inner poll reported readiness (or was never asked) since the sockets were last read
    /// empty.
    pub(super) ready: bool,
    /// The last read hit its bound: more may be waiting.
    pub(super) more: Option<Instant>,
    /// Its counters (`groups_joined` filled in when read).
    stats: MulticastStats,
}

/// Counters of the provider's IP multicast (zero when it is off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct MulticastStats {
    /// IP multicast groups joined now.
    pub groups_joined: u64,
    /// Groups that could not be joined (the error is logged).
    pub join_errors: u64,
    /// Datagrams received on the group sockets.
    pub rx_datagrams: u64,
    /// Dropped: this provider's own datagram looped back.
    pub rx_own: u64,
}

impl GroupSockets {
    /// The group sockets' poll, with the unicast socket `transport` set up to send to groups;
    /// `None` (multicast off) when the bind interface carries no multicast or the socket
    /// refuses to send it.
    pub(super) fn open(transport: &UdpTransport, cfg: &SoftConfig) -> io::Result<Option<Self>> {
        let Some(ifindex) = ifaddr::multicast_ifindex_of(cfg.local_ip) else {
            tracing::info!(
                bind = %cfg.local_ip,
                "the bind interface carries no IP multicast; multicast goes to --peer addresses only"
            );
            return Ok(None);
        };
        if let Err(e) = transport.enable_multicast_send(ifindex, cfg.multicast_ttl) {
            tracing::warn!(
                bind = %cfg.local_ip,
                error = %e,
                "cannot send IP multicast from the bind address; multicast goes to --peer addresses only"
            );
            return Ok(None);
        }
        Ok(Some(Self {
            ifindex,
            poll: Poll::new()?,
            events: Events::with_capacity(GROUP_EVENTS),
            sockets: Vec::new(),
            synced: None,
            ready: true,
            more: None,
            stats: MulticastStats::default(),
        }))
    }

    /// The counters.
    pub(super) fn stats(&self) -> MulticastStats {
        MulticastStats {
            groups_joined: self.sockets.len() as u64,
            ..self.stats
        }
    }

    /// Opens a socket (bound to `local`'s port) for each group the engine's attached MGIDs
    /// map to that has none, and closes (leaves) those of groups no longer attached; nothing
    /// when no group came or went.
    pub(super) fn sync(&mut self, verbs: &SoftVerbs, local: std::net::SocketAddr) {
        let generation = verbs.multicast_generation();
        if self.synced == Some(generation) {
            return;
        }
        self.synced = Some(generation);
        let wanted = verbs.ip_multicast_groups();
        let registry = self.poll.registry();
        self.sockets.retain(|(ip, sock)| {
            let keep = wanted.contains(ip);
            if !keep {
                // Closing the socket leaves the group (and drops it from the poll).
                let _ = registry.deregister(&mut SourceFd(&sock.as_raw_fd()));
                tracing::debug!(group = %ip, "left IP multicast group");
            }
            keep
        });
        for ip in wanted {
            if self.sockets.iter().any(|(have, _)| *have == ip) {
                continue;
            }
            let joined = UdpTransport::bind_group(ip, local.port(), self.ifindex, local.ip())
                .and_then(|sock| {
                    let token = Token(self.sockets.len());
                    self.poll.registry().register(
                        &mut SourceFd(&sock.as_raw_fd()),
                        token,
                        Interest::READABLE,
                    )?;
                    Ok(sock)
                });
            match joined {
                Ok(sock) => {
                    tracing::debug!(group = %ip, "joined IP multicast group");
                    self.sockets.push((ip, sock));
                    self.ready = true;
                }
                Err(e) => {
                    self.stats.join_errors += 1;
                    tracing::warn!(group = %ip, error = %e, "could not join IP multicast group");
                }
            }
        }
    }

    /// Reads the sockets into `rx` (when readiness or a full last read says there may be
    /// something), at most `max` datagrams in all, and hands each to `verbs` but those `own`
    /// sent (looped back); returns how many were read. `readiness_driven`: the driver reports
    /// the inner poll's readiness, so an empty read waits for it.
    pub(super) fn read(
        &mut self,
        now: Instant,
        rx: &mut RecvBatch,
        verbs: &mut SoftVerbs,
        own: std::net::SocketAddr,
        max: usize,
        readiness_driven: bool,
    ) -> io::Result<usize> {
        if !self.ready && self.more.is_none() {
            return Ok(0);
        }
        // Taking the inner poll's events re-arms its readiness edge; which socket they name
        // does not matter, all are read.
        self.poll.poll(&mut self.events, Some(Duration::ZERO))?;
        let mut read = 0;
        let mut full = false;
        for (_, sock) in &self.sockets {
            loop {
                let n = sock.recv_batch(rx)?;
                for i in 0..n {
                    let Some((meta, d)) = sock.datagram(rx, i) else {
                        continue;
                    };
                    self.stats.rx_datagrams += 1;
                    if meta.src == own {
                        self.stats.rx_own += 1;
                        continue;
                    }
                    verbs.handle_datagram(now, meta.src, meta.dst_ip, d);
                }
                read += n;
                if n < rx.capacity() {
                    break;
                }
                if read >= max {
                    full = true;
                    break;
                }
            }
        }
        self.more = full.then_some(now);
        self.ready = !readiness_driven;
        Ok(read)
    }
}
