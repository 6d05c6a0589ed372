//! The device threads: what each reads and probes, and how the checker
//! judges every access that succeeded.

use std::sync::atomic::Ordering;

use softiommu::access::{DmaAccessor, DmaAttrs};
use softiommu::dma::{DmaDevice, DmaPolicy};
use softiommu::hw::{Access as HwAccess, SourceId, Translator};
use softiommu::mem::PhysMemory;

use super::check::{classify, Access, DomainShadow, Entry, Life, Tag, TagKind, Verdict, Why, PAGE};
use super::run::*;
use super::*;
use crate::error::{LabError, LabResult};
use crate::workload::Rng;

/// A device thread's counters.
#[derive(Debug, Default)]
pub(super) struct DeviceCounts {
    pub(super) accesses: u64,
    pub(super) faults: u64,
    pub(super) stale: u64,
    pub(super) max_stale_age_us: u64,
    pub(super) violations: u64,
    pub(super) legal: u64,
    pub(super) unjudged: u64,
    pub(super) first_violation: Option<String>,
}

/// The kinds of device access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// A read of a live mapping it owns, at a random word.
    Owned,
    /// A read of one of its mappings that was just unmapped.
    JustUnmapped,
    /// A read of the words just around one of its sub-page buffers.
    Neighbour,
    /// A read at a random word of a page near one of its IOVAs.
    Near,
    /// A read at an IOVA the other domain's device was given.
    OtherDomain,
    /// A write through one of its read-only mappings (bounced or not).
    Write,
    /// A read at a random IOVA anywhere in the domain's aperture.
    Aperture,
}

impl DeviceCounts {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn judge(
        &mut self,
        sh: &Shared,
        op: Op,
        acc: &Access,
        seen: Option<&Entry>,
        device: usize,
        verdict: Verdict,
    ) {
        match verdict {
            Verdict::Legal => self.legal += 1,
            Verdict::Stale { age_us } => {
                self.stale += 1;
                self.max_stale_age_us = self.max_stale_age_us.max(age_us);
            }
            Verdict::Unknown => self.unjudged += 1,
            Verdict::Violation(why) => {
                self.violations += 1;
                if std::env::var_os("SOFTIOMMU_STRESS_TRACE").is_some() {
                    eprintln!(
                        "violation: {op:?} {why:?} {acc:?} {:?}",
                        Tag::decode(acc.value)
                    );
                }
                if self.first_violation.is_none() {
                    let what = sh
                        .policy
                        .map_or(SWITCHING.to_string(), |p| p.name().to_string());
                    self.first_violation = Some(format!(
                        "phase {what}, device {device} (domain {}), {op:?} {} at IOVA {:#x}: \
                         {why:?}; expected {}, seen {} (word {:?}); access {acc:?}; \
                         the shadow entry the device aimed at: {seen:?}",
                        acc.domain,
                        if acc.write { "write" } else { "read" },
                        acc.iova,
                        expected_of(&why, sh.bound_ns / 1000),
                        if acc.write {
                            "the write succeed".to_string()
                        } else {
                            format!("{:#x}", acc.value)
                        },
                        Tag::decode(acc.value),
                    ));
                }
            }
        }
    }
}

/// What the checker expected instead of the access `why` condemns.
pub(super) fn expected_of(why: &Why, bound_us: u64) -> String {
    match why {
        Why::AfterUnmap { entry, age_us } => format!(
            "a fault: begun {age_us} us after the unmap of IOVA {:#x} returned (deferred \
             allowance: {}, bound {bound_us} us)",
            entry.iova,
            if entry.deferred { "possible" } else { "none" }
        ),
        Why::WrongData { expected } => format!("the buffer's word {expected:#x}"),
        Why::LiveFault => "a live mapping's word, not a fault".into(),
        Why::WriteThroughReadOnly => "a fault: every mapping is read-only for the device".into(),
        Why::IommuFrame { phys } => {
            format!("a fault: {phys:#x} is a frame holding IOMMU state")
        }
        Why::BounceNotOwner { entry } => format!(
            "the bytes of the bounce slot's owners; that buffer's slot covered {:#x}..{:#x}",
            entry.iova,
            entry.iova.saturating_add(entry.len)
        ),
        Why::OtherDomain { owner } => format!("a fault: the word is domain {owner}'s"),
        Why::Untagged | Why::NeverMapped => "a fault: no mapping of this device held it".into(),
    }
}

