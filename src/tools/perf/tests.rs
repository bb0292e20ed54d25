//! The perf options (flags to [`PerfOptions`]) and the report formats.

use std::time::Duration;

use super::*;
use crate::setting::ConfigError;
use crate::soft::provider::UdpOffload;
use crate::verbs::PathMtu;
use clap::Parser;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    perf: PerfArgs,
}

/// Why a command line was refused: by clap, or by [`PerfArgs::resolve`].
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("clap: {0}")]
    Clap(#[from] clap::Error),
    #[error(transparent)]
    Resolve(#[from] ConfigError),
}

fn parse(args: &[&str]) -> Result<PerfOptions, Refused> {
    let cli = Cli::try_parse_from(std::iter::once("perf").chain(args.iter().copied()))?;
    let opts = cli.perf.resolve().inspect_err(|e| {
        let s = e.to_string();
        assert!(!s.contains('\n'), "multi-line error: {s:?}");
    })?;
    Ok(opts)
}

fn err(args: &[&str]) -> String {
    parse(args).expect_err("should be rejected").to_string()
}

#[test]
fn defaults() {
    let o = parse(&[]).unwrap();
    assert_eq!(o.tool.mode, Mode::Bw);
    assert_eq!(o.peer, None);
    assert_eq!(o.tcp_port, DEFAULT_TCP_PORT);
    assert_ne!(o.tcp_port, super::super::rc_pingpong::DEFAULT_TCP_PORT);
    assert_eq!(o.udp_port, 4791);
    assert_eq!(o.size, 65536);
    assert_eq!(o.iters, 1000);
    assert_eq!(o.tool.link.mtu, PathMtu::Mtu4096);
    assert_eq!((o.tool.tx_depth, o.rx_depth), (128, 512));
    assert_eq!(o.tool.link.qp_timeout, 14);
    assert!(o.verify_icrc_v4);
    assert_eq!(o.tool.offload, UdpOffload::On);
    assert!(o.tool.link.faults.is_clean());
    assert_eq!(o.deadline, Duration::from_secs(60));
    let lat = parse(&["--lat"]).unwrap();
    assert_eq!((lat.tool.mode, lat.size), (Mode::Lat, 2));
}

#[test]
fn every_flag() {
    let o = parse(&[
        "--lat",
        "198.18.0.1",
        "-p",
        "20000",
        "-s",
        "64",
        "-n",
        "2000",
        "-m",
        "1024",
        "--tx-depth",
        "16",
        "--rx-depth",
        "64",
        "--bind",
        "198.18.0.2",
        "--udp-port",
        "4800",
        "--qp-timeout",
        "10",
        "--no-icrc-v4",
        "--no-udp-offload",
        "--deadline",
        "30",
        "--fault-loss",
        "5",
        "--fault-seed",
        "7",
    ])
    .unwrap();
    assert_eq!(o.tool.mode, Mode::Lat);
    assert_eq!(o.peer, Some("198.18.0.1".parse().unwrap()));
    assert_eq!(o.bind, Some("198.18.0.2".parse().unwrap()));
    assert_eq!((o.tcp_port, o.udp_port), (20000, 4800));
    assert_eq!((o.size, o.iters), (64, 2000));
    assert_eq!(o.tool.link.mtu, PathMtu::Mtu1024);
    assert_eq!(
        (o.tool.tx_depth, o.rx_depth, o.tool.link.qp_timeout),
        (16, 64, 10)
    );
    assert!(!o.verify_icrc_v4);
    assert_eq!(o.tool.offload, UdpOffload::Off);
    assert_eq!(
        (o.tool.link.faults.loss_pct, o.tool.link.faults.seed),
        (5.0, 7)
    );
    assert_eq!(o.deadline, Duration::from_secs(30));
    assert_eq!(
        err(&["--deadline", "500ms"]),
        "--deadline: must be at least 1s (got \"500ms\")"
    );
}

#[test]
fn errors_name_the_flag() {
    for (args, field) in [
        (&["-s", "0"][..], "--size:"),
        (&["-s", "abc"], "--size:"),
        (&["-s", "16777217"], "--size:"),
        (&["-s", "16777216"], "--size:"),
        (&["-n", "0"], "--iters:"),
        (&["-n", "-5"], "--iters:"),
        (&["-m", "1000"], "--mtu:"),
        (&["-m", "8192"], "--mtu:"),
        (&["-p", "0"], "--port:"),
        (&["-p", "70000"], "--port:"),
        (&["--udp-port", "x"], "--udp-port:"),
        (&["--tx-depth", "0"], "--tx-depth:"),
        (&["--rx-depth", "20000"], "--rx-depth:"),
        (&["--qp-timeout", "32"], "--qp-timeout:"),
        (&["--deadline", "soon"], "--deadline:"),
        (&["--bind", "host"], "--bind:"),
        (&["not-an-ip"], "SERVER_IP:"),
        (&["--bind", "::1", "198.18.0.1"], "--bind:"),
        (&["--bw", "--lat"], "--lat:"),
        (&["--fault-loss", "101"], "--fault-loss:"),
    ] {
        let e = err(args);
        assert!(e.starts_with(field), "{args:?}: {e}");
    }
    assert_eq!(
        err(&["-m", "1000"]),
        "--mtu: must be 256, 512, 1024, 2048 or 4096 (got 1000)"
    );
}

#[test]
fn latency_is_half_the_round_trip_by_nearest_rank() {
    let mut rtts: Vec<Duration> = (1..=100u64).rev().map(Duration::from_micros).collect();
    let l = Latency::of_round_trips(&mut rtts).unwrap();
    assert_eq!(l.p50, Duration::from_nanos(25_000));
    assert_eq!(l.p99, Duration::from_nanos(49_500));
    assert_eq!(l.max, Duration::from_micros(50));
    assert_eq!(l.avg, Duration::from_nanos(25_250));
    assert_eq!(l.samples, 100);
    let mut one = vec![Duration::from_micros(10)];
    let l = Latency::of_round_trips(&mut one).unwrap();
    let half = Duration::from_micros(5);
    assert_eq!((l.p50, l.p99, l.max, l.avg), (half, half, half, half));
    assert_eq!(Latency::of_round_trips(&mut []), None);
}

#[test]
fn report_json_has_nulls_where_figures_do_not_apply() {
    let bw = Report {
        mode: Mode::Bw,
        is_client: false,
        size: 65536,
        iters: 2000,
        elapsed: Duration::from_millis(100),
        latency: None,
        stats: String::new(),
    };
    let j: serde_json::Value = serde_json::from_str(&bw.json()).unwrap();
    assert_eq!(j["bytes"], 65536 * 2000);
    assert_eq!(j["side"], "server");
    assert!((j["gbit_s"].as_f64().unwrap() - 10.48576).abs() < 1e-6);
    assert!((j["msg_per_s"].as_f64().unwrap() - 20000.0).abs() < 1e-6);
    assert!(j["lat_p50_us"].is_null());
    let mut rtts = vec![Duration::from_micros(40); 10];
    let lat = Report {
        mode: Mode::Lat,
        is_client: true,
        latency: Latency::of_round_trips(&mut rtts),
        ..bw
    };
    let j: serde_json::Value = serde_json::from_str(&lat.json()).unwrap();
    assert_eq!(j["mode"], "lat");
    assert!(j["gbit_s"].is_null() && j["msg_per_s"].is_null());
    assert_eq!(j["lat_p50_us"].as_f64(), Some(20.0));
    assert!(lat.text().contains("p50 20.00 us"), "{}", lat.text());
}
