//! `ipoib-cm rc-pingpong --provider verbs`: the rc-pingpong tool on [`HwVerbs`].
//!
//! The TCP QP-info exchange and the ping-pong loop are those of [`super::rc_pingpong`]
//! (compatible with rdma-core's `ibv_rc_pingpong`); only the provider differs. The CM mode
//! (`--cm`) and payload checks (`-c`) need the soft provider.

use std::time::{Duration, Instant};

use mio::{Events, Poll};

use super::exchange::{exchange_over_tcp, Dest, TcpExchange};
use super::pingpong::{run_pingpong, PingpongIo, PingpongRun, Summary};
use super::rc_pingpong::RcPingpongOptions;
use super::rc_qp::{connect_rc_qp, open_rc_qp, RcQpSetup};
use super::PingpongError;
use crate::driver::ProviderSources;
use crate::hw::{HwConfig, HwError, HwVerbs};
use crate::verbs::setup::os_seed;
use crate::verbs::{BufId, CqId, Provider, QpNum};

/// Why a run failed: the device could not be opened, or the run itself failed.
#[derive(Debug, thiserror::Error)]
pub enum HwPingpongError {
    /// Opening the device failed.
    #[error(transparent)]
    Open(#[from] HwError),
    /// The run failed.
    #[error(transparent)]
    Run(#[from] PingpongError),
}

impl HwPingpongError {
    /// The process exit status: 2 when there is no device or the options cannot work, 1 for a
    /// failed run.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Open(_) => 2,
            Self::Run(e) => e.exit_code(),
        }
    }
}

/// The device with the poll its completion channel wakes.
struct Ctx {
    v: HwVerbs,
    poll: Poll,
    events: Events,
    cq: CqId,
    qp: QpNum,
    send_buf: BufId,
    my: Dest,
}

impl PingpongIo for Ctx {
    type V = HwVerbs;

    fn verbs(&mut self) -> &mut HwVerbs {
        &mut self.v
    }

    fn pump(&mut self, now: Instant) -> Result<(), PingpongError> {
        self.v.handle_io(now)?;
        Ok(())
    }

    fn wait(&mut self, cap: Duration) -> Result<(), PingpongError> {
        // The CQ is armed (handle_io re-arms after every event): sleep until it fires.
        self.poll.poll(&mut self.events, Some(cap))?;
        Ok(())
    }
}

fn setup(opts: &RcPingpongOptions, mut v: HwVerbs) -> Result<Ctx, PingpongError> {
    let RcQpSetup {
        cq,
        qp,
        send_buf,
        my,
        ..
    } = open_rc_qp(&mut v, opts.size, (opts.rx_depth, 1), os_seed())?;
    let poll = Poll::new()?;
    ProviderSources::register(poll.registry(), &v, 0)?;
    Ok(Ctx {
        v,
        poll,
        events: Events::with_capacity(16),
        cq,
        qp,
        send_buf,
        my,
    })
}

/// Runs rc-pingpong on the device `cfg` names.
///
/// # Errors
/// [`HwPingpongError::Open`] if the device cannot be opened, else the run's error.
pub fn run(opts: &RcPingpongOptions, cfg: &HwConfig) -> Result<Summary, HwPingpongError> {
    if opts.tool.cm || opts.tool.validate {
        return Err(
            PingpongError::Usage("--provider verbs: --cm and -c need the soft provider").into(),
        );
    }
    let v = HwVerbs::open(cfg)?;
    let ctx = setup(opts, v)?;
    let ex = TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline);
    // The device's GID is this side's address; the exchange's local address is not needed.
    let (mut ctx, _) = exchange_over_tcp(
        &ex,
        |_| {
            let my = ctx.my;
            Ok((ctx, my))
        },
        |ctx, rem| {
            let psns = (rem.psn, ctx.my.psn);
            connect_rc_qp(&mut ctx.v, ctx.qp, rem, &opts.tool.link, psns)
        },
    )?;
    let run = PingpongRun::new(opts, ctx.qp, ctx.cq, ctx.send_buf);
    Ok(run_pingpong(&mut ctx, &run)?)
}
