//! Transcripts: what the client sends, what a scripted SA answers, what the client reports.

use super::*;
use crate::wire::ipoib::mcast::mgid_for_ipv6;

const SM: SmAddress = SmAddress { lid: 1, sl: 0 };

fn gid(last: u8) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = last;
    Gid(g)
}

fn client() -> (SaClient, Instant) {
    (
        SaClient::new(SaConfig::new(gid(1), 0xFFFF), SM),
        Instant::now(),
    )
}

fn sent(c: &mut SaClient) -> Vec<SaMad> {
    let sm = c.sm;
    std::iter::from_fn(|| c.pop_transmit())
        .map(|o| {
            assert_eq!(o.to, sm);
            SaMad::parse(&o.mad).unwrap()
        })
        .collect()
}

fn events(c: &mut SaClient) -> Vec<SaEvent> {
    std::iter::from_fn(|| c.pop_event()).collect()
}

/// The SA's answer to `req` with `status` and `record`; the high TID bits changed as the
/// kernel's umad does.
fn answer<const N: usize>(req: &SaMad, status: u16, record: &[u8; N]) -> [u8; MAD_LEN] {
    let mut h = req.header;
    h.mad.method = SaMethod::GetResp as u8;
    if req.header.method() == Some(SaMethod::Delete) {
        h.mad.method = SaMethod::DeleteResp as u8;
    }
    h.mad.status = status;
    h.mad.transaction_id |= 0x0000_00AB_0000_0000;
    SaMad::new(h, record).emit()
}

fn bcast_record(req: &SaMad) -> McMemberRecord {
    McMemberRecord {
        qkey: 0x0B1B,
        mlid: 0xC000,
        mtu: Selected::new(Selector::Exactly, 4),
        rate: Selected::new(Selector::Exactly, 3),
        sl: 0,
        tclass: 0,
        scope: 2,
        ..req.mcmember_record()
    }
}

#[test]
fn path_query_cache_and_expiry() {
    let (mut c, t0) = client();
    assert_eq!(c.path(t0, gid(2)), PathLookup::Pending);
    assert_eq!(
        c.path(t0, gid(2)),
        PathLookup::Pending,
        "one query per destination"
    );
    let q = sent(&mut c);
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].header.method(), Some(SaMethod::Get));
    assert_eq!(q[0].header.comp_mask, PathRecordMask::IPOIB_QUERY);
    let asked = q[0].path_record();
    assert_eq!(
        (asked.sgid, asked.dgid, asked.pkey, asked.numb_path),
        (gid(1), gid(2), 0xFFFF, 1)
    );

    let path = PathRecord {
        dlid: 4,
        slid: 3,
        sl: 2,
        ..asked
    };
    c.handle_mad(t0, &answer(&q[0], 0, &path.to_bytes()));
    assert_eq!(
        events(&mut c),
        [SaEvent::PathResolved { dgid: gid(2), path }]
    );
    assert_eq!(
        c.path(t0 + Duration::from_secs(59), gid(2)),
        PathLookup::Known(path)
    );
    assert!(sent(&mut c).is_empty());
    // Expired: asked again.
    assert_eq!(
        c.path(t0 + Duration::from_secs(60), gid(2)),
        PathLookup::Pending
    );
    assert_eq!(sent(&mut c).len(), 1);
}

#[test]
fn negative_cache_after_no_records_and_after_timeouts() {
    let (mut c, t0) = client();
    c.path(t0, gid(2));
    let q = sent(&mut c);
    c.handle_mad(t0, &answer(&q[0], 0x0300, &[0u8; 64]));
    assert!(matches!(
        events(&mut c)[..],
        [SaEvent::PathFailed { status: Some(s), .. }] if s.is_no_records()
    ));
    assert_eq!(
        c.path(t0 + Duration::from_secs(9), gid(2)),
        PathLookup::Negative
    );
    assert!(sent(&mut c).is_empty());
    assert_eq!(
        c.path(t0 + Duration::from_secs(10), gid(2)),
        PathLookup::Pending
    );
    assert_eq!(sent(&mut c).len(), 1, "asked again once the entry expired");

    // No answer: three retransmissions a second apart, then failure.
    let (mut c, t1) = client();
    c.path(t1, gid(3));
    assert_eq!(sent(&mut c).len(), 1);
    let mut t = t1;
    for i in 1..=3 {
        t += Duration::from_secs(1);
        assert_eq!(c.next_deadline(), Some(t));
        c.poll_timeout(t);
        let again = sent(&mut c);
        assert_eq!(again.len(), 1, "retransmission {i}");
    }
    t += Duration::from_secs(1);
    c.poll_timeout(t);
    assert!(sent(&mut c).is_empty());
    assert!(events(&mut c).contains(&SaEvent::PathFailed {
        dgid: gid(3),
        status: None
    }));
    assert_eq!(c.path(t, gid(3)), PathLookup::Negative);
    assert_eq!(c.counters().retransmits, 3);
    assert!(c.counters().timeouts >= 1);
}

