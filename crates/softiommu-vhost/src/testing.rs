//! Helpers for fake front-ends in tests: send a message with descriptors
//! and read a reply, as a front-end does. Not used by the back-end itself.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
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

/// A front-end's guest memory: `bytes` of a fresh memfd named `name`,
/// mapped shared and read-write. The fd is what a fake front-end sends in
/// its memory table; the pointer stays valid for the life of the process
/// (the mapping is never unmapped: tests only).
pub fn shared_memory(name: &std::ffi::CStr, bytes: usize) -> std::io::Result<(OwnedFd, *mut u8)> {
    let len = libc::off_t::try_from(bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: memfd_create takes a NUL-terminated name; the fd it returns
    // is owned here at once.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a valid descriptor just returned and not owned elsewhere.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and mmap on our own fd; results checked.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok((fd, p.cast()))
    }
}
