//! The status document's schema, its derivation from the endpoint's snapshot and its text.

use super::*;
use crate::wire::ipoib::HwAddr;

/// A status with one of everything.
fn sample() -> Status {
    let mut hw = [0u8; 20];
    hw[0] = 0x80;
    hw[3] = 0x48;
    hw[4] = 0xfe;
    hw[5] = 0x80;
    hw[19] = 0x01;
    let mut peer_hw = hw;
    peer_hw[3] = 0x4a;
    peer_hw[19] = 0x02;
    let counters = Counters {
        qp_live: 3,
        qp_created: 5,
        qp_destroyed: 2,
        rx_accepted: 3,
        rx_stale_reaped: 1,
        ..Counters::default()
    };
    let provider = BTreeMap::from([("retransmits".to_owned(), 7)]);
    Status {
        summary: Summary {
            uptime_s: 12,
            ..Summary::new(12, &counters, &provider)
        },
        interface: InterfaceStatus {
            name: "ib0".into(),
            mtu: 65520,
            mode: Mode::Connected,
            hwaddr: HwAddr::from(hw).to_string(),
            cm_transport: String::new(),
            path_mtu: 0,
            path_mtu_from: String::new(),
            underlay: None,
            port: None,
        },
        neighbours: vec![NeighbourStatus {
            ip: "198.19.0.2".parse().unwrap(),
            hwaddr: HwAddr::from(peer_hw).to_string(),
            state: NeighbourState::Reachable,
        }],
        neighbour_table: NeighbourTable {
            total: 1,
            reachable: 1,
            max: 1024,
            ..NeighbourTable::default()
        },
        tx: vec![TxStatus {
            peer: "198.19.0.2".into(),
            qpn: 0x4a,
            state: TxState::Established,
            mtu: 65520,
            queued: 0,
            in_flight: 2,
            path: None,
        }],
        rx: vec![
            RxStatus {
                peer: "fe80::2".into(),
                qpn: 0x4b,
                state: RxState::Live,
                idle_ms: 1200,
            },
            RxStatus {
                peer: "fe80::3".into(),
                qpn: 0x4c,
                state: RxState::Flush,
                idle_ms: 61000,
            },
        ],
        counters,
        provider,
        workers: vec![WorkerStatus {
            index: 0,
            rx_packets: 10,
            rx_bytes: 1000,
            tx_packets: 12,
            tx_bytes: 1200,
            rx_conns: 1,
            tx_conns: 1,
            cpu_seconds: 0.5,
        }],
    }
}

