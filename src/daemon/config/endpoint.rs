//! What the endpoint and the provider take from a resolved [`Config`].

use super::settings::Config;
use super::types::{path_mtu_for_link_mtu, FALLBACK_PATH_MTU};
use crate::ipoib::EndpointConfig;
use crate::verbs::PathMtu;

impl Config {
    /// The path MTU to use: the configured one, else the largest that fits the underlay
    /// `link_mtu`, else [`FALLBACK_PATH_MTU`].
    pub fn effective_path_mtu(&self, link_mtu: Option<u32>) -> PathMtu {
        self.path_mtu
            .or_else(|| link_mtu.map(path_mtu_for_link_mtu))
            .unwrap_or(FALLBACK_PATH_MTU)
    }

    /// The endpoint's settings from these: `path_mtu` as [`Config::effective_path_mtu`] gave
    /// it, `seed` for PSNs and CM ids; the rest as [`EndpointConfig::new`] sets them.
    pub fn endpoint_config(&self, path_mtu: PathMtu, seed: u64) -> EndpointConfig {
        EndpointConfig {
            mode: self.mode,
            srq: self.srq,
            rx_timeout: self.rx_timeout,
            drain_timeout: self.drain_timeout,
            tx_stall_timeout: self.tx_stall_timeout,
            neigh_timeout: self.neigh_timeout,
            neigh_max: self.neigh_max as usize,
            max_conn_qp: self.max_conn_qp as usize,
            budget_policy: self.qp_budget_policy,
            max_pending_rx: self.max_pending_rx as usize,
            tx_queue_len: self.tx_queue_len as usize,
            static_neighbours: self.neigh.clone(),
            qp_timeout: self.qp_timeout,
            path_mtu,
            pkey: self.pkey,
            rdma_cm_port: self.rdma_cm_port,
            seed,
            ..EndpointConfig::new(self.addr.iter().map(|c| (c.addr, c.prefix_len)).collect())
        }
    }
}
