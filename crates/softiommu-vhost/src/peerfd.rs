//! File descriptors a front-end hands over (kick and call eventfds, the
//! back-end channel): their kind is checked on receipt, and no call on
//! them may block. The front-end shares each descriptor's open-file
//! description and can clear `O_NONBLOCK` on it at any time, so the flag
//! is set again before every read or write, sends use `MSG_DONTWAIT`
//! (a per-call flag), and every wait is a `poll` with a deadline. The one
//! window left — the front-end clearing the flag between our `fcntl` and
//! our call while the call would block — is closed by
//! [`join_bounded`]: a worker that does not end within its bound is
//! interrupted by a signal whose handler does not restart system calls.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Once;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Whether `fd` is an eventfd (vhost-user's kick and call descriptors are).
pub(crate) fn check_eventfd(fd: &OwnedFd) -> Result<(), String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("cannot tell the descriptor's kind: {e}"))?;
    match link.to_str() {
        Some("anon_inode:[eventfd]") => Ok(()),
        _ => Err(format!("{} is not an eventfd", link.display())),
    }
}

/// Whether `fd` is an eventfd a kick may be: not in semaphore mode. A
/// semaphore-mode eventfd reads as 1 and counts down by one per read, so
/// one write of a huge count would wake the queue's worker 2^64 times, a
/// busy loop the front-end set off with one message. The mode is fixed
/// when the eventfd is made (`EFD_SEMAPHORE`); the kernel names it in
/// `/proc/self/fdinfo` (Linux 6.4 on; an older kernel does not say, and
/// the descriptor is taken as it is).
pub(crate) fn check_kick_eventfd(fd: &OwnedFd) -> Result<(), String> {
    check_eventfd(fd)?;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .unwrap_or_default();
    let semaphore = info
        .lines()
        .filter_map(|l| l.strip_prefix("eventfd-semaphore:"))
        .any(|v| v.trim() == "1");
    if semaphore {
        return Err(
            "a semaphore-mode eventfd (each read takes one of a count the \
                    front-end sets): not a kick"
                .into(),
        );
    }
    Ok(())
}

/// Whether `fd` is a connected-stream `AF_UNIX` socket (the back-end
/// channel is one end of a `socketpair`).
pub(crate) fn check_unix_stream(fd: &OwnedFd) -> Result<(), String> {
    let opt = |name: libc::c_int| -> Result<libc::c_int, String> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one int option into `v`, `len` its size.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(format!("not a socket: {}", io::Error::last_os_error()));
        }
        Ok(v)
    };
    let (domain, kind) = (opt(libc::SO_DOMAIN)?, opt(libc::SO_TYPE)?);
    if domain != libc::AF_UNIX || kind != libc::SOCK_STREAM {
        return Err(format!(
            "a socket of domain {domain} and type {kind}, not an AF_UNIX stream"
        ));
    }
    Ok(())
}

/// Sets `O_NONBLOCK` on `fd`'s file description (again: the peer may
/// have cleared it).
fn set_nonblocking(fd: RawFd) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we hold; results checked.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 && fl & libc::O_NONBLOCK == 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

/// Adds 1 to an eventfd's counter without waiting. `Ok(false)`: the
/// counter is at its maximum (the driver is signalled already) or the call
/// was interrupted; nothing written.
pub(crate) fn signal_eventfd(fd: RawFd) -> io::Result<bool> {
    set_nonblocking(fd);
    let v = 1u64;
    // SAFETY: writes 8 bytes from `v`.
    let n = unsafe { libc::write(fd, (&v as *const u64).cast(), 8) };
    if n == 8 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(false),
        _ => Err(e),
    }
}

/// How a wait for a kick ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kick {
    /// The eventfd was signalled (its counter read and cleared).
    Kicked,
    /// Nothing within the bound (or another reader took the count first).
    Quiet,
    /// The descriptor reports hang-up, an error or is invalid: it will
    /// never signal again (`revents`).
    Dead(i16),
}

