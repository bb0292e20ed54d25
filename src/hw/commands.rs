//! The QP commands the event loop need not wait for, run on a thread of their own: the
//! destroy of a drained QP ([`Verbs::retire_qp`]), the creation of RC QPs ahead of need (a
//! small stash per kind of QP the caller creates again and again, which `create_qp` takes
//! from), and the moves [`Verbs::begin_moves`] starts (a connection's INIT, RTR and RTS, a
//! teardown's ERR). On a ConnectX each is a firmware command of about a millisecond, and a
//! burst of connections set up or reaped would hold every packet behind them. The result of
//! a move wakes the caller's loop through an eventfd (the provider's third descriptor).
//!
//! Lifetimes: a job names device objects by their raw handles. The QP of a destroy job is the
//! thread's alone (the caller forgot it); the QP of a move job is used by no verb of the
//! caller's until the job is answered (each such verb waits for it first, `qp::settle`), and
//! a destroy of it goes behind it in the queue; the PD, CQs and SRQ a create job names
//! outlive it, for every destroy of such an object, and the context's close, first waits for
//! the thread to finish what it was given and destroys the stash ([`QpCommands::quiesce`]).
//!
//! [`Verbs::retire_qp`]: crate::verbs::Verbs::retire_qp
//! [`Verbs::begin_moves`]: crate::verbs::Verbs::begin_moves

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use crate::verbs::{QpInit, QpType};

/// QPs of one kind kept created ahead.
pub(super) const STASH_DEPTH: usize = 8;

/// Kinds of QP with a stash (the daemon creates two: its RX and its TX connections' QPs);
/// QPs of any other kind are created when asked.
pub(super) const MAX_KINDS: usize = 4;

/// Jobs given to the thread and not taken by it yet; beyond, a command runs on the caller's
/// thread.
const QUEUE: usize = 256;

/// What makes two QPs interchangeable before their first modify: their [`QpInit`], but for
/// `sq_sig_all`, which is the wrapper's own (the device never sees it).
pub(super) type QpKind = QpInit;

/// The kind of a QP created with `init`.
pub(super) fn kind_of(init: &QpInit) -> QpKind {
    QpInit {
        sq_sig_all: false,
        ..*init
    }
}

/// What `ibv_create_qp` is given for a QP of some kind: the raw handles of its PD, CQs and
/// SRQ (null: none) and its queue sizes.
#[derive(Debug, Clone, Copy)]
pub(super) struct RawQpInit {
    pub(super) pd: *mut ffi::ibv_pd,
    pub(super) send_cq: *mut ffi::ibv_cq,
    pub(super) recv_cq: *mut ffi::ibv_cq,
    pub(super) srq: *mut ffi::ibv_srq,
    pub(super) qp_type: ffi::ibv_qp_type::Type,
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
}

/// A QP the device created: its handle and the inline size it granted.
#[derive(Debug, Clone, Copy)]
pub(super) struct CreatedQp {
    pub(super) raw: *mut ffi::ibv_qp,
    pub(super) max_inline: u32,
}

/// The stash's bookkeeping, apart from the device: which kinds are kept, the QPs ready of
/// each, and how many are being created.
#[derive(Debug)]
pub(super) struct Stash<Q> {
    kinds: Vec<Kept<Q>>,
}

#[derive(Debug)]
struct Kept<Q> {
    kind: QpKind,
    ready: Vec<Q>,
    asked: usize,
}

impl<Q> Default for Stash<Q> {
    fn default() -> Self {
        Self { kinds: Vec::new() }
    }
}

impl<Q> Stash<Q> {
    /// A ready QP of `kind`, if there is one.
    pub(super) fn take(&mut self, kind: &QpKind) -> Option<Q> {
        self.kinds
            .iter_mut()
            .find(|k| k.kind == *kind)
            .and_then(|k| k.ready.pop())
    }

