//! `ipoib-cm ud-pingpong`: rdma-core's `ibv_ud_pingpong` over the software provider.
//!
//! Same TCP exchange as [`super::rc_pingpong`] (the client sends `LID:QPN:PSN:GID`, the
//! server answers with its own, the client sends `"done"`), then UD sends with Q_Key
//! `0x11111111` to the peer's QPN. Receive buffers hold `size + 40` bytes (the GRH area), as
//! in rdma-core. The ping-pong is [`super::pingpong`]'s: each side sends its next message
//! once its previous send completed and the peer's message arrived; the client starts.

use std::net::IpAddr;

use super::exchange::{exchange_over_tcp, Dest, TcpExchange};
use super::pingpong::{run_pingpong, PingpongIo, PingpongRun, Summary};
use super::rc_qp::random_psn;
use super::soft_loop::{SoftLink, SoftLoop};
use super::{Options, PingpongError, RECV_WRID};
use crate::soft::provider::UdpOffload;
use crate::soft::{FaultConfig, SoftVerbs};
use crate::verbs::setup::os_seed;
use crate::verbs::{
    AddressVector, BufId, CqId, Grh, PathMtu, Provider, QKey, QpAttr, QpInit, QpNum, QpState,
    QpType, UdDest, Verbs,
};

/// The Q_Key `ibv_ud_pingpong` uses.
pub const UD_PINGPONG_QKEY: QKey = QKey(0x1111_1111);

/// Bytes of the GRH area at the start of every UD receive buffer.
const GRH: usize = 40;

struct Ctx {
    lp: SoftLoop,
    qp: QpNum,
    cq: CqId,
    send_buf: BufId,
    my: Dest,
}

impl PingpongIo for Ctx {
    type V = SoftVerbs;

    fn verbs(&mut self) -> &mut SoftVerbs {
        self.lp.prov.verbs()
    }

    fn pump(&mut self, now: std::time::Instant) -> Result<(), PingpongError> {
        self.lp.prov.handle_io(now)?;
        Ok(())
    }

    fn wait(&mut self, cap: std::time::Duration) -> Result<(), PingpongError> {
        self.lp.wait(cap, None)
    }
}

fn setup(opts: &Options, local: IpAddr) -> Result<Ctx, PingpongError> {
    let mut lp = SoftLoop::bind(&SoftLink {
        local,
        udp_port: opts.udp_port,
        verify_icrc_v4: opts.verify_icrc_v4,
        faults: FaultConfig::default(),
        // Datagram by datagram (no GSO trains), so a capture anywhere shows every packet as
        // sent.
        offload: UdpOffload::Off,
    })?;
    let v = lp.prov.verbs();
    let pd = v.alloc_pd().map_err(PingpongError::verbs("alloc_pd"))?;
    let count = opts.rx_depth as usize + 1;
    let pool = v
        .create_pool(pd, opts.size + GRH, count)
        .map_err(PingpongError::verbs("create_pool"))?;
    let cq = v
        .create_cq(opts.rx_depth + 1)
        .map_err(PingpongError::verbs("create_cq"))?;
    let qp = v
        .create_qp(&QpInit {
            pd,
            qp_type: QpType::Ud,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            max_send_wr: 1,
            max_recv_wr: opts.rx_depth,
            sq_sig_all: false,
        })
        .map_err(PingpongError::verbs("create_qp"))?;
    let init = QpAttr {
        pkey_index: Some(0),
        port: Some(1),
        qkey: Some(UD_PINGPONG_QKEY),
        ..QpAttr::to_state(QpState::Init)
    };
    v.modify_qp(qp, &init)
        .map_err(PingpongError::verbs("RESET->INIT"))?;
    let send_buf = v
        .pools_mut()
        .alloc(pool)
        .ok_or(PingpongError::PoolExhausted)?;
    for _ in 0..opts.rx_depth {
        let b = v
            .pools_mut()
            .alloc(pool)
            .ok_or(PingpongError::PoolExhausted)?;
        v.post_recv(qp, RECV_WRID, b)
            .map_err(PingpongError::verbs("Couldn't post receive"))?;
    }
    let psn = random_psn(os_seed());
    v.modify_qp(qp, &QpAttr::to_state(QpState::Rtr))
        .map_err(PingpongError::verbs("INIT->RTR"))?;
    let rts = QpAttr {
        sq_psn: Some(psn),
        ..QpAttr::to_state(QpState::Rts)
    };
    v.modify_qp(qp, &rts)
        .map_err(PingpongError::verbs("RTR->RTS"))?;
    let my = Dest {
        lid: 0,
        qpn: qp,
        psn,
        gid: v.port_attr().gid,
    };
    Ok(Ctx {
        lp,
        qp,
        cq,
        send_buf,
        my,
    })
}

fn exchange(opts: &Options) -> Result<(Ctx, Dest), PingpongError> {
    let ex = TcpExchange::rdma_core(opts.peer, opts.bind, opts.tcp_port, opts.deadline);
    // UD needs no connecting: the peer's QPN and GID go into every send.
    exchange_over_tcp(
        &ex,
        |local| {
            let ctx = setup(opts, local)?;
            let my = ctx.my;
            Ok((ctx, my))
        },
        |_, _| Ok(()),
    )
}

/// Runs the tool.
///
/// # Errors
/// Any [`PingpongError`]; the caller prints it and exits with
/// [`PingpongError::exit_code`].
pub fn run(opts: &Options) -> Result<Summary, PingpongError> {
    if opts.size == 0 || opts.size > PathMtu::Mtu4096.bytes() {
        return Err(PingpongError::Usage(
            "size must be 1..=4096 (at most the path MTU)",
        ));
    }
    let (mut ctx, rem) = exchange(opts)?;
    let run = PingpongRun {
        ud: Some(UdDest {
            av: AddressVector::global(Grh {
                hop_limit: 1,
                ..Grh::to_gid(rem.gid)
            }),
            remote_qpn: rem.qpn,
            remote_qkey: UD_PINGPONG_QKEY,
        }),
        ..PingpongRun::new(opts, ctx.qp, ctx.cq, ctx.send_buf)
    };
    run_pingpong(&mut ctx, &run)
}
