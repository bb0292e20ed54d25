//! Control socket: server <-> client round trips in a temp dir (no root needed).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ipoib_cm::daemon::control::{query, ControlError, ControlServer, CLIENT_TIMEOUT};
use ipoib_cm::daemon::status::{Counters, InterfaceStatus, RxState, RxStatus, Status};
use ipoib_cm::daemon::Mode;
use mio::{Events, Poll, Token};

static N: AtomicUsize = AtomicUsize::new(0);

/// A fresh, not yet existing directory under the temp dir.
fn fresh_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "ipoib-cm-ctl-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn status() -> Status {
    Status {
        summary: Default::default(),
        interface: InterfaceStatus {
            name: "ib0".into(),
            mtu: 65520,
            mode: Mode::Connected,
            hwaddr: ipoib_cm::wire::ipoib::HwAddr::from([0x11; 20]).to_string(),
            cm_transport: String::new(),
            path_mtu: 0,
            path_mtu_from: String::new(),
            underlay: None,
            port: None,
        },
        neighbours: vec![],
        neighbour_table: Default::default(),
        tx: vec![],
        rx: vec![RxStatus {
            peer: "198.19.0.2".into(),
            qpn: 77,
            state: RxState::Drained,
            idle_ms: 5,
        }],
        counters: Counters {
            rx_accepted: 9,
            ..Counters::default()
        },
        provider: [("acks".to_owned(), 3)].into(),
        workers: Vec::new(),
    }
}

/// Serves through a mio poll loop, as the daemon's does, until `client` finishes; returns
/// how often `status` ran.
fn serve_until<T>(server: &mut ControlServer, client: &JoinHandle<T>) -> usize {
    let mut poll = Poll::new().unwrap();
    server
        .register(poll.registry(), Token(7), Token(1000))
        .unwrap();
    let mut events = Events::with_capacity(8);
    let mut calls = 0;
    let t0 = Instant::now();
    while !client.is_finished() {
        assert!(t0.elapsed() < Duration::from_secs(10), "client hung");
        let now = Instant::now();
        let timeout = server
            .poll_timeout()
            .map_or(Duration::from_millis(20), |t| {
                t.saturating_duration_since(now)
            })
            .min(Duration::from_millis(20));
        poll.poll(&mut events, Some(timeout)).unwrap();
        for ev in &events {
            assert!(server.note_readiness(ev.token()), "{:?}", ev.token());
        }
        server.handle(Instant::now(), || {
            calls += 1;
            status()
        });
    }
    calls
}

