//! Message framing on a vhost-user socket: a 12-byte header, a payload of
//! at most [`MAX_PAYLOAD`] bytes, and file descriptors passed as
//! `SCM_RIGHTS` ancillary data with the header.

use std::io::{self, Write};
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::error::SessionError;
use crate::proto::{FLAG_REPLY, HEADER_LEN, MAX_FDS, MAX_PAYLOAD, VERSION, VERSION_MASK};

/// One received message.
#[derive(Debug)]
pub(crate) struct Msg {
    pub(crate) request: u32,
    pub(crate) flags: u32,
    pub(crate) payload: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

/// Reads one message; `Ok(None)` at end of stream before a header.
///
/// Between messages the wait is the front-end's (an idle front-end is
/// legitimate); once a message has begun, its rest must arrive within
/// `bound`, else [`SessionError::Stalled`]: a front-end that stops
/// mid-message cannot hold the session's thread.
pub(crate) fn recv(sock: &UnixStream, bound: Duration) -> Result<Option<Msg>, SessionError> {
    let mut hdr = [0u8; HEADER_LEN];
    let (got, fds) = recv_with_fds(sock, &mut hdr)?;
    if got == 0 {
        return Ok(None);
    }
    let rest = Rest::begin(sock, bound);
    if got < HEADER_LEN {
        rest.read(&mut hdr[got..], "a header")?;
    }
    let le = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    let (request, flags, size) = (le(0), le(4), le(8) as usize);
    if flags & VERSION_MASK != VERSION {
        return Err(SessionError::Framing(format!(
            "request {request}: header version {} (expected {VERSION})",
            flags & VERSION_MASK
        )));
    }
    if size > MAX_PAYLOAD {
        return Err(SessionError::Framing(format!(
            "request {request}: payload of {size} bytes (at most {MAX_PAYLOAD})"
        )));
    }
    let mut payload = vec![0u8; size];
    rest.read(&mut payload, "a payload")?;
    Ok(Some(Msg {
        request,
        flags,
        payload,
        fds,
    }))
}

/// The rest of a message begun on `sock`, read against one deadline.
/// What has already arrived (a front-end writes a message whole, as QEMU
/// does) is taken at once, whatever the time: the deadline bounds only
/// waiting for bytes not there, with `poll(2)`, so a back-end that was
/// itself held up (stopped, starved) never blames the front-end, and the
/// socket keeps no timeout of its own between messages.
///
/// The clock is read only when a wait begins (a message already whole, as
/// every IOTLB message QEMU sends, reads none), so the bound runs from the
/// first byte found missing.
struct Rest<'a> {
    sock: &'a UnixStream,
    bound: Duration,
    deadline: std::cell::Cell<Option<Instant>>,
}

impl<'a> Rest<'a> {
    fn begin(sock: &'a UnixStream, bound: Duration) -> Self {
        Self {
            sock,
            bound,
            deadline: std::cell::Cell::new(None),
        }
    }

