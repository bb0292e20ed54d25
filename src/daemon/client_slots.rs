//! [`ClientSlots`]: the non-blocking clients of a listener the event loop drives, each in a
//! slot with its own mio token (`first_client + slot`), shared by the control socket and the
//! metrics listener.
//!
//! What one turn does is bounded: at most the caller's `per_turn` accepts, and one step per
//! client that readiness, a bound or its deadline made due. What a client holds is bounded:
//! one of a fixed number of slots and a deadline per phase of its exchange. Who may hold one
//! is decided at `accept`: a connection the server turns away ([`Admission::admit`] says no)
//! is answered and closed at once, and when every slot is taken the client that has waited
//! longest without sending anything gives its slot up to the newcomer, so idle connections
//! can delay no one (a connection finds a slot unless every client is mid-exchange). The slots read no clock (`now` comes in with every
//! turn) and never block; what an exchange reads and writes is the caller's step.

use std::io;
use std::time::{Duration, Instant};

use mio::event::Source;
use mio::{Interest, Registry, Token};

/// One accepted connection.
#[derive(Debug)]
pub(crate) struct Slot<S, E> {
    pub(crate) stream: S,
    /// When the current phase of the exchange times out.
    pub(crate) deadline: Instant,
    /// The socket may make progress: readiness was reported, or the last turn stopped at a
    /// bound rather than at `WouldBlock` (the step sets it then).
    pub(crate) ready: bool,
    /// WRITABLE (instead of READABLE) is registered: the answer is being written.
    writable: bool,
    /// Where the exchange is, the server's own.
    pub(crate) exchange: E,
    /// When it was accepted: the oldest idle client gives way first.
    accepted_at: Instant,
}

/// What one step left a client in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Still reading its request.
    Reading,
    /// Writing its answer: it only waits for WRITABLE now.
    Writing,
    /// Done with (answered, timed out or failed): deregister and close.
    Close,
}

/// A fixed number of client slots, the registration they share with their listener, and
/// whether the listener may have connections waiting.
///
/// Unregistered (in tests), every client is tried every turn and the listener every turn.
#[derive(Debug)]
pub(crate) struct ClientSlots<S, E> {
    /// What the log calls these clients (`control`, `metrics`).
    label: &'static str,
    /// The registry, the listener's token and the first client token.
    registration: Option<(Registry, Token, usize)>,
    /// The listener may have connections waiting (reported, or the accept bound was hit).
    listener_ready: bool,
    /// When to try the listener again after an accept failed ([`ACCEPT_RETRY`]).
    retry_at: Option<Instant>,
    /// Slot `i` is the client with token `first_client + i`.
    slots: Vec<Option<Slot<S, E>>>,
    /// The `now` of the last turn.
    now: Option<Instant>,
}

/// How long after a failed accept the listener is tried again: soon enough that a client
/// waits no longer than its connection takes, rarely enough that a process out of
/// descriptors does not spin on it.
pub(crate) const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Descriptors a listener with `max` client slots holds at most: the listener, the clone of
/// the registry its clients register with, one per slot, and one connection accepted only to
/// be answered and closed.
pub(crate) const fn descriptors(max: usize) -> usize {
    max + 3
}

impl<S: Source, E> ClientSlots<S, E> {
    /// `max` empty slots; `label` names the clients in the log.
    pub(crate) fn new(label: &'static str, max: usize) -> Self {
        Self {
            label,
            registration: None,
            listener_ready: true,
            retry_at: None,
            slots: (0..max).map(|_| None).collect(),
            now: None,
        }
    }

