//! The TUN side of a turn: packets between the TUN device and the endpoint's buffers.

use std::io;
use std::time::Instant;

use crate::ipoib::{Endpoint, TUN_BUFFER_OFFSET};
use crate::sys::tun::Tun;
use crate::verbs::Verbs;

/// What [`read_tun`] did.
pub(super) enum TunRead {
    /// Read and handled a packet.
    Packet,
    /// Nothing was waiting.
    Empty,
    /// Read nothing: no send buffer is free.
    NoSendBuffer,
}

/// Reads one packet from the TUN device into one of the endpoint's send buffers (a packet for
/// an established connection then leaves from there) and hands it over. With none free,
/// reads nothing, unless `draining` (shutting down: the packet is read into `buf` and handed
/// over, to be dropped or queued as the endpoint sees fit).
pub(super) fn read_tun<V: Verbs>(
    tun: &Tun,
    ep: &mut Endpoint,
    v: &mut V,
    now: Instant,
    buf: &mut [u8],
    draining: bool,
) -> io::Result<TunRead> {
    let Some(b) = ep.tun_buffer() else {
        if !draining {
            return Ok(TunRead::NoSendBuffer);
        }
        let Some(n) = tun.recv(buf)? else {
            return Ok(TunRead::Empty);
        };
        ep.handle_tun_packet(now, v, buf.get(..n).unwrap_or_default());
        return Ok(TunRead::Packet);
    };
    let got = match v
        .pools_mut()
        .get_mut(b)
        .ok()
        .and_then(|room| room.get_mut(TUN_BUFFER_OFFSET..))
    {
        Some(room) => tun.recv(room),
        None => Ok(None),
    };
    match got {
        Ok(Some(n)) => {
            ep.handle_tun_buffer(now, v, b, n);
            Ok(TunRead::Packet)
        }
        Ok(None) => {
            ep.return_tun_buffer(b);
            Ok(TunRead::Empty)
        }
        Err(e) => {
            ep.return_tun_buffer(b);
            Err(e)
        }
    }
}

/// What the TUN device took from the node: the host's receive side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TunStats {
    /// IP packets written to the TUN device.
    pub written: u64,
    /// Their bytes.
    pub written_bytes: u64,
    /// Packets the TUN device refused (its queue was full, or the write failed).
    pub write_drops: u64,
}

/// Writes the packets the endpoint delivered to the TUN device (straight from their receive
/// buffers), counting them in `stats`; returns whether it wrote any.
pub(super) fn write_tun<V: Verbs>(
    tun: &Tun,
    ep: &mut Endpoint,
    v: &mut V,
    stats: &mut TunStats,
) -> bool {
    let mut wrote = false;
    ep.drain_tun(v, |p| match tun.send(p) {
        Ok(true) => {
            wrote = true;
            stats.written += 1;
            stats.written_bytes += p.len() as u64;
        }
        Ok(false) => stats.write_drops += 1,
        Err(e) => {
            stats.write_drops += 1;
            tracing::debug!(error = %e, "TUN write failed");
        }
    });
    wrote
}