/// Waits up to `max` (at most 1 s) for `fd` to become readable and reads
/// its counter without blocking.
pub(crate) fn wait_eventfd(fd: RawFd, max: Duration) -> Kick {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // In nanoseconds (a paced transmit waits microseconds for its line;
    // the caller's timer slack decides how late it wakes), at most a
    // second.
    let max = max.min(Duration::from_secs(1));
    let ts = libc::timespec {
        tv_sec: max.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(max.subsec_nanos() as i32),
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let n = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    if n <= 0 {
        return Kick::Quiet;
    }
    if p.revents & libc::POLLIN == 0 {
        if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return Kick::Dead(p.revents);
        }
        return Kick::Quiet;
    }
    set_nonblocking(fd);
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into `v`.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if n == 8 {
        Kick::Kicked
    } else {
        Kick::Quiet
    }
}

/// A send that did not finish: `sent` bytes of the buffer went out.
#[derive(Debug)]
pub(crate) struct SendFailed {
    pub(crate) sent: usize,
    pub(crate) error: io::Error,
}

/// Sends all of `buf` on the stream socket `fd` by `deadline`, never
/// blocking in a call: `MSG_DONTWAIT` sends, `poll` for room between them.
pub(crate) fn send_all(fd: RawFd, buf: &[u8], deadline: Instant) -> Result<(), SendFailed> {
    let mut sent = 0usize;
    while sent < buf.len() {
        let rest = &buf[sent..];
        // SAFETY: sends from a live buffer of `rest.len()` bytes.
        let n = unsafe {
            libc::send(
                fd,
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            sent += n as usize;
            continue;
        }
        let error = if n == 0 {
            io::Error::from(io::ErrorKind::WriteZero)
        } else {
            io::Error::last_os_error()
        };
        match error.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {}
            _ => return Err(SendFailed { sent, error }),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(SendFailed {
                sent,
                error: io::Error::from(io::ErrorKind::TimedOut),
            });
        }
        let ms = (deadline - now).as_millis().clamp(1, 1000) as i32;
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) };
    }
    Ok(())
}

/// The signal that interrupts a worker stuck in a system call: its
/// handler does nothing and is installed without `SA_RESTART`, so the call
/// returns `EINTR`. `SIGURG` is ignored by default and sent by the kernel
/// only for out-of-band socket data to a process that asked for it
/// (`F_SETOWN`). Installed once, and only where the process left it at its
/// default: a handler someone else installed is kept (then the interrupt
/// works only if that handler does not restart calls).
const INTERRUPT: libc::c_int = libc::SIGURG;

extern "C" fn on_interrupt(_: libc::c_int) {}

fn install_interrupt() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: queries then sets one signal's disposition with a
        // handler that does nothing (async-signal-safe).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(INTERRUPT, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                return;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(INTERRUPT, &sa, std::ptr::null_mut());
        }
    });
}