fn keys(v: &serde_json::Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

#[test]
fn json_keys_are_the_schema() {
    let v = serde_json::to_value(sample()).unwrap();
    let mut top = keys(&v);
    top.sort_unstable();
    assert_eq!(
        top,
        [
            "counters",
            "drops",
            "interface",
            "neighbour_table",
            "neighbours",
            "provider",
            "rx",
            "rx_bytes",
            "rx_dropped",
            "rx_errors",
            "rx_packets",
            "schema",
            "tx",
            "tx_bytes",
            "tx_dropped",
            "tx_errors",
            "tx_packets",
            "uptime_s",
            "version",
            "workers",
        ]
    );
    let mut k = keys(&v["workers"][0]);
    k.sort_unstable();
    assert_eq!(
        k,
        [
            "cpu_seconds",
            "index",
            "rx_bytes",
            "rx_conns",
            "rx_packets",
            "tx_bytes",
            "tx_conns",
            "tx_packets",
        ]
    );
    let mut k = keys(&v["drops"]);
    k.sort_unstable();
    assert_eq!(k, ["rx", "tx"]);
    let mut k = keys(&v["interface"]);
    k.sort_unstable();
    assert_eq!(k, ["hwaddr", "mode", "mtu", "name"]);
    let mut k = keys(&v["neighbours"][0]);
    k.sort_unstable();
    assert_eq!(k, ["hwaddr", "ip", "state"]);
    let mut k = keys(&v["neighbour_table"]);
    k.sort_unstable();
    assert_eq!(
        k,
        [
            "incomplete",
            "max",
            "permanent",
            "reachable",
            "total",
            "truncated"
        ]
    );
    let mut k = keys(&v["tx"][0]);
    k.sort_unstable();
    assert_eq!(k, ["in_flight", "mtu", "peer", "qpn", "queued", "state"]);
    let mut k = keys(&v["rx"][0]);
    k.sort_unstable();
    assert_eq!(k, ["idle_ms", "peer", "qpn", "state"]);
    let mut k = keys(&v["counters"]);
    k.sort_unstable();
    let mut want = vec![
        "qp_live",
        "qp_created",
        "qp_destroyed",
        "rx_accepted",
        "rx_stale_reaped",
        "rx_dreq_reaped",
        "rx_evicted",
        "drain_timeouts",
        "last_wqe_events",
        "tx_established",
        "tx_failed",
        "tx_stalled",
        "tx_queue_drops",
        "icmp_too_big_sent",
        "rx_bad_packets",
    ];
    let in_order: Vec<_> = sample().counters.fields().map(|(n, _)| n).to_vec();
    assert_eq!(in_order, want);
    want.sort_unstable();
    assert_eq!(k, want);
}

#[test]
fn json_value_types() {
    let v = serde_json::to_value(sample()).unwrap();
    assert_eq!(v["interface"]["mode"], "connected");
    assert_eq!(v["interface"]["mtu"], 65520);
    assert_eq!(v["neighbours"][0]["ip"], "198.19.0.2");
    assert_eq!(v["neighbours"][0]["state"], "reachable");
    assert_eq!(v["tx"][0]["qpn"], 0x4a);
    assert_eq!(v["tx"][0]["state"], "live");
    assert_eq!(v["rx"][1]["state"], "flush");
    assert_eq!(v["rx"][1]["idle_ms"], 61000);
    assert_eq!(v["counters"]["qp_live"], 3);
    assert_eq!(v["provider"]["retransmits"], 7);
    let hw = v["interface"]["hwaddr"].as_str().unwrap();
    assert_eq!(
        hw,
        "80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"
    );
    assert!(hw.parse::<HwAddr>().is_ok());
}

#[test]
fn rx_states_are_the_four_names() {
    for (s, name) in [
        (RxState::Live, "live"),
        (RxState::Error, "error"),
        (RxState::Flush, "flush"),
        (RxState::Drained, "drained"),
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), name);
        assert_eq!(s.as_str(), name);
    }
    for s in [TxState::Connecting, TxState::Established, TxState::Closing] {
        assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
    }
    for (s, name) in [
        (NeighbourState::Incomplete, "incomplete"),
        (NeighbourState::Reachable, "reachable"),
        (NeighbourState::Permanent, "permanent"),
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), name);
        assert_eq!(s.as_str(), name);
    }
}

#[test]
fn json_round_trip_and_provider_defaults() {
    let s = sample();
    let back: Status = serde_json::from_str(&render_json(&s)).unwrap();
    assert_eq!(back, s);
    let mut v = serde_json::to_value(&s).unwrap();
    v.as_object_mut().unwrap().remove("provider");
    let back: Status = serde_json::from_value(v).unwrap();
    assert!(back.provider.is_empty());
}

#[test]
fn hwaddr_parse_rejects_junk() {
    let hw = HwAddr::from([0xabu8; 20]);
    let s = hw.to_string();
    let parse = |t: &str| t.parse::<HwAddr>().ok();
    assert_eq!(parse(&s), Some(hw));
    assert_eq!(parse(&s.to_uppercase()), Some(hw));
    assert_eq!(parse(""), None);
    assert_eq!(parse(&s[3..]), None);
    assert_eq!(parse(&format!("{s}:00")), None);
    assert_eq!(parse(&s.replace("ab", "zz")), None);
    assert_eq!(parse(&s.replacen("ab", "+b", 1)), None);
}