#[test]
fn caches_are_bounded_and_evictions_counted() {
    let (mut c, t0) = client();
    c.cfg.max_paths = 2;
    c.cfg.max_negative = 1;
    for i in 2..6 {
        let t = t0 + Duration::from_millis(u64::from(i));
        c.path(t, gid(i));
        let q = sent(&mut c);
        let rec = PathRecord {
            dlid: u16::from(i),
            ..q[0].path_record()
        };
        c.handle_mad(t, &answer(&q[0], 0, &rec.to_bytes()));
    }
    assert_eq!(c.paths.len(), 2);
    assert_eq!(c.counters().path_evictions, 2);
    // The two newest stay.
    assert!(matches!(c.path(t0, gid(5)), PathLookup::Known(p) if p.dlid == 5));
    for i in 10..13 {
        c.path(t0, gid(i));
        let q = sent(&mut c);
        c.handle_mad(t0, &answer(&q[0], 0x0300, &[0u8; 64]));
    }
    assert_eq!(c.negative.len(), 1);
    assert_eq!(c.counters().negative_evictions, 2);
    // Outstanding requests are capped too.
    c.cfg.max_outstanding = 1;
    assert_eq!(c.path(t0, gid(20)), PathLookup::Pending);
    assert_eq!(c.path(t0, gid(21)), PathLookup::Unavailable);
    assert_eq!(c.counters().outstanding_full, 1);
}

#[test]
fn broadcast_join_without_create_then_other_groups_copy_its_parameters() {
    let (mut c, t0) = client();
    let bcast = c.broadcast_mgid();
    assert_eq!(bcast.to_string(), "ff12:401b:ffff::ffff:ffff");
    let all_nodes = mgid_for_ipv6("ff02::1".parse().unwrap(), 0xFFFF);
    // The all-nodes join waits for the broadcast group.
    c.join(
        t0,
        all_nodes,
        GroupOptions {
            create: true,
            ..GroupOptions::default()
        },
    );
    assert!(sent(&mut c).is_empty());
    c.join(t0, bcast, GroupOptions::default());
    let q = sent(&mut c);
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].header.method(), Some(SaMethod::Set));
    assert_eq!(
        q[0].header.comp_mask,
        McMemberRecordMask::JOIN_EXISTING,
        "no create fields"
    );
    let r = q[0].mcmember_record();
    assert_eq!(
        (r.mgid, r.port_gid, r.pkey, r.join_state),
        (bcast, gid(1), 0xFFFF, JoinState::FULL_MEMBER)
    );

    let rec = bcast_record(&q[0]);
    c.handle_mad(t0, &answer(&q[0], 0, &rec.to_bytes()));
    let params = GroupParams {
        mlid: 0xC000,
        qkey: 0x0B1B,
        mtu: Some(PathMtu::Mtu2048),
        sl: 0,
        rate: 3,
        tclass: 0,
        flow_label: 0,
        hop_limit: 0,
    };
    assert_eq!(
        events(&mut c),
        [SaEvent::Joined {
            mgid: bcast,
            params
        }]
    );
    assert_eq!(c.group(bcast), Some(params));
    // Now the all-nodes join goes, with the broadcast group's Q_Key, MTU, rate, SL.
    let q = sent(&mut c);
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].header.comp_mask, McMemberRecordMask::JOIN_CREATE);
    let r = q[0].mcmember_record();
    assert_eq!(r.mgid, all_nodes);
    assert_eq!(
        (r.qkey, r.mtu, r.rate),
        (
            0x0B1B,
            Selected::new(Selector::Exactly, 4),
            Selected::new(Selector::Exactly, 3)
        )
    );
}

