//! Helpers for fake front-ends in tests: send a message with descriptors
//! and read a reply, as a front-end does. Not used by the back-end itself.

use std::io::Read;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;

use crate::proto::{FLAG_NEED_REPLY, HEADER_LEN, VERSION};
use crate::wire;

/// Sends one front-end message (version 1, with `NEED_REPLY` if `need_reply`)
/// with `fds` attached.
pub fn send(
    sock: &UnixStream,
    request: u32,
    payload: &[u8],
    fds: &[RawFd],
    need_reply: bool,
) -> std::io::Result<()> {
    let flags = VERSION | if need_reply { FLAG_NEED_REPLY } else { 0 };
    wire::send_with_fds(sock, &wire::encode(request, flags, payload), fds)
}

/// Sends raw bytes (a hand-made header, say).
pub fn send_raw(sock: &UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    wire::send_with_fds(sock, bytes, &[])
}

/// Reads one message: `(request, flags, payload)`.
pub fn recv(sock: &UnixStream) -> std::io::Result<(u32, u32, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    (&*sock).read_exact(&mut h)?;
    let le = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let mut p = vec![0u8; le(8) as usize];
    (&*sock).read_exact(&mut p)?;
    Ok((le(0), le(4), p))
}
