//! Registration of a provider's descriptors with mio.
//!
//! Providers name the descriptors they need watched ([`Provider::io_source`]); this module
//! owns their registration, so that neither the `verbs` seam nor a provider knows the event
//! loop.

use std::io;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::verbs::{IoSource, Provider};

/// A provider's descriptors as registered with a mio registry, on consecutive tokens.
#[derive(Debug)]
pub struct ProviderSources {
    first_token: usize,
    /// What each descriptor is registered for now, by index.
    registered: Vec<IoSource>,
}

impl ProviderSources {
    /// Registers every descriptor of `prov` on tokens `first_token`, `first_token + 1`, ...
    ///
    /// # Errors
    /// The registry's error.
    pub fn register<P: Provider>(
        registry: &Registry,
        prov: &P,
        first_token: usize,
    ) -> io::Result<Self> {
        let mut registered = Vec::new();
        while let Some(src) = prov.io_source(registered.len()) {
            let token = Token(first_token + registered.len());
            registry.register(&mut SourceFd(&src.fd), token, interest(src))?;
            registered.push(src);
        }
        Ok(Self {
            first_token,
            registered,
        })
    }

    /// How many tokens the provider took (from the first).
    #[must_use]
    pub fn len(&self) -> usize {
        self.registered.len()
    }

    /// True when the provider has no descriptor.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.registered.is_empty()
    }

    /// The descriptor index of `token`, when it is one of the provider's.
    #[must_use]
    pub fn index_of(&self, token: Token) -> Option<usize> {
        token
            .0
            .checked_sub(self.first_token)
            .filter(|&i| i < self.registered.len())
    }

    /// Re-registers each descriptor whose wanted interest changed since it was registered
    /// (a few comparisons when nothing did: call it once a turn, after the provider's I/O).
    ///
    /// # Errors
    /// The registry's error.
    pub fn sync<P: Provider>(&mut self, registry: &Registry, prov: &P) -> io::Result<()> {
        for (i, was) in self.registered.iter_mut().enumerate() {
            let Some(now) = prov.io_source(i) else {
                continue;
            };
            if now != *was {
                let token = Token(self.first_token + i);
                registry.reregister(&mut SourceFd(&now.fd), token, interest(now))?;
                *was = now;
            }
        }
        Ok(())
    }

    /// Takes every descriptor off `registry` (errors ignored: a descriptor of a closed device
    /// context has left the registry with it); the tokens may then be registered again.
    pub fn deregister(&mut self, registry: &Registry) {
        for src in self.registered.drain(..) {
            let _ = registry.deregister(&mut SourceFd(&src.fd));
        }
    }
}

fn interest(src: IoSource) -> Interest {
    if src.writable {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    }
}
