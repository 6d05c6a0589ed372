//! The device fails closed when a change it owes cannot be completed,
//! applies `bypass` as soon as it may be written, and bounds what a
//! slow or hostile endpoint can make it hold: a round's time, and the
//! table frames of resets whose detach stalled.

mod viommu_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softiommu::hw::{Access, System, TranslateError, UnitId};
use softiommu_virtio::spec::{iommu as s, reg, status as st};
use softiommu_virtio::viommu::{encode, Status, ViommuConfig, ViommuDriver, ViommuDriverConfig};
use softiommu_virtio::vring::{DriverRing, RingLayout};
use viommu_common::*;

/// A thread inside a translation section of the unit until the sender
/// is sent to or dropped: every drain queued meanwhile waits.
fn hold_section(sys: &Arc<System>, unit: UnitId) -> (JoinHandle<()>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let sys = sys.clone();
    let h = std::thread::spawn(move || {
        let mut tr = sys.unit(unit).unwrap().translator().unwrap();
        tr.section(|_| {
            entered_tx.send(()).unwrap();
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
        });
    });
    entered_rx.recv().unwrap();
    (h, release_tx)
}

/// A thread re-entering translation sections of `hold` each until `stop`.
fn churn_sections(r: &Rig, hold: Duration, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let (sys, unit) = (r.system.clone(), r.unit);
    std::thread::spawn(move || {
        let mut tr = sys.unit(unit).unwrap().translator().unwrap();
        while !stop.load(Ordering::Acquire) {
            tr.section(|_| std::thread::sleep(hold));
        }
    })
}

fn no_context<T>(r: &Result<T, TranslateError>) -> bool {
    matches!(r, Err(TranslateError::NoContext { .. }))
}

/// `bypass` turned off while an endpoint's translation section is open
/// (the first endpoint's drain stalls past the bound): when the write
/// returns, no unattached endpoint is in pass-through, and the device
/// asks for a reset. Before, the endpoints after the stalled one kept
/// pass-through to all guest RAM, with the config reading 0 and no
/// signal.
#[test]
fn bypass_turned_off_under_a_stalled_drain_blocks_every_endpoint_and_asks_for_a_reset() {
    let r = rig_with(
        ViommuConfig {
            invalidation_timeout: Duration::from_millis(100),
            ..config()
        },
        ViommuDriverConfig::default(),
    );
    assert!(r.drv.set_bypass(true));
    assert!(
        r.reach(B, 0x1000, Access::Write).is_ok(),
        "control: bypassed"
    );
    let (holder, release) = hold_section(&r.system, r.unit);
    assert!(r.drv.set_bypass(false));
    let (a, b) = (
        r.reach(A, 0x1000, Access::Write),
        r.reach(B, 0x1000, Access::Write),
    );
    let status = r.dev.transport().read(reg::STATUS);
    release.send(()).unwrap();
    holder.join().unwrap();
    assert!(no_context(&a), "{a:?}");
    assert!(no_context(&b), "{b:?}");
    assert_ne!(status & st::DEVICE_NEEDS_RESET, 0, "{status:#x}");
    let mut cfg = [0u8];
    r.dev
        .transport()
        .read_config(s::CFG_BYPASS as u64, &mut cfg);
    assert_eq!(cfg, [0]);
}

/// A driver negotiates `BYPASS_CONFIG`, writes `bypass = 0` after
/// `FEATURES_OK` and before `DRIVER_OK` (on a device that starts in
/// bypass): when its `DRIVER_OK` write returns, an unattached endpoint is
/// blocked. Before, the value waited for the device thread's next pass.
#[test]
fn bypass_written_before_driver_ok_holds_when_driver_ok_returns() {
    let r = rig_with(
        ViommuConfig {
            bypass: true,
            idle_wait: Duration::from_millis(200),
            ..config()
        },
        ViommuDriverConfig::default(),
    );
    let Rig {
        mem,
        system,
        unit,
        dev,
        drv,
    } = r;
    drop(drv);
    let t = dev.transport().clone();
    for _ in 0..5 {
        t.write(reg::STATUS, 0);
        t.write(reg::STATUS, st::ACKNOWLEDGE | st::DRIVER);
        for sel in 0..2 {
            t.write(reg::DEVICE_FEATURES_SEL, sel);
            let f = t.read(reg::DEVICE_FEATURES);
            t.write(reg::DRIVER_FEATURES_SEL, sel);
            t.write(reg::DRIVER_FEATURES, f);
        }
        t.write(reg::STATUS, st::ACKNOWLEDGE | st::DRIVER | st::FEATURES_OK);
        let l = RingLayout::new(8);
        let (rp, ep) = (
            mem.alloc_zeroed_frames(0).unwrap(),
            mem.alloc_zeroed_frames(0).unwrap(),
        );
        let req = DriverRing::new(mem.clone(), rp, rp, l).unwrap();
        let evt = DriverRing::new(mem.clone(), ep, ep, l).unwrap();
        t.program_queue(0, 8, req.device_addresses());
        t.program_queue(1, 8, evt.device_addresses());
        t.write_config(s::CFG_BYPASS as u64, &[1]);
        assert!(
            reach_in(&system, unit, B, 0x1000, Access::Write).is_ok(),
            "control: bypass 1 holds before DRIVER_OK"
        );
        t.write_config(s::CFG_BYPASS as u64, &[0]);
        t.write(
            reg::STATUS,
            st::ACKNOWLEDGE | st::DRIVER | st::FEATURES_OK | st::DRIVER_OK,
        );
        let b = reach_in(&system, unit, B, 0x1000, Access::Write);
        assert!(no_context(&b), "{b:?}");
        t.write(reg::STATUS, 0);
        mem.free_frames(rp, 0).unwrap();
        mem.free_frames(ep, 0).unwrap();
    }
}

