//! The per-thread state behind [`UnitIommu`](super::UnitIommu): one
//! translator per (thread, unit), the thread's device section, and one
//! vm-memory `Iotlb` per device.
//!
//! vm-memory's `Iommu` must be `Send + Sync` and is shared by every thread
//! that uses an `IommuMemory`; a softiommu [`Translator`] is bound to the
//! thread that made it. So the view keeps nothing per thread itself: each
//! thread that translates through it gets its own translator for the unit,
//! here, made on first use and kept until the thread exits (or
//! [`release`] is called), as a device thread keeps its accessor.
//!
//! # Sections
//!
//! A translation runs inside a section of the thread's translator. Outside
//! a *device section* ([`scope`], entered through
//! [`UnitIommu::section`](super::UnitIommu::section)) that section lasts
//! for the translation only. Inside one, every translation of the thread
//! shares the scope's section, which stays open until the scope's closure
//! returns: a driver's invalidation wait then waits for the device's whole
//! piece of work (its copies included), as the hardware drains DMA in
//! flight. Sections are only ever held by closures, never by the guards
//! vm-memory keeps, so no safe code can leak one (a leaked section would
//! hold every later wait forever).

#![deny(clippy::indexing_slicing)]

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
    /// Device scopes open on this thread (nested [`scope`] calls).
    scopes: usize,
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
            scopes: 0,
            devices: Vec::new(),
        })
    }

    /// Opens the section if it is not open, and returns it. (Takes the
    /// fields it needs, so that the caller can lend `devices` alongside.)
    fn open<'s>(
        section: &'s mut Option<TranslationGuard<'static>>,
        translator: NonNull<Translator>,
    ) -> &'s mut TranslationGuard<'static> {
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

    /// Closes the section unless a scope holds it.
    fn close_unless_scoped(&mut self) {
        if self.scopes == 0 {
            self.section = None;
        }
    }

    /// Whether the unit is gone and nobody uses this state.
    fn dead(&self) -> bool {
        // Ours, and the translator's: nobody else holds the unit.
        self.scopes == 0 && Arc::strong_count(&self.unit) <= 2
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

/// Runs `f` on this thread's state for `unit`, making it if need be.
fn with_unit<R>(unit: &Unit, f: impl FnOnce(&mut ThreadUnit) -> R) -> Result<R, HwError> {
    let key = key_of(unit);
    UNITS.with(|units| {
        let mut units = units.borrow_mut();
        if !units.iter().any(|t| t.key == key) {
            // Forget units that are gone before adding one.
            units.retain(|t| !t.dead());
            units.push(ThreadUnit::new(key, unit)?);
        }
        match units.iter_mut().find(|t| t.key == key) {
            Some(tu) => Ok(f(tu)),
            None => Err(HwError::UnknownUnit(crate::hw::UnitId(u16::MAX))),
        }
    })
}

/// Why [`with_section`] failed.
#[derive(Debug)]
pub(crate) enum SectionError<E> {
    /// No translator could be made.
    Setup(HwError),
    /// `f` failed.
    Inner(E),
}

/// Calls `f` inside this thread's section for `unit` with `sid`'s cache:
/// the scope's section if a device scope is open, else one that lasts for
/// the call only.
pub(crate) fn with_section<R, E>(
    unit: &Unit,
    sid: SourceId,
    f: impl FnOnce(&mut TranslationGuard<'static>, &mut DeviceCache) -> Result<R, E>,
) -> Result<R, SectionError<E>> {
    let f = |s: &mut TranslationGuard<'static>, d: &mut DeviceCache| {
        f(s, d).map_err(SectionError::Inner)
    };
    with_unit(unit, |tu| {
        if !tu.devices.iter().any(|d| d.sid == sid) {
            tu.devices.push(DeviceCache {
                sid,
                epoch: None,
                iotlb: Rc::new(Iotlb::new()),
            });
        }
        let section = ThreadUnit::open(&mut tu.section, tu.translator);
        let r = match tu.devices.iter_mut().find(|d| d.sid == sid) {
            Some(dev) => f(section, dev),
            // Pushed above.
            None => Err(SectionError::Setup(HwError::DeviceNotAssigned { sid })),
        };
        tu.close_unless_scoped();
        r
    })
    .map_err(SectionError::Setup)?
}

/// Leaves a scope when dropped, on return or unwind.
struct ScopeExit {
    key: usize,
}

impl Drop for ScopeExit {
    fn drop(&mut self) {
        // During thread exit the state is already gone, and with it the
        // section.
        let _ = UNITS.try_with(|units| {
            if let Ok(mut units) = units.try_borrow_mut() {
                if let Some(tu) = units.iter_mut().find(|t| t.key == self.key) {
                    tu.scopes = tu.scopes.saturating_sub(1);
                    tu.close_unless_scoped();
                }
            }
        });
    }
}

/// Runs `f` with this thread's section for `unit` held open throughout
/// (nested calls share it): see the module documentation.
pub(crate) fn scope<R>(unit: &Unit, f: impl FnOnce() -> R) -> Result<R, HwError> {
    let key = key_of(unit);
    with_unit(unit, |tu| {
        tu.scopes += 1;
        ThreadUnit::open(&mut tu.section, tu.translator);
    })?;
    let _exit = ScopeExit { key };
    Ok(f())
}

/// Drops this thread's translator and caches for `unit`, giving its slot
/// back; refused (`false`) while a device scope of this thread is open.
pub(crate) fn release(unit: &Unit) -> bool {
    let key = key_of(unit);
    UNITS.with(|units| {
        let mut units = units.borrow_mut();
        if units.iter().any(|t| t.key == key && t.scopes > 0) {
            return false;
        }
        units.retain(|t| t.key != key);
        true
    })
}