/// Joins a worker told to stop, waiting at most `bound`, then
/// interrupting its system call every 10 ms for another `bound`. Returns
/// its result, or the handle back if it still has not ended (a call the
/// interrupt cannot end).
pub(crate) fn join_bounded<T>(h: JoinHandle<T>, bound: Duration) -> Result<T, JoinHandle<T>> {
    use std::os::unix::thread::JoinHandleExt;
    let t0 = Instant::now();
    while !h.is_finished() && t0.elapsed() < bound {
        std::thread::sleep(Duration::from_millis(1));
    }
    if !h.is_finished() {
        install_interrupt();
        let t1 = Instant::now();
        while !h.is_finished() && t1.elapsed() < bound {
            // SAFETY: the thread is not joined or detached (we hold its
            // handle), so its pthread_t is valid.
            unsafe { libc::pthread_kill(h.as_pthread_t(), INTERRUPT) };
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if h.is_finished() {
        // Ended: join returns at once (a panic is the worker's, reported as one).
        Ok(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    } else {
        Err(h)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe fills two descriptors we own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn eventfd(flags: libc::c_int) -> OwnedFd {
        // SAFETY: plain syscall, checked.
        let fd = unsafe { libc::eventfd(0, flags) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    #[test]
    fn descriptor_kinds_are_told_apart() {
        let (r, _w) = pipe();
        let e = eventfd(0);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = OwnedFd::from(a);
        assert_eq!(check_eventfd(&e), Ok(()));
        assert_eq!(check_kick_eventfd(&e), Ok(()));
        // A semaphore-mode eventfd is an eventfd, but no kick.
        let sem = eventfd(libc::EFD_SEMAPHORE);
        assert_eq!(check_eventfd(&sem), Ok(()));
        let semaphore_named =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", sem.as_raw_fd()))
                .unwrap()
                .contains("eventfd-semaphore:");
        if semaphore_named {
            assert!(check_kick_eventfd(&sem)
                .unwrap_err()
                .starts_with("a semaphore-mode eventfd"));
        }
        assert!(check_kick_eventfd(&r)
            .unwrap_err()
            .contains("not an eventfd"));
        assert!(check_eventfd(&r).unwrap_err().contains("not an eventfd"));
        assert!(check_eventfd(&a).unwrap_err().contains("not an eventfd"));
        assert_eq!(check_unix_stream(&a), Ok(()));
        assert!(check_unix_stream(&r)
            .unwrap_err()
            .starts_with("not a socket"));
        assert!(check_unix_stream(&e)
            .unwrap_err()
            .starts_with("not a socket"));
    }

    #[test]
    fn a_full_blocking_eventfd_is_not_waited_on() {
        let e = eventfd(0);
        let max = 0xffff_ffff_ffff_fffeu64;
        // SAFETY: 8 bytes to an eventfd.
        assert_eq!(
            unsafe { libc::write(e.as_raw_fd(), (&max as *const u64).cast(), 8) },
            8
        );
        // Blocking as the peer made it: our write must not wait.
        let t = Instant::now();
        assert!(!signal_eventfd(e.as_raw_fd()).unwrap());
        assert!(t.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn a_hung_up_kick_is_dead_and_a_drained_one_is_quiet() {
        let (r, w) = pipe();
        drop(w);
        assert!(matches!(
            wait_eventfd(r.as_raw_fd(), Duration::from_millis(10)),
            Kick::Dead(ev) if ev & libc::POLLHUP != 0
        ));
        let e = eventfd(0);
        assert_eq!(
            wait_eventfd(e.as_raw_fd(), Duration::from_millis(5)),
            Kick::Quiet
        );
        assert!(signal_eventfd(e.as_raw_fd()).unwrap());
        assert_eq!(
            wait_eventfd(e.as_raw_fd(), Duration::from_millis(5)),
            Kick::Kicked
        );
    }

    #[test]
    fn a_send_to_a_reader_that_never_reads_ends_at_its_deadline() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let big = vec![0u8; 8 << 20];
        let t = Instant::now();
        let e = send_all(a.as_raw_fd(), &big, t + Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.error.kind(), io::ErrorKind::TimedOut);
        assert!(e.sent > 0 && e.sent < big.len(), "{}", e.sent);
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    /// A reader that keeps taking a little (so every call makes some
    /// progress) cannot stretch the send past its one deadline.
    #[test]
    fn a_drip_reader_cannot_stretch_a_send_past_its_deadline() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut chunk = [0u8; 64];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = (&b).read(&mut chunk);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let big = vec![0u8; 8 << 20];
        let t = Instant::now();
        let e = send_all(a.as_raw_fd(), &big, t + Duration::from_millis(100)).unwrap_err();
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(a);
        reader.join().unwrap();
        assert_eq!(e.error.kind(), io::ErrorKind::TimedOut);
        assert!(took < Duration::from_secs(1), "{took:?}");
    }

    #[test]
    fn a_worker_stuck_in_a_blocking_read_is_interrupted_and_joined() {
        let (r, _w) = pipe();
        let h = std::thread::spawn(move || {
            let mut b = [0u8; 1];
            // SAFETY: a blocking read into `b`, as a peer clearing
            // O_NONBLOCK in our window would leave it.
            let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            (n, io::Error::last_os_error().raw_os_error())
        });
        let t = Instant::now();
        let (n, errno) = join_bounded(h, Duration::from_millis(50)).expect("joined");
        assert_eq!((n, errno), (-1, Some(libc::EINTR)));
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
