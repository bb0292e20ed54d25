//! The checks of data movement: message sizes, completion order, UD with its GRH and Q_Key,
//! buffer lending.

use super::support::*;
use super::*;

/// **RC round trip of 1 B, 4 KiB, 64 KiB and larger messages.** Side `a` sends messages of
/// 1, 4096, 65 524 (the IPoIB-CM maximum), 65 536 and 100 000 bytes of distinct pseudo-random
/// content; `b` receives each and sends the received buffer straight back; `a` receives the
/// echoes. Every receive completes successfully with the right `byte_len` and exactly the
/// bytes sent, in order; every send completes successfully.
pub fn check_rc_message_sizes<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const SIZES: [usize; 5] = [1, 4096, 65_524, 65_536, 100_000];
    let (ea, eb) = endpoints(pair, BIG, 16)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    let msgs: Vec<Vec<u8>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, n)| pattern(0x5EED + i as u64, *n))
        .collect();
    post_recvs(a, RecvTarget::Qp(qa), ea.pool, 100, SIZES.len())?;
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 200, SIZES.len())?;
    for (i, m) in msgs.iter().enumerate() {
        post_send_data(a, qa, ea.pool, i as u64, m)?;
    }
    let n = SIZES.len();
    let ok = wait(pair, &ea, &eb, &mut seen, |s| s.b_recv.len() >= n);
    ensure!(ok, "b received {} of {n} messages", seen.b_recv.len());
    let (_, b) = pair.providers();
    for (i, (c, m)) in seen.b_recv.iter().zip(&msgs).enumerate() {
        expect_recv(b, c, 200 + i as u64, m, 0)?;
        let buf = c.buf.ok_or_else(|| violation!("no buffer"))?;
        b.post_send(qb, &SendWr::send(WrId(300 + i as u64), buf, m.len()))
            .ctx("echo")?;
    }
    // The echoed buffers now belong to b's send WRs, whose completions return them.
    seen.b_recv.clear();
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.a_recv.len() >= n && s.a_send.len() >= n && s.b_send.len() >= n
    });
    ensure!(
        ok,
        "round trip incomplete: a sent {}, b echoed {}, a got {} back",
        seen.a_send.len(),
        seen.b_send.len(),
        seen.a_recv.len()
    );
    let (a, _) = pair.providers();
    for (i, (c, m)) in seen.a_recv.iter().zip(&msgs).enumerate() {
        expect_recv(a, c, 100 + i as u64, m, 0)?;
    }
    let want: Vec<_> = (0..n as u64).map(|i| (i, WcStatus::Success)).collect();
    expect_statuses("a's sends", &seen.a_send, &want)?;
    let want: Vec<_> = (0..n as u64)
        .map(|i| (300 + i, WcStatus::Success))
        .collect();
    expect_statuses("b's echoes", &seen.b_send, &want)?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **Completion order.** 48 sends of sizes 0 to a few path MTUs, every third unsignaled and
/// every fifth with immediate data, are posted back to back. The receiver's completions come
/// in posting order with the right lengths, contents and immediates; the sender gets exactly
/// one successful completion per signaled WR, in posting order, and none for unsignaled
/// ones; afterwards no buffer is left posted.
pub fn check_completion_order<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const N: u64 = 48;
    let (ea, eb) = endpoints(pair, 16 * 1024, 64)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let base_a = a.pools().posted_count();
    let base_b = b.pools().posted_count();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 1000, N as usize)?;
    let mut msgs = Vec::new();
    for i in 0..N {
        let len = ((i * 997) % (3 * 1024 + 7)) as usize * usize::from(i % 7 != 0);
        let m = pattern(i, len);
        let buf = alloc_with(a, ea.pool, &m)?;
        let wr = SendWr {
            signaled: i % 3 != 2,
            imm: (i % 5 == 0).then_some(0xC0DE_0000 | i as u32),
            ..SendWr::send(WrId(i), buf, len)
        };
        a.post_send(qa, &wr).ctx("post_send")?;
        msgs.push((m, wr));
    }
    let signaled = msgs.iter().filter(|(_, w)| w.signaled).count();
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.b_recv.len() >= N as usize && s.a_send.len() >= signaled
    });
    ensure!(
        ok,
        "got {} receives and {} send completions, expected {N} and {signaled}",
        seen.b_recv.len(),
        seen.a_send.len()
    );
    let (a, b) = pair.providers();
    for (i, (c, (m, wr))) in seen.b_recv.iter().zip(&msgs).enumerate() {
        expect_recv(b, c, 1000 + i as u64, m, 0)?;
        ensure!(
            c.imm == wr.imm,
            "receive {i}: immediate {:?}, expected {:?}",
            c.imm,
            wr.imm
        );
    }
    let want: Vec<_> = msgs
        .iter()
        .filter(|(_, w)| w.signaled)
        .map(|(_, w)| (w.wr_id.0, WcStatus::Success))
        .collect();
    expect_statuses("sends", &seen.a_send, &want)?;
    seen.free(a, b);
    let (pa, pb) = (a.pools().posted_count(), b.pools().posted_count());
    ensure!(
        pa == base_a && pb == base_b,
        "buffers still posted after every WR completed: a {pa} (was {base_a}), b {pb} (was {base_b})"
    );
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &Seen::default());
    Ok(())
}