/// A domain's device thread: reads and probes until told to stop.
pub(super) fn device_thread(
    sh: &Shared,
    dev: &DmaDevice,
    domain: usize,
    slots: usize,
    seed: u64,
) -> LabResult<DeviceCounts> {
    let mut acc = DmaAccessor::for_device(dev)?;
    // A second look at where each successful access landed: no device
    // may reach a frame holding IOMMU state, whatever IOVA it used.
    let system = dev.domain().system().clone();
    let (unit_id, _) = system
        .unit_of(dev.source_id())
        .ok_or(LabError::Setup("the stress device has no unit"))?;
    let mut tr = system
        .unit(unit_id)
        .ok_or(LabError::Setup("the stress device's unit is gone"))?
        .translator()?;
    let mut rng = Rng::new(seed);
    let mut c = DeviceCounts::default();
    let me = &sh.shadows[domain];
    let other = &sh.shadows[1 - domain];
    let protected = sh.policy != Some(DmaPolicy::Passthrough);
    // Every mapping is read-only for the device, bounced ones included:
    // a write that succeeds anywhere is a violation.
    let writes = protected;
    let attrs = DmaAttrs::RELAXED;
    let mut n = 0u64;
    loop {
        n += 1;
        if n.is_multiple_of(256) && sh.stop.load(Ordering::Relaxed) {
            break;
        }
        let r = rng.below(16);
        let op = match r {
            _ if !protected => Op::Owned,
            0..=6 => Op::Owned,
            7..=10 => Op::JustUnmapped,
            11 => Op::Neighbour,
            12 => Op::Near,
            13 => Op::OtherDomain,
            14 => Op::Aperture,
            _ if writes => Op::Write,
            _ => Op::JustUnmapped,
        };
        if op == Op::Aperture {
            // Anywhere below the device's 48-bit mask.
            let x = (rng.next_u64() >> 19) << 3;
            c.probe_anywhere(sh, &mut acc, &mut tr, domain, x);
            continue;
        }
        let k = rng.below(slots as u64) as usize;
        let shadow = if op == Op::OtherDomain { other } else { me };
        let Some(newest) = shadow.slots[k].newest() else {
            continue;
        };
        let e = match op {
            Op::JustUnmapped => match newest.life {
                Life::Mapped | Life::Mapping if newest.gen > 1 => {
                    match shadow.slots[k].get(newest.gen - 1) {
                        Some(e) => e,
                        None => continue,
                    }
                }
                Life::Mapped | Life::Mapping => continue,
                _ => newest,
            },
            Op::Owned | Op::Neighbour | Op::Write if newest.life != Life::Mapped => continue,
            _ if newest.life == Life::Mapping => continue,
            _ => newest,
        };
        let word = |rng: &mut Rng| e.iova + 8 * rng.below(e.len / 8);
        let x = match op {
            Op::Owned | Op::JustUnmapped | Op::OtherDomain | Op::Write | Op::Aperture => {
                word(&mut rng)
            }
            Op::Neighbour if rng.below(2) == 0 => e.iova.wrapping_sub(8),
            Op::Neighbour => e.iova + e.len,
            Op::Near => {
                let delta = rng.below(9) as i64 - 4;
                (e.iova & !(PAGE - 1)).wrapping_add_signed(delta * PAGE as i64)
                    + 8 * rng.below(PAGE / 8)
            }
        };
        let flushed_upto_ns = me.flushed_upto_ns.load(Ordering::Acquire);
        let left_deferred_ns = me.left_deferred_ns.load(Ordering::Acquire);
        let t_before_ns = sh.clock.ns();
        let res = if op == Op::Write {
            acc.write_u64(x, 0, attrs).map(|()| 0)
        } else {
            acc.read_u64(x, attrs)
        };
        let t_after_ns = sh.clock.ns();
        c.accesses += 1;
        // Whether the owned mapping stayed live across the whole access.
        let live_throughout = op == Op::Owned
            && shadow.slots[k]
                .get(e.gen)
                .is_some_and(|a| a.life == Life::Mapped);
        let access = Access {
            domain: domain as u8,
            iova: x,
            value: res.as_ref().map_or(0, |v| *v),
            write: op == Op::Write,
            t_before_ns,
            t_after_ns,
            flushed_upto_ns,
            left_deferred_ns,
        };
        if res.is_ok() && protected {
            if let Some(phys) = iommu_frame_reached(sh, &mut tr, me, dev.source_id(), x) {
                c.judge(
                    sh,
                    op,
                    &access,
                    Some(&e),
                    domain,
                    Verdict::Violation(Why::IommuFrame { phys }),
                );
                continue;
            }
        }
        match res {
            Err(_) if live_throughout => {
                c.judge(
                    sh,
                    op,
                    &access,
                    Some(&e),
                    domain,
                    Verdict::Violation(Why::LiveFault),
                );
            }
            Err(_) => c.faults += 1,
            Ok(v) => {
                let expected = Tag {
                    kind: TagKind::Buffer,
                    domain: domain as u8,
                    slot: k as u16,
                    gen: e.gen,
                }
                .encode();
                let verdict = if live_throughout && v != expected {
                    Verdict::Violation(Why::WrongData { expected })
                } else if !protected {
                    // Pass-through isolates nothing: only the data of a
                    // live mapping is checked.
                    Verdict::Legal
                } else {
                    // A page whose map is in progress: let the shadow
                    // learn the IOVA first.
                    if let Some(t) = Tag::decode(v) {
                        if let Some(s) = sh
                            .shadows
                            .get(usize::from(t.domain))
                            .and_then(|d| d.slots.get(usize::from(t.slot)))
                        {
                            s.wait_mapped(t.gen, 100_000);
                        }
                    }
                    classify(&access, &sh.shadows, sh.bound_ns)
                };
                c.judge(sh, op, &access, Some(&e), domain, verdict);
            }
        }
    }
    Ok(c)
}