    /// Clients holding a slot.
    pub(crate) fn clients(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Registers `listener` with `registry` under `listener_token`, and every client admitted
    /// later under `first_client + slot`. Registering again moves the listener (and closes
    /// the clients).
    ///
    /// # Errors
    /// The registry's.
    pub(crate) fn register(
        &mut self,
        registry: &Registry,
        listener: &mut impl Source,
        listener_token: Token,
        first_client: Token,
    ) -> io::Result<()> {
        for slot in 0..self.slots.len() {
            self.close(slot);
        }
        if let Some((old, _, _)) = self.registration.take() {
            old.deregister(listener)?;
        }
        registry.register(listener, listener_token, Interest::READABLE)?;
        self.listener_ready = true;
        self.registration = Some((registry.try_clone()?, listener_token, first_client.0));
        Ok(())
    }

    /// Takes note of a readiness event; returns whether `token` is one of these.
    pub(crate) fn note_readiness(&mut self, token: Token) -> bool {
        let Some((_, listener, first)) = &self.registration else {
            return false;
        };
        if token == *listener {
            self.listener_ready = true;
            return true;
        }
        let Some(slot) = token
            .0
            .checked_sub(*first)
            .filter(|&s| s < self.slots.len())
        else {
            return false;
        };
        if let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) {
            c.ready = true;
        }
        true
    }

    /// When the next turn has work: at once while connections or answer bytes wait behind a
    /// per-turn bound, else the earliest client deadline.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let registered = self.registration.is_some();
        let mut next: Option<Instant> = None;
        for c in self.slots.iter().flatten() {
            let t = if c.ready && registered {
                self.now.unwrap_or(c.deadline)
            } else {
                c.deadline
            };
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        match self.now {
            Some(now) if registered && self.listener_ready => Some(now),
            _ => [next, self.retry_at].into_iter().flatten().min(),
        }
    }

