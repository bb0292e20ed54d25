//! Completion queues on the one completion channel: creation, polling (each device completion
//! mapped back to the caller's WR and buffer), and the channel's events.

use std::collections::VecDeque;
use std::ptr;

use super::context::HwVerbs;
use super::error::errno_err;
use super::ffi_map::status_from;
use super::objects::{Cq, CQ_EVENT_ACK_BATCH};
use super::objects::{Owner, Wr};
use super::wr;
use crate::verbs::{Completion, CqId, Lid, QpNum, QpType, Sl, VerbsError, WcOpcode, WcStatus};
use ibverbs_sys as ffi;

impl HwVerbs {
    pub(super) fn cq_raw(&self, cq: CqId) -> Result<*mut ffi::ibv_cq, VerbsError> {
        self.cqs
            .get(&cq.0)
            .map(|c| c.raw)
            .ok_or(VerbsError::NoSuchObject("CQ"))
    }

    pub(super) fn use_cq(&mut self, cq: CqId, d: isize) {
        if let Some(c) = self.cqs.get_mut(&cq.0) {
            c.users = c.users.saturating_add_signed(d);
        }
    }

    /// Reads every pending completion-channel event and re-arms its CQ; the events are acked
    /// [`CQ_EVENT_ACK_BATCH`] at a time (and all before the CQ is destroyed).
    pub(super) fn drain_channel(&mut self) {
        if self.channel.is_null() {
            return;
        }
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            self.stats.calls.channel_reads += 1;
            // SAFETY: valid channel (non-blocking fd) and out pointers.
            if unsafe { ffi::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) } != 0 {
                break;
            }
            self.stats.calls.cq_events += 1;
            let ack = match self.cqs.values_mut().find(|c| c.raw == cq) {
                Some(c) => {
                    c.unacked_events += 1;
                    (c.unacked_events >= CQ_EVENT_ACK_BATCH)
                        .then(|| std::mem::take(&mut c.unacked_events))
                }
                // Not one of ours (cannot happen): ack it at once.
                None => Some(1),
            };
            // SAFETY: `cq` was returned by the channel and is still live (we destroy CQs only
            // after draining the channel and acking what was read).
            unsafe {
                if let Some(n) = ack {
                    self.stats.calls.cq_event_acks += 1;
                    ffi::ibv_ack_cq_events(cq, n);
                }
                if let Some(arm) = (*self.ctx).ops.req_notify_cq {
                    arm(cq, 0);
                }
            }
        }
    }

    /// Acks the events read for `cq` and not acked yet.
    fn ack_events(&mut self, cq: CqId) {
        let Some(c) = self.cqs.get_mut(&cq.0) else {
            return;
        };
        let n = std::mem::take(&mut c.unacked_events);
        if n > 0 {
            self.stats.calls.cq_event_acks += 1;
            // SAFETY: a live CQ; these events were read from the channel.
            unsafe { ffi::ibv_ack_cq_events(c.raw, n) };
        }
    }

    /// Maps one work completion of `cq` onto the caller's WRs, into the CQ's backlog: for a
    /// send, first the earlier sends of its QP that it shows done (sends complete in order),
    /// then its own. A WR this wrapper no longer tracks maps to nothing.
    fn map_wc(&mut self, cq: CqId, wc: &ffi::ibv_wc) {
        let id = wc.wr_id();
        let Some(w) = self.wrs.remove(&id) else {
            return;
        };
        let status = status_from(
            wc.error()
                .map_or(ffi::ibv_wc_status::IBV_WC_SUCCESS, |e| e.0),
        );
        let qp = QpNum::new(wc.qp_num);
        if w.send {
            if let Owner::Qp(q) = w.owner {
                while let Some(x) = self.qps.get_mut(&q.get()) {
                    let Some(front) = x.sends.pop_front() else {
                        break;
                    };
                    x.sends_completed += 1;
                    if front == id {
                        break;
                    }
                    if let Some(e) = self.wrs.remove(&front) {
                        self.send_done(cq, q, e);
                    }
                }
            }
        } else {
            match w.owner {
                Owner::Qp(q) => {
                    if let Some(x) = self.qps.get_mut(&q.get()) {
                        x.recvs = x.recvs.saturating_sub(1);
                    }
                }
                Owner::Srq(s) => {
                    if let Some(x) = self.srqs.get_mut(&s.0) {
                        x.posted = x.posted.saturating_sub(1);
                    }
                }
            }
        }
        let ok = status == WcStatus::Success;
        if w.send && ok {
            if let Owner::Qp(q) = w.owner {
                self.send_done(cq, q, w);
            }
            return;
        }
        if let Some(b) = w.buf {
            self.pools.reclaim(b);
        }
        let recv = !w.send;
        let flags = wc.wc_flags;
        let imm = (ok && recv && (flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM).0 != 0)
            .then(|| u32::from_be(wc.imm_data));
        let grh = ok && recv && (flags & ffi::ibv_wc_flags::IBV_WC_GRH).0 != 0;
        let ud = self
            .qps
            .get(&wc.qp_num)
            .is_some_and(|x| x.qp_type != QpType::Rc);
        let c = Completion {
            wr_id: w.user,
            status,
            opcode: if recv { WcOpcode::Recv } else { WcOpcode::Send },
            byte_len: if recv && ok { wc.len() as u32 } else { 0 },
            qp: if recv {
                qp
            } else {
                match w.owner {
                    Owner::Qp(q) => q,
                    Owner::Srq(_) => qp,
                }
            },
            buf: w.buf,
            imm,
            src_qp: (ok && recv && ud).then(|| QpNum::new(wc.src_qp)),
            src_port: None,
            grh,
            // An IB port reports the sender's LID; RoCE's is 0, which names no port.
            slid: (ok && recv && ud && wc.slid != 0).then_some(Lid(wc.slid)),
            sl: Sl::from_bits(wc.sl),
            dlid_path_bits: wc.dlid_path_bits,
        };
        if let Some(x) = self.cqs.get_mut(&cq.0) {
            x.backlog.push_back(c);
        }
    }

    /// A send of `qp` that the device processed successfully: a completion into `cq`'s
    /// backlog if its caller asked for one (the buffer goes with it), else its buffer back.
    fn send_done(&mut self, cq: CqId, qp: QpNum, w: Wr) {
        if !w.signaled {
            if let Some(b) = w.buf {
                self.pools.release(b);
            }
            return;
        }
        if let Some(b) = w.buf {
            self.pools.reclaim(b);
        }
        if let Some(x) = self.cqs.get_mut(&cq.0) {
            x.backlog
                .push_back(Completion::of_send(w.user, qp, w.buf, WcStatus::Success));
        }
    }

    /// Hands out up to `max` completions of `cq`'s backlog; how many.
    fn drain_backlog(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        let Some(x) = self.cqs.get_mut(&cq.0) else {
            return 0;
        };
        let n = x.backlog.len().min(max);
        for c in x.backlog.drain(..n) {
            self.stats.count_completion(c.opcode, c.status);
            out.push(c);
        }
        n
    }
}