#[test]
fn join_retransmits_then_backs_off_and_retries() {
    let (mut c, t0) = client();
    let bcast = c.broadcast_mgid();
    c.join(t0, bcast, GroupOptions::default());
    assert_eq!(sent(&mut c).len(), 1);
    let mut t = t0;
    for _ in 0..3 {
        t += Duration::from_secs(1);
        c.poll_timeout(t);
        assert_eq!(sent(&mut c).len(), 1);
    }
    t += Duration::from_secs(1);
    c.poll_timeout(t);
    assert_eq!(
        events(&mut c),
        [SaEvent::JoinFailed {
            mgid: bcast,
            status: None
        }]
    );
    assert!(sent(&mut c).is_empty());
    assert_eq!(c.next_deadline(), Some(t + Duration::from_secs(4)));
    c.poll_timeout(t + Duration::from_secs(4));
    let q = sent(&mut c);
    assert_eq!(q.len(), 1, "rejoined after the backoff");
    // An SA error (the group does not exist) backs off too.
    c.handle_mad(
        t,
        &answer(&q[0], 0x0600, &q[0].mcmember_record().to_bytes()),
    );
    assert!(matches!(
        events(&mut c)[..],
        [SaEvent::JoinFailed {
            status: Some(_),
            ..
        }]
    ));
}

#[test]
fn leave_deletes_unless_shared() {
    let (mut c, t0) = client();
    let bcast = c.broadcast_mgid();
    let other = mgid_for_ipv6("ff02::1".parse().unwrap(), 0xFFFF);
    c.join(t0, bcast, GroupOptions::default());
    let q = sent(&mut c);
    c.handle_mad(t0, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
    c.join(
        t0,
        other,
        GroupOptions {
            create: true,
            shared: true,
            send_only: false,
        },
    );
    let q2 = sent(&mut c);
    c.handle_mad(t0, &answer(&q2[0], 0, &q2[0].mcmember_record().to_bytes()));
    events(&mut c);

    c.leave(t0, other);
    assert!(sent(&mut c).is_empty(), "a shared group is never DELETEd");
    assert_eq!(
        events(&mut c),
        [SaEvent::Left {
            mgid: other,
            deleted: false
        }]
    );
    assert_eq!(c.counters().shared_leaves, 1);

    c.leave(t0, bcast);
    let d = sent(&mut c);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].header.method(), Some(SaMethod::Delete));
    assert_eq!(d[0].header.comp_mask, McMemberRecordMask::JOIN_EXISTING);
    let r = d[0].mcmember_record();
    assert_eq!(
        (r.mgid, r.port_gid, r.join_state),
        (bcast, gid(1), JoinState::FULL_MEMBER)
    );
    c.handle_mad(t0, &answer(&d[0], 0, &r.to_bytes()));
    assert_eq!(
        events(&mut c),
        [SaEvent::Left {
            mgid: bcast,
            deleted: true
        }]
    );
    assert_eq!(c.group(bcast), None);
}