/// **UD send and receive.** Two UD QPs with Q_Key 0x11223344. A 200-byte send with immediate
/// data arrives in a receive buffer after a 40-byte GRH area: `byte_len` is 240, `grh` is
/// set, `src_qp` is the sender, the payload follows the GRH, and the GRH names the sender's
/// GID (for an IPv4-mapped GID, the IPv4 source at bytes 32..36; otherwise the IPv6 source
/// at 8..24). A send with the wrong Q_Key completes at the sender but is dropped by the
/// receiver: the next receive gets the following good message instead. The completion's
/// GRH flag agrees with the address vector, which has a GRH; a UD send whose address vector
/// has none (an IB LID route: DLID, SL 3) is refused by `post_send` on a RoCE port (every
/// provider here: RoCEv2 routes by the GRH; the kernel's `rdma_check_ah_attr`) and nothing
/// of it arrives.
pub fn check_ud_grh_qkey<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    const QK: QKey = QKey(0x1122_3344);
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let qa = create_qp(a, &ea, QpType::Ud, None, (16, 16)).ctx("create UD a")?;
    let qb = create_qp(b, &eb, QpType::Ud, None, (16, 16)).ctx("create UD b")?;
    for (v, q) in [(&mut *a, qa), (&mut *b, qb)] {
        let init = QpAttr {
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(QK),
            ..QpAttr::to_state(QpState::Init)
        };
        v.modify_qp(q, &init).ctx("UD RESET->INIT")?;
        v.modify_qp(q, &QpAttr::to_state(QpState::Rtr))
            .ctx("UD INIT->RTR")?;
        let rts = QpAttr {
            sq_psn: Some(Psn::new(0)),
            ..QpAttr::to_state(QpState::Rts)
        };
        v.modify_qp(q, &rts).ctx("UD RTR->RTS")?;
    }
    post_recvs(b, RecvTarget::Qp(qb), eb.pool, 10, 2)?;
    let gb = b.port_attr().gid;
    let ga = a.port_attr().gid;
    let dest = |qkey| UdDest {
        av: AddressVector::to_gid(gb),
        remote_qpn: qb,
        remote_qkey: qkey,
    };
    let lid_only = UdDest {
        av: AddressVector::to_lid(Lid(0x0012), Sl::new(3).unwrap_or_default()),
        ..dest(QK)
    };
    let buf = alloc_with(a, ea.pool, &pattern(9, 32))?;
    let wr = SendWr {
        ud: Some(lid_only),
        ..SendWr::send(WrId(99), buf, 32)
    };
    match a.post_send(qa, &wr) {
        Err(_) => {
            let _ = a.pools_mut().free(buf);
        }
        Ok(()) => {
            return Err(violation!(
                "a UD send without a GRH was accepted on a RoCE port"
            ))
        }
    }
    let msgs = [pattern(1, 200), pattern(2, 64), pattern(3, 77)];
    let keys = [QK, QKey(QK.0 ^ 1), QK];
    for (i, (m, k)) in msgs.iter().zip(keys).enumerate() {
        let buf = alloc_with(a, ea.pool, m)?;
        let wr = SendWr {
            ud: Some(dest(k)),
            imm: (i == 0).then_some(0xFEED),
            ..SendWr::send(WrId(i as u64), buf, m.len())
        };
        a.post_send(qa, &wr).ctx("UD post_send")?;
    }
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        s.b_recv.len() >= 2 && s.a_send.len() >= 3
    });
    ensure!(
        ok,
        "UD: {} receives and {} send completions, expected 2 and 3",
        seen.b_recv.len(),
        seen.a_send.len()
    );
    let want = [
        (0, WcStatus::Success),
        (1, WcStatus::Success),
        (2, WcStatus::Success),
    ];
    expect_statuses("UD sends", &seen.a_send, &want)?;
    let (_, b) = pair.providers();
    let c0 = &seen.b_recv[0];
    expect_recv(b, c0, 10, &msgs[0], 40)?;
    ensure!(
        c0.grh && c0.src_qp == Some(qa) && c0.imm == Some(0xFEED),
        "UD receive: grh {}, src_qp {:?}, imm {:?}",
        c0.grh,
        c0.src_qp,
        c0.imm
    );
    let grh = b
        .pools()
        .get(c0.buf.ok_or_else(|| violation!("no buffer"))?)
        .ctx("UD buffer")?;
    let src_ok = match ga.to_ip() {
        std::net::IpAddr::V4(v4) => grh.get(32..36) == Some(&v4.octets()[..]),
        std::net::IpAddr::V6(_) => grh.get(8..24) == Some(&ga.0[..]),
    };
    ensure!(src_ok, "the GRH area does not name the sender {ga}");
    // The wrong-key message (1) was dropped: receive 11 holds message 2.
    expect_recv(b, &seen.b_recv[1], 11, &msgs[2], 40)?;
    teardown(pair, (&ea, &eb), (&[qa], &[qb]), &seen);
    Ok(())
}

