//! The metrics listener over real loopback TCP sockets, unregistered (every client tried every
//! turn), with a virtual `now`.

use super::*;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream as StdStream};

fn server() -> MetricsServer {
    MetricsServer::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).expect("bind loopback")
}

fn client(s: &MetricsServer, request: &[u8]) -> StdStream {
    let mut c = StdStream::connect(s.local_addr()).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(request).unwrap();
    c
}

fn answer(c: &mut StdStream) -> String {
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

const BODY: &str = "# HELP ipoib_cm_up Up.\n# TYPE ipoib_cm_up gauge\nipoib_cm_up 1\n";

#[test]
fn requests_parse_by_their_request_line() {
    use HttpRequest::*;
    let cases: [(&[u8], HttpRequest); 9] = [
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            Metrics { head_only: false },
        ),
        (
            b"GET /metrics?a=1 HTTP/1.0\r\n\r\n",
            Metrics { head_only: false },
        ),
        (b"HEAD /metrics HTTP/1.0\n\n", Metrics { head_only: true }),
        (b"GET / HTTP/1.0\r\n\r\n", NotFound),
        (b"GET /metricsx HTTP/1.0\r\n\r\n", NotFound),
        (b"POST /metrics HTTP/1.0\r\n\r\n", BadMethod),
        (b"GET /metrics\r\n\r\n", Malformed),
        (b"GET metrics HTTP/1.0\r\n\r\n", Malformed),
        (b"\xff\xfe GET /metrics HTTP/1.0\r\n\r\n", Malformed),
    ];
    for (head, want) in cases {
        assert_eq!(
            parse_request(head),
            want,
            "{:?}",
            String::from_utf8_lossy(head)
        );
    }
}

#[test]
fn get_metrics_is_answered_with_the_exposition_built_once_per_turn() {
    let mut s = server();
    let mut a = client(&s, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut b = client(&s, b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut built = 0;
    s.handle(Instant::now(), || {
        built += 1;
        BODY.to_owned()
    });
    assert_eq!(built, 1);
    for c in [&mut a, &mut b] {
        let got = answer(c);
        assert!(got.starts_with("HTTP/1.0 200 OK\r\n"), "{got}");
        assert!(
            got.contains(&format!("Content-Length: {}\r\n", BODY.len())),
            "{got}"
        );
        assert!(
            got.contains("Content-Type: text/plain; version=0.0.4"),
            "{got}"
        );
        assert!(got.ends_with(&format!("\r\n\r\n{BODY}")), "{got}");
    }
    assert_eq!(s.counters().answered, 2);
    assert_eq!(s.clients(), 0);
}

#[test]
fn other_requests_get_an_error_status_and_no_exposition() {
    let mut s = server();
    let cases: [(&[u8], &str); 5] = [
        (b"GET /other HTTP/1.0\r\n\r\n", "404"),
        (b"DELETE /metrics HTTP/1.0\r\n\r\n", "405"),
        (b"hello\r\n\r\n", "400"),
        (&[b'a'; MAX_REQUEST_BYTES + 100], "431"),
        (b"HEAD /metrics HTTP/1.0\r\n\r\n", "200"),
    ];
    let mut clients: Vec<_> = cases.iter().map(|(r, _)| client(&s, r)).collect();
    let mut built = 0;
    s.handle(Instant::now(), || {
        built += 1;
        BODY.to_owned()
    });
    for (c, (_, status)) in clients.iter_mut().zip(cases) {
        let got = answer(c);
        assert!(got.starts_with(&format!("HTTP/1.0 {status} ")), "{got}");
        assert!(!got.contains("ipoib_cm_up 1"), "{got}");
    }
    assert_eq!(built, 1, "only the HEAD asked for it");
}

#[test]
fn a_silent_client_is_answered_408_and_closed_at_its_deadline() {
    let mut s = server();
    let mut c = client(&s, b"GET /metrics HTTP/1.0\r\n");
    let t0 = Instant::now();
    s.handle(t0, String::new);
    assert_eq!(s.clients(), 1);
    assert_eq!(s.poll_timeout(), Some(t0 + CLIENT_TIMEOUT));
    s.handle(t0 + CLIENT_TIMEOUT / 2, String::new);
    assert_eq!((s.clients(), s.counters().timed_out), (1, 0));
    s.handle(t0 + CLIENT_TIMEOUT, String::new);
    assert_eq!((s.clients(), s.counters().timed_out), (0, 1));
    assert!(answer(&mut c).starts_with("HTTP/1.0 408 "));
}

#[test]
fn connections_beyond_busy_slots_are_refused_and_counted() {
    let mut s = server();
    let _held: Vec<_> = (0..MAX_CLIENTS).map(|_| client(&s, b"GET /met")).collect();
    let t0 = Instant::now();
    s.handle(t0, String::new);
    assert_eq!(s.clients(), MAX_CLIENTS);
    let _extra = client(&s, b"");
    s.handle(t0, String::new);
    assert_eq!(s.clients(), MAX_CLIENTS);
    assert_eq!(s.counters().over_limit, 1);
    assert_eq!(s.counters().accepted, MAX_CLIENTS as u64);
    // Their deadline frees the slots.
    s.handle(t0 + CLIENT_TIMEOUT, String::new);
    assert_eq!(s.clients(), 0);
}

#[test]
fn an_idle_client_gives_its_slot_to_a_newcomer() {
    let mut s = server();
    let mut held: Vec<_> = (0..MAX_CLIENTS).map(|_| client(&s, b"")).collect();
    let t0 = Instant::now();
    s.handle(t0, String::new);
    assert_eq!(s.clients(), MAX_CLIENTS);
    let mut newcomer = client(&s, b"GET /metrics HTTP/1.0\r\n\r\n");
    s.handle(t0 + Duration::from_millis(1), || BODY.to_owned());
    assert!(answer(&mut newcomer).starts_with("HTTP/1.0 200 "));
    assert_eq!(answer(&mut held[0]), "");
    assert_eq!((s.counters().evicted_idle, s.counters().over_limit), (1, 0));
}

#[test]
fn accepts_per_turn_are_bounded() {
    let mut s = server();
    let n = ACCEPTS_PER_TURN.min(MAX_CLIENTS);
    let mut held: Vec<_> = (0..MAX_CLIENTS + 4)
        .map(|_| client(&s, b"GET /metrics HTTP/1.0\r\n\r\n"))
        .collect();
    s.handle(Instant::now(), || BODY.to_owned());
    assert!(s.counters().accepted + s.counters().over_limit <= ACCEPTS_PER_TURN as u64);
    assert_eq!(s.counters().answered, n as u64);
    for _ in 0..4 {
        s.handle(Instant::now(), || BODY.to_owned());
    }
    assert_eq!(s.counters().answered, held.len() as u64);
    for c in &mut held {
        assert!(answer(c).starts_with("HTTP/1.0 200 "));
    }
}
