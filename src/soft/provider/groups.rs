//! The receive side of the software provider's IP multicast: a socket per joined group, all
//! behind one inner poll, brought in line with the groups the engine's QPs are attached to.

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use super::{SoftProvider, MAX_RECV_BATCH};
use crate::soft::config::SoftConfig;
use crate::soft::transport::UdpTransport;
use crate::sys::ifaddr;

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

impl SoftProvider {
    /// The group sockets' poll, with the unicast socket set up to send to groups; `None`
    /// (multicast off) when the bind interface carries no multicast or the socket refuses to
    /// send it.
    pub(super) fn multicast_setup(
        transport: &UdpTransport,
        cfg: &SoftConfig,
    ) -> io::Result<Option<GroupSockets>> {
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
        Ok(Some(GroupSockets {
            ifindex,
            poll: Poll::new()?,
            events: Events::with_capacity(GROUP_EVENTS),
            sockets: Vec::new(),
            synced: None,
            ready: true,
            more: None,
        }))
    }

    /// Opens a socket for each group the engine's attached MGIDs map to that has none, and
    /// closes (leaves) those of groups no longer attached; nothing when no group came or went.
    pub(super) fn sync_groups(&mut self) {
        let Some(g) = self.groups.as_mut() else {
            return;
        };
        let generation = self.verbs.multicast_generation();
        if g.synced == Some(generation) {
            return;
        }
        g.synced = Some(generation);
        let wanted = self.verbs.ip_multicast_groups();
        g.sockets.retain(|(ip, sock)| {
            let keep = wanted.contains(ip);
            if !keep {
                // Closing the socket leaves the group (and drops it from the poll).
                let _ = g
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&sock.as_raw_fd()));
                tracing::debug!(group = %ip, "left IP multicast group");
            }
            keep
        });
        let local = self.transport.local_addr();
        for ip in wanted {
            if g.sockets.iter().any(|(have, _)| *have == ip) {
                continue;
            }
            let joined = UdpTransport::bind_group(ip, local.port(), g.ifindex, local.ip())
                .and_then(|sock| {
                    let token = Token(g.sockets.len());
                    g.poll.registry().register(
                        &mut SourceFd(&sock.as_raw_fd()),
                        token,
                        Interest::READABLE,
                    )?;
                    Ok(sock)
                });
            match joined {
                Ok(sock) => {
                    tracing::debug!(group = %ip, "joined IP multicast group");
                    g.sockets.push((ip, sock));
                    g.ready = true;
                }
                Err(e) => {
                    self.mcast_stats.join_errors += 1;
                    tracing::warn!(group = %ip, error = %e, "could not join IP multicast group");
                }
            }
        }
    }

    /// Reads the group sockets (when readiness or a full last read says there may be
    /// something), at most [`MAX_RECV_BATCH`] datagrams in all; returns how many were
    /// handed to the engine.
    pub(super) fn read_groups(&mut self, now: Instant) -> io::Result<usize> {
        let Some(g) = self.groups.as_mut() else {
            return Ok(0);
        };
        if !g.ready && g.more.is_none() {
            return Ok(0);
        }
        // Taking the inner poll's events re-arms its readiness edge; which socket they name
        // does not matter, all are read.
        g.poll.poll(&mut g.events, Some(Duration::ZERO))?;
        let own = self.transport.local_addr();
        let mut read = 0;
        let mut full = false;
        for (_, sock) in &g.sockets {
            loop {
                let n = sock.recv_batch(&mut self.rx)?;
                for i in 0..n {
                    let Some((meta, d)) = sock.datagram(&self.rx, i) else {
                        continue;
                    };
                    self.mcast_stats.rx_datagrams += 1;
                    if meta.src == own {
                        self.mcast_stats.rx_own += 1;
                        continue;
                    }
                    self.verbs.handle_datagram(now, meta.src, meta.dst_ip, d);
                }
                read += n;
                if n < self.rx.capacity() {
                    break;
                }
                if read >= MAX_RECV_BATCH {
                    full = true;
                    break;
                }
            }
        }
        g.more = full.then_some(now);
        g.ready = !self.readiness_driven;
        Ok(read)
    }
}
