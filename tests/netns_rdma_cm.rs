//! `ipoib-cm rc-pingpong --cm --rdma-cm` between two network namespaces: rdma_cm's framing.
//!
//! - Both sides framed: the client's REQ carries a `cma_hdr`, the server takes it and the
//!   messages cross (also with 10% of every packet lost, REQ/REP retransmissions included).
//! - A client without the framing gets the REJ the kernel's rdma_cm would send
//!   (ConsumerDefined), and the server says why and goes on listening.
//!
//! Each test builds its own namespaces (prefix `ipcmrd`, 198.18.0.0/24) and removes them;
//! without root they print `skipped: ...` and pass.

mod common;

use std::time::Duration;

use common::netns::{output_within, server_and_client, wait_within, Lab, Lines};

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

fn framed_run(lab: &Lab, extra: &[&str]) -> (String, String) {
    let bind = lab.addr(1).to_string();
    let mut client = vec![BIN, "rc-pingpong", "--cm", "--rdma-cm", "--deadline", "60"];
    client.extend_from_slice(extra);
    let mut server = client.clone();
    server.extend_from_slice(&["--bind", &bind]);
    server_and_client(lab, &server, &client, Duration::from_secs(90))
}

#[test]
fn framed_req_is_taken_and_messages_cross() {
    let lab = crate::lab_or_skip!("ipcmrdok", 2, 1500);
    let (server, client) = framed_run(&lab, &["-n", "20", "-s", "64", "-c"]);
    for out in [&server, &client] {
        assert!(out.contains("20 iters in"), "{out}");
    }
}

#[test]
fn framed_req_survives_ten_percent_loss() {
    let lab = crate::lab_or_skip!("ipcmrdls", 2, 1500);
    let (server, client) = framed_run(
        &lab,
        &[
            "-n",
            "20",
            "-s",
            "64",
            "-c",
            "--fault-loss",
            "10",
            "--fault-seed",
            "7",
        ],
    );
    for out in [&server, &client] {
        assert!(out.contains("20 iters in"), "{out}");
    }
}

#[test]
fn unframed_req_draws_the_kernels_rej() {
    let lab = crate::lab_or_skip!("ipcmrdrj", 2, 1500);
    let bind = lab.addr(1).to_string();
    let peer = lab.addr(1).to_string();
    let mut server = lab.spawn(
        1,
        &[
            BIN,
            "rc-pingpong",
            "--cm",
            "--rdma-cm",
            "--bind",
            &bind,
            "-n",
            "5",
            "--deadline",
            "20",
        ],
    );
    let mut srv_err = Lines::new(server.stderr.take().expect("stderr"));
    let _srv_out = Lines::new(server.stdout.take().expect("stdout"));
    let mut client = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        let out = output_within(
            lab.exec(2, &[BIN, "rc-pingpong", "--cm", "--deadline", "10", &peer]),
            Duration::from_secs(30),
        );
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if err.contains("no answer") {
            continue;
        }
        client = Some((out.status, err));
        break;
    }
    let (status, err) = client.expect("client never reached the server");
    assert_eq!(status.code(), Some(1), "client: {err}");
    assert!(
        err.contains("connection rejected: ConsumerDefined"),
        "client: {err}"
    );
    assert!(
        srv_err.wait_for("refused", Duration::from_secs(5)),
        "server: {:?}",
        srv_err.seen()
    );
    // The server is still listening: a framed client now gets through.
    let out = output_within(
        lab.exec(
            2,
            &[
                BIN,
                "rc-pingpong",
                "--cm",
                "--rdma-cm",
                "-n",
                "5",
                "--deadline",
                "15",
                &peer,
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "framed client after a refusal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = wait_within(&mut server, Duration::from_secs(30));
    let err = srv_err.finish(Duration::from_secs(2)).join("\n");
    assert!(status.success(), "server: {err}");
}
