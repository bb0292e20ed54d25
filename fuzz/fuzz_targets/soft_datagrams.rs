//! The software RoCEv2 engine (`SoftVerbs`) fed a sequence of arbitrary operations.
//!
//! Setup: one provider on 198.18.0.1 with an RC QP in RTS (peer 198.18.0.2, QPN 0x22, fixed
//! PSNs), a UD QP and QP1 (GSI), receives posted. ICRC checking of IPv4 is off so unverified
//! packets reach the QPs.
//!
//! The input is a sequence of chunks `[tag: u8][len: u16 LE][body: len bytes]`. The tag picks
//! the operation; the body is either a raw datagram or decoded with `arbitrary`:
//!
//! - raw datagram (first body byte picks the source address),
//! - a well-formed RoCE packet built with `RoceRepr` from fuzzed fields (PSNs can be relative
//!   to what the engine expects, so the fuzzer reaches in-sequence requests and valid ACKs),
//! - time advance + `handle_timeout` (by a fuzzed duration, or straight to `poll_timeout`),
//! - `poll_transmit` drain, checking every datagram sent is a valid RoCEv2 packet,
//! - `post_send` / `post_recv`,
//! - `poll_cq` of both CQs,
//! - QP state changes (ERR, SQD, back to RTS, RESET and up again).
//!
//! Invariants: no panic; `qp_count()` never changes; every datagram transmitted parses, has a
//! valid ICRC, TVer 0 and the default P_Key; every completion returns a buffer the harness did
//! not already hold, in the pool's held state, on the right CQ; at every step free + posted +
//! held-by-harness buffers never exceed the pool, and once the CQs are drained they add up to
//! it exactly; failed posts leave the buffer with the caller; `handle_timeout` leaves no timer
//! due and is idempotent.
#![no_main]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use ipoib_cm::soft::{SoftConfig, SoftStats, SoftVerbs};
use ipoib_cm::verbs::{
    AccessFlags, AddressVector, AsyncEvent, BufId, Completion, CqId, Gid, PathMtu, PoolId, Psn,
    QKey, QpAttr, QpInit, QpNum, QpState, QpType, SendWr, UdDest, Verbs, WcOpcode, WcStatus, WrId,
};
use ipoib_cm::wire::{
    Aeth, Bth, Deth, ImmDt, IpHeaderInfo, Opcode, Reth, RocePacket, RoceRepr, Syndrome,
    DEFAULT_PKEY, GSI_QKEY, ROCEV2_UDP_PORT,
};
use libfuzzer_sys::fuzz_target;

const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const STRANGER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
const PEER_QPN: u32 = 0x22;
const RQ_PSN: u32 = 100;
const SQ_PSN: u32 = 200;
const UD_QKEY: u32 = 0x1111_2222;
const NBUF: usize = 48;
const BUF_LEN: usize = 600;
const CQ_DEPTH: u32 = 16;
const MAX_OPS: usize = 256;

