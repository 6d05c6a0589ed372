//! One split virtqueue (virtio 1.2 §2.7) served through the [`DmaSpace`]:
//! the device side every vhost-user device here shares — popping heads,
//! walking chains, publishing used entries, the kick wait and the call.
//!
//! Every ring index, descriptor index and chain length the driver supplies
//! is checked: an avail index that runs more than the ring's size ahead is
//! refused ([`Pop::Overrun`]), a descriptor index past the ring, a chain
//! longer than the ring (a loop) or an indirect descriptor (not offered)
//! makes the chain [`Chain::Bad`].

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softiommu_virtio::spec::{desc, ring};

use crate::error::AccessError;
use crate::space::{AddrKind, DmaSpace};

/// Walked chains' vectors kept for reuse.
const SPARE_CHAINS: usize = 2;

/// Where a ring is (validated by the session).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RingAddrs {
    pub(crate) num: u16,
    pub(crate) desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
}

/// What a queue's worker shares with the session.
#[derive(Debug)]
pub(crate) struct WorkerShared {
    pub(crate) stop: AtomicBool,
    pub(crate) enabled: AtomicBool,
    pub(crate) call: Mutex<Option<OwnedFd>>,
}

/// One descriptor of a chain.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Desc {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) flags: u16,
}

impl Desc {
    /// Whether the device writes this buffer.
    pub(crate) fn writable(&self) -> bool {
        self.flags & desc::F_WRITE != 0
    }
}

/// A walked chain.
#[derive(Debug)]
pub(crate) enum Chain {
    /// A loop, an index past the ring, or an indirect descriptor.
    Bad,
    /// The chain's descriptors, in order.
    Ok(Vec<Desc>),
}

/// What [`Queue::pop`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pop {
    /// A head to serve.
    Head(u16),
    /// Nothing available.
    Empty,
    /// The driver published more than the ring holds: left alone.
    Overrun,
}

/// The device side of one split ring.
pub(crate) struct Queue {
    pub(crate) space: Arc<DmaSpace>,
    pub(crate) ring: RingAddrs,
    pub(crate) kick: Option<OwnedFd>,
    pub(crate) shared: Arc<WorkerShared>,
    /// Next avail entry to take.
    pub(crate) last_avail: u16,
    /// Next used entry to fill.
    pub(crate) used_idx: u16,
    /// Used entries published since the last signal.
    pending_signal: u32,
    /// The vectors walks fill, handed back with [`Queue::recycle`] (one per
    /// chain held at once: the one served, the one looked at ahead).
    spare: Vec<Vec<Desc>>,
}

impl Queue {
    pub(crate) fn new(
        space: Arc<DmaSpace>,
        ring: RingAddrs,
        kick: Option<OwnedFd>,
        shared: Arc<WorkerShared>,
        base: u16,
    ) -> Self {
        Self {
            space,
            ring,
            kick,
            shared,
            last_avail: base,
            used_idx: base,
            pending_signal: 0,
            spare: vec![Vec::with_capacity(usize::from(ring.num.min(64)))],
        }
    }

