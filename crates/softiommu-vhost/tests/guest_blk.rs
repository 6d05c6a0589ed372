//! A real Linux guest under QEMU (TCG) drives our vhost-user-blk back-end
//! through its own intel-iommu driver: the guest writes a random pattern,
//! drops its caches, reads it back and checksums; the host compares with
//! the backing file. Strict and lazy invalidation both.
//!
//! Needs the guest kit (`scripts/guest-kit.sh`); without it each test
//! prints one line saying how to get it and is skipped — unless
//! `SOFTIOMMU_GUEST_REQUIRED=1` (as CI sets), which makes a missing kit fail.

mod guest_common;

use guest_common::{assert_booted, assert_session, kit, say, GUEST_DEADLINE, ONE_GUEST};
use softiommu_vhost::guest::{run_blk, GuestDevice, IommuMode};

const DISK_MIB: u64 = 32;

fn check(mode: IommuMode) {
    let _one = ONE_GUEST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(kit) = kit() else { return };
    let r = run_blk(&kit, GuestDevice::VhostBlk, mode, DISK_MIB, GUEST_DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
    for l in &r.dmesg {
        say(l);
    }
    say(&r.result);
    let rep = r
        .report
        .as_ref()
        .expect("the back-end's session ends when QEMU exits");
    let s = &rep.iotlb;
    say(&format!(
        "guest-blk {}: {:.1} s wall; back-end requests={} iotlb updates={} invalidations={} misses={} miss_timeouts={} refused={} flushes={} evictions={} rejected_messages={}",
        mode.name(),
        r.wall_seconds,
        rep.blk.requests,
        s.updates,
        s.invalidations,
        s.misses,
        s.miss_timeouts,
        s.refused,
        s.flushes,
        s.evictions,
        rep.rejected_messages
    ));
    assert_booted(&r.dmesg, &r.result, |k| r.field(k), mode);
    assert!(
        r.checksum_ok(),
        "guest {} / backing file {:?}",
        r.result,
        r.disk_sha256()
    );
    assert_session(rep);
    assert_eq!(rep.blk.io_errors, 0, "{:?}", rep.blk);
}

#[test]
fn guest_blk_strict_checksums_match() {
    check(IommuMode::Strict);
}

#[test]
fn guest_blk_lazy_checksums_match() {
    check(IommuMode::Lazy);
}
