//! The metrics listener of a running daemon (`--metrics-listen` on each namespace's loopback),
//! read with curl from inside the namespace, in a lab of network namespaces built by
//! `scripts/lab.sh`. Without root the test prints `skipped: ...` and passes. Every wait is
//! bounded.

mod common;

use std::time::Duration;

use common::lab::Lab;

const URL: &str = "http://127.0.0.1:9464/metrics";

/// `curl` on node `k`: (HTTP status, body).
fn get(lab: &Lab, k: usize, url: &str) -> (String, String) {
    let out = lab.exec(
        k,
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "-w",
            "\n%{http_code}",
            url,
        ],
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    assert!(
        out.status.success(),
        "curl {url}: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    (code.to_owned(), body.to_owned())
}

/// The value of the sample `name{...}` in an exposition.
fn sample(body: &str, name: &str) -> Option<u64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn the_daemon_serves_its_counters_over_http() {
    let Some(lab) = Lab::up("e2em", 2, &["--metrics-listen", "127.0.0.1:9464"]) else {
        return;
    };
    let started = lab.wait_for(Duration::from_secs(5), |l| {
        l.log(1).contains("metrics_listen=127.0.0.1:9464")
    });
    assert!(started, "{}", lab.log(1));
    lab.ping_ok(1, "198.19.0.2", &[]);

    let (code, body) = get(&lab, 1, URL);
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("# HELP ipoib_cm_rx_packets_total "), "{body}");
    assert!(
        body.contains("# TYPE ipoib_cm_rx_packets_total counter"),
        "{body}"
    );
    assert!(body.contains("ifname=\"ib0\""), "{body}");
    let tx = sample(&body, "ipoib_cm_tx_packets_total").expect("tx_packets sample");
    assert!(tx >= 2, "{body}");
    // The status document's numbers (read after it: the host may have sent more since).
    let s = lab.status(1);
    assert!(s["tx_packets"].as_u64() >= Some(tx), "{tx} then {s}");

    let (code, _) = get(&lab, 1, "http://127.0.0.1:9464/other");
    assert_eq!(code, "404");

    // Many scrapes in a row, each answered; the loop carries on serving the data path.
    for _ in 0..20 {
        assert_eq!(get(&lab, 2, URL).0, "200");
    }
    lab.ping_ok(2, "198.19.0.1", &[]);
    println!(
        "exposition: {} bytes, {} samples",
        body.len(),
        body.lines().filter(|l| !l.starts_with('#')).count()
    );
}
