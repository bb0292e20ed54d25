//! `ipoib-cm sa path|join|leave`: the SA client ([`crate::sa`]) over a umad port, one request
//! at a time, printing what the SA answered: the sans-IO client on its own, so it can be
//! checked against a real SA (opensm, also on ibsim through `umad2sim`).
//!
//! `sa node` (in `sa_node`) runs the daemon's SA driver for an endpoint instead.
//!
//! `join --hold` stays a member until SIGINT/SIGTERM (then leaves, unless `--shared`) and
//! treats SIGUSR1 as the port's `CLIENT_REREGISTER` event (ibsim has no channel for port
//! events; on hardware they come from the verbs async events).

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sa::{GroupOptions, PathLookup, PortEvent, SaClient, SaConfig, SaEvent, SmAddress};
use crate::sys::umad::{Umad, UmadPort, UmadRecv};
use crate::wire::sa::{SA_CLASS_VERSION, SA_MGMT_CLASS};
use crate::wire::{Gid, GSI_QKEY};

pub use super::sa_args::{SaPortArgs, SaToolError};

/// `ipoib-cm sa …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SaCommand {
    /// Ask the SA for the path to a GID (default: the port's own).
    Path {
        #[command(flatten)]
        port: SaPortArgs,
        /// The destination GID.
        #[arg(long, value_name = "GID")]
        dgid: Option<Ipv6Addr>,
    },
    /// Join a multicast group (default: the partition's IPv4 broadcast group, no create).
    Join {
        #[command(flatten)]
        port: SaPortArgs,
        /// The group's MGID.
        #[arg(long, value_name = "MGID")]
        mgid: Option<Ipv6Addr>,
        /// Join with the create fields taken from the broadcast group (joined first).
        #[arg(long)]
        create: bool,
        /// Kernel ipoib holds the membership too: never DELETE it.
        #[arg(long)]
        shared: bool,
        /// Stay a member until SIGINT/SIGTERM; SIGUSR1 acts as CLIENT_REREGISTER.
        #[arg(long)]
        hold: bool,
    },
    /// Run the daemon's SA driver (`driver::SaDriver`) for an endpoint on an in-memory
    /// software device until SIGINT/SIGTERM, printing what the endpoint is told: its groups
    /// joined and attached, the broadcast group's Q_Key and MTU applied, paths; SIGUSR1 raises
    /// the port's CLIENT_REREGISTER async event on that device (ibsim delivers none).
    Node {
        #[command(flatten)]
        port: SaPortArgs,
        /// An interface address (ADDR/PREFIX; repeatable; default 198.19.0.2/24 and
        /// 2001:db8:19::2/64): the groups follow from it.
        #[arg(long, value_name = "CIDR")]
        addr: Vec<String>,
        /// Once the broadcast group is joined, ask for the path to this GID (repeatable).
        #[arg(long, value_name = "GID")]
        dgid: Vec<Ipv6Addr>,
        /// Once the broadcast group is joined, send a UDP packet to this IPv6 multicast group
        /// (repeatable): its send-only join goes first, the packet waits for nothing.
        #[arg(long, value_name = "GROUP")]
        send: Vec<Ipv6Addr>,
        /// Once the broadcast group is joined, send a UDP packet to a static neighbour at this
        /// GID (repeatable; connected mode, so it opens a connection): it waits for the GID's
        /// PathRecord, and the connection's REQ (printed, never sent) carries its LIDs.
        #[arg(long, value_name = "GID")]
        connect: Vec<Ipv6Addr>,
    },
    /// Read the port from its own SMA (NodeInfo, PortInfo, P_Key table), as a simulated
    /// port learns what firmware would tell a driver; `--watch` prints each port event.
    Port(super::sa_port::PortArgs),
    /// Leave a multicast group (DELETE the port's full membership).
    Leave {
        #[command(flatten)]
        port: SaPortArgs,
        /// The group's MGID.
        #[arg(long, value_name = "MGID")]
        mgid: Option<Ipv6Addr>,
    },
}

