//! Writes the seed corpora under `fuzz/seeds/<target>/`: datagrams emitted by `RoceRepr::emit`,
//! and for `soft_datagrams` chunk sequences (see that target's docs) that drive the engine
//! through in-order RC receives, multi-packet messages, UD/GSI receives, RC sends that are
//! ACKed, RNR-NAKed or time out, UD sends and QP state changes.
//!
//! For `cm_mad`, one MAD of each kind the CM sends; for `cm_machine`, operation sequences (see
//! that target's docs) that connect, lose and retransmit MADs, disconnect from both ends and
//! time out; for `endpoint_script`, scripts that ping across nodes (IPv4, IPv6, 65000 B),
//! kill and restart nodes, shut down, run with quirks and faults, hit the QP budget and inject
//! datagrams, and send packets too big for the connection.
//!
//! For `cma_hdr`, REQ private data framed by rdma_cm (IPv4, IPv6) and unframed.
//!
//! Run from `fuzz/`: `cargo run --example gen_seeds` (no sanitizer or nightly flags needed).

use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;

use ipoib_cm::verbs::{Gid, PathMtu, Psn, QpNum};
use ipoib_cm::wire::cm::{
    ipoib_service_id, CmMad, CmMessage, CmPath, Drep, Dreq, IpoibCmData, Mra, Rej, RejReason, Rep,
    Req, Rtu, TargetMsg,
};
use ipoib_cm::wire::cma::CmaHdr;
use ipoib_cm::wire::{
    Aeth, Bth, Deth, ImmDt, IpHeaderInfo, NakCode, Opcode, Reth, RoceRepr, GSI_QKEY,
    ROCEV2_UDP_PORT,
};

const UD_QKEY: u32 = 0x1111_2222;

fn ip() -> IpHeaderInfo {
    IpHeaderInfo::V4 {
        src: Ipv4Addr::new(198, 18, 0, 2),
        dst: Ipv4Addr::new(198, 18, 0, 1),
        identification: 0,
        dont_fragment: true,
    }
}

fn emit(repr: RoceRepr, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    repr.emit(payload, &ip(), ROCEV2_UDP_PORT, ROCEV2_UDP_PORT, &mut out);
    out
}

fn rc(op: Opcode, psn: u32, ack_req: bool) -> RoceRepr {
    let mut bth = Bth::new(op, 0x11, psn);
    bth.ack_req = ack_req;
    RoceRepr::new(bth)
}

fn ud(op: Opcode, qpn: u32, qkey: u32, src_qp: u32) -> RoceRepr {
    RoceRepr {
        deth: Some(Deth { qkey, src_qp }),
        imm: op.has_immediate().then_some(ImmDt(0xC0FF_EE00)),
        ..RoceRepr::new(Bth::new(op, qpn, 7))
    }
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| i as u8).collect()
}

/// Mirrors how `arbitrary` 1.x decodes the harness's structured chunk bodies.
#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn bool(self, v: bool) -> Self {
        self.u8(u8::from(v))
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A derived enum's variant: a u32 `v` with `(v * count) >> 32 == idx`.
    fn variant(self, idx: u64, count: u64) -> Self {
        self.u32((idx << 32).div_ceil(count) as u32)
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
}

fn supported_index(op: Opcode) -> u8 {
    Opcode::ALL_KNOWN
        .iter()
        .filter(|o| o.is_supported())
        .position(|o| *o == op)
        .unwrap() as u8
}

/// Body of a "built packet" chunk (`PacketSpec`) from 198.18.0.2 to QP `target` (0 RC, 1 UD,
/// 2 GSI), PSN relative to the last RC request sent (`psn_last_tx`) or to the expected one.
fn built(target: u64, op: Opcode, psn_last_tx: Option<i8>, syndrome: u8, len: u16) -> Vec<u8> {
    let e = Enc::default().variant(target, 4).u8(supported_index(op));
    let e = match psn_last_tx {
        Some(d) => e.variant(1, 3).u8(d as u8),
        None => e.variant(0, 3).u8(0),
    };
    e.variant(0, 5) // src: peer
        .bool(false) // solicited
        .bool(false) // mig_req
        .bool(true) // ack_req
        .bool(false) // fecn
        .bool(false) // becn
        .bool(false) // bad_tver: None
        .bool(false) // pkey: None
        .u64(0)
        .u32(0)
        .u32(0) // reth
        .u8(syndrome)
        .u32(0) // msn
        .variant(if target == 2 { 1 } else { 0 }, 3) // qkey
        .u32(0x33) // src_qp
        .u32(0xAB) // imm
        .variant(1, 2)
        .u16(len)
        .0
}

