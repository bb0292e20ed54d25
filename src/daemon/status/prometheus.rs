//! The status in the Prometheus text exposition format (`ipoib-cm status --prometheus`), for
//! node_exporter's textfile collector: every metric named `ipoib_cm_*`, with a `# HELP` and a
//! `# TYPE` line, labelled with the interface name.

use std::fmt::Write as _;

use super::Status;

/// One metric family: name, help, type, and its samples as `(extra labels, value)`.
struct Family<'a> {
    name: String,
    help: &'a str,
    kind: &'static str,
    samples: Vec<(String, u64)>,
}

/// `name` with every character Prometheus does not allow in a metric name made `_`.
fn metric_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A label value with `\`, `"` and newlines escaped.
fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The help text of a total.
fn total_help(name: &str) -> &'static str {
    match name {
        "rx_packets" => "IP packets delivered to the host.",
        "rx_bytes" => "Bytes of the IP packets delivered to the host.",
        "rx_dropped" => "Arrivals not delivered, every layer's, each once.",
        "rx_errors" => "Of rx_dropped, arrivals that were damaged.",
        "tx_packets" => "IP packets sent.",
        "tx_bytes" => "Bytes of the IP packets sent.",
        "tx_dropped" => "IP packets from the host not sent.",
        "tx_errors" => "Sends the underlay refused.",
        _ => "Interface total.",
    }
}

/// The exposition of `status`: text, one family after another, ending in a newline.
pub fn render_prometheus(status: &Status) -> String {
    render_prometheus_all(std::slice::from_ref(status))
}

/// The exposition of several daemons' statuses (`ipoib-cm status --prometheus` with no
/// interface named): each family once, with one sample per daemon, told apart by `ifname`.
pub fn render_prometheus_all(statuses: &[Status]) -> String {
    let mut merged: Vec<Family<'_>> = Vec::new();
    for status in statuses {
        for f in families(status) {
            match merged.iter_mut().find(|m| m.name == f.name) {
                Some(m) => m.samples.extend(f.samples),
                None => merged.push(f),
            }
        }
    }
    let mut out = String::new();
    for f in merged {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (labels, v) in f.samples {
            let _ = writeln!(out, "{}{{{labels}}} {v}", f.name);
        }
    }
    out
}