/// Runs one `sa` command; the error is the line to print.
///
/// # Errors
///
/// [`SaToolError`] as it says.
pub fn run(cmd: &SaCommand) -> Result<(), SaToolError> {
    let args = match cmd {
        SaCommand::Port(args) => return super::sa_port::run(args),
        SaCommand::Path { port, .. }
        | SaCommand::Join { port, .. }
        | SaCommand::Leave { port, .. } => port,
        SaCommand::Node {
            port,
            addr,
            dgid,
            send,
            connect,
        } => {
            let targets = super::sa_node::Targets {
                dgids: dgid,
                sends: send,
                connects: connect,
            };
            return super::sa_node::run(port.ca.as_deref(), port.port, port.pkey, addr, &targets);
        }
    };
    let port = UmadPort::find(args.ca.as_deref(), args.port).map_err(SaToolError::NoPort)?;
    if !port.active || port.sm_lid == 0 {
        return Err(SaToolError::NotActive {
            ca: port.ca,
            port: port.port,
            lid: port.lid,
            sm_lid: port.sm_lid,
        });
    }
    let umad = Umad::open(port.umad, SA_MGMT_CLASS, SA_CLASS_VERSION).map_err(|source| {
        SaToolError::Agent {
            umad: port.umad,
            step: "registering the SA agent",
            source,
        }
    })?;
    println!(
        "port {} {} lid {:#x} sm_lid {:#x} gid {}",
        port.ca,
        port.port,
        port.lid,
        port.sm_lid,
        Gid(port.gid)
    );
    let gid = Gid(port.gid);
    let sm = SmAddress {
        lid: port.sm_lid,
        sl: port.sm_sl,
    };
    let mut s = Session {
        client: SaClient::new(SaConfig::new(gid, args.pkey), sm),
        umad,
        dump: args.dump,
        deadline: Instant::now() + args.timeout,
    };
    match cmd {
        SaCommand::Path { dgid, .. } => {
            let dgid = dgid.map_or(gid, |a| Gid(a.octets()));
            s.path(dgid)
        }
        SaCommand::Join {
            mgid,
            create,
            shared,
            hold,
            ..
        } => {
            let mgid = mgid.map_or(s.client.broadcast_mgid(), |a| Gid(a.octets()));
            let opts = GroupOptions {
                create: *create,
                shared: *shared,
                send_only: false,
            };
            s.join(mgid, opts, *hold)
        }
        SaCommand::Leave { mgid, .. } => {
            let mgid = mgid.map_or(s.client.broadcast_mgid(), |a| Gid(a.octets()));
            s.leave(mgid)
        }
        // Returned from above: they run without the session.
        SaCommand::Node { .. } | SaCommand::Port(_) => Ok(()),
    }
}

struct Session {
    client: SaClient,
    umad: Umad,
    dump: bool,
    deadline: Instant,
}

