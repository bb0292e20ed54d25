//! Unit tests of the control socket: the codecs, and the server's state machine driven with
//! virtual `now`s over real sockets in a temp dir.

use super::server::default_allow;
use super::*;
use crate::daemon::status::{Counters, InterfaceStatus};
use crate::daemon::Mode;
use std::os::unix::net::UnixStream;

fn status() -> Status {
    Status {
        summary: Default::default(),
        interface: InterfaceStatus {
            name: "ib0".into(),
            mtu: 2044,
            mode: Mode::Datagram,
            hwaddr: HwAddr::from([0; 20]).to_string(),
            cm_transport: String::new(),
            path_mtu: 0,
            path_mtu_from: String::new(),
            underlay: None,
            port: None,
        },
        neighbours: vec![],
        neighbour_table: Default::default(),
        tx: vec![],
        rx: vec![],
        counters: Counters::default(),
        provider: Default::default(),
        workers: Vec::new(),
    }
}

#[test]
fn requests() {
    assert_eq!(
        parse_request(b"status\n"),
        Ok(Request::Status { json: false })
    );
    assert_eq!(
        parse_request(b"status json\n"),
        Ok(Request::Status { json: true })
    );
    assert_eq!(
        parse_request(b"status json\r\n"),
        Ok(Request::Status { json: true })
    );
    assert_eq!(
        parse_request(b"status"),
        Ok(Request::Status { json: false })
    );
    assert_eq!(
        parse_request(b"status\nsomething else"),
        Ok(Request::Status { json: false })
    );
    assert_eq!(parse_request(b""), Err(RequestError::Empty));
    assert_eq!(
        parse_request(b"\n").map_err(|e| e.to_string()),
        Err("empty request".into())
    );
    assert_eq!(
        parse_request(b"reboot\n").map_err(|e| e.to_string()),
        Err("unknown request \"reboot\" (expected status, status json, down, neigh add|del, peer add|del or reload)".into())
    );
    assert_eq!(
        parse_request(b"status xml\n").unwrap_err().to_string(),
        "unknown request \"status xml\" (expected status, status json, down, neigh add|del, peer add|del or reload)"
    );
    assert_eq!(
        parse_request(b"\xff\xfe\n").map_err(|e| e.to_string()),
        Err("request is not UTF-8".into())
    );
    let long = vec![b'a'; MAX_REQUEST_BYTES];
    assert_eq!(
        parse_request(&long).map_err(|e| e.to_string()),
        Err("request longer than 256 bytes".into())
    );
    let mut long_line = vec![b' '; MAX_REQUEST_BYTES + 10];
    long_line.push(b'\n');
    assert_eq!(parse_request(&long_line), Err(RequestError::TooLong));
    assert!(request_complete(b"x\n"));
    assert!(!request_complete(b"status"));
    assert!(request_complete(&long));
}

#[test]
fn responses() {
    let s = status();
    let text = format_response(&s);
    assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
    assert_eq!(parse_response(&text), Ok(s));
    assert_eq!(
        format_error("permission denied"),
        "{\"error\":\"permission denied\"}\n"
    );
    assert_eq!(
        parse_response("{\"error\":\"permission denied\"}\n"),
        Err(ResponseError::Daemon("permission denied".into()))
    );
    assert!(matches!(
        parse_response("{\"error\":5}"),
        Err(ResponseError::Daemon(m)) if m == "5"
    ));
    assert!(matches!(
        parse_response(""),
        Err(ResponseError::Malformed(_))
    ));
    assert!(matches!(
        parse_response("[1,2]"),
        Err(ResponseError::Malformed(_))
    ));
    assert!(matches!(
        parse_response("{\"interface\":{}}"),
        Err(ResponseError::Malformed(_))
    ));
}

#[test]
fn access_policy() {
    assert!(default_allow(0, 1000));
    assert!(default_allow(1000, 1000));
    assert!(!default_allow(1001, 1000));
    assert!(default_allow(0, 0));
    assert!(!default_allow(1000, 0));
}

/// A server bound in a fresh temp dir; the dir goes with it.
struct Bound {
    server: ControlServer,
    dir: PathBuf,
}