/// Body of a `post_send` chunk (`SendSpec`).
fn send(qp: u64, len: u16, imm: Option<u32>, signaled: bool, ud_qpn: u32) -> Vec<u8> {
    let e = Enc::default().variant(qp, 3).u16(len).bool(false);
    let e = match imm {
        Some(i) => e.bool(true).u32(i),
        None => e.bool(false),
    };
    e.bool(signaled)
        .bool(false)
        .variant(0, 3) // to the peer
        .u32(ud_qpn)
        .variant(0, 3) // UD Q_Key
        .0
}

fn modify(qp: u64, m: u64) -> Vec<u8> {
    let e = Enc::default().variant(qp, 3).variant(m, 5);
    if m == 1 {
        e.bool(true).0
    } else {
        e.0
    }
}

#[derive(Default)]
struct Seq(Vec<u8>);

impl Seq {
    fn chunk(mut self, tag: u8, body: &[u8]) -> Self {
        self.0.push(tag);
        self.0.extend_from_slice(&(body.len() as u16).to_le_bytes());
        self.0.extend_from_slice(body);
        self
    }
    fn raw(self, d: &[u8]) -> Self {
        self.chunk(0, &Enc::default().u8(0).bytes(d).0)
    }
    fn built(self, body: Vec<u8>) -> Self {
        self.chunk(1, &body)
    }
    fn until_timer(self) -> Self {
        self.chunk(3, &[0])
    }
    fn advance_ms(self, ms: u32) -> Self {
        self.chunk(3, &Enc::default().u8(3).u32(ms).0)
    }
    fn drain(self) -> Self {
        self.chunk(4, &[])
    }
    fn send(self, body: Vec<u8>) -> Self {
        self.chunk(5, &body)
    }
    fn recv(self, qp: u64, n: u8) -> Self {
        self.chunk(6, &Enc::default().variant(qp, 3).u8(n - 1).0)
    }
    fn poll(self) -> Self {
        self.chunk(7, &[255])
    }
    fn modify(self, body: Vec<u8>) -> Self {
        self.chunk(0x87, &body)
    }
}

fn write(target: &str, name: &str, data: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(name), data).unwrap();
}