impl Session {
    /// One turn: send what the client has, wait up to 100 ms for a MAD, hand it over, run
    /// the timers. Returns the events, or an error past the deadline.
    fn turn(&mut self) -> Result<Vec<SaEvent>, SaToolError> {
        while let Some(o) = self.client.pop_transmit() {
            self.umad
                .send_request(&o.mad, o.to.lid, o.to.sl, GSI_QKEY)
                .map_err(SaToolError::io("umad send"))?;
        }
        let now = Instant::now();
        if now >= self.deadline {
            return Err(SaToolError::TimedOut);
        }
        let wait = self
            .client
            .next_deadline()
            .map_or(Duration::from_millis(100), |d| {
                d.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        if self
            .umad
            .wait_readable(wait)
            .map_err(SaToolError::io("umad poll"))?
        {
            // Bounded: the agent sees only responses to our (capped) outstanding requests.
            let mut m = [0u8; crate::wire::cm::MAD_LEN];
            for _ in 0..64 {
                match self
                    .umad
                    .recv(&mut m)
                    .map_err(SaToolError::io("umad recv"))?
                {
                    Some(UmadRecv::Mad(_)) => {
                        if self.dump {
                            println!("mad {}", hex(&m));
                        }
                        self.client.handle_mad(Instant::now(), &m);
                    }
                    Some(UmadRecv::SendFailed(status)) => {
                        tracing::debug!(status, "umad: send reported failed");
                    }
                    None => break,
                }
            }
        }
        self.client.poll_timeout(Instant::now());
        Ok(std::iter::from_fn(|| self.client.pop_event()).collect())
    }

    fn path(&mut self, dgid: Gid) -> Result<(), SaToolError> {
        match self.client.path(Instant::now(), dgid) {
            PathLookup::Pending => {}
            other => return Err(SaToolError::PathNotStarted(other)),
        }
        loop {
            for ev in self.turn()? {
                match ev {
                    SaEvent::PathResolved { path: p, .. } => {
                        println!(
                            "path dgid {} sgid {} dlid {:#x} slid {:#x} sl {} mtu {} rate {} pkey {:#06x} hop_limit {} packet_life {}",
                            p.dgid, p.sgid, p.dlid, p.slid, p.sl,
                            p.mtu().map_or(0, |m| m.bytes()), p.rate.value, p.pkey,
                            p.hop_limit, p.packet_life_time.value
                        );
                        return Ok(());
                    }
                    SaEvent::PathFailed { status, .. } => {
                        return Err(SaToolError::NoPath(status));
                    }
                    _ => {}
                }
            }
        }
    }

    fn join(&mut self, mgid: Gid, opts: GroupOptions, hold: bool) -> Result<(), SaToolError> {
        let bcast = self.client.broadcast_mgid();
        if opts.create && mgid != bcast {
            self.client.join(
                Instant::now(),
                bcast,
                GroupOptions {
                    shared: true,
                    ..opts
                },
            );
        }
        self.client.join(Instant::now(), mgid, opts);
        let stop = Arc::new(AtomicBool::new(false));
        let rereg = Arc::new(AtomicBool::new(false));
        if hold {
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, Arc::clone(&stop))
                    .map_err(SaToolError::io("signal handler"))?;
            }
            signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(&rereg))
                .map_err(SaToolError::io("signal handler"))?;
            self.deadline = Instant::now() + Duration::from_secs(24 * 3600);
        }
        let mut leaving = false;
        loop {
            for ev in self.turn()? {
                match ev {
                    SaEvent::Joined { mgid: m, params: p } if m == mgid => {
                        println!(
                            "joined mgid {m} mlid {:#x} qkey {:#x} mtu {} sl {} rate {} tclass {} flow_label {:#x} hop_limit {}",
                            p.mlid, p.qkey, p.mtu.map_or(0, |m| m.bytes()), p.sl, p.rate,
                            p.tclass, p.flow_label, p.hop_limit
                        );
                        if !hold {
                            return Ok(());
                        }
                    }
                    SaEvent::JoinFailed { mgid: m, status } => {
                        println!("join failed mgid {m} status {status:?}");
                        if !hold {
                            return Err(SaToolError::JoinFailed);
                        }
                    }
                    SaEvent::Left { mgid: m, deleted } if m == mgid => {
                        println!("left mgid {m} deleted {deleted}");
                        return Ok(());
                    }
                    _ => {}
                }
            }
            if rereg.swap(false, Ordering::Relaxed) {
                println!("port event CLIENT_REREGISTER");
                self.client
                    .port_event(Instant::now(), PortEvent::ClientReregister);
            }
            if stop.load(Ordering::Relaxed) && !leaving {
                // A leave always ends in `Left` (after the DELETE, or at once if shared).
                leaving = true;
                self.deadline = Instant::now() + Duration::from_secs(10);
                self.client.leave(Instant::now(), mgid);
            }
        }
    }

    fn leave(&mut self, mgid: Gid) -> Result<(), SaToolError> {
        self.client
            .delete_membership(Instant::now(), mgid, GroupOptions::default());
        loop {
            for ev in self.turn()? {
                if let SaEvent::Left { mgid: m, deleted } = ev {
                    println!("left mgid {m} deleted {deleted}");
                    return Ok(());
                }
            }
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
