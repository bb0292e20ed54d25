//! Bounded queues between the event loops of one interface's threads, each of which wakes the
//! loop it feeds.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use mio::{Registry, Token, Waker};

/// Wakes one event loop; many senders share it, and a wake-up already pending is not sent
/// again (one `write` to an eventfd per batch, not per message).
#[derive(Debug)]
pub struct Wake {
    waker: Waker,
    pending: AtomicBool,
}

impl Wake {
    /// A wake-up for the loop of `registry`, reported on `token`.
    ///
    /// # Errors
    /// The eventfd could not be made or registered.
    pub fn new(registry: &Registry, token: Token) -> io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            waker: Waker::new(registry, token)?,
            pending: AtomicBool::new(false),
        }))
    }

    /// Wakes the loop unless a wake-up is pending already.
    pub fn notify(&self) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            // A failed wake-up leaves the loop to its next deadline (at most a second).
            let _ = self.waker.wake();
        }
    }

    /// The loop is about to read its queues: a message sent from now on wakes it again.
    pub fn clear(&self) {
        self.pending.store(false, Ordering::Release);
    }
}

/// The sending end of a bounded queue into another loop.
#[derive(Debug)]
pub struct Mailbox<T> {
    tx: SyncSender<T>,
    wake: Arc<Wake>,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            wake: Arc::clone(&self.wake),
        }
    }
}

impl<T> Mailbox<T> {
    /// Queues `m` and wakes the loop; false (and `m` dropped) when the queue is full or its
    /// loop is gone.
    pub fn post(&self, m: T) -> bool {
        match self.tx.try_send(m) {
            Ok(()) => {
                self.wake.notify();
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

/// A queue of `cap` messages into the loop that `wake` wakes.
pub fn mailbox<T>(cap: usize, wake: &Arc<Wake>) -> (Mailbox<T>, Receiver<T>) {
    let (tx, rx) = sync_channel(cap);
    (
        Mailbox {
            tx,
            wake: Arc::clone(wake),
        },
        rx,
    )
}