fn main() {
    let aeth_op = |op: Opcode, aeth: Aeth| RoceRepr {
        aeth: Some(aeth),
        ..rc(op, 200, false)
    };
    let packets: Vec<(&str, Vec<u8>)> = vec![
        (
            "rc_send_only",
            emit(rc(Opcode::RC_SEND_ONLY, 100, true), b"hello"),
        ),
        (
            "rc_send_first",
            emit(rc(Opcode::RC_SEND_FIRST, 100, false), &payload(256)),
        ),
        (
            "rc_send_last_imm",
            emit(
                RoceRepr {
                    imm: Some(ImmDt(0x1234_5678)),
                    ..rc(Opcode::RC_SEND_LAST_WITH_IMMEDIATE, 102, true)
                },
                &payload(13),
            ),
        ),
        (
            "rc_write_only_imm",
            emit(
                RoceRepr {
                    reth: Some(Reth {
                        va: 0x1000,
                        rkey: 0x42,
                        dma_len: 8,
                    }),
                    imm: Some(ImmDt(1)),
                    ..rc(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 5, true)
                },
                &payload(8),
            ),
        ),
        (
            "rc_read_request",
            emit(
                RoceRepr {
                    reth: Some(Reth {
                        va: 0x2000,
                        rkey: 0x43,
                        dma_len: 4096,
                    }),
                    ..rc(Opcode::RC_RDMA_READ_REQUEST, 6, true)
                },
                &[],
            ),
        ),
        (
            "rc_read_response_first",
            emit(
                aeth_op(Opcode::RC_RDMA_READ_RESPONSE_FIRST, Aeth::ack(3)),
                &payload(256),
            ),
        ),
        (
            "rc_ack",
            emit(aeth_op(Opcode::RC_ACKNOWLEDGE, Aeth::ack(1)), &[]),
        ),
        (
            "rc_nak_seq",
            emit(
                aeth_op(
                    Opcode::RC_ACKNOWLEDGE,
                    Aeth::nak(NakCode::PsnSequenceError, 1),
                ),
                &[],
            ),
        ),
        (
            "rc_rnr_nak",
            emit(aeth_op(Opcode::RC_ACKNOWLEDGE, Aeth::rnr_nak(12, 1)), &[]),
        ),
        (
            "ud_send_only",
            emit(ud(Opcode::UD_SEND_ONLY, 0x12, UD_QKEY, 0x33), &payload(100)),
        ),
        (
            "ud_send_only_imm",
            emit(
                ud(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 0x12, UD_QKEY, 0x33),
                &payload(3),
            ),
        ),
        (
            "gsi_mad",
            emit(ud(Opcode::UD_SEND_ONLY, 1, GSI_QKEY, 1), &payload(256)),
        ),
        (
            "cnp",
            emit(RoceRepr::new(Bth::new(Opcode::CNP, 0x11, 0)), &[]),
        ),
        (
            "uc_send_only",
            emit(
                RoceRepr::new(Bth::new(Opcode::UC_SEND_ONLY, 0x11, 9)),
                b"uc",
            ),
        ),
    ];
    for (name, p) in &packets {
        write("roce_parse", name, p);
        // The header codecs see the same bytes (BTH first, extension headers after it).
        write("wire_headers", name, &p[..p.len() - 4]);
    }

    let find = |n: &str| {
        packets
            .iter()
            .find(|(name, _)| *name == n)
            .unwrap()
            .1
            .clone()
    };
    let seqs: Vec<(&str, Seq)> = vec![
        (
            "rc_inorder",
            Seq::default().raw(&find("rc_send_only")).drain().poll(),
        ),
        (
            "rc_multi_packet",
            Seq::default()
                .raw(&emit(rc(Opcode::RC_SEND_FIRST, 100, false), &payload(256)))
                .raw(&emit(rc(Opcode::RC_SEND_MIDDLE, 101, false), &payload(256)))
                .raw(&emit(rc(Opcode::RC_SEND_LAST, 102, true), &payload(40)))
                .drain()
                .poll(),
        ),
        (
            "rc_out_of_sequence_and_dup",
            Seq::default()
                .raw(&emit(rc(Opcode::RC_SEND_ONLY, 101, true), b"x"))
                .raw(&emit(rc(Opcode::RC_SEND_ONLY, 100, true), b"y"))
                .raw(&emit(rc(Opcode::RC_SEND_ONLY, 100, true), b"y"))
                .drain()
                .poll(),
        ),
        (
            "ud_and_gsi",
            Seq::default()
                .raw(&find("ud_send_only"))
                .raw(&find("ud_send_only_imm"))
                .raw(&find("gsi_mad"))
                .poll()
                .recv(1, 2),
        ),
        (
            "rc_send_acked",
            Seq::default()
                .send(send(0, 300, None, true, 0))
                .drain()
                .built(built(0, Opcode::RC_ACKNOWLEDGE, Some(0), 0x1F, 0))
                .poll(),
        ),
        (
            "rc_send_seq_nak",
            Seq::default()
                .send(send(0, 600, Some(7), true, 0))
                .drain()
                .built(built(0, Opcode::RC_ACKNOWLEDGE, Some(-1), 0x60, 0))
                .drain()
                .built(built(0, Opcode::RC_ACKNOWLEDGE, Some(0), 0x1F, 0))
                .poll(),
        ),
        (
            "rc_send_rnr_nak",
            Seq::default()
                .send(send(0, 20, None, true, 0))
                .drain()
                .built(built(0, Opcode::RC_ACKNOWLEDGE, Some(0), 0x21, 0))
                .until_timer()
                .drain()
                .built(built(0, Opcode::RC_ACKNOWLEDGE, Some(0), 0x21, 0))
                .until_timer()
                .drain()
                .built(built(0, Opcode::RC_ACKNOWLEDGE, Some(0), 0x21, 0))
                .poll(),
        ),
        (
            "rc_send_timeout",
            Seq::default()
                .send(send(0, 10, None, false, 0))
                .drain()
                .until_timer()
                .drain()
                .until_timer()
                .drain()
                .until_timer()
                .drain()
                .until_timer()
                .drain()
                .advance_ms(5)
                .poll(),
        ),
        (
            "rc_request_built",
            Seq::default()
                .built(built(0, Opcode::RC_SEND_FIRST, None, 0, 256))
                .built(built(0, Opcode::RC_SEND_LAST_WITH_IMMEDIATE, None, 0, 17))
                .drain()
                .poll(),
        ),
        (
            "ud_send",
            Seq::default()
                .send(send(1, 64, Some(9), true, 0x22))
                .send(send(2, 256, None, true, 1))
                .drain()
                .poll(),
        ),
        (
            "modify",
            Seq::default()
                .modify(modify(0, 1))
                .modify(modify(0, 2))
                .modify(modify(1, 0))
                .poll()
                .modify(modify(1, 4))
                .recv(1, 3)
                .raw(&find("ud_send_only"))
                .poll(),
        ),
    ];
    for (name, s) in seqs {
        write("soft_datagrams", name, &s.0);
    }

    for (name, mad) in cm_mads() {
        write("cm_mad", name, &mad);
    }
    for (name, s) in cm_machine_seeds() {
        write("cm_machine", name, &s.0);
    }
    for (name, s) in endpoint_script_seeds() {
        write("endpoint_script", name, &s.0);
    }
    for (name, pd) in cma_hdr_seeds() {
        write("cma_hdr", name, &pd);
    }
}

