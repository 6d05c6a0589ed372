//! Reading a scenario file with bounds: at most [`MAX_SCENARIO_BYTES`]
//! (a file that keeps going, `/dev/zero`, is refused after one byte
//! more), and, for a pipe or FIFO, at most [`READ_DEADLINE`] of waiting
//! for its writer (a FIFO with no writer is opened without blocking and
//! reads as empty).

use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::ScenarioError;

/// The largest scenario file read: 1 MiB. The built-in ones are under
/// 2 KiB; a scenario is a header and one table.
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

/// How long a read may wait for a pipe's writer in all.
pub const READ_DEADLINE: Duration = Duration::from_secs(2);

/// The text of the scenario file at `path`, read within the bounds.
pub(super) fn read_scenario(path: &Path) -> Result<String, ScenarioError> {
    let io = |source| ScenarioError::Read {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO without a writer returns at once instead
    // of waiting for one; reads below wait with a deadline instead.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let fd = file.as_raw_fd();
    let mut bounded = file.take(MAX_SCENARIO_BYTES + 1);
    let mut bytes = Vec::new();
    let deadline = Instant::now() + READ_DEADLINE;
    let mut chunk = [0u8; 64 * 1024];
    loop {
        match bounded.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => wait_readable(fd, deadline, path)?,
            Err(e) => return Err(io(e)),
        }
    }
    if bytes.len() as u64 > MAX_SCENARIO_BYTES {
        return Err(ScenarioError::TooLarge {
            path: path.to_path_buf(),
            max: MAX_SCENARIO_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|e| ScenarioError::NotText {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Waits until `fd` has data (or its writer left), at most until
/// `deadline`.
fn wait_readable(fd: i32, deadline: Instant, path: &Path) -> Result<(), ScenarioError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ScenarioError::ReadTimeout {
            path: path.to_path_buf(),
            waited: READ_DEADLINE,
        });
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: `p` is one valid, initialised pollfd that outlives the call;
    // poll(2) writes only its `revents`.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(ScenarioError::Read {
                path: path.to_path_buf(),
                source: e,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_never_ends_is_too_large_after_the_cap() {
        let e = read_scenario(Path::new("/dev/zero")).unwrap_err();
        assert!(
            matches!(e, ScenarioError::TooLarge { max, .. } if max == MAX_SCENARIO_BYTES),
            "{e}"
        );
    }

    #[test]
    fn bytes_that_are_not_text_are_refused_with_their_offset() {
        let p = std::env::temp_dir().join(format!("softiommu-nottext-{}", std::process::id()));
        std::fs::write(&p, b"about = \"\xff\"\n").unwrap();
        let e = read_scenario(&p).unwrap_err();
        assert!(matches!(e, ScenarioError::NotText { offset: 9, .. }), "{e}");
        std::fs::remove_file(&p).unwrap();
    }
}