#[test]
fn port_events_flush_paths_and_rejoin() {
    let events_under_test = [
        PortEvent::LidChange,
        PortEvent::SmChange(SmAddress { lid: 7, sl: 1 }),
        PortEvent::ClientReregister,
        PortEvent::PkeyChange,
    ];
    for ev in events_under_test {
        let (mut c, t0) = client();
        let bcast = c.broadcast_mgid();
        c.join(t0, bcast, GroupOptions::default());
        let q = sent(&mut c);
        c.handle_mad(t0, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
        c.path(t0, gid(2));
        let q = sent(&mut c);
        c.handle_mad(t0, &answer(&q[0], 0, &q[0].path_record().to_bytes()));
        events(&mut c);
        assert!(matches!(c.path(t0, gid(2)), PathLookup::Known(_)));

        c.port_event(t0, ev);
        assert_eq!(c.group(bcast), None, "{ev:?}: membership forgotten");
        let q = sent(&mut c);
        assert_eq!(q.len(), 1, "{ev:?}: rejoin sent");
        assert_eq!(q[0].header.method(), Some(SaMethod::Set));
        if let PortEvent::SmChange(sm) = ev {
            assert_eq!(c.sm, sm);
        }
        c.handle_mad(t0, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
        assert!(matches!(events(&mut c)[..], [SaEvent::Joined { .. }]));
        assert_eq!(
            c.path(t0, gid(2)),
            PathLookup::Pending,
            "{ev:?}: paths flushed"
        );
    }
}

#[test]
fn port_down_holds_everything_until_up() {
    let (mut c, t0) = client();
    let bcast = c.broadcast_mgid();
    c.port_event(t0, PortEvent::PortDown);
    c.join(t0, bcast, GroupOptions::default());
    assert_eq!(c.path(t0, gid(2)), PathLookup::Unavailable);
    assert!(sent(&mut c).is_empty());
    c.port_event(t0, PortEvent::PortUp(SmAddress { lid: 9, sl: 0 }));
    let q = sent(&mut c);
    assert_eq!(q.len(), 1);
    assert_eq!(c.sm.lid, 9);
    c.handle_mad(t0, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
    // A leave cut short by the port going down still ends.
    c.leave(t0, bcast);
    assert_eq!(sent(&mut c).len(), 1);
    events(&mut c);
    c.port_event(t0, PortEvent::PortDown);
    assert_eq!(
        events(&mut c),
        [SaEvent::Left {
            mgid: bcast,
            deleted: false
        }]
    );
    assert_eq!(c.next_deadline(), None);
}

#[test]
fn stray_and_mismatched_mads_are_counted_and_ignored() {
    let (mut c, t0) = client();
    c.path(t0, gid(2));
    let q = sent(&mut c);
    c.handle_mad(t0, &[0u8; 10]);
    // A request, not a response, with the right TID.
    c.handle_mad(t0, &q[0].emit());
    // The right TID but the wrong attribute.
    let mut wrong = q[0];
    wrong.header.mad.attr_id = ATTR_MCMEMBER_RECORD;
    c.handle_mad(t0, &answer(&wrong, 0, &[0u8; 52]));
    // An unknown TID.
    let mut stray = q[0];
    stray.header.mad.transaction_id = 999;
    c.handle_mad(t0, &answer(&stray, 0, &[0u8; 64]));
    assert_eq!(c.counters().unmatched, 4);
    assert!(events(&mut c).is_empty());
    assert_eq!(c.path(t0, gid(2)), PathLookup::Pending);
}

#[test]
fn group_cap_is_counted() {
    let (mut c, t0) = client();
    c.cfg.max_groups = 1;
    assert!(c.join(t0, c.broadcast_mgid(), GroupOptions::default()));
    assert!(!c.join(t0, gid(9), GroupOptions::default()));
    assert_eq!(c.counters().groups_full, 1);
}

/// The client against what opensm answered (captured through umad2sim from Hca2, GID
/// fe80::10:4, in partition 0xFFFF): each response's TID set to the request's.
#[test]
fn captured_opensm_transcript() {
    let port = Gid("fe80::10:4".parse::<std::net::Ipv6Addr>().unwrap().octets());
    let mut c = SaClient::new(SaConfig::new(port, 0xFFFF), SM);
    let t0 = Instant::now();
    let [path, join, leave] = crate::wire::sa::tests::captured();
    let with_tid = |b: &[u8], req: &SaMad| {
        let mut m = SaMad::parse(b).unwrap();
        m.header.mad.transaction_id = req.header.mad.transaction_id | 0x0001_0000_0000;
        m.emit()
    };
    c.path(t0, port);
    let q = sent(&mut c);
    c.handle_mad(t0, &with_tid(&path, &q[0]));
    match events(&mut c)[..] {
        [SaEvent::PathResolved { path, .. }] => {
            assert_eq!(
                (path.dlid, path.slid, path.mtu(), path.pkey),
                (4, 4, Some(PathMtu::Mtu2048), 0xFFFF)
            );
        }
        ref e => panic!("{e:?}"),
    }
    let bcast = c.broadcast_mgid();
    c.join(t0, bcast, GroupOptions::default());
    let q = sent(&mut c);
    // The request is the one opensm answered: same mask and record but for the SA's fields.
    let answered = SaMad::parse(&join).unwrap();
    assert_eq!(q[0].header.comp_mask, answered.header.comp_mask);
    c.handle_mad(t0, &with_tid(&join, &q[0]));
    match events(&mut c)[..] {
        [SaEvent::Joined { mgid, params }] => {
            assert_eq!(mgid, bcast);
            assert_eq!(
                (params.mlid, params.qkey, params.mtu, params.rate),
                (0xC000, 0x0B1B, Some(PathMtu::Mtu2048), 3)
            );
        }
        ref e => panic!("{e:?}"),
    }
    c.leave(t0, bcast);
    let q = sent(&mut c);
    let req = q[0].mcmember_record();
    let answered = SaMad::parse(&leave).unwrap().mcmember_record();
    assert_eq!((req.mgid, req.port_gid), (answered.mgid, answered.port_gid));
    assert_eq!(req.join_state, JoinState::FULL_MEMBER);
    assert_eq!(
        answered.join_state,
        JoinState(0),
        "opensm answers with what is left"
    );
    c.handle_mad(t0, &with_tid(&leave, &q[0]));
    assert_eq!(
        events(&mut c),
        [SaEvent::Left {
            mgid: bcast,
            deleted: true
        }]
    );
}

#[test]
fn a_limited_member_joins_the_broadcast_group_of_the_full_p_key() {
    let c = SaClient::new(
        SaConfig::new(
            Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4]),
            0x7fff,
        ),
        SmAddress { lid: 1, sl: 0 },
    );
    assert_eq!(c.broadcast_mgid(), broadcast_mgid(0xffff));
}

#[test]
fn a_membership_the_sa_no_longer_lists_is_reported_lost() {
    let mut cfg = SaConfig::new(gid(1), 0xFFFF);
    let every = Duration::from_secs(1);
    cfg.membership_check = Some(every);
    let mut c = SaClient::new(cfg, SM);
    let t0 = Instant::now();
    let bcast = c.broadcast_mgid();
    assert!(c.join(t0, bcast, GroupOptions::default()));
    let q = sent(&mut c);
    c.handle_mad(t0, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
    assert!(matches!(events(&mut c)[..], [SaEvent::Joined { .. }]));
    assert_eq!(
        c.next_deadline(),
        Some(t0 + every),
        "the first check a period after the join"
    );

    // The SA still lists the port: nothing to report.
    let t1 = t0 + every;
    c.poll_timeout(t1);
    let q = sent(&mut c);
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].header.method(), Some(SaMethod::Get));
    assert_eq!(
        q[0].header.comp_mask,
        McMemberRecordMask::MGID | McMemberRecordMask::PORT_GID
    );
    let asked = q[0].mcmember_record();
    assert_eq!((asked.mgid, asked.port_gid), (bcast, gid(1)));
    c.handle_mad(t1, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
    assert_eq!(events(&mut c), []);

    // An unanswered check proves nothing, and a second is not sent while one is outstanding.
    let t2 = t1 + every;
    c.poll_timeout(t2);
    let first = sent(&mut c);
    assert_eq!(first.len(), 1);
    c.poll_timeout(t2 + every);
    assert_eq!(
        sent(&mut c),
        first,
        "only the outstanding check, sent again"
    );
    for k in 2..=6 {
        c.poll_timeout(t2 + every * k);
        let _ = sent(&mut c);
    }
    assert_eq!(events(&mut c), []);

    // The SM restarted and forgot the port: no record.
    let t3 = t2 + every * 8;
    c.poll_timeout(t3);
    let q = sent(&mut c);
    let check = q
        .iter()
        .find(|m| m.header.method() == Some(SaMethod::Get))
        .expect("a check");
    c.handle_mad(t3, &answer(check, 0x0300, &[0u8; 0]));
    assert_eq!(events(&mut c), [SaEvent::MembershipLost { mgid: bcast }]);
    assert_eq!(c.counters().memberships_lost, 1);

    // What the caller does with it: the port's CLIENT_REREGISTER, and the join goes again.
    c.port_event(t3, PortEvent::ClientReregister);
    let q = sent(&mut c);
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].header.method(), Some(SaMethod::Set));
}

#[test]
fn no_membership_check_unless_configured() {
    let (mut c, t0) = client();
    let bcast = c.broadcast_mgid();
    assert!(c.join(t0, bcast, GroupOptions::default()));
    let q = sent(&mut c);
    c.handle_mad(t0, &answer(&q[0], 0, &bcast_record(&q[0]).to_bytes()));
    assert_eq!(c.next_deadline(), None);
    c.poll_timeout(t0 + Duration::from_secs(3600));
    assert!(sent(&mut c).is_empty());
    assert_eq!(c.counters().membership_checks, 0);
}