/// **Buffer lending.** A posted buffer cannot be read, written, freed or posted again by the
/// caller (all fail with [`VerbsError::BufferNotHeld`]); `posted_count` counts it. The
/// completion returns it with its contents (the sent bytes unchanged, the received bytes
/// written). Destroying a QP with a receive still posted frees that buffer without a
/// completion, and `posted_count` returns to where it started.
pub fn check_buffer_lending<V: Verbs, P: ConformancePair<V>>(
    pair: &mut P,
) -> Result<(), ConformanceError> {
    let (ea, eb) = endpoints(pair, 4096, 8)?;
    let mut seen = Seen::default();
    let (a, b) = pair.providers();
    let (base_a, base_b) = (a.pools().posted_count(), b.pools().posted_count());
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).ctx("connect")?;
    let rb = post_recvs(b, RecvTarget::Qp(qb), eb.pool, 5, 2)?;
    let msg = pattern(11, 3333);
    let sb = post_send_data(a, qa, ea.pool, 1, &msg)?;
    for (v, buf, who) in [(&mut *a, sb, "send"), (&mut *b, rb[0], "receive")] {
        ensure!(
            v.pools().get(buf) == Err(VerbsError::BufferNotHeld(buf)),
            "a posted {who} buffer is readable"
        );
        ensure!(
            v.pools_mut().get_mut(buf).is_err(),
            "a posted {who} buffer is writable"
        );
        ensure!(
            v.pools_mut().free(buf).is_err(),
            "a posted {who} buffer could be freed"
        );
    }
    match a.post_send(qa, &SendWr::send(WrId(2), sb, 10)) {
        Err(VerbsError::BufferNotHeld(_)) => {}
        r => return Err(violation!("posting a posted buffer again gave {r:?}")),
    }
    match b.post_recv(qb, WrId(7), rb[0]) {
        Err(VerbsError::BufferNotHeld(_)) => {}
        r => {
            return Err(violation!(
                "posting a posted receive buffer again gave {r:?}"
            ))
        }
    }
    ensure!(
        a.pools().posted_count() == base_a + 1 && b.pools().posted_count() == base_b + 2,
        "posted_count: a {} (expected {}), b {} (expected {})",
        a.pools().posted_count(),
        base_a + 1,
        b.pools().posted_count(),
        base_b + 2
    );
    let ok = wait(pair, &ea, &eb, &mut seen, |s| {
        !s.a_send.is_empty() && !s.b_recv.is_empty()
    });
    ensure!(ok, "the send did not complete");
    let (a, b) = pair.providers();
    ensure!(
        seen.a_send[0].buf == Some(sb) && seen.b_recv[0].buf == Some(rb[0]),
        "completions returned other buffers: {:?} / {:?}",
        seen.a_send[0].buf,
        seen.b_recv[0].buf
    );
    ensure!(
        a.pools()
            .get(sb)
            .ctx("returned send buffer")?
            .get(..msg.len())
            == Some(&msg[..]),
        "the send buffer changed while lent"
    );
    expect_recv(b, &seen.b_recv[0], 5, &msg, 0)?;
    ensure!(
        b.pools().posted_count() == base_b + 1,
        "b posted_count {} after one of two receives completed, expected {}",
        b.pools().posted_count(),
        base_b + 1
    );
    let free_before = b.pools().free_count(eb.pool);
    b.destroy_qp(qb).ctx("destroy b")?;
    ensure!(
        b.pools().posted_count() == base_b,
        "destroying a QP left its receive buffer posted"
    );
    ensure!(
        b.pools().free_count(eb.pool) == free_before + 1,
        "destroying a QP did not free its receive buffer"
    );
    ensure!(
        b.pools().get(rb[1]).is_err(),
        "the freed buffer is still readable as held"
    );
    seen.free(a, b);
    ensure!(
        a.pools().posted_count() == base_a,
        "a still has buffers posted"
    );
    teardown(pair, (&ea, &eb), (&[qa], &[]), &Seen::default());
    Ok(())
}
