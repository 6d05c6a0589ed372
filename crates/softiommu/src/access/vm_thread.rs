//! The per-thread state behind [`UnitIommu`](super::UnitIommu): one
//! translator per (thread, unit), a translation section shared by nested
//! users, and one vm-memory `Iotlb` per device.
//!
//! vm-memory's `Iommu` must be `Send + Sync` and is shared by every thread
//! that uses an `IommuMemory`; a softiommu [`Translator`] is bound to the
//! thread that made it. So the view keeps nothing per thread itself: each
//! thread that translates through it gets its own translator for the unit,
//! here, made on first use and kept until the thread exits (or
//! [`release`] is called), as a device thread keeps its accessor.
//!
//! A guard returned by `Iommu::translate` holds the thread's section open
//! until it is dropped (so a driver's wait cannot complete while vm-memory
//! still copies through the translation). Guards may nest — vm-memory code
//! can translate again while an iterator from an earlier call is alive —
//! so the section is counted: the first guard opens it, the last closes it.

use std::any::Any;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::Arc;

use vm_memory::Iotlb;

use super::epoch::DeviceEpoch;
use crate::hw::{HwError, SourceId, TranslationGuard, Translator, Unit};

/// A device's cached translations on this thread.
#[derive(Debug)]
pub(crate) struct DeviceCache {
    /// The device.
    pub(crate) sid: SourceId,
    /// The epoch `iotlb` was filled under (`None`: never filled).
    pub(crate) epoch: Option<DeviceEpoch>,
    /// The translations; shared with the guards handed out (a guard's
    /// snapshot never changes under it).
    pub(crate) iotlb: Rc<Iotlb>,
}

/// This thread's state for one unit.
struct ThreadUnit {
    /// The unit's identity: the address of its shared state, which `unit`
    /// (and the translator) keep alive, so it cannot be reused meanwhile.
    key: usize,
    /// A reference to the unit's shared state, to notice the unit is gone.
    unit: Arc<dyn Any + Send + Sync>,
    /// The translator, owned (from `Box::into_raw`). While `section` is
    /// `Some`, it is reached only through `section`.
    translator: NonNull<Translator>,
    /// The open section, borrowing `*translator`.
    section: Option<TranslationGuard<'static>>,
    /// Guards sharing the section.
    depth: usize,
    devices: Vec<DeviceCache>,
}

impl ThreadUnit {
    fn new(key: usize, unit: &Unit) -> Result<Self, HwError> {
        let t = Box::new(unit.translator()?);
        let shared: Arc<dyn Any + Send + Sync> = unit.shared.clone();
        Ok(Self {
            key,
            unit: shared,
            translator: NonNull::from(Box::leak(t)),
            section: None,
            depth: 0,
            devices: Vec::new(),
        })
    }

    /// Joins the section, opening it if no guard holds it. (Takes the
    /// fields it needs, so that the caller can lend `devices` alongside.)
    fn open<'s>(
        section: &'s mut Option<TranslationGuard<'static>>,
        depth: &mut usize,
        translator: NonNull<Translator>,
    ) -> &'s mut TranslationGuard<'static> {
        *depth += 1;
        section.get_or_insert_with(|| {
            // SAFETY: `translator` came from `Box::leak` and is freed only
            // in `drop`, after `section` is dropped, so the reference lives
            // as long as any guard made from it. No other reference to the
            // translator exists while `section` is `Some` (this is the only
            // place that makes one, and only when `section` is `None`).
            let t: &'static mut Translator = unsafe { &mut *translator.as_ptr() };
            t.begin()
        })
    }

    /// Leaves the section, closing it when the last guard leaves.
    fn close(&mut self) {
        self.depth = self.depth.saturating_sub(1);
        if self.depth == 0 {
            self.section = None;
        }
    }

    /// Whether the unit is gone and nobody uses this state.
    fn dead(&self) -> bool {
        // Ours, and the translator's: nobody else holds the unit.
        self.depth == 0 && Arc::strong_count(&self.unit) <= 2
    }
}

impl Drop for ThreadUnit {
    fn drop(&mut self) {
        self.section = None;
        // SAFETY: `translator` came from `Box::leak` in `new`; the section
        // borrowing it is gone (above) and nothing else refers to it.
        drop(unsafe { Box::from_raw(self.translator.as_ptr()) });
    }
}

thread_local! {
    static UNITS: RefCell<Vec<ThreadUnit>> = const { RefCell::new(Vec::new()) };
}

fn key_of(unit: &Unit) -> usize {
    Arc::as_ptr(&unit.shared) as *const () as usize
}

/// A share of this thread's section for a unit; leaves it on drop.
#[derive(Debug)]
pub(crate) struct SectionToken {
    key: usize,
    /// Neither `Send` nor `Sync`: the section belongs to this thread.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for SectionToken {
    fn drop(&mut self) {
        // Tokens are dropped by their holders, never while `with_section`
        // borrows the state, so the borrow succeeds; during thread exit the
        // state is already gone and with it the section.
        let _ = UNITS.try_with(|units| {
            if let Ok(mut units) = units.try_borrow_mut() {
                if let Some(tu) = units.iter_mut().find(|t| t.key == self.key) {
                    tu.close();
                }
            }
        });
    }
}

/// Why [`with_section`] failed.
#[derive(Debug)]
pub(crate) enum SectionError<E> {
    /// No translator could be made.
    Setup(HwError),
    /// `f` failed.
    Inner(E),
}

/// Joins (or opens) this thread's section for `unit`, and calls `f` with it
/// and `sid`'s cache. On success the section stays joined until the
/// returned token is dropped; on failure it is left at once.
pub(crate) fn with_section<R, E>(
    unit: &Unit,
    sid: SourceId,
    f: impl FnOnce(&mut TranslationGuard<'static>, &mut DeviceCache) -> Result<R, E>,
) -> Result<(R, SectionToken), SectionError<E>> {
    let key = key_of(unit);
    UNITS.with(|units| {
        let mut units = units.borrow_mut();
        let i = match units.iter().position(|t| t.key == key) {
            Some(i) => i,
            None => {
                // Forget units that are gone before adding one.
                units.retain(|t| !t.dead());
                units.push(ThreadUnit::new(key, unit).map_err(SectionError::Setup)?);
                units.len() - 1
            }
        };
        let tu = &mut units[i];
        let translator = tu.translator;
        let d = match tu.devices.iter().position(|d| d.sid == sid) {
            Some(d) => d,
            None => {
                tu.devices.push(DeviceCache {
                    sid,
                    epoch: None,
                    iotlb: Rc::new(Iotlb::new()),
                });
                tu.devices.len() - 1
            }
        };
        let section = ThreadUnit::open(&mut tu.section, &mut tu.depth, translator);
        let r = f(section, &mut tu.devices[d]);
        match r {
            Ok(r) => Ok((
                r,
                SectionToken {
                    key,
                    _thread: std::marker::PhantomData,
                },
            )),
            Err(e) => {
                tu.close();
                Err(SectionError::Inner(e))
            }
        }
    })
}

/// Drops this thread's translator and caches for `unit`, giving its slot
/// back; refused (`false`) while a guard of this thread holds its section.
pub(crate) fn release(unit: &Unit) -> bool {
    let key = key_of(unit);
    UNITS.with(|units| {
        let mut units = units.borrow_mut();
        match units.iter().position(|t| t.key == key) {
            Some(i) if units[i].depth > 0 => false,
            Some(i) => {
                units.swap_remove(i);
                true
            }
            None => true,
        }
    })
}