#[test]
fn text_rendering_of_every_counter() {
    let text = render_text(&sample(), Shown::All);
    let want = "\
ib0: mtu 65520 mode connected hwaddr 80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01
  version VERSION uptime 12s
  RX: packets 0 bytes 0 dropped 0 errors 0
  TX: packets 0 bytes 0 dropped 0 errors 0

neighbours (1):
  IP          HWADDR                                                       STATE
  198.19.0.2  80:00:00:4a:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:02  reachable

tx (1):
  PEER        QPN       STATE  MTU    QUEUED  IN_FLIGHT
  198.19.0.2  0x00004a  live   65520  0       2

rx (2):
  PEER     QPN       STATE  IDLE
  fe80::2  0x00004b  live   1200ms
  fe80::3  0x00004c  flush  61000ms

counters:
  qp_live            3
  qp_created         5
  qp_destroyed       2
  rx_accepted        3
  rx_stale_reaped    1
  rx_dreq_reaped     0
  rx_evicted         0
  drain_timeouts     0
  last_wqe_events    0
  tx_established     0
  tx_failed          0
  tx_stalled         0
  tx_queue_drops     0
  icmp_too_big_sent  0
  rx_bad_packets     0

provider:
  retransmits  7
";
    let want = want.replace("VERSION", env!("CARGO_PKG_VERSION"));
    assert_eq!(text, want, "got:\n{text}");
}

#[test]
fn status_from_snapshot_has_the_endpoints_states() {
    let hw = HwAddr::from([0x11u8; 20]);
    let snap = ipoib::Snapshot {
        hwaddr: hw,
        mtu: 65520,
        mode: Mode::Connected,
        neighbours: vec![
            (
                "198.19.0.2".parse().unwrap(),
                Some(hw),
                ipoib::NeighState::Static,
            ),
            (
                "198.19.0.3".parse().unwrap(),
                Some(hw),
                ipoib::NeighState::Reachable,
            ),
            (
                "198.19.0.4".parse().unwrap(),
                None,
                ipoib::NeighState::Incomplete { retries_left: 2 },
            ),
        ],
        neigh_counts: ipoib::NeighCounts {
            incomplete: 1,
            reachable: 1,
            permanent: 1,
        },
        neigh_max: 1024,
        tx: vec![],
        rx: vec![],
        counters: ipoib::Counters {
            qp_created: 5,
            qp_destroyed: 2,
            rx_rejected: 9,
            ..ipoib::Counters::default()
        },
    };
    let s = Status::from_snapshot("ib0", &snap);
    assert_eq!(s.interface.hwaddr, hw.to_string());
    let states: Vec<_> = s.neighbours.iter().map(|n| n.state.as_str()).collect();
    assert_eq!(states, ["permanent", "reachable", "incomplete"]);
    assert_eq!(s.neighbours[2].hwaddr, "");
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["neighbours"][0]["state"], "permanent");
    assert_eq!(
        (
            s.counters.qp_live,
            s.counters.qp_created,
            s.counters.qp_destroyed
        ),
        (3, 5, 2)
    );
    // The endpoint's counters beyond the schema's are in the provider map.
    assert_eq!(s.provider["rx_rejected"], 9);
    for name in [
        "rx_packets",
        "tx_ip_packets",
        "tx_dropped",
        "neigh_conflicts",
        "neigh_failed",
        "rx_ip_bytes",
        "tx_ip_bytes",
        "rx_closing_drops",
        "rx_buffer_drops",
        "srq_limit_events",
        "srq_refills",
        "events_dropped",
        "neigh_out_of_prefix",
        "neigh_table_full",
        "neigh_source_full",
        "neigh_evicted",
        "neigh_foreign_port",
        "peer_restarts",
        "rx_bad_cma_hdr",
        "tx_rdma_cm_retries",
        "path_wait_held",
        "path_wait_drops",
        "path_failed_drops",
        "rx_source_full",
        "rx_ud_spoofed_drops",
        "rx_ud_unbound_drops",
        "rx_ud_unknown_sender_drops",
        "neigh_unvouched_drops",
        "neigh_unsolicited_drops",
        "neigh_answer_budget_drops",
        "neigh_probes",
        "neigh_bindings_failed",
        "rx_mtu_rejected",
        "tx_mtu_retries",
        "path_mtu_changes",
        "mtu_reconnects",
    ] {
        assert_eq!(s.provider[name], 0, "{name}");
    }
    assert_eq!(s.provider.len(), 39, "{:?}", s.provider);
    assert_eq!(
        s.neighbour_table,
        NeighbourTable {
            total: 3,
            incomplete: 1,
            reachable: 1,
            permanent: 1,
            max: 1024,
            truncated: false,
        }
    );
    for st in [TxState::Connecting, TxState::Established, TxState::Closing] {
        let name = serde_json::to_value(st).unwrap();
        assert!(["connecting", "live", "closing"].contains(&name.as_str().unwrap()));
        assert_eq!(name, st.as_str());
    }
}

