//! A thread's seat in each space it accesses: the reader slot it claimed
//! there on its first access. Kept in a thread-local list, so an access
//! finds its slot without touching anything shared; the slot is released
//! when the thread ends. A thread that finds no free slot enters through
//! the space's overflow lock instead.
//!
//! A slot's counter is written only by its thread, so the thread reads it
//! back (Relaxed) instead of keeping a copy: an odd value means this thread
//! is already inside a section of the space (an access inside an access's
//! callback), and the inner section leaves the slot alone.

use std::cell::RefCell;
use std::sync::{Arc, RwLockReadGuard};

use crate::readers::Readers;

#[derive(Debug)]
struct Seat {
    /// The space's identity.
    id: u64,
    readers: Arc<Readers>,
    index: usize,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.readers.release(self.index);
    }
}

thread_local! {
    static SEATS: RefCell<Vec<Seat>> = const { RefCell::new(Vec::new()) };
    /// The space whose overflow lock this thread holds (0: none), so that
    /// a nested access does not take the lock's read side twice (`std`
    /// allows a recursive read to deadlock or panic, e.g. behind a
    /// waiting drain).
    static OVERFLOW: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// An open section: every translation and copy of an access happens while
/// one is alive; an invalidation's drain waits for it.
#[derive(Debug)]
#[must_use]
pub(crate) struct Section<'a> {
    how: How<'a>,
}

#[derive(Debug)]
enum How<'a> {
    /// The outermost section on slot `index`; `state` is its odd value.
    Slot {
        readers: &'a Readers,
        index: usize,
        state: u64,
    },
    /// Inside another section of this thread on the same space.
    Nested,
    Overflow(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

/// This thread's slot in the space `id`, claimed now if it has none.
#[inline]
fn slot(id: u64, readers: &Arc<Readers>) -> Option<usize> {
    SEATS
        .try_with(|s| {
            if let Some(seat) = s.borrow().iter().find(|s| s.id == id) {
                return Some(seat.index);
            }
            let mut seats = s.borrow_mut();
            // Seats of spaces gone go first.
            seats.retain(|s| !s.readers.is_closed());
            let index = readers.claim()?;
            seats.push(Seat {
                id,
                readers: readers.clone(),
                index,
            });
            Some(index)
        })
        .ok()
        .flatten()
}

/// Whether this thread is inside a section of space `id` through the
/// overflow lock.
#[cfg(all(test, not(loom)))]
pub(crate) fn in_overflow(id: u64) -> bool {
    OVERFLOW.with(|o| o.get() == id)
}

/// Opens a section of this thread in the space `id` whose slots are `readers`.
#[inline]
pub(crate) fn enter(id: u64, readers: &Arc<Readers>) -> Section<'_> {
    let how = match slot(id, readers) {
        Some(index) => {
            let now = readers.state(index);
            if now & 1 == 1 {
                How::Nested
            } else {
                readers.enter(index, now + 1);
                How::Slot {
                    readers,
                    index,
                    state: now + 1,
                }
            }
        }
        None if OVERFLOW.try_with(|o| o.get() == id).unwrap_or(false) => How::Nested,
        None => {
            let g = readers.enter_overflow();
            let _ = OVERFLOW.try_with(|o| o.set(id));
            How::Overflow(g)
        }
    };
    Section { how }
}

impl Drop for Section<'_> {
    #[inline]
    fn drop(&mut self) {
        if let How::Slot {
            readers,
            index,
            state,
        } = self.how
        {
            readers.exit(index, state + 1);
        } else if let How::Overflow(_) = self.how {
            let _ = OVERFLOW.try_with(|o| o.set(0));
        }
    }
}
