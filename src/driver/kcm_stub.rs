//! Without the `verbs` feature there is no librdmacm: [`KernelCmDriver`] has no value, and
//! `--cm-transport rdmacm` fails at set-up (`Node::new`).

use std::net::SocketAddr;
use std::time::Instant;

use super::{KcmSink, KcmStats};
use crate::cm::KcmCommand;
use crate::ipoib::Endpoint;

/// No kernel CM in this build (no value of this type exists).
#[derive(Debug)]
pub enum KernelCmDriver {}

impl KernelCmDriver {
    /// Always fails: built without the `verbs` feature.
    ///
    /// # Errors
    /// Always.
    pub fn open(_bind: SocketAddr, _max_ids: usize) -> Result<Self, &'static str> {
        Err("no RDMA CM: built without the `verbs` feature")
    }

    /// Never called.
    pub fn fd(&self) -> i32 {
        match *self {}
    }

    /// Never called.
    pub fn stats(&self) -> KcmStats {
        match *self {}
    }

    /// Never called.
    pub fn has_pending(&self) -> bool {
        match *self {}
    }

    /// Never called.
    pub fn device_removed(&self) -> bool {
        match *self {}
    }

    /// Never called.
    pub fn receive(&mut self, _now: Instant, _ep: &mut dyn KcmSink) {
        match *self {}
    }

    /// Never called.
    pub fn execute(&mut self, _now: Instant, _ep: &mut Endpoint) {
        match *self {}
    }

    /// Never called.
    pub fn execute_one(&mut self, _now: Instant, _sink: &mut dyn KcmSink, _c: KcmCommand) {
        match *self {}
    }

    /// Never called.
    pub fn set_workers(&mut self, _workers: crate::wire::WorkerCount) {
        match *self {}
    }
}