    /// The first half of a turn at `now`: accepts up to `per_turn` connections from `accept`
    /// (the listener's non-blocking accept) if the listener may have some waiting, giving each
    /// a free slot (its exchange from [`Admission::admit`], `timeout` for its first phase) or
    /// handing it to [`Admission::refuse`]. `listener_ready` stays set if the bound stopped it.
    /// A connection aborted before its accept is passed over. Any other error but
    /// `WouldBlock` and `Interrupted` (no descriptor left, `EMFILE` or `ENFILE`, above all)
    /// ends the accepting and is returned; the listener is tried again [`ACCEPT_RETRY`] later,
    /// as its connections stay waiting in its backlog and, edge-triggered, it reports no
    /// readiness for them again.
    pub(crate) fn accept(
        &mut self,
        now: Instant,
        per_turn: usize,
        timeout: Duration,
        mut accept: impl FnMut() -> io::Result<S>,
        admission: &mut impl Admission<S, E>,
    ) -> io::Result<()> {
        self.now = Some(now);
        if self.retry_at.is_some_and(|t| now >= t) {
            self.retry_at = None;
            self.listener_ready = true;
        }
        if !(self.listener_ready || self.registration.is_none()) {
            return Ok(());
        }
        for _ in 0..per_turn {
            match accept() {
                Ok(stream) => self.admit(stream, now, timeout, admission),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.listener_ready = false;
                    return Ok(());
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    self.listener_ready = false;
                    self.retry_at = Some(now + ACCEPT_RETRY);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The second half of a turn at `now`: steps every client that is due (readiness, a
    /// bound, or its deadline passed), and closes or turns to writing the clients as the
    /// step says; a step's error drops its client (logged at debug).
    pub(crate) fn step_due(
        &mut self,
        now: Instant,
        mut step: impl FnMut(&mut Slot<S, E>) -> io::Result<Step>,
    ) {
        let poll_all = self.registration.is_none();
        for slot in 0..self.slots.len() {
            let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            if !(c.ready || poll_all || now >= c.deadline) {
                continue;
            }
            c.ready = false;
            let writable = c.writable;
            match step(c) {
                Ok(Step::Reading) => {}
                Ok(Step::Writing) => {
                    if !writable {
                        self.want_writable(slot);
                    }
                }
                Ok(Step::Close) => self.close(slot),
                Err(e) => {
                    tracing::debug!(error = %e, "{} client dropped", self.label);
                    self.close(slot);
                }
            }
        }
    }

    /// Gives an accepted connection the server lets in a slot and its token: a free one, else
    /// the one of the client that has waited longest without sending anything (closed), else
    /// none (the connection goes to `refuse`). A connection the server turns away goes to
    /// `deny` and never holds a slot.
    fn admit<A: Admission<S, E>>(
        &mut self,
        mut stream: S,
        now: Instant,
        timeout: Duration,
        admission: &mut A,
    ) {
        if !admission.allowed(&stream) {
            admission.deny(stream);
            return;
        }
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                let oldest_idle = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
                    .filter(|(_, c)| A::idle(&c.exchange))
                    .min_by_key(|(_, c)| c.accepted_at)
                    .map(|(i, _)| i);
                let Some(idle) = oldest_idle else {
                    admission.refuse(stream);
                    return;
                };
                tracing::debug!(
                    "{} client idle since its accept gives its slot up",
                    self.label
                );
                admission.evicted();
                self.close(idle);
                idle
            }
        };
        if let Some((registry, _, first)) = &self.registration {
            if let Err(e) = registry.register(&mut stream, Token(first + slot), Interest::READABLE)
            {
                tracing::debug!(error = %e, "{} client dropped", self.label);
                return;
            }
        }
        let exchange = admission.admit(&stream);
        if let Some(s) = self.slots.get_mut(slot) {
            *s = Some(Slot {
                stream,
                deadline: now + timeout,
                accepted_at: now,
                // The request may have arrived before the accept.
                ready: true,
                writable: false,
                exchange,
            });
        }
    }

    /// Asks for WRITABLE on a client writing its answer (it only waits for that then).
    fn want_writable(&mut self, slot: usize) {
        let Some((registry, _, first)) = &self.registration else {
            return;
        };
        if let Some(c) = self.slots.get_mut(slot).and_then(Option::as_mut) {
            match registry.reregister(&mut c.stream, Token(first + slot), Interest::WRITABLE) {
                Ok(()) => c.writable = true,
                Err(e) => {
                    tracing::debug!(error = %e, "{} client dropped", self.label);
                    self.close(slot);
                }
            }
        }
    }

    /// Deregisters and closes the client in `slot`.
    fn close(&mut self, slot: usize) {
        let Some(mut c) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        if let Some((registry, _, _)) = &self.registration {
            let _ = registry.deregister(&mut c.stream);
        }
    }
}

/// What a server does with the connections it accepts.
pub(crate) trait Admission<S, E> {
    /// Whether `stream` may talk to the server (if not, [`Admission::deny`] gets it).
    fn allowed(&mut self, stream: &S) -> bool;
    /// `stream` got a slot (and its token): its exchange; count it.
    fn admit(&mut self, stream: &S) -> E;
    /// `stream` may not talk to the server: answer it briefly (never waiting), count it, drop it.
    fn deny(&mut self, stream: S);
    /// No slot is free for `stream`, and no client is idle: answer it briefly (never waiting),
    /// count it, drop it.
    fn refuse(&mut self, stream: S);
    /// A client that had sent nothing gave its slot up to a newcomer: count it.
    fn evicted(&mut self);
    /// The client of `exchange` has sent nothing yet.
    fn idle(exchange: &E) -> bool;
}

/// Most bytes a client sent beyond its request that are read and discarded before its socket
/// is closed (closing a socket with unread data resets the connection, and the client could
/// lose its answer).
const DISCARD_BYTES: usize = 16 << 10;

/// Writes `answer` from byte `*sent` on, at most `per_turn` bytes, as far as the socket takes
/// them without blocking. `Ok(true)` once all of it is written; `Ok(false)` if more is to
/// come (with `ready` set if the bound, not the socket, stopped it).
pub(crate) fn write_answer(
    stream: &mut impl io::Write,
    ready: &mut bool,
    answer: &[u8],
    sent: &mut usize,
    per_turn: usize,
) -> io::Result<bool> {
    let budget_end = (*sent + per_turn).min(answer.len());
    while *sent < answer.len() {
        if *sent >= budget_end {
            // More to write and the socket did not say no: carry on next turn.
            *ready = true;
            return Ok(false);
        }
        let chunk = answer.get(*sent..budget_end).unwrap_or_default();
        match stream.write(chunk) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => *sent += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads and drops what the client sent beyond its request, up to [`DISCARD_BYTES`] and
/// without waiting.
pub(crate) fn discard_input(stream: &mut impl io::Read) {
    let mut sink = [0u8; 1024];
    let mut left = DISCARD_BYTES;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(k) => left = left.saturating_sub(k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::net::{UnixListener, UnixStream};
    use mio::Poll;

    /// Lets everyone in and counts them.
    struct Everyone(usize);

    impl Admission<UnixStream, ()> for Everyone {
        fn allowed(&mut self, _: &UnixStream) -> bool {
            true
        }
        fn admit(&mut self, _: &UnixStream) {
            self.0 += 1;
        }
        fn deny(&mut self, _: UnixStream) {}
        fn refuse(&mut self, _: UnixStream) {}
        fn evicted(&mut self) {}
        fn idle((): &()) -> bool {
            true
        }
    }

    const CLIENT: Duration = Duration::from_secs(1);

    #[test]
    fn an_accept_out_of_descriptors_is_tried_again_on_a_timer_not_every_turn() {
        let poll = Poll::new().unwrap();
        let path = std::env::temp_dir().join(format!("ipoib-cm-slots-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut listener = UnixListener::bind(&path).unwrap();
        let mut slots = ClientSlots::<UnixStream, ()>::new("test", 4);
        slots
            .register(poll.registry(), &mut listener, Token(0), Token(1))
            .unwrap();
        let mut admitted = Everyone(0);
        let t0 = Instant::now();
        let mut tries = 0;
        let emfile = |tries: &mut usize| {
            *tries += 1;
            Err(io::Error::from_raw_os_error(libc::EMFILE))
        };
        let e = slots
            .accept(t0, 8, CLIENT, || emfile(&mut tries), &mut admitted)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        assert_eq!(tries, 1, "one try per turn, not a spin");
        assert_eq!(slots.poll_timeout(), Some(t0 + ACCEPT_RETRY));
        // No readiness comes for the waiting connection; before the retry, nothing is tried.
        let early = t0 + ACCEPT_RETRY / 2;
        slots
            .accept(early, 8, CLIENT, || emfile(&mut tries), &mut admitted)
            .unwrap();
        assert_eq!(tries, 1);
        // At the retry the descriptors are back: the waiting connection is taken.
        let (waiting, _peer) = UnixStream::pair().unwrap();
        let mut waiting = Some(waiting);
        let retry = t0 + ACCEPT_RETRY;
        slots
            .accept(
                retry,
                8,
                CLIENT,
                || {
                    waiting
                        .take()
                        .ok_or_else(|| io::ErrorKind::WouldBlock.into())
                },
                &mut admitted,
            )
            .unwrap();
        assert_eq!(admitted.0, 1);
        assert_eq!(slots.clients(), 1);
        // A connection aborted before its accept does not stop the ones behind it.
        let (behind, _peer) = UnixStream::pair().unwrap();
        let mut queue = vec![Ok(behind), Err(io::ErrorKind::ConnectionAborted.into())];
        slots.note_readiness(Token(0));
        slots
            .accept(
                retry,
                8,
                CLIENT,
                || {
                    queue
                        .pop()
                        .unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into()))
                },
                &mut admitted,
            )
            .unwrap();
        assert_eq!(admitted.0, 2);
        let _ = std::fs::remove_file(&path);
    }
}