    /// A QP of `kind` was just created for the caller: how many more to create ahead (and
    /// now counted as asked for). RC kinds only, the first [`MAX_KINDS`] of them, and only
    /// from the second QP of a kind on: a caller that creates one QP of a kind (a tool, a
    /// test) gets none ahead.
    pub(super) fn ask(&mut self, kind: &QpKind) -> usize {
        if kind.qp_type != QpType::Rc {
            return 0;
        }
        let Some(i) = self.kinds.iter().position(|k| k.kind == *kind) else {
            if self.kinds.len() < MAX_KINDS {
                self.kinds.push(Kept {
                    kind: *kind,
                    ready: Vec::new(),
                    asked: 0,
                });
            }
            return 0;
        };
        let k = &mut self.kinds[i];
        let more = STASH_DEPTH.saturating_sub(k.ready.len() + k.asked);
        k.asked += more;
        more
    }

    /// One asked for was made: kept, or handed back when its kind is no longer kept.
    pub(super) fn arrived(&mut self, kind: &QpKind, q: Q) -> Option<Q> {
        match self.kinds.iter_mut().find(|k| k.kind == *kind) {
            Some(k) => {
                k.asked = k.asked.saturating_sub(1);
                k.ready.push(q);
                None
            }
            None => Some(q),
        }
    }

    /// One asked for could not be made.
    pub(super) fn failed(&mut self, kind: &QpKind) {
        if let Some(k) = self.kinds.iter_mut().find(|k| k.kind == *kind) {
            k.asked = k.asked.saturating_sub(1);
        }
    }

    /// Forgets every kind (none is asked for again until created again); the QPs that were
    /// ready, for the caller to destroy.
    pub(super) fn clear(&mut self) -> Vec<Q> {
        self.kinds.drain(..).flat_map(|k| k.ready).collect()
    }

    /// QPs ready, of every kind.
    pub(super) fn ready(&self) -> usize {
        self.kinds.iter().map(|k| k.ready.len()).sum()
    }
}

/// A raw libibverbs handle handed to the command thread or back.
#[derive(Debug)]
struct Handed<T>(T);

// SAFETY: libibverbs verbs may be called from any thread. The handles a job carries are used
// by one thread at a time: a destroyed QP's only by the command thread (the caller forgot
// it), a created QP's only by the caller once it is handed back, a moved QP's by no verb of
// the caller's until the moves are answered (`qp::settle` waits for them; a retired QP's
// destroy is queued behind them), and the PD, CQs and SRQ of a create job stay alive until
// the thread is done with them (`QpCommands::quiesce`).
unsafe impl<T> Send for Handed<T> {}

enum Job {
    Create(QpKind, RawQpInit),
    Destroy(*mut ffi::ibv_qp),
    Modify(RawMoves),
}

enum Done {
    Created(QpKind, Result<CreatedQp, i32>),
    Destroyed(Result<(), i32>),
    Modified(MovesDone),
}

/// The `ibv_modify_qp` calls of one [`Verbs::begin_moves`](crate::verbs::Verbs::begin_moves),
/// built and checked by the caller: each attribute struct with its mask.
pub(super) struct RawMoves {
    pub(super) qp: *mut ffi::ibv_qp,
    pub(super) qpn: u32,
    /// Names this job among the QP's (a QPN is reused once its QP is destroyed).
    pub(super) token: u64,
    pub(super) steps: Vec<(ffi::ibv_qp_attr, i32)>,
}

/// What became of [`RawMoves`]: how many steps were done, and the errno of the one that
/// failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MovesDone {
    pub(super) qpn: u32,
    pub(super) token: u64,
    pub(super) done: usize,
    pub(super) result: Result<(), i32>,
}

