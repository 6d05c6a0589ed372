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
        None => How::Overflow(readers.enter_overflow()),
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
        }
    }
}