    /// Whether the session asked the worker to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    /// Whether the ring is enabled.
    pub(crate) fn enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Acquire)
    }

    /// The driver's avail index now.
    pub(crate) fn avail_idx(&self) -> Result<u16, AccessError> {
        self.space
            .load_u16_acquire(AddrKind::Ring, at(self.ring.avail, 2)?)
    }

    /// The head in avail entry `idx` (mod the ring's size), without taking it.
    pub(crate) fn head_at(&self, idx: u16) -> Result<u16, AccessError> {
        let r = self.ring;
        let slot = u64::from(idx % r.num);
        let mut h = [0u8; 2];
        self.space
            .read_bytes(AddrKind::Ring, at(r.avail, 4 + 2 * slot)?, &mut h)?;
        Ok(u16::from_le_bytes(h))
    }

    /// The next available head, if any.
    pub(crate) fn pop(&mut self) -> Result<Pop, AccessError> {
        let r = self.ring;
        let avail_idx = self
            .space
            .load_u16_acquire(AddrKind::Ring, at(r.avail, 2)?)?;
        if avail_idx == self.last_avail {
            return Ok(Pop::Empty);
        }
        if avail_idx.wrapping_sub(self.last_avail) > r.num {
            return Ok(Pop::Overrun);
        }
        let slot = u64::from(self.last_avail % r.num);
        let mut h = [0u8; 2];
        self.space
            .read_bytes(AddrKind::Ring, at(r.avail, 4 + 2 * slot)?, &mut h)?;
        self.last_avail = self.last_avail.wrapping_add(1);
        Ok(Pop::Head(u16::from_le_bytes(h)))
    }

    /// Gives back the head [`Queue::pop`] just took (its request was
    /// cancelled before it completed), so the ring's base stays on it.
    pub(crate) fn unpop(&mut self) {
        self.last_avail = self.last_avail.wrapping_sub(1);
    }

    /// Walks a chain; a loop or an out-of-range index makes it bad. The
    /// chain's vector is the queue's spare one (no allocation per chain once
    /// it has grown), to be handed back with [`Queue::recycle`].
    pub(crate) fn walk(&mut self, head: u16) -> Result<Chain, AccessError> {
        let r = self.ring;
        let mut out = self.spare.pop().unwrap_or_default();
        out.clear();
        let mut i = head;
        loop {
            if i >= r.num || out.len() >= usize::from(r.num) {
                self.spare.push(out);
                return Ok(Chain::Bad);
            }
            let mut d = [0u8; 16];
            let a = at(r.desc, 16 * u64::from(i));
            if let Err(e) = a.and_then(|a| self.space.read_bytes(AddrKind::Ring, a, &mut d)) {
                self.spare.push(out);
                return Err(e);
            }
            let addr = u64::from_le_bytes(d[0..8].try_into().expect("8"));
            let len = u32::from_le_bytes(d[8..12].try_into().expect("4"));
            let flags = u16::from_le_bytes([d[12], d[13]]);
            let next = u16::from_le_bytes([d[14], d[15]]);
            if flags & desc::F_INDIRECT != 0 {
                self.spare.push(out);
                return Ok(Chain::Bad);
            }
            out.push(Desc { addr, len, flags });
            if flags & desc::F_NEXT == 0 {
                return Ok(Chain::Ok(out));
            }
            i = next;
        }
    }

    /// Hands a walked chain's vector back for the next walk.
    pub(crate) fn recycle(&mut self, v: Vec<Desc>) {
        if self.spare.len() < SPARE_CHAINS {
            self.spare.push(v);
        }
    }

    /// Publishes `(head, len)` as the next used entry.
    pub(crate) fn push_used(&mut self, head: u16, len: u32) -> Result<(), AccessError> {
        let r = self.ring;
        let uslot = u64::from(self.used_idx % r.num);
        let mut e = [0u8; 8];
        e[0..4].copy_from_slice(&u32::from(head).to_le_bytes());
        e[4..8].copy_from_slice(&len.to_le_bytes());
        self.space
            .write_bytes(AddrKind::Ring, at(r.used, 4 + 8 * uslot)?, &e)?;
        self.used_idx = self.used_idx.wrapping_add(1);
        self.space
            .store_u16_release(AddrKind::Ring, at(r.used, 2)?, self.used_idx)?;
        self.pending_signal += 1;
        Ok(())
    }

    /// Signals the driver once for everything published since the last
    /// signal, unless it asked for no interrupts.
    pub(crate) fn signal_if_wanted(&mut self) -> Result<(), AccessError> {
        if self.pending_signal == 0 {
            return Ok(());
        }
        self.pending_signal = 0;
        let mut f = [0u8; 2];
        self.space
            .read_bytes(AddrKind::Ring, self.ring.avail, &mut f)?;
        if u16::from_le_bytes(f) & ring::AVAIL_F_NO_INTERRUPT == 0 {
            let call = self.shared.call.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = call.as_ref() {
                let v = 1u64;
                // SAFETY: writes 8 bytes to the eventfd.
                unsafe { libc::write(c.as_raw_fd(), (&v as *const u64).cast(), 8) };
            }
        }
        Ok(())
    }

    /// Waits up to `max` for a kick; returns whether one came.
    pub(crate) fn wait_kick(&self, max: Duration) -> bool {
        let Some(k) = &self.kick else {
            std::thread::sleep(max.min(Duration::from_millis(1)));
            return false;
        };
        let mut p = libc::pollfd {
            fd: k.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = max.as_millis().clamp(0, 1000) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 && p.revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into v from the eventfd.
            unsafe { libc::read(k.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            return true;
        }
        false
    }
}

/// `base + off` of a ring address the front-end supplied, or the typed
/// error for a ring that wraps past 2^64.
fn at(base: u64, off: u64) -> Result<u64, AccessError> {
    base.checked_add(off).ok_or(AccessError::Wraps {
        iova: base,
        len: off,
    })
}

/// The total length of a chain's descriptors, `None` if it overflows.
pub(crate) fn chain_len(chain: &[Desc]) -> Option<u64> {
    chain
        .iter()
        .try_fold(0u64, |a, d| a.checked_add(u64::from(d.len)))
}