    /// One `recv` of what is already there, without waiting.
    fn read_ready(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a live buffer of the stated length.
        let n = unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Waits until the socket has bytes (or an end or error to report),
    /// at most until the deadline: `false` if the deadline passed.
    fn wait_readable(&self) -> io::Result<bool> {
        let deadline = match self.deadline.get() {
            Some(d) => d,
            None => {
                let d = Instant::now() + self.bound;
                self.deadline.set(Some(d));
                d
            }
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // Rounded up, so that a wait never ends before the deadline.
            let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            let mut p = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let n = unsafe { libc::poll(&mut p, 1, ms) };
            if n > 0 {
                return Ok(true);
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }

    /// Fills `buf`, or fails: `Stalled` once the deadline passed with
    /// bytes still missing, the socket's error, or `UnexpectedEof` if the
    /// stream ends first.
    fn read(&self, mut buf: &mut [u8], what: &'static str) -> Result<(), SessionError> {
        while !buf.is_empty() {
            match self.read_ready(buf) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !self.wait_readable()? {
                        return Err(SessionError::Stalled {
                            what,
                            bound_ms: self.bound.as_millis() as u64,
                        });
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// Whether a socket error is its send timeout passing (`SO_SNDTIMEO`:
/// `EAGAIN` on Linux).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A message header: request, flags, payload size, little-endian.
fn header(request: u32, flags: u32, size: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&request.to_le_bytes());
    h[4..8].copy_from_slice(&flags.to_le_bytes());
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

/// Encodes a header and payload into one buffer.
pub(crate) fn encode(request: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header(request, flags, payload.len() as u32));
    out.extend_from_slice(payload);
    out
}

/// Sends a reply to `request` (`flags` = version | reply).
pub(crate) fn reply(sock: &UnixStream, request: u32, payload: &[u8]) -> io::Result<()> {
    (&*sock).write_all(&encode(request, VERSION | FLAG_REPLY, payload))
}

/// Sends the reply-ack `v` (0 success, 1 failure) to `request`, from a
/// buffer on the stack.
pub(crate) fn ack(sock: &UnixStream, request: u32, v: u64) -> io::Result<()> {
    let mut b = [0u8; HEADER_LEN + 8];
    b[..HEADER_LEN].copy_from_slice(&header(request, VERSION | FLAG_REPLY, 8));
    b[HEADER_LEN..].copy_from_slice(&v.to_le_bytes());
    (&*sock).write_all(&b)
}

/// `recvmsg` of up to `buf.len()` bytes with room for [`MAX_FDS`]
/// descriptors; every descriptor received is owned by the result (closed
/// on drop), including when the control data was truncated.
fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>), SessionError> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<libc::c_int>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = space as _;
    let n = loop {
        // SAFETY: mh describes live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut mh, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e.into());
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const libc::c_int;
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(SessionError::Framing(format!(
            "more than {MAX_FDS} file descriptors with one message"
        )));
    }
    Ok((n, fds))
}

/// Sends `bytes` with `fds` attached (used by tests' fake front-ends
/// through [`crate::testing`]).
pub(crate) fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[i32]) -> io::Result<()> {
    if fds.is_empty() {
        return (&*sock).write_all(bytes);
    }
    let payload = std::mem::size_of_val(fds);
    // SAFETY: pure size computations.
    let space = unsafe { libc::CMSG_SPACE(payload as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut _,
        iov_len: bytes.len(),
    };
    // SAFETY: as in recv_with_fds; the control buffer holds one SCM_RIGHTS cmsg.
    let n = unsafe {
        let mut mh: libc::msghdr = std::mem::zeroed();
        mh.msg_iov = &mut iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&mh);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(payload as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut i32, fds.len());
        libc::sendmsg(sock.as_raw_fd(), &mh, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n < bytes.len() {
        (&*sock).write_all(&bytes[n..])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes already in the socket are taken even past the deadline (a
    /// back-end held up between a header and its payload does not blame
    /// the front-end); only bytes still missing at the deadline stall.
    #[test]
    fn the_deadline_bounds_waiting_only_not_bytes_already_there() {
        let (fe, be) = UnixStream::pair().unwrap();
        (&fe).write_all(&[7; 8]).unwrap();
        let rest = Rest::begin(&be, Duration::ZERO);
        let mut buf = [0u8; 8];
        assert!(matches!(rest.read(&mut buf, "a payload"), Ok(())));
        assert_eq!(buf, [7; 8]);
        // Half of the next 8 bytes: the rest stalls once the bound passed.
        (&fe).write_all(&[9; 4]).unwrap();
        let rest = Rest::begin(&be, Duration::from_millis(50));
        let t = Instant::now();
        let r = rest.read(&mut buf, "a payload");
        assert!(
            matches!(
                r,
                Err(SessionError::Stalled {
                    what: "a payload",
                    bound_ms: 50
                })
            ),
            "{r:?}"
        );
        assert!(
            t.elapsed() >= Duration::from_millis(50),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(buf[..4], [9; 4]);
        // The socket kept no timeout: a blocking read waits for the next
        // bytes as before.
        assert_eq!(be.read_timeout().unwrap(), None);
        // The stream's end before the rest: not a stall.
        drop(fe);
        let rest = Rest::begin(&be, Duration::from_secs(5));
        let r = rest.read(&mut buf, "a payload");
        assert!(
            matches!(&r, Err(SessionError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{r:?}"
        );
    }
}