/// Where a successful access at `x` landed, if that is a frame holding
/// IOMMU state (page tables, queues; the domain's bounce pool is the
/// IOMMU's too, and the device's by design, so it is left out).
pub(super) fn iommu_frame_reached(
    sh: &Shared,
    tr: &mut Translator,
    me: &DomainShadow,
    sid: SourceId,
    x: u64,
) -> Option<u64> {
    if me.in_pool(x) {
        return None;
    }
    iommu_state_at(&sh.mem, tr, sid, x)
}

/// The physical address device `sid` reaches at `x`, if the frame there
/// holds IOMMU state.
pub(super) fn iommu_state_at(
    mem: &PhysMemory,
    tr: &mut Translator,
    sid: SourceId,
    x: u64,
) -> Option<u64> {
    let span = tr.translate_page(sid, x, HwAccess::Read).ok()?;
    mem.is_iommu_frame(span.phys).then_some(span.phys)
}

impl DeviceCounts {
    /// A read at an arbitrary IOVA of the aperture: judged like any other
    /// access (what it read, and where it landed).
    pub(super) fn probe_anywhere(
        &mut self,
        sh: &Shared,
        acc: &mut DmaAccessor,
        tr: &mut Translator,
        domain: usize,
        x: u64,
    ) {
        let me = &sh.shadows[domain];
        let flushed_upto_ns = me.flushed_upto_ns.load(Ordering::Acquire);
        let left_deferred_ns = me.left_deferred_ns.load(Ordering::Acquire);
        let t_before_ns = sh.clock.ns();
        let res = acc.read_u64(x, DmaAttrs::RELAXED);
        let t_after_ns = sh.clock.ns();
        self.accesses += 1;
        let Ok(value) = res else {
            self.faults += 1;
            return;
        };
        let access = Access {
            domain: domain as u8,
            iova: x,
            value,
            write: false,
            t_before_ns,
            t_after_ns,
            flushed_upto_ns,
            left_deferred_ns,
        };
        let sid = acc.source_id();
        let verdict = match iommu_frame_reached(sh, tr, me, sid, x) {
            Some(phys) => Verdict::Violation(Why::IommuFrame { phys }),
            None => classify(&access, &sh.shadows, sh.bound_ns),
        };
        self.judge(sh, Op::Aperture, &access, None, domain, verdict);
    }
}