/// The thread, its two queues and what it was given.
#[derive(Debug)]
struct Worker {
    jobs: Option<SyncSender<Handed<Job>>>,
    /// Each answer with the time its job took on the thread.
    done: Receiver<Handed<(Done, Duration)>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Create(k, _) => write!(f, "Create({k:?})"),
            Self::Destroy(q) => write!(f, "Destroy({q:?})"),
            Self::Modify(m) => write!(f, "Modify({}, {} steps)", m.qpn, m.steps.len()),
        }
    }
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Created(k, r) => write!(f, "Created({k:?}, {:?})", r.map(|c| c.raw)),
            Self::Destroyed(r) => write!(f, "Destroyed({r:?})"),
            Self::Modified(m) => write!(f, "Modified({m:?})"),
        }
    }
}

/// What the command thread did, as counted when its results come back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct OffLoop {
    pub(super) created: u64,
    pub(super) destroyed: u64,
    /// `ibv_modify_qp` calls made (failed ones included).
    pub(super) modified: u64,
    pub(super) failed: u64,
    /// Time the thread spent in `ibv_create_qp` (failed calls included).
    pub(super) create_time: Duration,
    /// Time the thread spent in `ibv_modify_qp` (failed calls included).
    pub(super) modify_time: Duration,
    /// Time the thread spent in `ibv_destroy_qp` (failed calls included).
    pub(super) destroy_time: Duration,
}

/// The command thread (started at its first job) and the stash. See the
/// [module documentation](self).
#[derive(Debug, Default)]
pub(super) struct QpCommands {
    worker: Option<Worker>,
    /// The thread could not be started: every command runs on the caller's thread.
    no_thread: bool,
    stash: Stash<CreatedQp>,
    /// Jobs given and not answered.
    in_flight: usize,
    /// Moves answered, for the caller to take ([`QpCommands::take_moved`]).
    moved: VecDeque<MovesDone>,
    /// Written by the thread when it answered a move, read by the caller's loop (`None`:
    /// no eventfd, and no moves off the caller's thread).
    wake: Option<OwnedFd>,
    pub(super) counts: OffLoop,
}

