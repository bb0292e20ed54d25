//! OS glue: the only module with unsafe: OS calls no safe crate exposes.
//!
//! Everything here is a thin, documented wrapper around one system call. Every `unsafe` block
//! carries a `// SAFETY:` comment; the rest of the crate stays `unsafe`-free (the crate denies
//! `unsafe_code` and only this module opts back in).
//!
//! - [`sockopt`]: socket options socket2 does not expose (DF / path-MTU discovery, packet info,
//!   zero-checksum IPv6 UDP receive, forced buffer sizes).
//! - [`udp`]: `recvmsg` / `recvmmsg` with the packet-info control message decoded, so a
//!   receiver learns the destination address the datagram was sent to; `sendmmsg` to many
//!   destinations in one call.
//! - [`peercred`]: `SO_PEERCRED` of a Unix socket peer, and the process's effective uid.
//! - [`tun`]: the TUN device and the interface ioctls that configure it.
//! - [`ifaddr`]: which interface carries an address, and its MTU.
#![allow(unsafe_code)]

pub mod ifaddr;
pub mod peercred;
pub mod sockopt;
pub mod tun;
pub mod udp;