/// The provider map keeps every name scripts read: the serde names of the CM's, QP1
/// transport's and software provider's counters, with their prefixes.
#[test]
fn serde_counter_names_are_the_provider_map_names() {
    let mut m = BTreeMap::new();
    add_counters(&mut m, "cm_", &crate::cm::CmStats::default());
    add_counters(&mut m, "mad_", &crate::mad::MadStats::default());
    let soft = crate::soft::SoftStats::default();
    add_counters(&mut m, "", &soft);
    add_counters(&mut m, "fault_", &soft.faults);
    for name in [
        "cm_mads_received",
        "cm_dropped_malformed",
        "cm_dropped_unknown",
        "cm_dropped_spoofed",
        "cm_dropped_unexpected",
        "cm_retransmits",
        "cm_mra_received",
        "cm_rej_sent",
        "cm_timeouts",
        "cm_req_rate_limited",
        "cm_req_sources_evicted",
        "cm_req_retx_clamped",
        "cm_ids_exhausted",
        "mad_sent",
        "mad_received",
        "mad_send_dropped",
        "mad_recv_malformed",
        "rx_datagrams",
        "rx_malformed",
        "rx_bad_icrc",
        "rx_bad_pkey",
        "rx_unknown_qpn",
        "rx_bad_src",
        "rx_bad_qkey",
        "rx_bad_state",
        "tx_packets",
        "tx_retransmits",
        "retransmit_timeouts",
        "rx_rnr_naks",
        "tx_rnr_naks",
        "rx_seq_naks",
        "tx_seq_naks",
        "rx_out_of_sequence",
        "rx_gso_segments",
        "fault_dropped",
        "fault_duplicated",
        "fault_reordered",
        "fault_corrupted",
    ] {
        assert_eq!(m.get(name), Some(&0), "{name}");
    }
    assert!(!m.contains_key("faults"), "nested structs are left out");
}