impl QpCommands {
    /// No thread yet (it starts at its first job), and the eventfd its moves' results wake
    /// the caller's loop with.
    pub(super) fn new() -> Self {
        // SAFETY: eventfd(2) with valid flags; a returned descriptor is ours alone.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        let wake = if fd >= 0 {
            // SAFETY: a fresh descriptor no one else owns.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        } else {
            let error = std::io::Error::last_os_error();
            tracing::warn!(%error, "no eventfd: QPs are moved on the event loop");
            None
        };
        let mut c = Self::default();
        c.wake = wake;
        c
    }

    /// The descriptor that becomes readable when a move was answered.
    pub(super) fn wake_fd(&self) -> Option<RawFd> {
        self.wake.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Empties the eventfd (its readiness was reported), then takes in what the thread
    /// finished.
    pub(super) fn woken(&mut self) {
        if let Some(fd) = self.wake_fd() {
            let mut n = [0u8; 8];
            // SAFETY: a live non-blocking eventfd and an 8-byte buffer; EAGAIN when empty.
            unsafe { libc::read(fd, n.as_mut_ptr().cast(), n.len()) };
        }
        self.collect();
    }

    /// Gives `moves` to the thread; `Err` hands them back (the caller moves the QP itself)
    /// when there is no thread, no eventfd, or no room.
    pub(super) fn modify(&mut self, moves: RawMoves) -> Result<(), RawMoves> {
        if self.wake.is_none() {
            return Err(moves);
        }
        self.collect();
        self.send(Job::Modify(moves)).map_err(|j| match j {
            Job::Modify(m) => m,
            _ => unreachable!("the job given back is the one sent"),
        })
    }

    /// The moves answered since the last call, oldest first.
    pub(super) fn take_moved(&mut self) -> Option<MovesDone> {
        self.moved.pop_front()
    }

    /// Whether answered moves wait for [`QpCommands::take_moved`].
    pub(super) fn has_moved(&self) -> bool {
        !self.moved.is_empty()
    }

    /// Waits until the moves named `token` are answered (then in
    /// [`QpCommands::take_moved`]), and with them the jobs given before them, which the
    /// thread does first; not for those given after. Blocks for as long as that takes: for a
    /// verb on a QP whose moves are on the thread, a rare case.
    pub(super) fn wait_for(&mut self, token: u64) {
        while self.in_flight > 0 && !self.moved.iter().any(|m| m.token == token) {
            let Some(d) = self.worker.as_ref().and_then(|w| w.done.recv().ok()) else {
                self.in_flight = 0;
                break;
            };
            self.answered(d.0);
        }
    }

    /// Waits for every job given to the thread to be answered.
    fn wait(&mut self) {
        while self.in_flight > 0 {
            let Some(d) = self.worker.as_ref().and_then(|w| w.done.recv().ok()) else {
                self.in_flight = 0;
                break;
            };
            self.answered(d.0);
        }
    }

    /// A QP of `kind` created ahead, if one is ready.
    pub(super) fn take(&mut self, kind: &QpKind) -> Option<CreatedQp> {
        self.collect();
        self.stash.take(kind)
    }

    /// A QP of `kind` was created for the caller: asks the thread for what the stash of that
    /// kind lacks.
    pub(super) fn refill(&mut self, kind: &QpKind, init: RawQpInit) {
        let more = self.stash.ask(kind);
        for _ in 0..more {
            if self.send(Job::Create(*kind, init)).is_err() {
                self.stash.failed(kind);
            }
        }
    }

    /// Gives `qp` to the thread to destroy; `false` (the caller destroys it) when there is no
    /// thread or its queue is full.
    pub(super) fn destroy(&mut self, qp: *mut ffi::ibv_qp) -> bool {
        self.collect();
        self.send(Job::Destroy(qp)).is_ok()
    }

    /// Gives `job` to the thread, or back when there is none or its queue is full.
    fn send(&mut self, job: Job) -> Result<(), Job> {
        let Some(w) = self.worker() else {
            return Err(job);
        };
        let Some(jobs) = &w.jobs else {
            return Err(job);
        };
        match jobs.try_send(Handed(job)) {
            Ok(()) => {
                self.in_flight += 1;
                Ok(())
            }
            Err(TrySendError::Full(Handed(j)) | TrySendError::Disconnected(Handed(j))) => Err(j),
        }
    }

    fn worker(&mut self) -> Option<&Worker> {
        if self.worker.is_none() && !self.no_thread {
            match Worker::start(self.wake_fd()) {
                Ok(w) => self.worker = Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "no QP command thread: QPs are created and destroyed on the event loop");
                    self.no_thread = true;
                }
            }
        }
        self.worker.as_ref()
    }

    /// Takes in what the thread finished, without waiting.
    pub(super) fn collect(&mut self) {
        while let Some(d) = self.worker.as_ref().and_then(|w| w.done.try_recv().ok()) {
            self.answered(d.0);
        }
    }

    fn answered(&mut self, (d, took): (Done, Duration)) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match d {
            Done::Created(..) => self.counts.create_time += took,
            Done::Destroyed(_) => self.counts.destroy_time += took,
            Done::Modified(_) => self.counts.modify_time += took,
        }
        match d {
            Done::Created(kind, Ok(q)) => {
                self.counts.created += 1;
                if let Some(q) = self.stash.arrived(&kind, q) {
                    destroy_now(q.raw);
                }
            }
            Done::Created(kind, Err(errno)) => {
                self.counts.failed += 1;
                self.stash.failed(&kind);
                tracing::debug!(errno, "creating a QP ahead failed");
            }
            Done::Destroyed(Ok(())) => self.counts.destroyed += 1,
            Done::Destroyed(Err(errno)) => {
                self.counts.failed += 1;
                tracing::warn!(errno, "ibv_destroy_qp failed on the QP command thread");
            }
            Done::Modified(m) => {
                self.counts.modified += m.done as u64 + u64::from(m.result.is_err());
                if m.result.is_err() {
                    self.counts.failed += 1;
                }
                self.moved.push_back(m);
            }
        }
    }

    /// Waits for every job given to the thread, then destroys the QPs created ahead and
    /// forgets their kinds: nothing of the thread's refers to a device object after it.
    /// Blocks (for as long as the jobs take): called before a PD, CQ or SRQ is destroyed and
    /// before the context is closed, never on the data path.
    pub(super) fn quiesce(&mut self) {
        self.wait();
        for q in self.stash.clear() {
            destroy_now(q.raw);
        }
    }

    /// QPs created ahead and not taken.
    pub(super) fn ready(&self) -> usize {
        self.stash.ready()
    }
}