impl Bound {
    fn new(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ipoib-cm-ctl-unit-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let server = ControlServer::bind(&dir.join("ib9.sock")).unwrap();
        Self { server, dir }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(self.server.path()).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the server has written to `s` so far, and whether it closed (EOF).
fn received(s: &mut UnixStream) -> (String, bool) {
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return (String::from_utf8(out).unwrap(), true),
            Ok(k) => out.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return (String::from_utf8(out).unwrap(), false)
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

#[test]
fn refused_peer_gets_permission_denied() {
    let mut b = Bound::new("refused");
    b.server.set_policy(|_, _| false);
    let client = std::thread::spawn({
        let path = b.server.path().to_owned();
        move || query(&path, Duration::from_secs(5))
    });
    let t0 = Instant::now();
    while !client.is_finished() && t0.elapsed() < Duration::from_secs(5) {
        b.server.handle(Instant::now(), || {
            unreachable!("status computed for a refused peer")
        });
        std::thread::sleep(Duration::from_millis(2));
    }
    let err = client.join().unwrap().unwrap_err();
    assert_eq!(
        err.to_string(),
        "the daemon for ib9 answered: permission denied"
    );
}

#[test]
fn a_silent_client_is_answered_at_its_deadline_not_before() {
    let mut b = Bound::new("silent");
    let mut c = b.connect();
    let t0 = Instant::now();
    b.server.handle(t0, status);
    assert_eq!(b.server.clients(), 1);
    assert_eq!(b.server.poll_timeout(), Some(t0 + CLIENT_TIMEOUT));
    b.server
        .handle(t0 + CLIENT_TIMEOUT - Duration::from_millis(1), status);
    assert_eq!(received(&mut c), (String::new(), false));
    b.server.handle(t0 + CLIENT_TIMEOUT, status);
    assert_eq!(
        received(&mut c),
        ("{\"error\":\"no request within 1s\"}\n".to_owned(), true)
    );
    assert_eq!(b.server.clients(), 0);
    assert_eq!(b.server.poll_timeout(), None);
    let n = b.server.counters();
    assert_eq!((n.accepted, n.timed_out, n.answered), (1, 1, 1));
}

#[test]
fn a_request_sent_a_byte_at_a_time_is_answered_once_whole() {
    let mut b = Bound::new("slow");
    let mut c = b.connect();
    let t0 = Instant::now();
    let mut calls = 0;
    for (i, byte) in b"status json\n".iter().enumerate() {
        assert_eq!(received(&mut c), (String::new(), false), "after {i} bytes");
        c.write_all(&[*byte]).unwrap();
        let now = t0 + Duration::from_millis(10 * i as u64);
        b.server.handle(now, || {
            calls += 1;
            status()
        });
    }
    assert_eq!(calls, 1);
    let (text, closed) = received(&mut c);
    assert!(closed);
    assert_eq!(parse_response(&text), Ok(status()));
}

/// Fills every slot with clients that connected (at `now`, ACCEPTS_PER_TURN a turn).
fn fill_slots(b: &mut Bound, now: Instant) -> Vec<UnixStream> {
    let held: Vec<UnixStream> = (0..MAX_CLIENTS).map(|_| b.connect()).collect();
    for _ in 0..MAX_CLIENTS.div_ceil(ACCEPTS_PER_TURN) {
        b.server.handle(now, status);
    }
    assert_eq!(b.server.clients(), MAX_CLIENTS);
    held
}

#[test]
fn an_idle_client_gives_its_slot_to_a_newcomer_oldest_first() {
    let mut b = Bound::new("idle");
    let t0 = Instant::now();
    let mut held = fill_slots(&mut b, t0);
    let mut newcomer = b.connect();
    newcomer.write_all(b"status json\n").unwrap();
    b.server.handle(t0 + Duration::from_millis(1), status);
    let (text, closed) = received(&mut newcomer);
    assert!(closed);
    assert_eq!(parse_response(&text), Ok(status()));
    // The first accepted, idle since, was closed without an answer; the others wait on.
    assert_eq!(received(&mut held[0]), (String::new(), true));
    assert_eq!(received(&mut held[1]), (String::new(), false));
    let n = b.server.counters();
    assert_eq!((n.evicted_idle, n.over_limit), (1, 0));
    assert_eq!(b.server.clients(), MAX_CLIENTS - 1);
}

#[test]
fn a_newcomer_is_refused_only_when_every_client_is_mid_exchange() {
    let mut b = Bound::new("limit");
    let now = Instant::now();
    let mut held = fill_slots(&mut b, now);
    for c in &mut held {
        c.write_all(b"stat").unwrap();
    }
    b.server.handle(now, status);
    let mut extra = b.connect();
    b.server.handle(now, status);
    assert_eq!(
        received(&mut extra),
        (
            "{\"error\":\"too many control clients\"}\n".to_owned(),
            true
        )
    );
    assert_eq!(b.server.counters().over_limit, 1);
    assert_eq!(b.server.counters().evicted_idle, 0);
    // A slot freed is a slot given.
    held[0].write_all(b"us\n").unwrap();
    b.server.handle(now, status);
    assert!(received(&mut held[0]).1);
    assert_eq!(b.server.clients(), MAX_CLIENTS - 1);
    let _next = b.connect();
    b.server.handle(now, status);
    assert_eq!(b.server.clients(), MAX_CLIENTS);
    assert_eq!(b.server.counters().accepted, MAX_CLIENTS as u64 + 1);
}

#[test]
fn a_peer_that_may_not_talk_is_answered_at_accept_and_never_holds_a_slot() {
    let mut b = Bound::new("denied");
    b.server.set_policy(|_, _| false);
    let mut denied: Vec<UnixStream> = (0..2 * MAX_CLIENTS).map(|_| b.connect()).collect();
    let now = Instant::now();
    for _ in 0..(2 * MAX_CLIENTS).div_ceil(ACCEPTS_PER_TURN) {
        b.server
            .handle(now, || unreachable!("status computed for a denied peer"));
        assert_eq!(b.server.clients(), 0);
    }
    for c in &mut denied {
        assert_eq!(
            received(c),
            ("{\"error\":\"permission denied\"}\n".to_owned(), true)
        );
    }
    let n = b.server.counters();
    assert_eq!(
        (n.denied, n.accepted, n.over_limit),
        (2 * MAX_CLIENTS as u64, 0, 0)
    );
    assert_eq!(b.server.poll_timeout(), None);
}

#[test]
fn accepts_are_bounded_per_turn_and_the_rest_is_due_at_once() {
    let mut b = Bound::new("accepts");
    let mut poll = mio::Poll::new().unwrap();
    b.server
        .register(poll.registry(), mio::Token(1), mio::Token(1000))
        .unwrap();
    let _clients: Vec<UnixStream> = (0..ACCEPTS_PER_TURN + 8).map(|_| b.connect()).collect();
    let mut events = mio::Events::with_capacity(8);
    poll.poll(&mut events, Some(Duration::from_secs(5)))
        .unwrap();
    for ev in &events {
        assert!(b.server.note_readiness(ev.token()));
    }
    let now = Instant::now();
    b.server.handle(now, status);
    assert_eq!(b.server.clients(), ACCEPTS_PER_TURN);
    assert_eq!(b.server.poll_timeout(), Some(now));
    b.server.handle(now, status);
    assert_eq!(b.server.clients(), ACCEPTS_PER_TURN + 8);
    assert_eq!(b.server.poll_timeout(), Some(now + CLIENT_TIMEOUT));
    assert!(!b.server.note_readiness(mio::Token(1000 + MAX_CLIENTS)));
    assert!(b.server.note_readiness(mio::Token(1000 + MAX_CLIENTS - 1)));
}

#[test]
fn a_large_answer_is_written_across_turns_and_a_client_that_stops_reading_is_dropped() {
    let big = || {
        let mut s = status();
        s.provider = (0..200_000).map(|i| (format!("counter_{i}"), i)).collect();
        s
    };
    let want = format_response(&big());
    assert!(want.len() > 4 * WRITE_PER_TURN);
    let mut b = Bound::new("large");
    let mut reader = b.connect();
    let mut stuck = b.connect();
    reader.write_all(b"status\n").unwrap();
    stuck.write_all(b"status\n").unwrap();
    let t0 = Instant::now();
    let mut calls = 0;
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut turns = 0;
    while turns == 0 || (b.server.clients() > 1 && turns < 10_000) {
        turns += 1;
        b.server.handle(t0, || {
            calls += 1;
            big()
        });
        while let Ok(k) = reader.read(&mut chunk) {
            if k == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..k]);
        }
    }
    assert_eq!(calls, 1, "one status for both clients");
    assert!(turns > want.len() / WRITE_PER_TURN, "{turns} turns");
    assert_eq!(String::from_utf8(got).unwrap(), want);
    // The other one never read: closed when its time to read runs out.
    assert_eq!(b.server.clients(), 1);
    b.server.handle(t0 + CLIENT_TIMEOUT, status);
    assert_eq!(b.server.clients(), 0);
    assert_eq!(b.server.counters().timed_out, 1);
}

#[test]
fn command_requests_parse_and_print_back() {
    let hw = "80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:c6:12:00:02";
    let cases = [
        ("down", Request::Down { ifname: None }),
        (
            "down ib3",
            Request::Down {
                ifname: Some("ib3".into()),
            },
        ),
        (
            &*format!("neigh add 198.19.0.9 {hw}"),
            Request::NeighAdd {
                ip: "198.19.0.9".parse().unwrap(),
                hw: hw.parse().unwrap(),
            },
        ),
        (
            "neigh del 2001:db8::9",
            Request::NeighDel {
                ip: "2001:db8::9".parse().unwrap(),
            },
        ),
        (
            "peer add 198.18.0.7",
            Request::PeerAdd {
                addr: "198.18.0.7".parse().unwrap(),
            },
        ),
        (
            "peer del 198.18.0.7",
            Request::PeerDel {
                addr: "198.18.0.7".parse().unwrap(),
            },
        ),
        ("reload", Request::Reload),
    ];
    for (line, req) in cases {
        assert_eq!(
            parse_request(format!("{line}\n").as_bytes()),
            Ok(req.clone())
        );
        assert_eq!(req.line(), line);
        assert!(req.line().len() < MAX_REQUEST_BYTES);
    }
    assert_eq!(
        parse_request(b"neigh add 198.19.0.9 nothw\n")
            .unwrap_err()
            .to_string(),
        "neigh add: invalid hardware address \"nothw\""
    );
    assert_eq!(
        parse_request(b"peer add host\n").unwrap_err().to_string(),
        "peer add: invalid IP address \"host\""
    );
}

#[test]
fn ok_answers_parse_and_errors_stay_errors() {
    assert_eq!(parse_ok(&format_ok("peer added")), Ok("peer added".into()));
    assert_eq!(
        parse_ok(&format_error("no peer")),
        Err(ResponseError::Daemon("no peer".into()))
    );
    assert!(matches!(
        parse_ok("{\"ok\":1}"),
        Err(ResponseError::Malformed(_))
    ));
}

#[test]
fn listening_abstract_sockets_are_found_in_proc_net_unix() {
    let text = "\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 1001 @ipoib-cm/ib0
0000000000000000: 00000003 00000000 00000000 0001 03 1002 @ipoib-cm/ib0
0000000000000000: 00000002 00000000 00010000 0001 01 1003 @ipoib-cm/ib1
0000000000000000: 00000002 00000000 00010000 0001 01 1004 @other/ib2
0000000000000000: 00000002 00000000 00010000 0001 01 1005 /run/ipoib-cm/ib3.sock
0000000000000000: 00000002 00000000 00000000 0002 01 1006
";
    assert_eq!(
        listening_sockets(text, "@ipoib-cm/"),
        [
            PathBuf::from("@ipoib-cm/ib0"),
            PathBuf::from("@ipoib-cm/ib1")
        ]
    );
}

#[test]
fn an_abstract_control_socket_leaves_no_file_and_refuses_a_second_daemon() {
    let path = PathBuf::from(format!("@ipoib-cm-test/{}/ib0", std::process::id()));
    let server = ControlServer::bind(&path).unwrap();
    let e = ControlServer::bind(&path).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    assert!(e.to_string().contains("another daemon"), "{e}");
    drop(server);
    assert!(!path.exists());
    ControlServer::bind(&path).unwrap();
}

/// Serves `b` until `client` finishes (at most 5 s), answering commands with `answer`.
fn serve_until<T>(
    b: &mut Bound,
    client: &std::thread::JoinHandle<T>,
    mut answer: impl FnMut(&Request) -> Reply,
) {
    let t0 = Instant::now();
    while !client.is_finished() && t0.elapsed() < Duration::from_secs(5) {
        b.server.serve(Instant::now(), &mut answer);
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn commands_are_answered_by_the_loop_and_refused_to_other_users() {
    let mut b = Bound::new("commands");
    let path = b.server.path().to_owned();
    let client = std::thread::spawn({
        let path = path.clone();
        move || command(&path, &Request::Reload, Duration::from_secs(5))
    });
    let mut asked = Vec::new();
    serve_until(&mut b, &client, |req| {
        asked.push(req.clone());
        Reply::Ok("reloaded".into())
    });
    assert_eq!(client.join().unwrap(), Ok("reloaded".into()));
    assert_eq!(asked, [Request::Reload]);

    let client = std::thread::spawn({
        let path = path.clone();
        move || {
            command(
                &path,
                &Request::Down { ifname: None },
                Duration::from_secs(5),
            )
        }
    });
    serve_until(&mut b, &client, |_| Reply::Error("not now".into()));
    let e = client.join().unwrap().unwrap_err();
    assert_eq!(e.to_string(), "the daemon for ib9 answered: not now");
    assert_eq!(e.exit_code(), 2);

    b.server.set_policy(|_, _| false);
    let client = std::thread::spawn(move || {
        command(
            &path,
            &Request::Down { ifname: None },
            Duration::from_secs(5),
        )
    });
    serve_until(&mut b, &client, |req| {
        unreachable!("{req:?} done for a refused peer")
    });
    let e = client.join().unwrap().unwrap_err();
    assert_eq!(
        e.to_string(),
        "the daemon for ib9 answered: permission denied"
    );
}
