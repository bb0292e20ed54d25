//! What the workers hand each other beside messages, each bounded: datagrams one worker's
//! socket received for another's QPs, and the bytes of packets followers hand control to send.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::time::Instant;

use super::mailbox::Mailbox;
use crate::verbs::Provider;

/// Datagrams for one worker that others received (a GRO buffer of several workers' QPs) and
/// hand over, queued at most; more are dropped (the RC sender retransmits them).
pub const FOREIGN_CAP: usize = 1024;

/// Bytes of IP packets the followers hand to control to send (multicast and broadcast, a peer
/// that takes one connection, datagram sends) queued at most, together: more are dropped and
/// counted (`tx_dropped`), as a full send queue drops them. What bounds their memory, which the
/// daemon's stated need counts.
pub const HANDED_BYTES_MAX: usize = 16 << 20;

/// The bytes of packets the followers handed to control and control has not taken yet,
/// against [`HANDED_BYTES_MAX`].
#[derive(Debug, Default)]
pub(super) struct HandedBytes(AtomicUsize);

impl HandedBytes {
    /// Takes room for `bytes`; false (nothing taken) where it would pass the bound.
    pub(super) fn take(&self, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&n| n <= HANDED_BYTES_MAX)
            })
            .is_ok()
    }

    /// Gives back the room of `bytes` taken.
    pub(super) fn release(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A datagram one worker received for another: its sender and bytes.
pub(super) type Foreign = (SocketAddr, Vec<u8>);

/// Where every worker's foreign datagrams go (index: the worker), and this loop's own.
pub(super) struct ForeignRoutes {
    pub(super) to: Vec<Mailbox<Foreign>>,
    pub(super) inbox: Receiver<Foreign>,
}

impl ForeignRoutes {
    /// Hands the datagrams `prov` received for other workers to them; returns how many
    /// were dropped (a full queue).
    pub(super) fn send<P: Provider>(&self, prov: &mut P) -> u64 {
        let mut dropped = 0;
        prov.take_foreign(&mut |worker, src, d| {
            let sent = self
                .to
                .get(usize::from(worker))
                .is_some_and(|m| m.post((src, d.to_vec())));
            dropped += u64::from(!sent);
        });
        dropped
    }

    /// Gives `prov` what the other workers received for it (bounded); true if any.
    pub(super) fn accept<P: Provider>(&self, now: Instant, prov: &mut P) -> bool {
        let mut any = false;
        for _ in 0..FOREIGN_CAP {
            let Ok((src, d)) = self.inbox.try_recv() else {
                break;
            };
            prov.accept_foreign(now, src, &d);
            any = true;
        }
        any
    }
}