/// The view an operator reads first: the tables as with `--all`, then only the counters that
/// are not zero, a line per group, and what the drops were under the totals.
#[test]
fn text_rendering_shows_what_is_not_zero_grouped() {
    let mut s = sample();
    s.provider.insert("cm_req_sent".into(), 4);
    s.provider.insert("tun_queue_drops".into(), 0);
    s.summary.drops.rx.insert("rx_buffer_drops".into(), 2);
    s.summary.drops.rx.insert("tun_queue_drops".into(), 0);
    let text = render_text(&s, Shown::NonZero);
    let all = render_text(&s, Shown::All);
    let tables = all.split("\ncounters:\n").next().unwrap();
    assert!(
        text.starts_with(tables.split("\nneighbours").next().unwrap()),
        "{text}"
    );
    assert!(text.contains("  RX dropped: rx_buffer_drops 2\n"), "{text}");
    assert!(!text.contains("TX dropped"), "{text}");
    assert!(
        text.ends_with(
            "\ncounters (not zero; --all for every one):
  connections: qp_live 3, qp_created 5, qp_destroyed 2, rx_accepted 3
  reaping: rx_stale_reaped 1
  cm: cm_req_sent 4
  other: retransmits 7
"
        ),
        "{text}"
    );
    s.provider.clear();
    s.counters = Counters::default();
    let quiet = render_text(&s, Shown::NonZero);
    assert!(
        quiet.ends_with("\ncounters (not zero; --all for every one): none\n"),
        "{quiet}"
    );
}

#[test]
fn text_rendering_empty_tables() {
    let mut s = sample();
    s.neighbours.clear();
    s.tx.clear();
    s.rx.clear();
    s.provider.clear();
    let text = render_text(&s, Shown::All);
    assert!(text.contains("\nneighbours (0): none\n"));
    assert!(text.contains("\ntx (0): none\n"));
    assert!(text.contains("\nrx (0): none\n"));
    assert!(!text.contains("provider"));
    assert!(text.ends_with("  rx_bad_packets     0\n"));
}

#[test]
fn a_truncated_neighbour_list_says_how_many_there_are() {
    let mut s = sample();
    s.neighbour_table.total = 1024;
    s.neighbour_table.truncated = true;
    let text = render_text(&s, Shown::NonZero);
    assert!(text.contains("\nneighbours (1 of 1024):\n"), "{text}");
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["neighbour_table"]["truncated"], true);
    assert_eq!(v["neighbour_table"]["total"], 1024);
}

/// The path MTU and where it came from, in JSON and on the interface line, where the daemon
/// set them; a status without them (an older daemon) reads as before.
#[test]
fn the_path_mtu_and_its_source_are_shown() {
    let mut s = sample();
    let v = serde_json::to_value(&s).unwrap();
    assert!(v["interface"].get("path_mtu").is_none());
    s.interface.cm_transport = "qp1".into();
    s.interface.path_mtu = 4096;
    s.interface.path_mtu_from = "port active_mtu 4096".into();
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["interface"]["path_mtu"], 4096);
    assert_eq!(v["interface"]["path_mtu_from"], "port active_mtu 4096");
    let back: Status = serde_json::from_value(v).unwrap();
    assert_eq!(back.interface, s.interface);
    let text = render_text(&s, Shown::NonZero);
    assert!(
        text.starts_with(
            "ib0: mtu 65520 mode connected hwaddr 80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01 cm qp1 path_mtu 4096 (port active_mtu 4096)\n"
        ),
        "{text}"
    );
}

#[test]
fn an_infiniband_port_and_each_connections_path_are_shown() {
    let mut s = sample();
    let text = render_text(&s, Shown::All);
    assert!(
        !text.contains("PATH") && !text.contains("  port "),
        "RoCE: {text}"
    );
    s.interface.port = Some(PortStatus {
        link_layer: "infiniband".into(),
        device: "ibsim0".into(),
        port: 1,
        lid: 5,
        sm_lid: 1,
        pkey: 0xffff,
    });
    s.tx[0].path = Some(PathStatus {
        dlid: 6,
        slid: 5,
        sl: 0,
        mtu: 2048,
    });
    let text = render_text(&s, Shown::All);
    assert!(
        text.contains("  port ibsim0 1 infiniband lid 0x5 sm_lid 0x1 pkey 0xffff\n"),
        "{text}"
    );
    assert!(text.contains("lid 0x6 sl 0 mtu 2048"), "{text}");
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["interface"]["port"]["lid"], 5);
    assert_eq!(v["tx"][0]["path"]["dlid"], 6);
}