/// For `cma_hdr`: REQ private data with an IPv4 and an IPv6 header, and one with none.
fn cma_hdr_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let v4 = CmaHdr {
        src_port: 40000,
        src: Ipv4Addr::new(198, 18, 0, 2).into(),
        dst: Ipv4Addr::new(198, 18, 0, 1).into(),
    };
    let v6 = CmaHdr {
        src_port: 7471,
        src: "2001:db8::2".parse::<std::net::Ipv6Addr>().unwrap().into(),
        dst: "2001:db8::1".parse::<std::net::Ipv6Addr>().unwrap().into(),
    };
    let mut padded = v4.req_private_data(b"user").unwrap();
    padded.resize(92, 0);
    vec![
        ("req_v4", padded),
        ("req_v6", v6.req_private_data(&[]).unwrap()),
        ("no_header", vec![0; 92]),
    ]
}

/// Set-up of one `endpoint_script` node (its `NodeSetup`).
#[derive(Default, Clone, Copy)]
struct EpNode {
    drain_never: bool,
    no_last_wqe: bool,
    dup_last_wqe: bool,
    last_wqe_again: bool,
    loss: u8,
    dup: u8,
    reorder: u8,
    corrupt: u8,
    no_srq: bool,
    max_conn_qp: u8,
    reject_policy: bool,
    rx_timeout_s: u8,
    advertise_rdma_cm: bool,
    rdma_cm_only: bool,
}

