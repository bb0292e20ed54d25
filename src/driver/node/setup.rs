//! Setting a [`Node`] up: its CM transport, endpoint and TUN device (its own, or a queue of
//! a multi-worker interface), registered with the caller's loop.

use super::*;

/// The ids of the kernel's CM an endpoint may hold at once: two per connection its tables
/// hold (one may be in TimeWait beside its successor).
fn kernel_cm_ids(ep: &EndpointConfig) -> usize {
    (2 * (ep.max_conn_qp + ep.max_pending_rx + 1) + ep.neigh_max).min(crate::cm::MAX_LIVE_IDS)
}

/// The transport [`Node::new`] opens for `cfg`; an error for a transport that needs what only
/// the caller knows of its provider ([`CmTransport::Umad`]: the verbs device, port and GID
/// index), which the caller opens and hands to [`Node::with_transport`].
///
/// # Errors
/// The set-up step that failed.
fn open_transport<P: Provider>(
    prov: &mut P,
    cfg: &NodeConfig,
) -> Result<Box<dyn MadTransport<P::Verbs>>, NodeError> {
    match cfg.cm_transport {
        CmTransport::Qp1 => Ok(Box::new(
            Gsi::open_for_cm(prov.verbs()).map_err(NodeError::Provider)?,
        )),
        CmTransport::Udp => {
            let udp = MadUdp::bind(cfg.mad_udp.ip(), cfg.mad_udp.port()).map_err(|source| {
                NodeError::MadBind {
                    addr: cfg.mad_udp,
                    source,
                }
            })?;
            Ok(Box::new(udp))
        }
        CmTransport::Umad => Err(NodeError::TransportNeedsCaller(cfg.cm_transport)),
        CmTransport::RdmaCm => Ok(Box::new(NoMads)),
    }
}

impl<P: Provider> Node<P> {
    /// The CM transport [`Node::new`] would open on `prov` for `cfg`, for a caller that
    /// wraps it ([`crate::driver::workers::RoutedMads`]).
    ///
    /// # Errors
    /// The set-up step that failed.
    pub fn open_transport(
        prov: &mut P,
        cfg: &NodeConfig,
    ) -> Result<Box<dyn MadTransport<P::Verbs>>, NodeError> {
        open_transport(prov, cfg)
    }

    /// Sets the interface up: opens the CM MAD transport, builds the endpoint on `prov`,
    /// creates the TUN device with the endpoint's interface MTU and addresses and brings it
    /// up, then registers the provider's descriptors, the TUN device and the side channel (if
    /// any) with `registry` on consecutive tokens from `first_token` (up to
    /// [`Node::tokens_end`]).
    ///
    /// # Errors
    /// The step that failed.
    pub fn new(
        now: Instant,
        mut prov: P,
        cfg: NodeConfig,
        registry: &Registry,
        first_token: usize,
    ) -> Result<Self, NodeError> {
        let mad = open_transport(&mut prov, &cfg)?;
        Self::with_transport(now, prov, cfg, mad, registry, first_token)
    }

    /// [`Node::new`] with a transport the caller opened (`cfg.cm_transport` is only
    /// reported).
    ///
    /// # Errors
    /// The step that failed.
    pub fn with_transport(
        now: Instant,
        prov: P,
        cfg: NodeConfig,
        mad: Box<dyn MadTransport<P::Verbs>>,
        registry: &Registry,
        first_token: usize,
    ) -> Result<Self, NodeError> {
        Self::assemble(
            now,
            prov,
            cfg,
            mad,
            NodeRole::Whole(None),
            registry,
            first_token,
        )
    }

    /// [`Node::with_transport`] for worker 0 of a multi-worker interface (`--workers`): the
    /// interface is `tun`, its first queue (created by the caller with the others), which it
    /// sets up (MTU, addresses, up) as [`Node::new`] does a device of its own.
    ///
    /// # Errors
    /// The step that failed.
    pub fn control(
        now: Instant,
        prov: P,
        cfg: NodeConfig,
        mad: Box<dyn MadTransport<P::Verbs>>,
        tun: Tun,
        registry: &Registry,
        first_token: usize,
    ) -> Result<Self, NodeError> {
        Self::assemble(
            now,
            prov,
            cfg,
            mad,
            NodeRole::Whole(Some(tun)),
            registry,
            first_token,
        )
    }

    /// A follower node: worker `cfg.endpoint.worker` (not 0) of the interface whose hardware
    /// address is `interface`, on its own provider, with `tun` one queue of the interface
    /// (set up by control) and `mad` the transport its CM's MADs take to and from control.
    ///
    /// # Errors
    /// The step that failed.
    #[allow(clippy::too_many_arguments)]
    pub fn follower(
        now: Instant,
        prov: P,
        cfg: NodeConfig,
        mad: Box<dyn MadTransport<P::Verbs>>,
        tun: Tun,
        interface: Interface,
        registry: &Registry,
        first_token: usize,
    ) -> Result<Self, NodeError> {
        let role = NodeRole::Follower { tun, interface };
        Self::assemble(now, prov, cfg, mad, role, registry, first_token)
    }

