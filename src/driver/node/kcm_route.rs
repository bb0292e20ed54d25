//! The other workers' kernel CM inputs, read on control's event channel.

use std::time::Instant;

use crate::ipoib::Endpoint;

/// Where the kernel's CM inputs of the other workers' ids go ([`Node::route_kcm`](super::Node::route_kcm)).
#[derive(Debug)]
pub struct KcmRoute {
    /// The interface's workers.
    pub count: crate::wire::WorkerCount,
    /// Worker `i`'s queue at `i - 1`.
    pub to: Vec<crate::driver::workers::Mailbox<crate::cm::KcmInput>>,
    /// Inputs dropped: a worker's queue was full (its connection then times out).
    pub dropped: u64,
}

/// Control's endpoint, or the worker queue an input's id names.
pub(super) struct KcmRouter<'a> {
    pub(super) ep: &'a mut Endpoint,
    pub(super) route: Option<&'a mut KcmRoute>,
}

impl crate::driver::KcmSink for KcmRouter<'_> {
    fn handle_kcm_input(&mut self, now: Instant, input: crate::cm::KcmInput) {
        let Some(route) = self.route.as_mut() else {
            self.ep.handle_kcm_input(now, input);
            return;
        };
        match usize::from(route.count.owner(input.id().0)).checked_sub(1) {
            None => self.ep.handle_kcm_input(now, input),
            Some(i) => {
                if !route.to.get(i).is_some_and(|m| m.post(input)) {
                    route.dropped += 1;
                }
            }
        }
    }
}