/// `endpoint_script` inputs: a set-up chunk, then one chunk per step (tags as in the target).
fn endpoint_script_seeds() -> Vec<(&'static str, Seq)> {
    let setup = |three: bool, nodes: [EpNode; 3]| {
        let mut e = Enc::default().bool(three);
        for n in nodes {
            e = e
                .bool(n.drain_never)
                .bool(n.no_last_wqe)
                .bool(n.dup_last_wqe)
                .bool(n.last_wqe_again)
                .u8(n.loss)
                .u8(n.dup)
                .u8(n.reorder)
                .u8(n.corrupt)
                .u8(7) // fault seed
                .bool(n.no_srq)
                .u8(n.max_conn_qp.saturating_sub(1))
                .bool(n.reject_policy)
                .u8(n.rx_timeout_s.max(1) - 1)
                .bool(n.advertise_rdma_cm)
                .bool(n.rdma_cm_only);
        }
        Seq::default().chunk(0, &e.0)
    };
    let plain = [EpNode {
        max_conn_qp: 4,
        rx_timeout_s: 2,
        ..EpNode::default()
    }; 3];
    // TunSpec::Ping4 / Ping6 { to: DstSel, len }
    let ping = |s: Seq, from: u8, v6: bool, to: u64, node: u8, len: u16| {
        // DstSel: 0 Node(node), 1 Unknown, 2 Multicast.
        let e = Enc::default()
            .u8(from)
            .variant(u64::from(v6), 3)
            .variant(to, 3);
        let e = if to == 0 { e.u8(node) } else { e };
        s.chunk(0, &e.u16(len).0)
    };
    let run = |s: Seq, ms: u16| s.chunk(5, &Enc::default().u16(ms).0);
    let kill = |s: Seq, n: u8| s.chunk(2, &[n]);
    let restart = |s: Seq, n: u8| s.chunk(3, &[n]);
    let shutdown = |s: Seq, n: u8, force: bool| s.chunk(4, &[n | if force { 0x80 } else { 0 }]);
    // RoceSpec, with QpSel `qp` (0 Ud, 1 Gsi, 2 Rx(k), 3 Tx(k)) and PayloadSel `payload`
    // (0 Ipoib(t), 1 Mad(t), 2 Raw).
    let roce =
        |s: Seq, node: u8, from: u8, qp: u64, op: Opcode, payload: u64, t: u8, rest: &[u8]| {
            let e = Enc::default().u8(node).u8(from).variant(qp, 6);
            let e = if qp >= 2 { e.u8(0) } else { e };
            let e = e
                .u8(supported_index(op))
                .u32(0)
                .bool(true)
                .u8(0x1F)
                .u32(0)
                .bool(true)
                .u32(0)
                .u32(0x11)
                .variant(payload, 3);
            let e = if payload < 2 { e.u8(t) } else { e };
            s.chunk(8, &e.bytes(rest).0)
        };
    let arp_like = [0u8; 36];
    let mut ids = Vec::new();
    ids.extend_from_slice(&1u32.to_be_bytes());
    ids.extend_from_slice(&1u32.to_be_bytes());
    ids.extend_from_slice(&0x11u32.to_be_bytes());
    // Node 1 a kernel-CM stand-in advertising 0x20, node 2 one that does not (REJ 8, retry).
    let kernel_cm = [
        plain[0],
        EpNode {
            advertise_rdma_cm: true,
            rdma_cm_only: true,
            ..plain[1]
        },
        EpNode {
            rdma_cm_only: true,
            ..plain[2]
        },
    ];
    // CM MAD kind 4 (a REQ), with bits k / 5: 2 a valid cma_hdr, 4 a wrong one, 1 the
    // standard service.
    let req_kind = |bits: u8| 4 + 5 * bits;
    let mut req_ids = Vec::new();
    req_ids.extend_from_slice(&0u32.to_be_bytes());
    req_ids.extend_from_slice(&0x0777u32.to_be_bytes());
    req_ids.extend_from_slice(&0x0123u32.to_be_bytes());
    vec![
        (
            "rdma_cm_flag_and_fallback",
            run(
                ping(
                    ping(
                        ping(setup(true, kernel_cm), 0, false, 0, 1, 100),
                        0,
                        true,
                        0,
                        2,
                        100,
                    ),
                    1,
                    false,
                    0,
                    0,
                    100,
                ),
                3000,
            ),
        ),
        (
            "rdma_cm_reqs_crafted",
            roce(
                roce(
                    roce(
                        setup(false, plain),
                        0,
                        1,
                        1,
                        Opcode::UD_SEND_ONLY,
                        1,
                        req_kind(2),
                        &req_ids,
                    ),
                    0,
                    1,
                    1,
                    Opcode::UD_SEND_ONLY,
                    1,
                    req_kind(4),
                    &req_ids,
                ),
                0,
                1,
                1,
                Opcode::UD_SEND_ONLY,
                1,
                req_kind(0),
                &req_ids,
            )
            .chunk(5, &Enc::default().u16(3000).0),
        ),
        (
            "ping_v4_both_ways",
            run(
                ping(
                    run(ping(setup(false, plain), 0, false, 0, 1, 100), 300),
                    1,
                    false,
                    0,
                    0,
                    3000,
                ),
                300,
            ),
        ),
        (
            "ping_v6_three_nodes_65000",
            run(
                ping(
                    ping(
                        ping(setup(true, plain), 0, true, 0, 1, 64),
                        1,
                        true,
                        0,
                        2,
                        64,
                    ),
                    2,
                    true,
                    0,
                    0,
                    65000,
                ),
                1000,
            ),
        ),
        (
            "kill_and_restart",
            run(
                ping(
                    restart(
                        run(
                            kill(run(ping(setup(false, plain), 0, false, 0, 1, 64), 200), 1),
                            3000,
                        ),
                        1,
                    ),
                    0,
                    false,
                    0,
                    1,
                    64,
                ),
                5000,
            ),
        ),
        (
            "shutdown_then_force",
            shutdown(
                run(
                    shutdown(
                        run(
                            ping(
                                ping(setup(false, plain), 0, false, 0, 1, 64),
                                1,
                                false,
                                0,
                                0,
                                64,
                            ),
                            200,
                        ),
                        0,
                        false,
                    ),
                    300,
                ),
                0,
                true,
            ),
        ),
        (
            "quirks_faults_nosrq",
            run(
                ping(
                    ping(
                        setup(
                            false,
                            [
                                EpNode {
                                    drain_never: true,
                                    loss: 10,
                                    dup: 10,
                                    reorder: 10,
                                    corrupt: 5,
                                    max_conn_qp: 2,
                                    rx_timeout_s: 1,
                                    ..EpNode::default()
                                },
                                EpNode {
                                    no_srq: true,
                                    no_last_wqe: true,
                                    loss: 5,
                                    max_conn_qp: 1,
                                    rx_timeout_s: 3,
                                    ..EpNode::default()
                                },
                                EpNode::default(),
                            ],
                        ),
                        0,
                        false,
                        0,
                        1,
                        2000,
                    ),
                    1,
                    true,
                    0,
                    0,
                    500,
                ),
                4000,
            ),
        ),
        (
            "qp_budget_reject_and_evict",
            run(
                ping(
                    run(
                        ping(
                            setup(
                                true,
                                [
                                    EpNode {
                                        max_conn_qp: 1,
                                        reject_policy: true,
                                        rx_timeout_s: 5,
                                        dup_last_wqe: true,
                                        ..EpNode::default()
                                    },
                                    EpNode {
                                        max_conn_qp: 1,
                                        rx_timeout_s: 5,
                                        ..EpNode::default()
                                    },
                                    EpNode {
                                        no_srq: true,
                                        max_conn_qp: 1,
                                        rx_timeout_s: 5,
                                        ..EpNode::default()
                                    },
                                ],
                            ),
                            1,
                            false,
                            0,
                            0,
                            64,
                        ),
                        200,
                    ),
                    2,
                    false,
                    0,
                    0,
                    64,
                ),
                200,
            ),
        ),
        (
            "too_big_for_the_connection",
            run(
                ping(
                    run(ping(setup(false, plain), 0, false, 0, 1, 65535), 300),
                    1,
                    true,
                    0,
                    0,
                    65535,
                ),
                300,
            ),
        ),
        (
            "unknown_and_multicast",
            run(
                ping(
                    ping(setup(false, plain), 0, false, 1, 0, 64),
                    1,
                    true,
                    2,
                    0,
                    64,
                ),
                4000,
            ),
        ),
        (
            "injected_datagrams",
            roce(
                roce(
                    roce(
                        run(ping(setup(false, plain), 0, false, 0, 1, 64), 200),
                        1,
                        0,
                        2,
                        Opcode::RC_SEND_ONLY,
                        0,
                        0,
                        &ping4_bytes(),
                    ),
                    1,
                    0,
                    1,
                    Opcode::UD_SEND_ONLY,
                    1,
                    1,
                    &ids,
                ),
                0,
                1,
                0,
                Opcode::UD_SEND_ONLY,
                0,
                2,
                &arp_like,
            )
            .chunk(
                7,
                &[
                    0x81, 0x04, 0x00, 0xFF, 0xFF, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
                ],
            )
            .chunk(5, &Enc::default().u16(500).0),
        ),
    ]
}

