//! The path in REQs and the passive side's path from them: IB LIDs, SL, rate and GRH fields
//! (`cm_format_req`, `cm_format_paths_from_req`, `cm_process_routed_req`).

use super::*;

fn req_of(m: &[u8; 256]) -> Req {
    match parse(m).msg {
        CmMessage::Req(r) => r,
        other => panic!("not a REQ: {other:?}"),
    }
}

fn ib_path(hop_limit: u8) -> Path {
    Path {
        dlid: Lid(0x0012),
        slid: Lid(0x0004),
        sl: Sl::new(5).unwrap(),
        rate: Rate(7),
        flow_label: 0x5_4321,
        hop_limit,
        traffic_class: 0x60,
        ..Path::roce(a(), b(), PathMtu::Mtu2048)
    }
}

fn req_received_path(ev: &[CmEvent]) -> Path {
    match ev {
        [CmEvent::ReqReceived { path, .. }] => *path,
        other => panic!("{other:?}"),
    }
}

/// Transcript: the encoded REQ of a subnet-local IB path carries its LIDs, SL, rate, flow
/// label, traffic class and hop limit with Subnet Local set; the passive side's path is
/// the reverse and its address vector a LID route without GRH.
#[test]
fn a_subnet_local_path_puts_its_lids_in_the_req_and_the_passive_av_routes_by_lid() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let p = ConnectParams {
        path: Some(ib_path(0)),
        path_mtu: PathMtu::Mtu2048,
        ..connect_params()
    };
    ca.connect(t0, p).unwrap();
    let mad = sent_one(&mut ca, b());
    let r = req_of(&mad);
    let pp = r.primary_path;
    assert_eq!((pp.local_lid, pp.remote_lid), (0x0004, 0x0012));
    assert_eq!((pp.sl, pp.packet_rate, pp.flow_label), (5, 7, 0x5_4321));
    assert_eq!(
        (pp.traffic_class, pp.hop_limit, pp.subnet_local),
        (0x60, 0, true)
    );
    assert_eq!((pp.local_gid, pp.remote_gid), (a(), b()));
    assert_eq!(r.path_mtu, Some(PathMtu::Mtu2048));
    // The bytes themselves (primary path at MAD offset 24 + 52): LIDs big-endian, then
    // SL in the high nibble of rel 42 with Subnet Local in bit 3.
    let off = 24 + 52;
    assert_eq!(&mad[off..off + 4], &[0x00, 0x04, 0x00, 0x12]);
    assert_eq!(mad[off + 42], 5 << 4 | 0x08);
    assert!(!r.alternate_path.is_present());

    // Passive side, on a port with LIDs: the REQ is subnet local, so the completion's LID
    // fields change nothing, and the MAD had no GRH: a LID route back.
    let route = MadRoute {
        slid: Lid(0x0099),
        sl: Sl::new(1).unwrap(),
        dlid_path_bits: 0,
        grh: false,
    };
    cb.handle_routed_mad(t0, a(), Some(route), &mad);
    let back = req_received_path(&events(&mut cb));
    assert_eq!((back.dgid, back.sgid), (a(), b()));
    assert_eq!(
        (back.dlid, back.slid, back.sl.get()),
        (Lid(0x0004), Lid(0x0012), 5)
    );
    assert_eq!(
        (back.rate, back.mtu, back.hop_limit),
        (Rate(7), PathMtu::Mtu2048, 0)
    );
    let av = back.av();
    assert_eq!(
        (av.dlid, av.sl.get(), av.static_rate, av.grh),
        (Lid(0x0004), 5, Rate(7), None)
    );
}

/// A routed REQ (hop limit above 1) carries permissive LIDs (Linux's work-around); the
/// passive side takes the DLID and SL from the MAD's completion, the SLID from its path
/// bits, and, the MAD having had a GRH, a global address vector with the REQ's flow label
/// and traffic class.
#[test]
fn a_routed_req_has_permissive_lids_and_the_passive_av_takes_the_completions() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    let p = ConnectParams {
        path: Some(ib_path(4)),
        ..connect_params()
    };
    ca.connect(t0, p).unwrap();
    let mad = sent_one(&mut ca, b());
    let pp = req_of(&mad).primary_path;
    assert_eq!((pp.local_lid, pp.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!((pp.hop_limit, pp.subnet_local, pp.sl), (4, false, 5));
    let route = MadRoute {
        slid: Lid(0x0033),
        sl: Sl::new(2).unwrap(),
        dlid_path_bits: 1,
        grh: true,
    };
    cb.handle_routed_mad(t0, a(), Some(route), &mad);
    let back = req_received_path(&events(&mut cb));
    assert_eq!(
        (back.dlid, back.slid, back.sl.get()),
        (Lid(0x0033), Lid(1), 2)
    );
    let av = back.av();
    assert_eq!(av.dlid, Lid(0x0033));
    let g = av.grh.expect("a routed path is global");
    assert_eq!((g.dgid, g.hop_limit), (a(), 0xFF));
    assert_eq!((g.flow_label, g.traffic_class), (0x5_4321, 0x60));
}

/// RoCE: no path given, the REQ is the kernel's (permissive LIDs, hop limit 64, rate 0 =
/// the port's, SL 0,
/// Subnet Local clear) and a MAD without LID fields gives a path without LIDs.
#[test]
fn without_a_path_the_req_is_the_roce_one() {
    let t0 = Instant::now();
    let (mut ca, mut cb) = (cm_a(), cm_b());
    ca.connect(t0, connect_params()).unwrap();
    let mad = sent_one(&mut ca, b());
    let pp = req_of(&mad).primary_path;
    assert_eq!(
        (pp.local_lid, pp.remote_lid, pp.hop_limit),
        (0xFFFF, 0xFFFF, 64)
    );
    assert_eq!(
        (pp.packet_rate, pp.sl, pp.subnet_local, pp.flow_label),
        (0, 0, false, 0)
    );
    cb.handle_mad(t0, a(), &mad);
    let back = req_received_path(&events(&mut cb));
    assert_eq!(
        (back.dlid, back.slid, back.hop_limit),
        (Lid::NONE, Lid::NONE, 64)
    );
    assert_eq!(back.av().grh.map(|g| g.dgid), Some(a()));
}