pub(super) fn create(v: &mut HwVerbs, depth: u32) -> Result<CqId, VerbsError> {
    let n = i32::try_from(depth.max(1)).map_err(|_| VerbsError::OutOfResources("CQ"))?;
    // CQs take the device's completion vectors in turn, so that their interrupts spread
    // over the vectors' CPUs rather than all landing on vector 0's.
    // SAFETY: valid context.
    let vectors = unsafe { (*v.ctx).num_comp_vectors }.max(1);
    let vector = v.next_comp_vector % vectors;
    v.next_comp_vector = (vector + 1) % vectors;
    // SAFETY: valid context and channel; `vector` is below the device's count.
    let raw = unsafe { ffi::ibv_create_cq(v.ctx, n, ptr::null_mut(), v.channel, vector) };
    if raw.is_null() {
        return Err(errno_err("ibv_create_cq", -1));
    }
    // SAFETY: a live CQ of this context.
    if let Some(arm) = unsafe { (*v.ctx).ops.req_notify_cq } {
        // SAFETY: as above.
        unsafe { arm(raw, 0) };
    }
    let id = v.id();
    v.cqs.insert(
        id,
        Cq {
            raw,
            users: 0,
            unacked_events: 0,
            backlog: VecDeque::new(),
        },
    );
    Ok(CqId(id))
}