/// An IPv4 packet from 198.19.0.1 to 198.19.0.2 (a 16-byte UDP datagram).
fn ping4_bytes() -> Vec<u8> {
    let mut p = vec![
        0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 17, 0, 0, 198, 19, 0, 1, 198, 19, 0, 2,
    ];
    p.extend_from_slice(&[0x30, 0x39, 0x30, 0x39, 0, 16, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    p
}

/// One CM MAD of each kind, as the CM fills them in.
fn cm_mads() -> Vec<(&'static str, Vec<u8>)> {
    let gid = |n: u8| Gid::from(Ipv4Addr::new(198, 18, 0, n));
    let ipoib = |qpn: u32| {
        let mut b = [0u8; 8];
        IpoibCmData {
            qpn: QpNum::new(qpn),
            mtu: IpoibCmData::LINUX_MTU,
        }
        .encode(&mut b)
        .unwrap();
        b
    };
    let mut req_private = [0u8; 92];
    req_private[..8].copy_from_slice(&ipoib(0x12));
    let req = Req {
        local_comm_id: 0x1234_0001,
        service_id: ipoib_service_id(QpNum::new(0x12), true),
        local_ca_guid: 0x0002_C903_0000_0101,
        local_qpn: QpNum::new(0x13),
        remote_cm_response_timeout: 17,
        starting_psn: Psn::new(0x00AB_CDEF),
        local_cm_response_timeout: 17,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: Some(PathMtu::Mtu1024),
        rnr_retry_count: 7,
        max_cm_retries: 15,
        primary_path: CmPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid(1),
            remote_gid: gid(2),
            packet_rate: 3,
            hop_limit: 64,
            local_ack_timeout: 14,
            ..CmPath::default()
        },
        private_data: req_private,
        ..Req::default()
    };
    let mut rep_private = [0u8; 196];
    rep_private[..8].copy_from_slice(&ipoib(0x12));
    let rep = Rep {
        local_comm_id: 0x5678_0001,
        remote_comm_id: 0x1234_0001,
        local_qpn: QpNum::new(0x14),
        starting_psn: Psn::new(0x0012_3456),
        target_ack_delay: 15,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: 0x0002_C903_0000_0201,
        private_data: rep_private,
        ..Rep::default()
    };
    let mut rej = Rej {
        local_comm_id: 0,
        remote_comm_id: 0x1234_0001,
        msg_rejected: TargetMsg::Req,
        reason: RejReason::Timeout,
        reject_info_len: 8,
        ..Rej::default()
    };
    rej.ari[..8].copy_from_slice(&0x0002_C903_0000_0201u64.to_be_bytes());
    let tid = 1 << 32 | 0x1234_0001;
    let msgs = [
        ("req", CmMessage::Req(req)),
        ("rep", CmMessage::Rep(rep)),
        (
            "rtu",
            CmMessage::Rtu(Rtu {
                local_comm_id: 0x1234_0001,
                remote_comm_id: 0x5678_0001,
                ..Rtu::default()
            }),
        ),
        (
            "mra",
            CmMessage::Mra(Mra {
                local_comm_id: 0x5678_0001,
                remote_comm_id: 0x1234_0001,
                msg_mraed: TargetMsg::Req,
                service_timeout: 20,
                ..Mra::default()
            }),
        ),
        ("rej_timeout", CmMessage::Rej(rej)),
        (
            "dreq",
            CmMessage::Dreq(Dreq {
                local_comm_id: 0x1234_0001,
                remote_comm_id: 0x5678_0001,
                remote_qpn: QpNum::new(0x14),
                ..Dreq::default()
            }),
        ),
        (
            "drep",
            CmMessage::Drep(Drep {
                local_comm_id: 0x5678_0001,
                remote_comm_id: 0x1234_0001,
                ..Drep::default()
            }),
        ),
    ];
    msgs.into_iter()
        .map(|(name, m)| (name, CmMad::new(tid, m).emit().to_vec()))
        .collect()
}

/// `cm_machine` inputs: a set-up chunk, then one chunk per operation (tags as in the target).
fn cm_machine_seeds() -> Vec<(&'static str, Seq)> {
    // Set-up: `three`, then three `NodeSetup`s (custom = false: CmConfig defaults).
    let setup = |three: bool| {
        let mut e = Enc::default().bool(three);
        for _ in 0..3 {
            e = e.bool(false).u8(0).u8(0).u8(0).u16(0).u32(0).bool(false);
        }
        e.0
    };
    let known = |e: Enc, k: u8| e.variant(0, 2).u8(k);
    let connect = |from: u8, to: u8| {
        Enc::default()
            .u8(from)
            .variant(0, 2) // PeerSel::Node
            .u8(to)
            .variant(0, 4) // ServiceSel::Ipoib
            .u32(0x100 + u32::from(from))
            .u32(0x00AB_CDEF)
            .u8(2) // MTU 1024
            .u8(7)
            .u8(7)
            .bool(false)
            .u8(14)
            .u8(8) // private data
            .0
    };
    let connect_forged = |from: u8| {
        Enc::default()
            .u8(from)
            .variant(1, 2) // PeerSel::Forged
            .u32(0x0000_0909)
            .variant(0, 4)
            .u32(0x200)
            .u32(1)
            .u8(2)
            .u8(7)
            .u8(7)
            .bool(false)
            .u8(14)
            .u8(8)
            .0
    };
    let accept = |node: u8, k: u8| {
        known(Enc::default().u8(node), k)
            .u32(0x300 + u32::from(node))
            .u32(0x0012_3456)
            .bool(true)
            .u8(7)
            .u8(8)
            .0
    };
    let id_op = |node: u8, k: u8| known(Enc::default().u8(node), k).0;
    let deliver_all = Enc::default().variant(3, 4).0;
    let drop_first = Enc::default().variant(1, 4).u16(0).0;
    let advance = |ms: u32| Enc::default().u32(ms).bool(false).0;

    let handshake = |s: Seq, from: u8, to: u8, k_from: u8, k_to: u8| {
        s.chunk(0, &connect(from, to))
            .chunk(7, &deliver_all)
            .chunk(1, &accept(to, k_to))
            .chunk(7, &deliver_all)
            .chunk(3, &id_op(from, k_from))
            .chunk(7, &deliver_all)
    };
    vec![
        (
            "connect_and_disconnect",
            handshake(Seq::default().chunk(0, &setup(false)), 0, 1, 0, 0)
                .chunk(5, &id_op(0, 0))
                .chunk(7, &deliver_all)
                .chunk(7, &deliver_all)
                .chunk(12, &[]),
        ),
        (
            "lost_rtu_rep_resent",
            Seq::default()
                .chunk(0, &setup(false))
                .chunk(0, &connect(0, 1))
                .chunk(7, &deliver_all)
                .chunk(1, &accept(1, 0))
                .chunk(7, &deliver_all)
                .chunk(3, &id_op(0, 0))
                .chunk(7, &drop_first)
                .chunk(12, &[])
                .chunk(7, &deliver_all)
                .chunk(7, &deliver_all)
                .chunk(5, &id_op(1, 0))
                .chunk(7, &deliver_all),
        ),
        (
            "req_times_out",
            Seq::default()
                .chunk(0, &setup(false))
                .chunk(0, &connect_forged(0))
                .chunk(11, &advance(30_000))
                .chunk(11, &advance(30_000))
                .chunk(11, &advance(30_000)),
        ),
        (
            "reject_and_comm_est",
            Seq::default()
                .chunk(0, &setup(true))
                .chunk(0, &connect(0, 1))
                .chunk(0, &connect(2, 1))
                .chunk(7, &deliver_all)
                .chunk(2, &known(Enc::default().u8(1), 0).u16(28).0)
                .chunk(1, &accept(1, 1))
                .chunk(7, &deliver_all)
                .chunk(4, &id_op(1, 1))
                .chunk(7, &deliver_all),
        ),
        (
            "crossing_dreqs",
            handshake(Seq::default().chunk(0, &setup(true)), 1, 2, 0, 0)
                .chunk(5, &id_op(1, 0))
                .chunk(5, &id_op(2, 0))
                .chunk(7, &deliver_all)
                .chunk(7, &deliver_all)
                .chunk(11, &advance(1_000)),
        ),
        (
            "self_connect",
            Seq::default()
                .chunk(0, &setup(false))
                .chunk(0, &connect(0, 0))
                .chunk(7, &deliver_all)
                .chunk(1, &accept(0, 1))
                .chunk(7, &deliver_all)
                .chunk(3, &id_op(0, 0))
                .chunk(7, &deliver_all),
        ),
    ]
}
