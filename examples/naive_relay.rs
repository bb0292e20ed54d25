//! A naive TUN <-> UDP relay: one packet per syscall, no protocol, no reliability. It exists
//! for `scripts/bench.sh`, as the floor of what any userspace tunnel that sleeps between
//! packets costs on the machine (its ping RTT is mostly the four process wakeups every
//! userspace tunnel pays), next to which the ipoib-cm figures can be read.
//!
//! ```text
//! naive_relay IFNAME LOCAL_IP:PORT PEER_IP:PORT
//! ```
//!
//! Creates the TUN interface (addresses, MTU and link state are left to the caller), then
//! relays until killed. Needs `CAP_NET_ADMIN`.

#![forbid(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use mio::net::UdpSocket;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

const TUN: Token = Token(0);
const UDP: Token = Token(1);
/// Packets moved per direction before polling again.
const BATCH: usize = 64;

fn main() {
    if let Err(e) = run() {
        eprintln!("naive_relay: {e}");
        std::process::exit(1);
    }
}

fn run() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [ifname, local, peer] = args.as_slice() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "usage: naive_relay IFNAME LOCAL_IP:PORT PEER_IP:PORT",
        ));
    };
    let addr = |s: &str| {
        s.parse::<SocketAddr>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{s}: {e}")))
    };
    let (local, peer) = (addr(local)?, addr(peer)?);
    let tun = tun_tap::Iface::without_packet_info(ifname, tun_tap::Mode::Tun)?;
    tun.set_non_blocking()?;
    let mut udp = UdpSocket::bind(local)?;
    udp.connect(peer)?;
    let mut poll = Poll::new()?;
    let fd = tun.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), TUN, Interest::READABLE)?;
    poll.registry()
        .register(&mut udp, UDP, Interest::READABLE)?;
    let mut events = Events::with_capacity(8);
    let mut buf = vec![0u8; 65_536];
    let mut more = false;
    loop {
        // Something may be left from the last round: look again without sleeping.
        let timeout = more.then_some(std::time::Duration::ZERO);
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Edge-triggered: drain both until neither has anything (bounded per round; `more`
        // says the bound was hit).
        more = true;
        for _ in 0..16 {
            let mut moved = false;
            for _ in 0..BATCH {
                match tun.recv(&mut buf) {
                    Ok(n) => {
                        moved = true;
                        // A full socket buffer drops the packet, as a link would.
                        let _ = udp.send(buf.get(..n).unwrap_or_default());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            for _ in 0..BATCH {
                match udp.recv(&mut buf) {
                    Ok(n) => {
                        moved = true;
                        let _ = tun.send(buf.get(..n).unwrap_or_default());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // ICMP errors from the peer (port unreachable while it starts) surface
                    // here on a connected socket: not fatal.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break,
                    Err(e) => return Err(e),
                }
            }
            if !moved {
                more = false;
                break;
            }
        }
    }
}