impl Drop for QpCommands {
    fn drop(&mut self) {
        self.quiesce();
        if let Some(mut w) = self.worker.take() {
            // Its queue closed, the thread's loop ends.
            w.jobs = None;
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Worker {
    /// Starts the thread; it writes `wake` after each move it answered. The descriptor
    /// outlives the thread: [`QpCommands`] joins it on drop, before its fields go.
    fn start(wake: Option<RawFd>) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::sync_channel::<Handed<Job>>(QUEUE);
        let (tx, done) = mpsc::channel::<Handed<(Done, Duration)>>();
        let thread = std::thread::Builder::new()
            .name("ipoib-cm-qp-cmd".into())
            .spawn(move || {
                while let Ok(Handed(job)) = rx.recv() {
                    let t0 = Instant::now();
                    let (d, wakes) = match job {
                        Job::Create(kind, init) => (Done::Created(kind, create(&init)), false),
                        Job::Destroy(qp) => (Done::Destroyed(destroy(qp)), false),
                        Job::Modify(m) => (Done::Modified(modify(m)), true),
                    };
                    if tx.send(Handed((d, t0.elapsed()))).is_err() {
                        break;
                    }
                    if let Some(fd) = wake.filter(|_| wakes) {
                        let one = 1u64.to_ne_bytes();
                        // SAFETY: a live eventfd (see above) and an 8-byte buffer.
                        unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
                    }
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }
}

/// The payload bytes a send QP asks to carry inline (the device may grant more): an IP
/// packet up to this size (TCP ACKs, ARP and ND, small UDP) is copied into the WQE.
pub(super) const MAX_INLINE_DATA: u32 = 128;

/// `ibv_create_qp`, asking for [`MAX_INLINE_DATA`] and without inline data where the device
/// refuses that; the errno on failure.
pub(super) fn create(init: &RawQpInit) -> Result<CreatedQp, i32> {
    let mut a = ffi::ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        cap: ffi::ibv_qp_cap {
            max_send_wr: init.max_send_wr.max(1),
            max_recv_wr: if init.srq.is_null() {
                init.max_recv_wr.max(1)
            } else {
                0
            },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: MAX_INLINE_DATA,
        },
        qp_type: init.qp_type,
        // The device signals only what `wr::flush_sends` asks; `sq_sig_all` is the
        // wrapper's: every send then completes towards the caller.
        sq_sig_all: 0,
    };
    // SAFETY: live PD, CQs and SRQ (or null) (see the module documentation) and a filled
    // attribute struct.
    let mut raw = unsafe { ffi::ibv_create_qp(init.pd, &mut a) };
    if raw.is_null() {
        // A device that cannot put MAX_INLINE_DATA bytes in a WQE: no inline sends.
        a.cap.max_inline_data = 0;
        // SAFETY: as above.
        raw = unsafe { ffi::ibv_create_qp(init.pd, &mut a) };
    }
    if raw.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    // ibv_create_qp wrote back what the device granted.
    Ok(CreatedQp {
        raw,
        max_inline: a.cap.max_inline_data,
    })
}

/// `ibv_destroy_qp`; its error code.
fn destroy(qp: *mut ffi::ibv_qp) -> Result<(), i32> {
    // SAFETY: a live QP no one else refers to (see the module documentation).
    match unsafe { ffi::ibv_destroy_qp(qp) } {
        0 => Ok(()),
        rc => Err(rc),
    }
}

/// The `ibv_modify_qp` calls of `m`, in order, up to the first that fails.
fn modify(mut m: RawMoves) -> MovesDone {
    let mut done = 0;
    let mut result = Ok(());
    for (attr, mask) in &mut m.steps {
        // SAFETY: a live QP no verb of the caller's uses meanwhile (see the module
        // documentation), and an attribute struct whose mask names the set fields.
        let rc = unsafe { ffi::ibv_modify_qp(m.qp, attr, *mask) };
        if rc != 0 {
            result = Err(rc);
            break;
        }
        done += 1;
    }
    MovesDone {
        qpn: m.qpn,
        token: m.token,
        done,
        result,
    }
}

/// Destroys a QP created ahead and never handed out; errors are ignored (nothing refers to
/// it, and nothing can be done).
fn destroy_now(qp: *mut ffi::ibv_qp) {
    let _ = destroy(qp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{CqId, PdId};

    fn kind(send_cq: u32) -> QpKind {
        kind_of(&QpInit {
            pd: PdId(1),
            qp_type: QpType::Rc,
            send_cq: CqId(send_cq),
            recv_cq: CqId(send_cq),
            srq: None,
            max_send_wr: 64,
            max_recv_wr: 16,
            sq_sig_all: true,
        })
    }

    #[test]
    fn sq_sig_all_makes_no_other_kind() {
        let signaled = kind(1);
        let unsignaled = kind_of(&QpInit {
            sq_sig_all: false,
            ..signaled
        });
        assert_eq!(signaled, unsignaled);
        assert_ne!(kind(1), kind(2));
    }

    #[test]
    fn a_kind_is_kept_full_once_created_and_what_is_asked_is_counted_once() {
        let mut s = Stash::<u32>::default();
        let a = kind(1);
        assert_eq!(s.take(&a), None, "nothing ahead of the first create");
        assert_eq!(s.ask(&a), 0, "one QP of a kind asks for none");
        assert_eq!(s.ask(&a), STASH_DEPTH, "a second one fills the stash");
        assert_eq!(s.ask(&a), 0, "already asked for");
        for i in 0..STASH_DEPTH as u32 {
            assert_eq!(s.arrived(&a, i), None);
        }
        assert_eq!(s.ready(), STASH_DEPTH);
        assert!(s.take(&a).is_some());
        assert_eq!(s.ask(&a), 1, "one taken, one asked for");
        s.failed(&a);
        assert_eq!(
            s.ask(&a),
            1,
            "a failure is asked for again at the next create"
        );
    }

    #[test]
    fn only_rc_kinds_and_at_most_max_kinds_are_kept() {
        let mut s = Stash::<u32>::default();
        let mut ud = kind(1);
        ud.qp_type = QpType::Ud;
        assert_eq!(s.ask(&ud), 0);
        for k in 0..MAX_KINDS as u32 {
            assert_eq!(s.ask(&kind(10 + k)), 0);
            assert_eq!(s.ask(&kind(10 + k)), STASH_DEPTH);
        }
        assert_eq!(s.ask(&kind(99)), 0, "beyond MAX_KINDS");
        assert_eq!(s.ask(&kind(99)), 0, "beyond MAX_KINDS");
        assert_eq!(
            s.arrived(&kind(99), 7),
            Some(7),
            "an unkept kind's QP is handed back"
        );
    }

    #[test]
    fn clear_hands_back_every_ready_qp_and_forgets_the_kinds() {
        let mut s = Stash::<u32>::default();
        let (a, b) = (kind(1), kind(2));
        for k in [a, a, b, b] {
            s.ask(&k);
        }
        s.arrived(&a, 1);
        s.arrived(&b, 2);
        s.arrived(&b, 3);
        let mut back = s.clear();
        back.sort_unstable();
        assert_eq!(back, vec![1, 2, 3]);
        assert_eq!(s.ready(), 0);
        assert_eq!(
            s.arrived(&a, 4),
            Some(4),
            "in flight at the clear: handed back"
        );
        assert_eq!(s.take(&a), None);
    }
}