    fn assemble(
        now: Instant,
        mut prov: P,
        mut cfg: NodeConfig,
        mad: Box<dyn MadTransport<P::Verbs>>,
        role: NodeRole,
        registry: &Registry,
        first_token: usize,
    ) -> Result<Self, NodeError> {
        let mad_fd = mad.readiness_fd();
        let kcm = if cfg.cm_transport == CmTransport::RdmaCm {
            let max_ids = kernel_cm_ids(&cfg.endpoint);
            let listen = SocketAddr::new(cfg.rdma_cm_bind, cfg.endpoint.rdma_cm_port);
            cfg.endpoint.kernel_cm.get_or_insert(KernelCmConfig {
                max_ids,
                service_id: cfg.endpoint.rdma_cm_service_id(),
                link: cfg.link_layer,
            });
            if matches!(role, NodeRole::Follower { .. }) {
                // A follower's kernel CM ids run on control's event channel.
                None
            } else {
                let k = KernelCmDriver::open(listen, max_ids).map_err(|e| NodeError::RdmaCm {
                    addr: listen,
                    message: e.to_string(),
                })?;
                Some(k)
            }
        } else {
            None
        };
        let mtu = cfg.endpoint.interface_mtu();
        let addrs = cfg.endpoint.addrs.clone();
        let (ep, tun) = match role {
            NodeRole::Follower { tun, interface } => {
                let ep = Endpoint::new_follower(now, prov.verbs(), cfg.endpoint, interface)
                    .map_err(NodeError::Provider)?;
                (ep, tun)
            }
            NodeRole::Whole(tun) => {
                let ep = Endpoint::new(now, prov.verbs(), cfg.endpoint, mad.provider_qp())
                    .map_err(NodeError::Provider)?;
                let tun = match tun {
                    Some(t) => t,
                    None => Tun::create(&cfg.ifname).map_err(NodeError::Tun)?,
                };
                set_up_interface(&tun, mtu, &addrs)?;
                (ep, tun)
            }
        };
        Self::register_parts(
            now,
            prov,
            ep,
            mad,
            tun,
            kcm,
            mad_fd,
            cfg.cm_transport,
            cfg.tun_write_rate,
            mtu,
            registry,
            first_token,
        )
    }
}

/// What a node is of its interface.
enum NodeRole {
    /// The whole interface, or worker 0 of several: it sets the interface up, on a TUN device
    /// of its own (`None`: created here) or on the queue given.
    Whole(Option<Tun>),
    /// Another worker: its queue of the interface, and control's hardware address.
    Follower { tun: Tun, interface: Interface },
}

/// Sets the interface of `tun` up: MTU, addresses, up, addresses kept while down.
fn set_up_interface(tun: &Tun, mtu: u32, addrs: &[(IpAddr, u8)]) -> Result<(), NodeError> {
    tun.set_mtu(mtu).map_err(NodeError::InterfaceMtu)?;
    for &(addr, prefix_len) in addrs {
        let r = match addr {
            IpAddr::V4(a) => tun.add_ipv4(a, prefix_len),
            IpAddr::V6(a) => tun.add_ipv6(a, prefix_len),
        };
        r.map_err(|source| NodeError::Addr {
            addr,
            prefix_len,
            source,
        })?;
    }
    tun.set_up().map_err(NodeError::InterfaceUp)?;
    // Its IPv6 addresses survive `ip link set down` (the kernel deletes them otherwise).
    if let Err(e) = tun.keep_addresses_on_down() {
        tracing::warn!(
            "interface {}: keep_addr_on_down not set ({e}): its IPv6 addresses go when it \
                 is set down, and come back when it is up again",
            tun.name()
        );
    }
    Ok(())
}

impl<P: Provider> Node<P> {
    #[allow(clippy::too_many_arguments)]
    fn register_parts(
        now: Instant,
        prov: P,
        ep: Endpoint,
        mad: Box<dyn MadTransport<P::Verbs>>,
        mut tun: Tun,
        kcm: Option<KernelCmDriver>,
        mad_fd: Option<std::os::fd::RawFd>,
        cm_transport: CmTransport,
        tun_write_rate: Option<NonZeroU32>,
        mtu: u32,
        registry: &Registry,
        first_token: usize,
    ) -> Result<Self, NodeError> {
        let sources =
            ProviderSources::register(registry, &prov, first_token).map_err(NodeError::Register)?;
        let source_count = sources.len();
        let tun_token = Token(first_token + source_count);
        registry
            .register(&mut tun, tun_token, Interest::READABLE)
            .map_err(NodeError::Register)?;
        let mut end = Token(tun_token.0 + 1);
        let mad_token = match mad_fd {
            Some(fd) => {
                let token = end;
                registry
                    .register(&mut SourceFd(&fd), token, Interest::READABLE)
                    .map_err(NodeError::Register)?;
                end = Token(token.0 + 1);
                Some(token)
            }
            None => None,
        };
        let kcm_token = match &kcm {
            Some(k) => {
                let token = end;
                registry
                    .register(&mut SourceFd(&k.fd()), token, Interest::READABLE)
                    .map_err(NodeError::Register)?;
                end = Token(token.0 + 1);
                Some(token)
            }
            None => None,
        };
        Ok(Self {
            prov,
            sources,
            ep,
            mad,
            kcm,
            kcm_route: None,
            cm_transport,
            mads: Vec::new(),
            tun,
            tokens: Tokens {
                tun: tun_token,
                mad: mad_token,
                kcm: kcm_token,
                end,
            },
            tun_ready: true,
            event_log: EventLog::default(),
            tun_more: false,
            tun_stats: TunStats::default(),
            tun_throttle: tun_write_rate.map(|r| TunThrottle::new(now, r)),
            drain_buf: vec![0; DRAIN_READ_BYTES],
            stop_deadline: None,
            interface_removed: false,
            sa: None,
            tun_mtu: mtu,
            tun_up: true,
            port_active: false,
            first_token,
            source_count,
            down: None,
            gave_up: None,
            device_stats: DeviceStats::default(),
        })
    }
}