pub(super) fn destroy(v: &mut HwVerbs, cq: CqId) -> Result<(), VerbsError> {
    let c = v.cqs.get(&cq.0).ok_or(VerbsError::NoSuchObject("CQ"))?;
    if c.users > 0 {
        return Err(VerbsError::Busy("CQ"));
    }
    let raw = c.raw;
    // QPs created ahead on the CQ, or destroyed behind, are gone first.
    v.commands.quiesce();
    // ibv_destroy_cq waits until every event it reported was acked.
    v.drain_channel();
    v.ack_events(cq);
    // SAFETY: a live CQ no QP uses, with all its events acked.
    let rc = unsafe { ffi::ibv_destroy_cq(raw) };
    if rc != 0 {
        return Err(errno_err("ibv_destroy_cq", rc));
    }
    v.cqs.remove(&cq.0);
    Ok(())
}

/// Reads up to `want` completions from the device's `cq` into the CQ's backlog; how many,
/// and how many of them were `qp`'s.
fn poll_device(v: &mut HwVerbs, cq: CqId, want: usize, qp: Option<QpNum>) -> (usize, u64) {
    let Ok(raw) = v.cq_raw(cq) else {
        return (0, 0);
    };
    let Some(poll) = (
        // SAFETY: valid context.
        unsafe { (*v.ctx).ops.poll_cq }
    ) else {
        return (0, 0);
    };
    if v.wc.len() < want {
        // SAFETY: ibv_wc is plain C data; all-zero is valid.
        v.wc.resize(want, unsafe { std::mem::zeroed() });
    }
    v.stats.calls.poll_cq_calls += 1;
    // SAFETY: a live CQ and room for `want` entries.
    let n = unsafe { poll(raw, want as i32, v.wc.as_mut_ptr()) };
    if n <= 0 {
        return (0, 0);
    }
    v.stats.calls.cqes += n as u64;
    let mut of_qp = 0;
    for i in 0..n as usize {
        let wc = v.wc[i];
        if qp.is_some_and(|q| wc.qp_num == q.get()) {
            of_qp += 1;
        }
        v.map_wc(cq, &wc);
    }
    (n as usize, of_qp)
}

/// Completions one device poll reads at most.
const POLL_BATCH: usize = 64;

/// Moves every completion the device holds on `cq` into its backlog, where they wait for
/// [`poll`] in order; returns how many of them were `qp`'s. Done before `qp` is destroyed:
/// some providers (mlx5) clean a destroyed QP's completions from its CQs and hand the SRQ
/// WQEs they name back to the SRQ, which would leave this wrapper's records of those
/// receives (and the caller's buffers) outstanding forever. Bounded by the CQ's depth (and
/// at most 1024 polls).
pub(super) fn sweep(v: &mut HwVerbs, cq: CqId, qp: QpNum) -> u64 {
    let mut of_qp = 0;
    for _ in 0..1024 {
        let (n, mine) = poll_device(v, cq, POLL_BATCH, Some(qp));
        of_qp += mine;
        if n < POLL_BATCH {
            break;
        }
    }
    of_qp
}

/// Polls `cq` for at most `max` completions: first the sends posted since the last doorbell
/// go to the device (a caller that polls for what it posted is never left waiting), then the
/// backlog, then the device's CQ, 64 entries a call.
pub(super) fn poll(v: &mut HwVerbs, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
    wr::flush_all(v);
    if v.cq_raw(cq).is_err() {
        return 0;
    }
    let mut got = v.drain_backlog(cq, out, max);
    let mut polled = false;
    while got < max {
        let want = (max - got).min(POLL_BATCH);
        let (n, _) = poll_device(v, cq, want, None);
        if n == 0 {
            break;
        }
        polled = true;
        got += v.drain_backlog(cq, out, max - got);
        if n < want {
            break;
        }
    }
    if polled {
        // Sends completed: retired AHs may now be unused.
        v.reap_ahs();
    }
    got
}
