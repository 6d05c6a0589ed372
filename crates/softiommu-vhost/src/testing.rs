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
/// sealed against resizing (`F_SEAL_SHRINK | F_SEAL_GROW`, as QEMU's
/// `memory-backend-memfd` does by default), mapped shared and read-write.
/// The fd is what a fake front-end sends in its memory table; the pointer
/// stays valid for the life of the process (the mapping is never
/// unmapped: tests only).
pub fn shared_memory(name: &std::ffi::CStr, bytes: usize) -> std::io::Result<(OwnedFd, *mut u8)> {
    memfd(name, bytes, bytes, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
}

/// A memfd of `file_bytes` with `seals` added (0: none), of which the
/// first `map_bytes` are mapped shared (a mapping may run past the file,
/// as a hostile front-end's table may), and the host pointer.
pub fn memfd(
    name: &std::ffi::CStr,
    file_bytes: usize,
    map_bytes: usize,
    seals: libc::c_int,
) -> std::io::Result<(OwnedFd, *mut u8)> {
    let bytes = map_bytes;
    let file_len = libc::off_t::try_from(file_bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: memfd_create takes a NUL-terminated name; the fd it returns
    // is owned here at once.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a valid descriptor just returned and not owned elsewhere.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate and mmap on our own fd; results checked.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), file_len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if seals != 0 && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
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

/// One split-ring descriptor (virtio 1.2 §2.7.5) as a driver writes it.
pub fn desc(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..14].copy_from_slice(&flags.to_le_bytes());
    b[14..16].copy_from_slice(&next.to_le_bytes());
    b
}

/// A device IOTLB (under `ACCESS_PLATFORM`, 64 entries, misses bounded by
/// `miss_timeout`) whose memory table is `bytes` of fresh shared memory at
/// front-end address `ua`, and the host pointer of that memory.
#[cfg(test)]
pub(crate) fn shared_space(
    name: &std::ffi::CStr,
    bytes: usize,
    ua: u64,
    miss_timeout: std::time::Duration,
) -> (crate::space::DmaSpace, *mut u8) {
    let (fd, p) = shared_memory(name, bytes).expect("shared memory");
    let mut t = vec![0u8; 8 + 32];
    t[0..4].copy_from_slice(&1u32.to_le_bytes());
    t[16..24].copy_from_slice(&(bytes as u64).to_le_bytes());
    t[24..32].copy_from_slice(&ua.to_le_bytes());
    let space = crate::space::DmaSpace::new(64, miss_timeout);
    space.set_memory(crate::memtable::MemTable::map(&t, &[fd]).expect("memory table"));
    space.set_iommu(true);
    (space, p)
}