/// `SOFT_FUZZ_TRACE=1` prints every operation, completion and transmitted packet, and the
/// final counters (for triaging an input: run the target binary with the file as argument).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("SOFT_FUZZ_TRACE").is_some())
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum QpSel {
    Rc,
    Ud,
    Gsi,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Target {
    Rc,
    Ud,
    Gsi,
    Other(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum SrcSel {
    Peer,
    PeerOtherPort(u16),
    Stranger,
    /// A packet addressed to some other local IP.
    WrongDst,
    V6,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PsnSel {
    /// Relative to the PSN the RC responder is believed to expect next.
    Expected(i8),
    /// Relative to the last RC request PSN this engine transmitted (for ACKs and NAKs).
    LastTx(i8),
    Raw(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum QkeySel {
    Ud,
    Gsi,
    Raw(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum LenSel {
    Mtu,
    Len(u16),
}

/// A well-formed packet: the opcode decides which extension headers are present.
#[derive(Arbitrary, Debug)]
struct PacketSpec {
    target: Target,
    opcode: u8,
    psn: PsnSel,
    src: SrcSel,
    solicited: bool,
    mig_req: bool,
    ack_req: bool,
    fecn: bool,
    becn: bool,
    bad_tver: Option<u8>,
    pkey: Option<u16>,
    reth: (u64, u32, u32),
    syndrome: u8,
    msn: u32,
    qkey: QkeySel,
    src_qp: u32,
    imm: u32,
    len: LenSel,
}

#[derive(Arbitrary, Debug)]
enum UdIp {
    Peer,
    Local,
    V6,
}

#[derive(Arbitrary, Debug)]
struct SendSpec {
    qp: QpSel,
    len: u16,
    no_buf: bool,
    imm: Option<u32>,
    signaled: bool,
    solicited: bool,
    ud_ip: UdIp,
    ud_qpn: u32,
    ud_qkey: QkeySel,
}

#[derive(Arbitrary, Debug)]
enum Modify {
    ToErr,
    ToSqd(bool),
    SqdToRts,
    RtsToRts,
    Reinit,
}

const SUPPORTED: [Opcode; 34] = {
    let mut out = [Opcode(0); 34];
    let mut i = 0;
    let mut n = 0;
    while i < Opcode::ALL_KNOWN.len() {
        if Opcode::ALL_KNOWN[i].is_supported() {
            out[n] = Opcode::ALL_KNOWN[i];
            n += 1;
        }
        i += 1;
    }
    assert!(n == 34);
    out
};

struct Harness {
    v: SoftVerbs,
    start: Instant,
    now: Instant,
    pool: PoolId,
    send_cq: CqId,
    recv_cq: CqId,
    rc: QpNum,
    ud: QpNum,
    gsi: QpNum,
    /// Buffers the harness owns (allocated, or returned by a completion it polled).
    held: BTreeSet<BufId>,
    next_wr: u64,
    /// The PSN the RC responder is believed to expect next.
    req_next: u32,
    /// The last RC request PSN transmitted.
    last_tx_psn: u32,
    tx: Vec<u8>,
    completions: Vec<Completion>,
}

fn rts_attr(qp_type: QpType) -> QpAttr {
    match qp_type {
        QpType::Rc => QpAttr {
            timeout: Some(4),
            retry_cnt: Some(3),
            rnr_retry: Some(2),
            sq_psn: Some(Psn::new(SQ_PSN)),
            max_rd_atomic: Some(0),
            ..QpAttr::to_state(QpState::Rts)
        },
        _ => QpAttr {
            sq_psn: Some(Psn::new(SQ_PSN)),
            ..QpAttr::to_state(QpState::Rts)
        },
    }
}

fn bring_up(v: &mut SoftVerbs, qp: QpNum, qp_type: QpType) {
    let init = match qp_type {
        QpType::Rc => QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            access: Some(AccessFlags::default()),
            ..QpAttr::to_state(QpState::Init)
        },
        QpType::Ud => QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(QKey(UD_QKEY)),
            ..QpAttr::to_state(QpState::Init)
        },
        QpType::Gsi => QpAttr {
            pkey_index: Some(0),
            qkey: Some(QKey::GSI),
            ..QpAttr::to_state(QpState::Init)
        },
    };
    v.modify_qp(qp, &init).expect("to INIT");
    let rtr = match qp_type {
        QpType::Rc => QpAttr {
            av: Some(AddressVector::to_gid(Gid::from(PEER))),
            path_mtu: Some(PathMtu::Mtu256),
            dest_qpn: Some(QpNum::new(PEER_QPN)),
            rq_psn: Some(Psn::new(RQ_PSN)),
            max_dest_rd_atomic: Some(0),
            min_rnr_timer: Some(3),
            ..QpAttr::to_state(QpState::Rtr)
        },
        _ => QpAttr::to_state(QpState::Rtr),
    };
    v.modify_qp(qp, &rtr).expect("to RTR");
    v.modify_qp(qp, &rts_attr(qp_type)).expect("to RTS");
    assert_eq!(v.query_qp_state(qp), Ok(QpState::Rts));
}

/// Sum of the receive-side drop counters and RNR NAKs: unchanged iff a request was accepted.
fn rejections(s: &SoftStats) -> u64 {
    s.rx_malformed
        + s.rx_bad_icrc
        + s.rx_bad_tver
        + s.rx_bad_pkey
        + s.rx_unknown_qpn
        + s.rx_bad_src
        + s.rx_bad_qkey
        + s.rx_bad_state
        + s.rx_ud_dropped
        + s.rx_duplicate
        + s.rx_out_of_sequence
        + s.tx_rnr_naks
}

impl Harness {
    fn new() -> Self {
        let mut cfg = SoftConfig::new(IpAddr::V4(LOCAL));
        cfg.verify_icrc_v4 = false;
        let mut v = SoftVerbs::new(cfg);
        let pd = v.alloc_pd().unwrap();
        let pool = v.create_pool(pd, BUF_LEN, NBUF).unwrap();
        let send_cq = v.create_cq(CQ_DEPTH).unwrap();
        let recv_cq = v.create_cq(CQ_DEPTH).unwrap();
        let mk = |v: &mut SoftVerbs, qp_type| {
            v.create_qp(&QpInit {
                pd,
                qp_type,
                send_cq,
                recv_cq,
                srq: None,
                max_send_wr: 8,
                max_recv_wr: 8,
                sq_sig_all: false,
            })
            .unwrap()
        };
        let rc = mk(&mut v, QpType::Rc);
        let ud = mk(&mut v, QpType::Ud);
        let gsi = mk(&mut v, QpType::Gsi);
        assert_eq!(gsi, QpNum::GSI);
        for (qp, t) in [(rc, QpType::Rc), (ud, QpType::Ud), (gsi, QpType::Gsi)] {
            bring_up(&mut v, qp, t);
        }
        let start = Instant::now();
        let mut h = Self {
            v,
            start,
            now: start,
            pool,
            send_cq,
            recv_cq,
            rc,
            ud,
            gsi,
            held: BTreeSet::new(),
            next_wr: 1,
            req_next: RQ_PSN,
            last_tx_psn: SQ_PSN.wrapping_sub(1) & 0xFF_FFFF,
            tx: Vec::with_capacity(2048),
            completions: Vec::new(),
        };
        for qp in [rc, ud, gsi] {
            for _ in 0..3 {
                h.post_recv(qp);
            }
        }
        h.check();
        h
    }

    fn qpn(&self, s: QpSel) -> QpNum {
        match s {
            QpSel::Rc => self.rc,
            QpSel::Ud => self.ud,
            QpSel::Gsi => self.gsi,
        }
    }

    fn qp_type(&self, qp: QpNum) -> QpType {
        if qp == self.rc {
            QpType::Rc
        } else if qp == self.ud {
            QpType::Ud
        } else {
            QpType::Gsi
        }
    }

    fn alloc(&mut self) -> Option<BufId> {
        let b = self.v.pools_mut().alloc(self.pool)?;
        assert!(self.held.insert(b), "pool handed out {b:?} twice");
        Some(b)
    }

    /// Gives a held buffer back to the pool; it must be in the pool's held state.
    fn free(&mut self, b: BufId) {
        assert!(
            self.held.remove(&b),
            "freeing {b:?} which the harness does not hold"
        );
        self.v
            .pools_mut()
            .free(b)
            .unwrap_or_else(|e| panic!("buffer {b:?} not held by the caller: {e:?}"));
    }

    fn wr(&mut self) -> WrId {
        self.next_wr += 1;
        WrId(self.next_wr)
    }

    fn post_recv(&mut self, qp: QpNum) {
        let Some(b) = self.alloc() else { return };
        let wr = self.wr();
        match self.v.post_recv(qp, wr, b) {
            Ok(()) => {
                self.held.remove(&b);
            }
            Err(_) => self.free(b),
        }
    }

    fn check(&mut self) {
        assert_eq!(self.v.qp_count(), 3, "qp_count changed");
        let pools = self.v.pools();
        let free = pools.free_count(self.pool);
        let posted = pools.posted_count();
        assert!(
            free + posted + self.held.len() <= NBUF,
            "buffers over-accounted: free {free} + posted {posted} + held {} > {NBUF}",
            self.held.len()
        );
        for b in &self.held {
            assert!(
                pools.get(*b).is_ok(),
                "harness-held {b:?} is not in held state"
            );
        }
        while let Some(ev) = self.v.poll_async_event() {
            match ev {
                AsyncEvent::QpLastWqeReached(q)
                | AsyncEvent::QpFatal(q)
                | AsyncEvent::QpReqErr(q)
                | AsyncEvent::QpAccessErr(q)
                | AsyncEvent::CommEst(q)
                | AsyncEvent::SqDrained(q) => {
                    assert!([self.rc, self.ud, self.gsi].contains(&q), "event for {q}")
                }
                _ => {}
            }
        }
    }

    fn src_addr(&self, s: SrcSel) -> (SocketAddr, IpAddr) {
        let p = ROCEV2_UDP_PORT;
        match s {
            SrcSel::Peer => (SocketAddr::new(PEER.into(), p), LOCAL.into()),
            SrcSel::PeerOtherPort(port) => (SocketAddr::new(PEER.into(), port), LOCAL.into()),
            SrcSel::Stranger => (SocketAddr::new(STRANGER.into(), p), LOCAL.into()),
            SrcSel::WrongDst => (
                SocketAddr::new(PEER.into(), p),
                Ipv4Addr::new(198, 18, 0, 9).into(),
            ),
            SrcSel::V6 => (
                SocketAddr::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).into(), p),
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into(),
            ),
        }
    }

    fn deliver(&mut self, src: SocketAddr, dst: IpAddr, d: &[u8]) {
        let before = self.v.stats().rx_datagrams;
        self.v.handle_datagram(self.now, src, dst, d);
        assert_eq!(self.v.stats().rx_datagrams, before + 1);
    }

    fn raw(&mut self, body: &[u8]) {
        let Some((&sel, d)) = body.split_first() else {
            return;
        };
        let src = match sel % 5 {
            0 => SrcSel::Peer,
            1 => SrcSel::PeerOtherPort(u16::from(sel)),
            2 => SrcSel::Stranger,
            3 => SrcSel::WrongDst,
            _ => SrcSel::V6,
        };
        let (src, dst) = self.src_addr(src);
        self.deliver(src, dst, d);
    }

    fn built(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let s = PacketSpec::arbitrary(u)?;
        if trace() {
            eprintln!("  built {s:?}");
        }
        let op = SUPPORTED[usize::from(s.opcode) % SUPPORTED.len()];
        let dest_qp = match s.target {
            Target::Rc => self.rc.get(),
            Target::Ud => self.ud.get(),
            Target::Gsi => self.gsi.get(),
            Target::Other(q) => q,
        };
        let psn = match s.psn {
            PsnSel::Expected(d) => self.req_next.wrapping_add(d as i32 as u32),
            PsnSel::LastTx(d) => self.last_tx_psn.wrapping_add(d as i32 as u32),
            PsnSel::Raw(p) => p,
        } & 0xFF_FFFF;
        let mut bth = Bth::new(op, dest_qp, psn);
        bth.solicited = s.solicited;
        bth.mig_req = s.mig_req;
        bth.ack_req = s.ack_req;
        bth.fecn = s.fecn;
        bth.becn = s.becn;
        bth.tver = s.bad_tver.map_or(0, |t| t & 0xF);
        bth.pkey = s.pkey.unwrap_or(DEFAULT_PKEY);
        let syndrome = Syndrome::from_byte(s.syndrome & 0x7F).unwrap_or(Syndrome::Ack {
            credits: s.syndrome & 0x1F,
        });
        let qkey = match s.qkey {
            QkeySel::Ud => UD_QKEY,
            QkeySel::Gsi => GSI_QKEY,
            QkeySel::Raw(k) => k,
        };
        let repr = RoceRepr {
            bth,
            reth: op.has_reth().then_some(Reth {
                va: s.reth.0,
                rkey: s.reth.1,
                dma_len: s.reth.2,
            }),
            aeth: op.has_aeth().then_some(Aeth {
                syndrome,
                msn: s.msn & 0xFF_FFFF,
            }),
            deth: op.has_deth().then_some(Deth {
                qkey,
                src_qp: s.src_qp & 0xFF_FFFF,
            }),
            imm: op.has_immediate().then_some(ImmDt(s.imm)),
        };
        assert_eq!(repr.check(), Ok(()));
        let len = match s.len {
            LenSel::Mtu => 256,
            LenSel::Len(n) => usize::from(n) % 1100,
        };
        let mut payload = u.bytes(u.len())?.to_vec();
        payload.resize(len, 0x5A);
        if !op.has_payload() {
            payload.clear();
        }
        let (src, dst) = self.src_addr(s.src);
        let ip = match (src.ip(), dst) {
            (IpAddr::V4(a), IpAddr::V4(b)) => IpHeaderInfo::V4 {
                src: a,
                dst: b,
                identification: 0,
                dont_fragment: true,
            },
            (IpAddr::V6(a), IpAddr::V6(b)) => IpHeaderInfo::V6 { src: a, dst: b },
            _ => unreachable!(),
        };
        let mut d = Vec::new();
        repr.emit(&payload, &ip, src.port(), ROCEV2_UDP_PORT, &mut d);

        let is_rc_request =
            dest_qp == self.rc.get() && op.0 < 0x20 && op.is_send() && !op.is_response();
        let before = rejections(&self.v.stats());
        self.deliver(src, dst, &d);
        if is_rc_request
            && psn == self.req_next
            && rejections(&self.v.stats()) == before
            && self.v.query_qp_state(self.rc) != Ok(QpState::Err)
        {
            self.req_next = (psn + 1) & 0xFF_FFFF;
        }
        Ok(())
    }

    fn advance(&mut self, body: &[u8]) {
        let mode = body.first().copied().unwrap_or(0);
        let n = body
            .get(1..5)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
        let step = match mode % 4 {
            0 => match self.v.poll_timeout() {
                Some(t) if t > self.now => t - self.now,
                _ => Duration::ZERO,
            },
            1 => Duration::from_nanos(u64::from(n)),
            2 => Duration::from_micros(u64::from(n % 1_000_000)),
            _ => Duration::from_millis(u64::from(n % 10_000)),
        };
        self.now += step;
        assert!(self.now - self.start < Duration::from_secs(1 << 40));
        self.v.handle_timeout(self.now);
        if let Some(t) = self.v.poll_timeout() {
            assert!(t > self.now, "handle_timeout left a due timer");
        }
        let s = self.v.stats();
        self.v.handle_timeout(self.now);
        assert_eq!(self.v.stats(), s, "handle_timeout not idempotent");
    }

    fn drain(&mut self, body: &[u8]) {
        let max = body.first().map_or(64, |b| usize::from(*b) + 1);
        for _ in 0..max {
            let Some(dst) = self.v.poll_transmit(self.now, &mut self.tx) else {
                break;
            };
            assert_eq!(dst.port(), ROCEV2_UDP_PORT);
            let IpAddr::V4(dip) = dst.ip() else {
                panic!("IPv4 provider sent to {dst}");
            };
            let ip = IpHeaderInfo::V4 {
                src: LOCAL,
                dst: dip,
                identification: 0,
                dont_fragment: true,
            };
            let p = RocePacket::parse_verified(&self.tx, &ip, ROCEV2_UDP_PORT, ROCEV2_UDP_PORT)
                .unwrap_or_else(|e| {
                    panic!("transmitted an invalid datagram ({e:?}): {:02x?}", self.tx)
                });
            if trace() {
                eprintln!(
                    "  tx to {dst}: {} psn {} {:?} {} bytes",
                    p.bth.opcode,
                    p.bth.psn,
                    p.aeth,
                    p.payload.len()
                );
            }
            assert_eq!(p.bth.tver, 0);
            assert_eq!(p.bth.pkey, DEFAULT_PKEY);
            let op = p.bth.opcode;
            if op.0 < 0x20 {
                // RC: only from our RC QP to the peer.
                assert_eq!(dip, PEER, "RC packet to {dip}");
                assert_eq!(p.bth.dest_qp, PEER_QPN);
                assert!(p.payload.len() <= 256, "RC packet larger than the path MTU");
                if op.is_send() {
                    self.last_tx_psn = p.bth.psn;
                } else {
                    assert_eq!(op, Opcode::RC_ACKNOWLEDGE, "RC QP sent {op}");
                }
            } else {
                assert!(
                    op == Opcode::UD_SEND_ONLY || op == Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                    "sent {op}"
                );
                let deth = p.deth.unwrap();
                assert!(deth.src_qp == self.ud.get() || deth.src_qp == self.gsi.get());
            }
        }
    }

    fn post_send(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let s = SendSpec::arbitrary(u)?;
        if trace() {
            eprintln!("  post_send {s:?}");
        }
        let qp = self.qpn(s.qp);
        let buf = if s.no_buf {
            None
        } else {
            match self.alloc() {
                Some(b) => Some(b),
                None => return Ok(()),
            }
        };
        let ip: IpAddr = match s.ud_ip {
            UdIp::Peer => PEER.into(),
            UdIp::Local => LOCAL.into(),
            UdIp::V6 => Ipv6Addr::LOCALHOST.into(),
        };
        let qkey = match s.ud_qkey {
            QkeySel::Ud => UD_QKEY,
            QkeySel::Gsi => GSI_QKEY,
            QkeySel::Raw(k) => k,
        };
        let wr = SendWr {
            wr_id: self.wr(),
            buf,
            len: if buf.is_some() {
                usize::from(s.len) % 700
            } else {
                0
            },
            imm: s.imm,
            signaled: s.signaled,
            solicited: s.solicited,
            ud: (self.qp_type(qp) != QpType::Rc).then(|| UdDest {
                av: AddressVector::to_gid(Gid::from_ip(ip)),
                remote_qpn: QpNum::new(s.ud_qpn),
                remote_qkey: QKey(qkey),
            }),
        };
        let r = self.v.post_send(qp, &wr);
        if trace() {
            eprintln!("  -> {r:?}");
        }
        match r {
            Ok(()) => {
                if let Some(b) = buf {
                    self.held.remove(&b);
                }
            }
            Err(_) => {
                if let Some(b) = buf {
                    self.free(b);
                }
            }
        }
        Ok(())
    }

    fn poll_cqs(&mut self, max: usize) {
        for (cq, want) in [
            (self.send_cq, WcOpcode::Send),
            (self.recv_cq, WcOpcode::Recv),
        ] {
            self.completions.clear();
            let n = self.v.poll_cq(cq, &mut self.completions, max);
            assert_eq!(n, self.completions.len());
            assert!(n <= max);
            for c in std::mem::take(&mut self.completions) {
                if trace() {
                    eprintln!("  completion {c:?}");
                }
                assert_eq!(c.opcode, want, "{c:?} on the wrong CQ");
                assert!([self.rc, self.ud, self.gsi].contains(&c.qp), "{c:?}");
                if c.opcode == WcOpcode::Recv {
                    assert!(c.buf.is_some(), "receive completion without a buffer");
                    if c.status == WcStatus::Success {
                        assert!(c.byte_len as usize <= BUF_LEN, "{c:?}");
                        assert_eq!(c.grh, c.qp != self.rc, "{c:?}");
                    }
                }
                if let Some(b) = c.buf {
                    assert!(
                        self.v.pools().get(b).is_ok(),
                        "completion buffer {b:?} not held"
                    );
                    assert!(self.held.insert(b), "buffer {b:?} returned twice");
                    self.free(b);
                }
            }
        }
    }

    fn modify(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let qp = self.qpn(QpSel::arbitrary(u)?);
        let t = self.qp_type(qp);
        let m = Modify::arbitrary(u)?;
        let cur = self.v.query_qp_state(qp).unwrap();
        let r = match m {
            Modify::ToErr => self.v.modify_qp(qp, &QpAttr::to_state(QpState::Err)),
            Modify::ToSqd(notify) => self.v.modify_qp(
                qp,
                &QpAttr {
                    en_sqd_async_notify: Some(notify),
                    ..QpAttr::to_state(QpState::Sqd)
                },
            ),
            Modify::SqdToRts | Modify::RtsToRts => {
                self.v.modify_qp(qp, &QpAttr::to_state(QpState::Rts))
            }
            Modify::Reinit => {
                self.v
                    .modify_qp(qp, &QpAttr::to_state(QpState::Reset))
                    .unwrap();
                bring_up(&mut self.v, qp, t);
                if t == QpType::Rc {
                    self.req_next = RQ_PSN;
                    self.last_tx_psn = SQ_PSN.wrapping_sub(1) & 0xFF_FFFF;
                }
                Ok(())
            }
        };
        let now = self.v.query_qp_state(qp).unwrap();
        if trace() {
            eprintln!("  modify {qp} {m:?}: {cur:?} -> {now:?} ({r:?})");
        }
        match r {
            Ok(()) => {}
            Err(_) => assert_eq!(now, cur, "failed modify_qp changed the state"),
        }
        Ok(())
    }

    fn op(&mut self, tag: u8, body: &[u8]) {
        if trace() {
            eprintln!("op tag {tag:#04x} ({} bytes)", body.len());
        }
        let mut u = Unstructured::new(body);
        match tag % 8 {
            0 => self.raw(body),
            1 | 2 => {
                let _ = self.built(&mut u);
            }
            3 => self.advance(body),
            4 => self.drain(body),
            5 => {
                let _ = self.post_send(&mut u);
            }
            6 => {
                let qp = self.qpn(QpSel::arbitrary(&mut u).unwrap_or(QpSel::Rc));
                let n = u.int_in_range(1..=4u8).unwrap_or(1);
                for _ in 0..n {
                    self.post_recv(qp);
                }
            }
            _ => {
                if tag & 0x80 != 0 {
                    let _ = self.modify(&mut u);
                } else {
                    self.poll_cqs(usize::from(body.first().copied().unwrap_or(64)));
                }
            }
        }
        self.check();
    }
}

fuzz_target!(|data: &[u8]| {
    let mut h = Harness::new();
    let mut rest = data;
    let mut ops = 0;
    while rest.len() >= 3 && ops < MAX_OPS {
        let tag = rest[0];
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let body = &rest[3..3 + len];
        rest = &rest[3 + len..];
        h.op(tag, body);
        ops += 1;
    }
    // Drain everything; then every buffer is accounted for exactly.
    h.drain(&[255]);
    h.poll_cqs(usize::MAX);
    h.check();
    if trace() {
        eprintln!("end: {:#?}", h.v.stats());
    }
    let pools = h.v.pools();
    let (free, posted) = (pools.free_count(h.pool), pools.posted_count());
    assert_eq!(
        free + posted + h.held.len(),
        NBUF,
        "buffers lost: free {free} + posted {posted} + held {}",
        h.held.len()
    );
});
