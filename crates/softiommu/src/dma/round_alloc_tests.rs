//! The flush timer's round allocates nothing once warm: a counting
//! allocator (this crate's test binary only) counts the calling thread's
//! allocations around a round run on the test thread.

use std::alloc::{GlobalAlloc, Layout, System as SysAlloc};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

use super::timer::TimerWork;
use super::{DmaDirection, DmaDomain, DmaPolicy};
use crate::hw::UnitId;

/// The system allocator, counting each thread's allocations.
struct Counting;

std::thread_local! {
    /// Allocations (and reallocations) made by this thread, ever.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: a thread being torn down still allocates.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is passed to the system allocator unchanged; the
// count is a thread-local `Cell` with a const initialiser and no
// destructor, so counting never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { SysAlloc.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { SysAlloc.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { SysAlloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract, passed on.
        unsafe { SysAlloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Allocations the calling thread makes while running `f`.
fn allocs_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

fn deferred_domain_with_a_cpu() -> (Arc<DmaDomain>, crate::dma::DmaCpu) {
    let p = crate::Platform::builder()
        .policy(DmaPolicy::Deferred)
        .device(crate::hw::SourceId(0x0100))
        .build()
        .unwrap();
    let mut cpu = p.domain.cpu();
    // One deferred unmap, flushed: the domain has a CPU slot and a unit,
    // and nothing queued.
    let dev = p.devices.into_iter().next().unwrap();
    let buf = p.mem.alloc_zeroed_frames(0).unwrap();
    let a = cpu.map(&dev, buf, 64, DmaDirection::ToDevice).unwrap();
    cpu.unmap(&dev, a, 64, DmaDirection::ToDevice).unwrap();
    p.domain.flush_all().unwrap();
    (p.domain, cpu)
}

#[test]
fn a_timer_round_with_nothing_queued_allocates_nothing() {
    let (domain, _cpu) = deferred_domain_with_a_cpu();
    assert!(!domain.any_queued());
    // The first round may size the round's buffer.
    let _ = TimerWork::round(&*domain, Instant::now());
    let n = allocs_in(|| {
        for _ in 0..10 {
            let round = TimerWork::round(&*domain, Instant::now());
            assert!(!round.worked, "nothing was queued: {round:?}");
        }
    });
    assert_eq!(n, 0, "allocations in 10 idle timer rounds");
}

#[test]
fn an_idle_rounds_expiry_clearing_reuses_the_timers_buffer() {
    let (domain, _cpu) = deferred_domain_with_a_cpu();
    domain.arm_expiry(domain.unit_mask());
    let mut marks: Vec<(UnitId, u64)> = Vec::new();
    TimerWork::begin_clear_expiry(&*domain, &mut marks);
    assert_eq!(marks.len(), 1, "one unit's deadline marked");
    TimerWork::finish_clear_expiry(&*domain, &marks, false);
    let n = allocs_in(|| {
        TimerWork::begin_clear_expiry(&*domain, &mut marks);
        TimerWork::finish_clear_expiry(&*domain, &marks, false);
    });
    assert_eq!(
        marks.len(),
        1,
        "the deadline stayed armed and was marked again"
    );
    assert_eq!(n, 0, "allocations in an idle round's expiry clearing");
}
