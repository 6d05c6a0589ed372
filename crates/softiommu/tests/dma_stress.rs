//! The DMA layer's invariant under load: CPU threads map and unmap, device
//! threads behind two units access what they were given and probe what was
//! taken back, while the policy switches between strict and deferred.
//!
//! Asserted:
//! - a device reads exactly the token of the mapping it was given (a stale
//!   IOTLB entry of an earlier mapping of the same IOVA would show another);
//! - once a strict unmap has returned, or a deferred unmap's flush has
//!   completed, no device (of either unit) reaches the old buffer;
//! - never two live mappings with one IOVA.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softiommu::dma::{DmaDirection, DmaDomain, DmaDomainConfig, DmaPolicy};
use softiommu::hw::{Access, SourceId, System, UnitConfig};
use softiommu::mem::PhysMemory;

enum Msg {
    Live {
        addr: u64,
        token: u64,
        ack: Sender<()>,
    },
    Revoked {
        addr: u64,
        token: u64,
    },
}

const CPUS: usize = 2;
const MAPS_PER_CPU: u64 = 1500;
const POOL: u64 = 256;

fn device(
    sys: Arc<System>,
    sid: SourceId,
    unit: softiommu::hw::UnitId,
    mem: Arc<PhysMemory>,
    rx: Receiver<Msg>,
) -> (u64, u64) {
    let mut tr = sys.unit(unit).unwrap().translator().unwrap();
    let (mut live, mut probes) = (0, 0);
    let read = |tr: &mut softiommu::hw::Translator, addr: u64| -> Option<u64> {
        tr.section(|g| {
            let r = g.translate(sid, addr, 8, Access::Read).ok()?;
            let p = r.as_slice()[0];
            assert_eq!(p.len, 8, "tokens never straddle a page");
            Some(mem.load_u64(p.phys, Ordering::Acquire).unwrap())
        })
    };
    while let Ok(m) = rx.recv() {
        match m {
            Msg::Live { addr, token, ack } => {
                let got = read(&mut tr, addr);
                assert_eq!(
                    got,
                    Some(token),
                    "device {sid}: a live mapping shows another buffer (stale entry?)"
                );
                live += 1;
                let _ = ack.send(());
            }
            Msg::Revoked { addr, token } => {
                if let Some(v) = read(&mut tr, addr) {
                    assert_ne!(
                        v, token,
                        "device {sid} reached a buffer after its unmap was complete"
                    );
                }
                probes += 1;
            }
        }
    }
    (live, probes)
}

#[test]
fn no_access_after_revocation_and_no_shared_iova_under_policy_switches() {
    let mem = Arc::new(PhysMemory::new(512 << 20).unwrap());
    let mut sys = System::new(mem.clone());
    let u0 = sys.add_unit(UnitConfig::default()).unwrap();
    let u1 = sys.add_unit(UnitConfig::default()).unwrap();
    let sids = [SourceId(0x0100), SourceId(0x0200)];
    sys.assign(sids[0], u0).unwrap();
    sys.assign(sids[1], u1).unwrap();
    let sys = Arc::new(sys);
    let domain = DmaDomain::new(
        sys.clone(),
        DmaDomainConfig {
            policy: DmaPolicy::Strict,
            ..Default::default()
        },
    )
    .unwrap();
    domain.set_timeout(Duration::from_millis(2)).unwrap();
    domain.set_high_water(16).unwrap();
    let devs = [
        domain.attach(sids[0], u64::MAX, false).unwrap(),
        domain.attach(sids[1], u64::MAX, false).unwrap(),
    ];

    let (txs, rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| channel::<Msg>()).unzip();
    let units = [u0, u1];
    let device_threads: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(i, rx)| {
            let (sys, mem) = (sys.clone(), mem.clone());
            let (sid, unit) = (sids[i], units[i]);
            std::thread::spawn(move || device(sys, sid, unit, mem, rx))
        })
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let switcher = {
        let (d, stop) = (domain.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = if n.is_multiple_of(2) {
                    DmaPolicy::Deferred
                } else {
                    DmaPolicy::Strict
                };
                d.set_policy(p)
                    .expect("strict <-> deferred switches freely");
                n += 1;
                std::thread::sleep(Duration::from_micros(700));
            }
            n
        })
    };

    let live_iovas = Arc::new(Mutex::new(HashSet::new()));
    let cpu_threads: Vec<_> = (0..CPUS)
        .map(|c| {
            let (d, mem, live_iovas) = (domain.clone(), mem.clone(), live_iovas.clone());
            let devs = devs.clone();
            let txs = txs.clone();
            std::thread::spawn(move || {
                let mut cpu = d.cpu();
                let pool = mem.alloc_zeroed_frames(POOL.ilog2()).unwrap();
                let mut pending = Vec::new();
                for k in 0..MAPS_PER_CPU {
                    let page = pool + (k % POOL) * 4096;
                    let off = 8 * (k % 500);
                    let token = ((c as u64 + 1) << 48) | k;
                    mem.store_u64(page + off, token, Ordering::Release).unwrap();
                    let who = (k as usize + c) % 2;
                    let pages = 1 + k % 3;
                    let len = pages * 4096 - off;
                    let addr = cpu
                        .map(&devs[who], page + off, len, DmaDirection::Bidirectional)
                        .unwrap();
                    {
                        let mut set = live_iovas.lock().unwrap();
                        for p in 0..pages {
                            assert!(
                                set.insert((addr >> 12) + p),
                                "IOVA page {:#x} mapped twice",
                                (addr >> 12) + p
                            );
                        }
                    }
                    let (ack_tx, ack_rx) = channel();
                    txs[who]
                        .send(Msg::Live {
                            addr,
                            token,
                            ack: ack_tx,
                        })
                        .unwrap();
                    ack_rx.recv().unwrap();
                    {
                        let mut set = live_iovas.lock().unwrap();
                        for p in 0..pages {
                            set.remove(&((addr >> 12) + p));
                        }
                    }
                    let before = d.policy();
                    cpu.unmap(&devs[who], addr, len, DmaDirection::Bidirectional)
                        .unwrap();
                    if before == DmaPolicy::Strict && d.policy() == DmaPolicy::Strict {
                        // Strict: revoked when unmap returns. Both devices probe.
                        for tx in &txs {
                            tx.send(Msg::Revoked { addr, token }).unwrap();
                        }
                    } else {
                        pending.push((addr, token));
                    }
                    if pending.len() >= 8 {
                        // Deferred: revoked once a flush covering it is done.
                        cpu.flush_own().unwrap();
                        for (addr, token) in pending.drain(..) {
                            for tx in &txs {
                                tx.send(Msg::Revoked { addr, token }).unwrap();
                            }
                        }
                    }
                }
                cpu.flush_own().unwrap();
                for (addr, token) in pending.drain(..) {
                    for tx in &txs {
                        tx.send(Msg::Revoked { addr, token }).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in cpu_threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let switches = switcher.join().unwrap();
    drop(txs);
    let mut total_live = 0;
    for t in device_threads {
        let (live, probes) = t.join().unwrap();
        total_live += live;
        assert!(probes > 0);
    }
    assert_eq!(total_live, CPUS as u64 * MAPS_PER_CPU);
    assert!(switches >= 2, "the policy did switch during the run");
    assert_eq!(domain.stats().live(), 0, "every mapping was unmapped");
    assert!(live_iovas.lock().unwrap().is_empty());
}
