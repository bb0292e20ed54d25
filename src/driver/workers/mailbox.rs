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

/// The newest value of one kind of message for a loop whose queue may be full, kept until it
/// is queued: a newer value replaces one not queued yet, so the newest always arrives and an
/// older one never after it.
#[derive(Debug)]
pub struct Latest<T> {
    pending: Option<Arc<T>>,
}

impl<T> Default for Latest<T> {
    fn default() -> Self {
        Self { pending: None }
    }
}

impl<T> Latest<T> {
    /// `v` is the newest value: it replaces any not queued yet.
    pub fn set(&mut self, v: Arc<T>) {
        self.pending = Some(v);
    }

    /// Queues the pending value with `post` (false: no room, kept for the next call); true
    /// when nothing is left pending.
    pub fn flush(&mut self, post: impl FnOnce(Arc<T>) -> bool) -> bool {
        match self.pending.take() {
            None => true,
            Some(v) => {
                if post(Arc::clone(&v)) {
                    true
                } else {
                    self.pending = Some(v);
                    false
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The order a loop keeps (`daemon/run.rs`, the workers' loop): clear the wake-up, then
    /// drain. A message posted between the drain and the next poll then wakes that poll at
    /// once; cleared after the drain (the order control's loop had), the same message waits
    /// for the poll's timeout (a second there). Measured with a real poll, with the post
    /// made in that window.
    #[test]
    fn a_message_posted_after_the_drain_wakes_the_next_poll() {
        let mut poll = mio::Poll::new().unwrap();
        let wake = Wake::new(poll.registry(), Token(0)).unwrap();
        let (tx, rx) = mailbox::<u32>(4, &wake);
        let mut events = mio::Events::with_capacity(4);
        let timeout = Duration::from_millis(500);
        let mut turn = |clear_first: bool| {
            tx.post(1);
            poll.poll(&mut events, Some(timeout)).unwrap();
            if clear_first {
                wake.clear();
            }
            while rx.try_recv().is_ok() {}
            // Posted in the window: after the drain, before the next poll.
            tx.post(2);
            if !clear_first {
                wake.clear();
            }
            let t0 = Instant::now();
            poll.poll(&mut events, Some(timeout)).unwrap();
            let waited = t0.elapsed();
            while rx.try_recv().is_ok() {}
            wake.clear();
            waited
        };
        let cleared_first = turn(true);
        assert!(cleared_first < timeout / 2, "{cleared_first:?}");
        let cleared_after = turn(false);
        assert!(cleared_after >= timeout, "{cleared_after:?}");
    }

    /// Through a queue of one that the receiving loop has not read: the value set while it is
    /// full waits, a newer one replaces it, and once there is room the newest arrives and
    /// nothing older after it.
    #[test]
    fn the_newest_value_arrives_once_there_is_room() {
        let poll = mio::Poll::new().unwrap();
        let wake = Wake::new(poll.registry(), Token(0)).unwrap();
        let (tx, rx) = mailbox::<Arc<u32>>(1, &wake);
        let mut latest = Latest::default();
        latest.set(Arc::new(1));
        assert!(latest.flush(|v| tx.post(v)));
        latest.set(Arc::new(2));
        assert!(!latest.flush(|v| tx.post(v)), "full: kept");
        latest.set(Arc::new(3));
        assert!(!latest.flush(|v| tx.post(v)));
        assert_eq!(rx.try_recv().map(|v| *v), Ok(1));
        assert!(latest.flush(|v| tx.post(v)));
        assert!(latest.flush(|v| tx.post(v)), "nothing left");
        assert_eq!(rx.try_recv().map(|v| *v), Ok(3));
        assert!(rx.try_recv().is_err(), "2 never arrives");
    }
}
