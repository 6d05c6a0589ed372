//! A thread's seat in each space it accesses: the reader slot it claimed
//! there (once, on its first access), its slot's counter, and how deeply
//! its sections nest. Kept in a thread-local list, so an access finds its
//! slot without touching anything shared; the slot is released when the
//! thread ends. A thread that finds no free slot enters through the
//! space's overflow lock instead.

use std::cell::RefCell;
use std::sync::{Arc, RwLockReadGuard};

use crate::readers::Readers;

#[derive(Debug)]
struct Seat {
    /// The space's identity.
    id: u64,
    readers: Arc<Readers>,
    index: usize,
    /// The slot's counter: odd inside a section.
    state: u64,
    /// Sections open on this thread (an access inside an access's callback
    /// nests; only the outermost enters and exits the slot).
    depth: u32,
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
    Slot(u64),
    Overflow(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

/// Opens a section of this thread in the space `id` whose slots are `readers`.
#[inline]
pub(crate) fn enter(id: u64, readers: &Arc<Readers>) -> Section<'_> {
    let slot = SEATS
        .try_with(|s| {
            let mut seats = s.borrow_mut();
            let k = match seats.iter().position(|s| s.id == id) {
                Some(k) => k,
                None => {
                    // Seats of spaces gone go first.
                    seats.retain(|s| !s.readers.is_closed());
                    let c = readers.claim()?;
                    seats.push(Seat {
                        id,
                        readers: readers.clone(),
                        index: c.index,
                        state: c.state,
                        depth: 0,
                    });
                    seats.len() - 1
                }
            };
            let seat = &mut seats[k];
            if seat.depth == 0 {
                seat.state += 1;
                seat.readers.enter(seat.index, seat.state);
            }
            seat.depth += 1;
            Some(())
        })
        .ok()
        .flatten();
    match slot {
        Some(()) => Section { how: How::Slot(id) },
        None => Section {
            how: How::Overflow(readers.enter_overflow()),
        },
    }
}

impl Drop for Section<'_> {
    #[inline]
    fn drop(&mut self) {
        if let How::Slot(id) = self.how {
            let _ = SEATS.try_with(|s| {
                let mut seats = s.borrow_mut();
                if let Some(seat) = seats.iter_mut().find(|s| s.id == id) {
                    seat.depth -= 1;
                    if seat.depth == 0 {
                        seat.state += 1;
                        seat.readers.exit(seat.index, seat.state);
                    }
                }
            });
        }
    }
}