/// Resets whose endpoint detach stalls (a section open) cannot make the
/// device hold more table frames than its quota: the tables such a reset
/// must keep stay counted, and the first later reset that drains frees
/// them. Before, each stalled reset leaked every domain's tables and the
/// next session got a fresh quota: 38, 76, 114, 152 frames held against
/// a quota of 40.
#[test]
fn resets_whose_detach_stalls_hold_no_more_table_frames_than_the_quota() {
    let quota = 40u64;
    let r = rig_with(
        ViommuConfig {
            table_frames: quota,
            invalidation_timeout: Duration::from_millis(50),
            ..config()
        },
        ViommuDriverConfig::default(),
    );
    let phys = r.ram(0);
    let Rig {
        mem,
        dev,
        drv,
        system,
        unit,
    } = r;
    let base = mem.iommu_frame_stats().allocated_frames;
    let mut drv = Some(drv);
    for round in 0..4 {
        let mut d = drv.take().unwrap_or_else(|| {
            ViommuDriver::probe(
                dev.transport().clone(),
                mem.clone(),
                ViommuDriverConfig::default(),
            )
            .unwrap()
        });
        assert_eq!(
            d.attach(1, EA, 0).unwrap(),
            Some(Status::Ok),
            "round {round}"
        );
        // One 4 KiB mapping per 2 MiB (a leaf table each) until NOMEM.
        let mut n = 0u64;
        while n < 1000 {
            let iova = (1u64 << 32) + n * (2 << 20);
            match d.map(1, iova, iova + 0xfff, phys, RW).unwrap() {
                Some(Status::Ok) => n += 1,
                other => {
                    assert_eq!(other, Some(Status::NoMem), "round {round}");
                    break;
                }
            }
        }
        assert!(n > 0, "round {round}");
        let held = || mem.iommu_frame_stats().allocated_frames - base;
        assert!(held() <= quota, "round {round}: {} frames held", held());
        // The reset dropping the driver stalls on an open section: the
        // tables must be kept.
        let (holder, release) = hold_section(&system, unit);
        drop(d);
        assert!(held() > 0, "control: the reset kept the tables");
        assert!(held() <= quota, "round {round}: {} frames kept", held());
        release.send(()).unwrap();
        holder.join().unwrap();
        // A reset that drains (this one, or the device thread's own pass)
        // frees what the stalled one kept.
        dev.transport().write(reg::STATUS, 0);
        assert_eq!(held(), 0, "round {round}");
    }
}

/// A notification of many ATTACHes, each of whose drains waits on a
/// slow endpoint's sections, no longer holds the request queue for all
/// of them: a round stops taking chains once one bound has passed, so a
/// reset written meanwhile returns within a few bounds. Before, the
/// round ran every chain (30 waits here) and the reset's write waited
/// for all of them.
#[test]
fn a_round_of_slow_drains_is_cut_so_a_reset_returns_within_a_few_bounds() {
    let bound = Duration::from_millis(300);
    let mut r = rig_with(
        ViommuConfig {
            invalidation_timeout: bound,
            ..config()
        },
        ViommuDriverConfig {
            wait: Duration::from_millis(500),
            ..Default::default()
        },
    );
    r.attach_ok(1, EA);
    let stop = Arc::new(AtomicBool::new(false));
    let h = churn_sections(&r, Duration::from_millis(150), stop.clone());
    std::thread::sleep(Duration::from_millis(20));
    for i in 0..30 {
        let dom = if i % 2 == 0 { 2 } else { 1 };
        r.drv.queue(&encode::attach(dom, EA, 0), 4).unwrap();
    }
    let t = r.dev.transport().clone();
    let resetter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        t.write(reg::STATUS, 0);
        t0.elapsed()
    });
    // Times out or hears the reset; either way the device got the round.
    let _ = r.drv.sync();
    let took = resetter.join().unwrap();
    stop.store(true, Ordering::Release);
    h.join().unwrap();
    assert!(took < Duration::from_secs(2), "the reset took {took:?}");
}
