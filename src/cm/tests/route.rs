//! Connections spread over workers: each side's CM split into one per worker, the MADs of
//! one transport handed to the worker [`mad_owner`] names.

use super::*;
use crate::wire::{WorkerCount, WorkerId};

/// The CMs of `count` workers of the node at `gid`, their comm ids tagged with their index.
fn workers(gid: Gid, guid: u64, count: WorkerCount, listen: bool) -> Vec<Cm> {
    count
        .slots()
        .map(|slot| {
            let mut c = CmConfig::new(gid, guid);
            c.timewait = TW;
            c.comm_id_slot = slot;
            let mut cm = Cm::new(c);
            if listen {
                cm.listen(SID, u64::MAX);
            }
            cm
        })
        .collect()
}

/// Every MAD the CMs of `from` queued, handed to the CM of `to` that [`mad_owner`] names;
/// returns the workers they went to, in order.
fn deliver(now: Instant, from: &mut [Cm], from_gid: Gid, to: &mut [Cm]) -> Vec<u8> {
    let count = WorkerCount::new(u32::try_from(to.len()).unwrap()).unwrap();
    let mut went = Vec::new();
    for cm in from.iter_mut() {
        while let Some((_, m)) = cm.poll_transmit() {
            let w = mad_owner(&m, count);
            went.push(w);
            to[usize::from(w)].handle_mad(now, from_gid, &m);
        }
    }
    went
}

/// Transcript: worker 1 of two on A connects from a QPN tagged 1 to B, also with two
/// workers: B's worker 1 gets the REQ (the sender's QPN), A's worker 1 the REP (its comm
/// id), B's worker 1 the RTU; the disconnect goes the same way back; worker 0 of either side
/// sees nothing.
#[test]
fn a_connection_stays_on_one_worker_each_side() {
    let t0 = Instant::now();
    let two = WorkerCount::new(2).unwrap();
    let mut a_side = workers(a(), GUID_A, two, false);
    let mut b_side = workers(b(), GUID_B, two, true);
    let a1 = WorkerId::new(1, two).unwrap();
    let p = ConnectParams {
        local_qpn: QpNum::new(a1.tag(0x1234)),
        ..connect_params()
    };
    let id = a_side[1].connect(t0, p).unwrap();
    assert!(a1.owns(id.0), "comm id {:#x} not tagged 1", id.0);

    assert_eq!(deliver(t0, &mut a_side, a(), &mut b_side), [1]);
    let bid = match events(&mut b_side[1]).as_slice() {
        [CmEvent::ReqReceived { id, .. }] => *id,
        other => panic!("{other:?}"),
    };
    assert!(a1.owns(bid.0), "B's comm id {:#x} not tagged 1", bid.0);
    b_side[1].accept(t0, bid, accept_params()).unwrap();
    assert_eq!(deliver(t0, &mut b_side, b(), &mut a_side), [1]);
    assert!(matches!(
        events(&mut a_side[1]).as_slice(),
        [CmEvent::RepReceived { .. }]
    ));
    a_side[1].rtu(t0, id).unwrap();
    assert_eq!(deliver(t0, &mut a_side, a(), &mut b_side), [1]);
    assert!(matches!(
        events(&mut b_side[1]).as_slice(),
        [CmEvent::Established { .. }]
    ));

    b_side[1].disconnect(t0, bid).unwrap();
    assert_eq!(deliver(t0, &mut b_side, b(), &mut a_side), [1]);
    assert_eq!(deliver(t0, &mut a_side, a(), &mut b_side), [1]);
    for side in [&mut a_side, &mut b_side] {
        assert!(events(&mut side[0]).is_empty());
        assert_eq!(side[0].stats().mads_received, 0);
    }
}

/// A REQ sent again reaches the worker that has it and is a duplicate there; a peer whose
/// QPNs are not tagged (Linux) spreads its REQs by its QPN's low bits.
#[test]
fn a_repeated_req_reaches_the_same_worker() {
    let t0 = Instant::now();
    let four = WorkerCount::new(4).unwrap();
    let mut b_side = workers(b(), GUID_B, four, true);
    for qpn in [0x100_u32, 0x101, 0x102, 0x103] {
        let mut ca = cm_a();
        let p = ConnectParams {
            local_qpn: QpNum::new(qpn),
            ..connect_params()
        };
        ca.connect(t0, p).unwrap();
        let (_, req) = ca.poll_transmit().unwrap();
        let w = mad_owner(&req, four);
        assert_eq!(u32::from(w), qpn & 3);
        b_side[usize::from(w)].handle_mad(t0, a(), &req);
        b_side[usize::from(mad_owner(&req, four))].handle_mad(t0 + msec(1), a(), &req);
        assert_eq!(
            events(&mut b_side[usize::from(w)]).len(),
            1,
            "one REQ event"
        );
    }
}

proptest! {
    /// Whatever arrives, the owner is a worker of the count and nothing panics.
    #[test]
    fn any_bytes_have_an_owner_among_the_workers(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        bits in 0u32..7,
    ) {
        let count = WorkerCount::new(1 << bits).unwrap();
        prop_assert!(mad_owner(&bytes, count) < count.get());
    }
}