/// The metric families of one daemon's status, every sample labelled with its `ifname`.
fn families(status: &Status) -> Vec<Family<'_>> {
    let ifname = format!("ifname=\"{}\"", label_value(&status.interface.name));
    let m = &status.summary;
    let mut families = vec![
        Family {
            name: "ipoib_cm_info".into(),
            help: "The daemon: its version, the status schema and the IPoIB mode (always 1).",
            kind: "gauge",
            samples: vec![(
                format!(
                    "version=\"{}\",schema=\"{}\",mode=\"{}\",hwaddr=\"{}\"",
                    label_value(&m.version),
                    m.schema,
                    status.interface.mode,
                    label_value(&status.interface.hwaddr)
                ),
                1,
            )],
        },
        Family {
            name: "ipoib_cm_uptime_seconds".into(),
            help: "Seconds since the daemon started.",
            kind: "gauge",
            samples: vec![(String::new(), m.uptime_s)],
        },
        Family {
            name: "ipoib_cm_mtu_bytes".into(),
            help: "Interface MTU.",
            kind: "gauge",
            samples: vec![(String::new(), u64::from(status.interface.mtu))],
        },
        Family {
            name: "ipoib_cm_path_mtu_bytes".into(),
            help: "The path MTU of UD sends and new connections (0: not known).",
            kind: "gauge",
            samples: vec![(String::new(), u64::from(status.interface.path_mtu))],
        },
        Family {
            name: "ipoib_cm_neighbours".into(),
            help: "Neighbour entries, by state.",
            kind: "gauge",
            samples: [
                ("incomplete", status.neighbour_table.incomplete),
                ("reachable", status.neighbour_table.reachable),
                ("permanent", status.neighbour_table.permanent),
            ]
            .into_iter()
            .map(|(state, n)| (format!("state=\"{state}\""), n))
            .collect(),
        },
        Family {
            name: "ipoib_cm_neighbours_max".into(),
            help: "The cap on learned neighbour entries (neigh_max).",
            kind: "gauge",
            samples: vec![(String::new(), status.neighbour_table.max)],
        },
        Family {
            name: "ipoib_cm_tx_connections".into(),
            help: "Transmit (active) connections, any state.",
            kind: "gauge",
            samples: vec![(String::new(), status.tx.len() as u64)],
        },
        Family {
            name: "ipoib_cm_rx_connections".into(),
            help: "Receive (passive) connections, any state.",
            kind: "gauge",
            samples: vec![(String::new(), status.rx.len() as u64)],
        },
    ];
    if let Some(u) = &status.interface.underlay {
        let link = format!("link=\"{}\"", label_value(&u.link));
        families.push(Family {
            name: "ipoib_cm_underlay_up".into(),
            help: "1 while the --bind link is up with a carrier and the address; 0 with the \
                   state that stops traffic.",
            kind: "gauge",
            samples: vec![(
                format!("{link},state=\"{}\"", u.state.as_str()),
                u64::from(u.state == super::UnderlayCondition::Up),
            )],
        });
        families.push(Family {
            name: "ipoib_cm_underlay_mtu_bytes".into(),
            help: "The MTU of the --bind link (0 while it is gone).",
            kind: "gauge",
            samples: vec![(link, u64::from(u.mtu))],
        });
    }
    for (name, v) in m.totals.fields() {
        families.push(Family {
            name: format!("ipoib_cm_{name}_total"),
            help: total_help(name),
            kind: "counter",
            samples: vec![(String::new(), v)],
        });
    }
    for (name, reasons, help) in [
        (
            "ipoib_cm_rx_dropped_by_reason_total",
            &m.drops.rx,
            "What rx_dropped adds, by the counter that counted it.",
        ),
        (
            "ipoib_cm_tx_dropped_by_reason_total",
            &m.drops.tx,
            "What tx_dropped adds, by the counter that counted it.",
        ),
    ] {
        families.push(Family {
            name: name.into(),
            help,
            kind: "counter",
            samples: reasons
                .iter()
                .map(|(r, v)| (format!("reason=\"{}\"", label_value(r)), *v))
                .collect(),
        });
    }
    for (name, v) in status.counters.fields() {
        let (full, kind) = if name == "qp_live" {
            (format!("ipoib_cm_{name}"), "gauge")
        } else {
            (format!("ipoib_cm_{name}_total"), "counter")
        };
        families.push(Family {
            name: full,
            help: "Endpoint counter of the same name in `ipoib-cm status`.",
            kind,
            samples: vec![(String::new(), v)],
        });
    }
    let counters = status.counters.fields();
    for (name, v) in &status.provider {
        // A name the endpoint's counters have already (they are not repeated in the map).
        if counters.iter().any(|(n, _)| n == name) {
            continue;
        }
        let (suffix, help, kind) = if crate::soft::SoftStats::GAUGES.contains(&name.as_str()) {
            (
                "",
                "Gauge of the same name in the `provider` section of `ipoib-cm status`.",
                "gauge",
            )
        } else {
            (
                "_total",
                "Counter of the same name in the `provider` section of `ipoib-cm status`.",
                "counter",
            )
        };
        families.push(Family {
            name: format!("ipoib_cm_provider_{}{suffix}", metric_name(name)),
            help,
            kind,
            samples: vec![(String::new(), *v)],
        });
    }
    if !status.workers.is_empty() {
        type Field = fn(&super::WorkerStatus) -> u64;
        let per_worker: [(&str, &'static str, &'static str, Field); 7] = [
            (
                "ipoib_cm_worker_rx_packets_total",
                "IP packets a worker wrote to its TUN queue.",
                "counter",
                |w| w.rx_packets,
            ),
            (
                "ipoib_cm_worker_rx_bytes_total",
                "Bytes of those packets.",
                "counter",
                |w| w.rx_bytes,
            ),
            (
                "ipoib_cm_worker_tx_packets_total",
                "IP packets a worker sent.",
                "counter",
                |w| w.tx_packets,
            ),
            (
                "ipoib_cm_worker_tx_bytes_total",
                "Bytes of those packets.",
                "counter",
                |w| w.tx_bytes,
            ),
            (
                "ipoib_cm_worker_rx_connections",
                "A worker's RX connections.",
                "gauge",
                |w| w.rx_conns,
            ),
            (
                "ipoib_cm_worker_tx_connections",
                "A worker's TX connections.",
                "gauge",
                |w| w.tx_conns,
            ),
            (
                "ipoib_cm_worker_cpu_milliseconds_total",
                "CPU time a worker's thread has used, in milliseconds.",
                "counter",
                |w| (w.cpu_seconds * 1000.0) as u64,
            ),
        ];
        for (name, help, kind, field) in per_worker {
            families.push(Family {
                name: name.into(),
                help,
                kind,
                samples: status
                    .workers
                    .iter()
                    .map(|w| (format!("worker=\"{}\"", w.index), field(w)))
                    .collect(),
            });
        }
    }
    for f in &mut families {
        for (labels, _) in &mut f.samples {
            *labels = if labels.is_empty() {
                ifname.clone()
            } else {
                format!("{ifname},{labels}")
            };
        }
    }
    families
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::daemon::status::{Counters, InterfaceStatus, Summary};
    use crate::ipoib::Mode;

    fn valid_name(n: &str) -> bool {
        let mut c = n.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
    }

    /// Checks `text` as the exposition format: every sample's family has a HELP and a TYPE
    /// line before it, once each; names and label names valid; values integers. Returns the
    /// samples as `(name, labels, value)`.
    fn parse(text: &str) -> Vec<(String, String, u64)> {
        let mut help = HashSet::new();
        let mut kind = HashSet::new();
        let mut samples = Vec::new();
        assert!(text.ends_with('\n'));
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, h) = rest.split_once(' ').expect("help text");
                assert!(valid_name(name) && !h.is_empty(), "{line}");
                assert!(help.insert(name.to_owned()), "second HELP: {line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, t) = rest.split_once(' ').expect("type");
                assert!(["counter", "gauge"].contains(&t), "{line}");
                assert!(help.contains(name), "TYPE before HELP: {line}");
                assert!(kind.insert(name.to_owned()), "second TYPE: {line}");
                continue;
            }
            assert!(!line.starts_with('#'), "{line}");
            let (series, value) = line.rsplit_once(' ').expect("value");
            let (name, labels) = series.split_once('{').expect("labels");
            let labels = labels.strip_suffix('}').expect("closing brace");
            assert!(valid_name(name), "{line}");
            assert!(kind.contains(name), "sample without TYPE: {line}");
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (l, v) = pair.split_once("=\"").expect("label=\"value\"");
                assert!(valid_name(l) && !l.starts_with("__"), "{line}");
                assert!(!v.trim_end_matches('"').contains('"'), "{line}");
            }
            assert!(name.starts_with("ipoib_cm_"), "{line}");
            if name.ends_with("_total") {
                assert!(labels.contains("ifname=\"ib0\""), "{line}");
            }
            samples.push((
                name.to_owned(),
                labels.to_owned(),
                value.parse().expect("integer value"),
            ));
        }
        samples
    }

    fn status() -> Status {
        let mut counters = Counters {
            qp_live: 3,
            tx_queue_drops: 2,
            ..Counters::default()
        };
        counters.rx_accepted = 1;
        let provider: BTreeMap<String, u64> = [
            ("tx_dropped", 3),
            ("rx_bad_icrc", 4),
            ("fault_loss", 1),
            ("hw_odd-name", 2),
            ("srtt_us", 40_000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        Status {
            summary: Summary::new(42, &counters, &provider),
            neighbour_table: Default::default(),
            interface: InterfaceStatus {
                name: "ib0".into(),
                mtu: 65520,
                mode: Mode::Connected,
                hwaddr: "80:00:00:48".into(),
                cm_transport: String::new(),
                path_mtu: 0,
                path_mtu_from: String::new(),
                underlay: None,
                port: None,
            },
            neighbours: Vec::new(),
            tx: Vec::new(),
            rx: Vec::new(),
            counters,
            provider,
            workers: Vec::new(),
        }
    }

    #[test]
    fn the_exposition_parses_and_names_every_metric() {
        let text = render_prometheus(&status());
        let samples = parse(&text);
        let get = |n: &str| {
            samples
                .iter()
                .find(|(name, ..)| name == n)
                .map(|(_, _, v)| *v)
        };
        assert_eq!(get("ipoib_cm_tx_dropped_total"), Some(5), "{text}");
        assert_eq!(get("ipoib_cm_rx_dropped_total"), Some(4), "{text}");
        assert_eq!(get("ipoib_cm_uptime_seconds"), Some(42));
        assert_eq!(get("ipoib_cm_qp_live"), Some(3));
        assert_eq!(get("ipoib_cm_provider_hw_odd_name_total"), Some(2));
        // The software provider's gauges are gauges, without `_total`.
        assert_eq!(get("ipoib_cm_provider_srtt_us"), Some(40_000));
        assert!(
            text.contains("# TYPE ipoib_cm_provider_srtt_us gauge"),
            "{text}"
        );
        assert!(samples
            .iter()
            .any(|(n, l, v)| n == "ipoib_cm_tx_dropped_by_reason_total"
                && l.contains("reason=\"tx_queue_drops\"")
                && *v == 2));
        assert!(text.contains("version=\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = status();
        s.interface.name = "a\"b\\c".into();
        let text = render_prometheus(&s);
        assert!(text.contains("ifname=\"a\\\"b\\\\c\""), "{text}");
    }

    #[test]
    fn the_underlay_is_a_gauge_with_its_state() {
        let mut s = status();
        assert!(!render_prometheus(&s).contains("ipoib_cm_underlay"));
        s.interface.underlay = Some(super::super::UnderlayStatus {
            link: "eth0".into(),
            state: super::super::UnderlayCondition::NoAddress,
            mtu: 1500,
        });
        let text = render_prometheus(&s);
        assert!(
            text.contains(
                "ipoib_cm_underlay_up{ifname=\"ib0\",link=\"eth0\",state=\"no-address\"} 0"
            ),
            "{text}"
        );
        assert!(
            text.contains("ipoib_cm_underlay_mtu_bytes{ifname=\"ib0\",link=\"eth0\"} 1500"),
            "{text}"
        );
        parse(&text);
    }
}
