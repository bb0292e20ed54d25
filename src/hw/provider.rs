//! [`Verbs`] and [`Provider`] for [`HwVerbs`]: each verb is done by the module of the object it
//! acts on; the provider's I/O drains the completion channel and the async events.

use std::io;
use std::time::Instant;

use super::{cq, pd, pkey, qp, srq, wr, HwVerbs};
use crate::verbs::{
    AsyncEvent, BufId, BufPools, Completion, CqId, Gid, IoSource, Moved, Moves, PKey, PdId, PoolId,
    PortAttr, Provider, QpAttr, QpInit, QpNum, QpState, SendWr, SrqId, SrqInit, Verbs, VerbsError,
    WrId,
};

impl Verbs for HwVerbs {
    fn port_attr(&self) -> PortAttr {
        self.attr
    }

    fn pkey_index(&self, pkey: PKey) -> Result<u16, VerbsError> {
        self.open_context()?;
        pkey::find(self, pkey)
    }

    fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        self.open_context()?;
        pd::alloc(self)
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        pd::dealloc(self, pd)
    }

    fn create_pool(
        &mut self,
        pd: PdId,
        buf_len: usize,
        count: usize,
    ) -> Result<PoolId, VerbsError> {
        pd::register_pool(self, pd, buf_len, count)
    }

    fn pools(&self) -> &BufPools {
        &self.pools
    }

    fn pools_mut(&mut self) -> &mut BufPools {
        &mut self.pools
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError> {
        self.open_context()?;
        cq::create(self, depth)
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        cq::destroy(self, cq)
    }

    fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.ctx.is_null() {
            return 0;
        }
        cq::poll(self, cq, out, max)
    }

    fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError> {
        self.open_context()?;
        srq::create(self, init)
    }

    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        srq::modify(self, srq, limit)
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        self.open_context()?;
        srq::post_recv(self, srq, wr_id, buf)
    }

    fn post_srq_recvs(&mut self, srq: SrqId, wrs: &[(WrId, BufId)]) -> Result<usize, VerbsError> {
        wr::post_srq_chain(self, srq, wrs)
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        srq::destroy(self, srq)
    }

    fn srq_posted(&self, srq: SrqId) -> Result<usize, VerbsError> {
        srq::posted(self, srq)
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpNum, VerbsError> {
        self.open_context()?;
        qp::create(self, init)
    }

    fn modify_qp(&mut self, qp: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
        qp::modify(self, qp, attr)
    }

    fn begin_moves(&mut self, qp: QpNum, attrs: &[QpAttr]) -> Result<Moves, VerbsError> {
        self.open_context()?;
        qp::begin_moves(self, qp, attrs)
    }

    fn poll_moved(&mut self) -> Option<Moved> {
        qp::poll_moved(self)
    }

    fn query_qp_state(&self, qp: QpNum) -> Result<QpState, VerbsError> {
        qp::query_qp_state(self, qp)
    }

    fn post_send(&mut self, qp: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
        self.open_context()?;
        qp::settle(self, qp);
        wr::post_send(self, qp, wr)
    }

    fn post_recv(&mut self, qp: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        self.open_context()?;
        qp::settle(self, qp);
        wr::post_recv(self, qp, wr_id, buf)
    }

    fn destroy_qp(&mut self, qp: QpNum) -> Result<(), VerbsError> {
        qp::destroy(self, qp)
    }

    fn retire_qp(&mut self, qp: QpNum) -> Result<(), VerbsError> {
        qp::retire(self, qp)
    }

    fn qp_count(&self) -> usize {
        self.qps.len()
    }

    fn attach_mcast(&mut self, qp: QpNum, mgid: Gid, mlid: u16) -> Result<(), VerbsError> {
        qp::attach_mcast(self, qp, mgid, mlid)
    }

    fn detach_mcast(&mut self, qp: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        qp::detach_mcast(self, qp, mgid)
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        if self.readiness.is_none() {
            self.drain_async();
        }
        self.events.pop_front()
    }
}

impl Provider for HwVerbs {
    type Verbs = Self;
    type PortView = ();

    fn verbs(&mut self) -> &mut Self {
        self
    }

    /// The completion channel (0), the async-event descriptor (1) and the QP command
    /// thread's eventfd (2, when there is one), all read only; none while the context is
    /// closed (a lost device not opened again yet).
    fn io_source(&self, index: usize) -> Option<IoSource> {
        if self.ctx.is_null() || self.channel.is_null() {
            return None;
        }
        let fd = match index {
            // SAFETY: the channel is live while `self` is.
            0 => unsafe { (*self.channel).fd },
            // SAFETY: the context is live while `self` is.
            1 => unsafe { (*self.ctx).async_fd },
            2 => self.commands.wake_fd()?,
            _ => return None,
        };
        Some(IoSource {
            fd,
            writable: false,
        })
    }

    fn note_readiness(&mut self, index: usize) {
        let r = self.readiness.get_or_insert([false; 3]);
        if let Some(ready) = r.get_mut(index) {
            *ready = true;
        }
    }

    fn handle_io(&mut self, now: Instant) -> io::Result<()> {
        wr::flush_all(self);
        self.commands.collect();
        self.handle_input(now).map(|_| ())
    }

    /// Reads the descriptors that reported readiness since they were last read (both, for a
    /// caller that reports none): each is read until it would block, so an edge-triggered
    /// registration reports the next event again.
    fn handle_input(&mut self, _now: Instant) -> io::Result<usize> {
        let [channel, async_fd, moved] = match &mut self.readiness {
            Some(r) => std::mem::take(r),
            None => [true; 3],
        };
        if channel {
            self.drain_channel();
        }
        if async_fd {
            self.drain_async();
        }
        if moved {
            self.commands.woken();
        }
        Ok(0)
    }

    /// Rings the doorbell of every QP with sends posted since its last one.
    fn flush(&mut self, _now: Instant) -> io::Result<()> {
        wr::flush_all(self);
        Ok(())
    }

    /// Closes the lost context first (its objects destroyed, as on drop: the kernel may be
    /// waiting for that to finish removing the device, as `rdma link delete` of rxe does),
    /// then opens the same device and port again ([`HwVerbs::open`]); the counters carry
    /// over. On failure the context stays closed.
    fn reopen(&mut self) -> Result<(), crate::verbs::ReopenError> {
        self.close_context();
        let mut new =
            Self::open(&self.cfg).map_err(|e| crate::verbs::ReopenError::Open(Box::new(e)))?;
        new.stats = self.stats;
        new.commands.counts = self.commands.counts;
        *self = new;
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}