/// Sends raw bytes, returns the raw answer.
fn raw(path: &Path, request: &'static [u8], close_write: bool) -> JoinHandle<String> {
    let path = path.to_owned();
    std::thread::spawn(move || {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request).unwrap();
        if close_write {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
}

#[test]
fn round_trip_and_permissions() {
    let dir = fresh_dir().join("nested");
    let path = dir.join("ib0.sock");
    let mut server = ControlServer::bind(&path).unwrap();
    assert_eq!(server.path(), path);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(dir.parent().unwrap()), 0o700);

    let client = std::thread::spawn({
        let path = path.clone();
        move || query(&path, Duration::from_secs(5))
    });
    let calls = serve_until(&mut server, &client);
    assert_eq!(client.join().unwrap().unwrap(), status());
    assert_eq!(calls, 1);

    // Plain `status` also answers JSON; several clients at once share one snapshot.
    let clients: Vec<_> = (0..4).map(|_| raw(&path, b"status\n", false)).collect();
    std::thread::sleep(Duration::from_millis(50));
    let mut total = 0;
    for c in &clients {
        total += serve_until(&mut server, c);
    }
    assert!((1..=4).contains(&total));
    for c in clients {
        let text = c.join().unwrap();
        assert!(text.ends_with("}\n"));
        let s: Status = serde_json::from_str(&text).unwrap();
        assert_eq!(s, status());
    }

    drop(server);
    assert!(!path.exists(), "socket file removed on drop");
    std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

#[test]
fn json_key_names_on_the_wire() {
    let dir = fresh_dir();
    let path = dir.join("ib0.sock");
    let mut server = ControlServer::bind(&path).unwrap();
    let client = raw(&path, b"status json\n", false);
    serve_until(&mut server, &client);
    let v: serde_json::Value = serde_json::from_str(&client.join().unwrap()).unwrap();
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&v),
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
    assert_eq!(keys(&v["interface"]), ["hwaddr", "mode", "mtu", "name"]);
    assert_eq!(keys(&v["rx"][0]), ["idle_ms", "peer", "qpn", "state"]);
    assert_eq!(v["rx"][0]["state"], "drained");
    assert_eq!(keys(&v["counters"]).len(), 15);
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_requests_get_an_error() {
    let dir = fresh_dir();
    let path = dir.join("ib0.sock");
    let mut server = ControlServer::bind(&path).unwrap();
    let cases: [(&'static [u8], bool, &str); 5] = [
        (
            b"hello\n",
            false,
            "{\"error\":\"unknown request \\\"hello\\\" (expected status, status json, down, neigh add|del, peer add|del or reload)\"}\n",
        ),
        (b"\n", false, "{\"error\":\"empty request\"}\n"),
        (b"", true, "{\"error\":\"empty request\"}\n"),
        (
            &[b'x'; 300],
            false,
            "{\"error\":\"request longer than 256 bytes\"}\n",
        ),
        (b"\xff\n", false, "{\"error\":\"request is not UTF-8\"}\n"),
    ];
    for (req, close, want) in cases {
        let client = raw(&path, req, close);
        let calls = serve_until(&mut server, &client);
        assert_eq!(calls, 0);
        assert_eq!(client.join().unwrap(), want, "request {req:?}");
    }
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn silent_client_does_not_stall_the_loop() {
    let dir = fresh_dir();
    let path = dir.join("ib0.sock");
    let mut server = ControlServer::bind(&path).unwrap();
    let silent = UnixStream::connect(&path).unwrap();
    silent.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    server.handle(t0, status);
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(50), "took {took:?}");
    let mut byte = [0u8; 1];
    let nothing = (&silent).read(&mut byte).unwrap_err();
    assert_eq!(nothing.kind(), std::io::ErrorKind::WouldBlock);
    // Its deadline is the server's next timer; at it, the client gets the error and EOF.
    assert_eq!(server.poll_timeout(), Some(t0 + CLIENT_TIMEOUT));
    let t1 = Instant::now();
    server.handle(t0 + CLIENT_TIMEOUT, status);
    assert!(t1.elapsed() < Duration::from_millis(50));
    silent.set_nonblocking(false).unwrap();
    let mut out = String::new();
    (&silent).read_to_string(&mut out).unwrap();
    assert_eq!(out, "{\"error\":\"no request within 1s\"}\n");
    assert_eq!(server.poll_timeout(), None);
    // Nothing pending: returns at once.
    let t0 = Instant::now();
    server.handle(t0, status);
    assert!(t0.elapsed() < Duration::from_millis(50));
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn stale_socket_is_replaced_live_one_is_not() {
    let dir = fresh_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ib0.sock");
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "stale socket file left behind");
    let server = ControlServer::bind(&path).unwrap();

    let err = ControlServer::bind(&path).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert_eq!(
        err.to_string(),
        format!(
            "control socket {}: another daemon is listening on it",
            path.display()
        )
    );
    assert!(path.exists(), "live socket left alone");

    // If someone replaced our file, drop leaves theirs.
    std::fs::remove_file(&path).unwrap();
    let other = ControlServer::bind(&path).unwrap();
    drop(server);
    assert!(path.exists());
    drop(other);
    assert!(!path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn non_socket_file_is_not_replaced() {
    let dir = fresh_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ib0.sock");
    std::fs::write(&path, "precious").unwrap();
    let err = ControlServer::bind(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "control socket {}: exists and is not a socket",
            path.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn query_errors_are_one_line() {
    let dir = fresh_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ib0.sock");
    let err = query(&path, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(err, ControlError::NoDaemon { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "no daemon for ib0: {}: No such file or directory",
            path.display()
        )
    );

    // Stale socket file: connection refused.
    drop(UnixListener::bind(&path).unwrap());
    let err = query(&path, Duration::from_secs(1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("no daemon for ib0: {}: Connection refused", path.display())
    );
    std::fs::remove_file(&path).unwrap();

    // A daemon that never answers.
    let _hung = UnixListener::bind(&path).unwrap();
    let t0 = Instant::now();
    let err = query(&path, Duration::from_millis(200)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(
        err.to_string(),
        format!(
            "the daemon for ib0 did not answer within 200ms ({})",
            path.display()
        )
    );
    drop(_hung);
    std::fs::remove_file(&path).unwrap();

    // A daemon that answers garbage.
    let l = UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf).unwrap();
        s.write_all(b"not json\n").unwrap();
    });
    let err = query(&path, Duration::from_secs(5)).unwrap_err();
    t.join().unwrap();
    assert!(matches!(err, ControlError::Malformed { .. }));
    let msg = err.to_string();
    assert!(msg.starts_with("malformed answer from the daemon for ib0: "));
    assert!(!msg.contains('\n'));
    std::fs::remove_dir_all(&dir).unwrap();
}
