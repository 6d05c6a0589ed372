//! Read-after-write through the whole storage path — driver `map_sg`,
//! rings, device workers, DMA through the unit, back-end — on the
//! `memory` and `file` back-ends, under every DMA policy; the `null`
//! back-end's pattern; `GET_ID` and `FLUSH`; several queues at once.

mod blk_common;

use std::time::Duration;

use blk_common::{complete, data, host};
use softiommu::dma::DmaPolicy;
use softiommu_virtio::blk::{device_id_string, BackendConfig, BlkDriverConfig, BlkOp};
use softiommu_virtio::spec::blk::S_OK;

const POLICIES: [DmaPolicy; 4] = [
    DmaPolicy::Passthrough,
    DmaPolicy::Strict,
    DmaPolicy::Deferred,
    DmaPolicy::Bounce,
];

/// Writes requests of 512 B to 128 KiB (multi-page scatter lists) at
/// scattered sectors, then reads each back and compares.
fn read_after_write(policy: DmaPolicy, backend: BackendConfig) {
    let h = host(policy, backend, 1);
    let mut d = h.driver(BlkDriverConfig::default()).expect("probe");
    let mut q = d.take_queue(0).expect("queue 0");
    q.bind_interrupt();
    let reqs: [(u64, usize); 6] = [
        (0, 512),
        (8, 4096),
        (100, 8192),
        (1000, 65536),
        (4096, 131072),
        (777, 12288),
    ];
    for &(sector, len) in &reqs {
        let w = data(sector, len);
        q.submit(BlkOp::Write, sector, len as u64, Some(&w))
            .expect("submit write")
            .expect("a free slot");
    }
    for (c, _) in complete(&mut q, reqs.len()) {
        assert_eq!(c.status, S_OK, "{policy:?}: write {c:?}");
    }
    for &(sector, len) in &reqs {
        q.submit(BlkOp::Read, sector, len as u64, None)
            .expect("submit read")
            .expect("a free slot");
    }
    let mut got = complete(&mut q, reqs.len());
    got.sort_by_key(|(c, _)| c.sector);
    let mut want: Vec<_> = reqs.to_vec();
    want.sort();
    for ((c, buf), (sector, len)) in got.iter().zip(want) {
        assert_eq!((c.status, c.sector, c.len), (S_OK, sector, len as u64));
        assert_eq!(c.used_len as usize, len + 1, "data and status written");
        assert!(buf == &data(sector, len), "{policy:?}: sector {sector}");
    }
    let s = h.device.stats();
    assert_eq!((s.writes, s.reads, s.request_errors), (6, 6, 0));
    assert!(h.take_faults().is_empty(), "no DMA fault");
    d.reset();
    q.release().expect("release");
}

#[test]
fn memory_backend_keeps_what_each_policy_wrote() {
    for p in POLICIES {
        read_after_write(p, BackendConfig::Memory { capacity: 64 << 20 });
    }
}

#[test]
fn file_backend_keeps_what_each_policy_wrote() {
    let path = std::env::temp_dir().join(format!("softiommu-blk-{}.img", std::process::id()));
    let f = std::fs::File::create(&path).expect("create");
    f.set_len(8 << 20).expect("size");
    drop(f);
    for p in POLICIES {
        read_after_write(
            p,
            BackendConfig::File {
                path: path.clone(),
                direct: false,
                size: None,
            },
        );
    }
    // The data is in the file, where the last policy's writes put it.
    let bytes = std::fs::read(&path).expect("read back");
    assert_eq!(&bytes[100 * 512..100 * 512 + 8192], &data(100, 8192)[..]);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn null_reads_the_sector_pattern_and_serves_get_id_and_flush() {
    let h = host(DmaPolicy::Deferred, BackendConfig::default(), 1);
    let mut d = h.driver(BlkDriverConfig::default()).expect("probe");
    assert_eq!(d.geometry().capacity_sectors, (1u64 << 40) / 512);
    assert!(d.geometry().flush);
    let mut q = d.take_queue(0).expect("queue");
    q.bind_interrupt();
    q.submit(BlkOp::Read, 123_456, 65536, None)
        .unwrap()
        .unwrap();
    q.submit(BlkOp::GetId, 0, 0, None).unwrap().unwrap();
    q.submit(BlkOp::Flush, 0, 0, None).unwrap().unwrap();
    let mut n = 0;
    let t0 = std::time::Instant::now();
    q.commit();
    while n < 3 {
        n += q
            .reap(None, |c, data| {
                assert_eq!(c.status, S_OK, "{c:?}");
                match c.op {
                    BlkOp::Read => {
                        assert_eq!(data.pattern_mismatch(123_456 * 512).unwrap(), None)
                    }
                    BlkOp::GetId => {
                        let mut id = [0u8; 20];
                        data.read(&mut id).unwrap();
                        assert_eq!(id, device_id_string(softiommu::hw::SourceId(0x0400)));
                        assert_eq!(c.used_len, 21);
                    }
                    BlkOp::Flush => assert_eq!(c.used_len, 1),
                    BlkOp::Write => unreachable!(),
                }
            })
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10));
        q.wait(Duration::from_millis(5)).unwrap();
    }
    assert_eq!(h.device.stats().flushes, 1);
    d.reset();
    q.release().unwrap();
}

#[test]
fn several_queues_run_at_once_on_their_own_threads() {
    let h = host(
        DmaPolicy::Strict,
        BackendConfig::Memory { capacity: 64 << 20 },
        4,
    );
    let mut d = h
        .driver(BlkDriverConfig {
            queues: 4,
            ..BlkDriverConfig::default()
        })
        .expect("probe");
    assert_eq!(d.queue_count(), 4);
    let queues = d.take_queues();
    let threads: Vec<_> = queues
        .into_iter()
        .map(|mut q| {
            std::thread::spawn(move || {
                q.bind_interrupt();
                // Each queue its own region of the disk.
                let base = u64::from(q.index()) * 16384;
                for round in 0..20u64 {
                    let sector = base + round * 16;
                    let w = data(sector, 8192);
                    q.submit(BlkOp::Write, sector, 8192, Some(&w))
                        .unwrap()
                        .unwrap();
                    q.submit(BlkOp::Read, sector, 8192, None).unwrap().unwrap();
                    // Reads may pass writes: wait for both, then read again.
                    let done = complete(&mut q, 2);
                    assert!(done.iter().all(|(c, _)| c.status == S_OK));
                    q.submit(BlkOp::Read, sector, 8192, None).unwrap().unwrap();
                    let (c, buf) = complete(&mut q, 1).remove(0);
                    assert_eq!(c.status, S_OK);
                    assert!(buf == w, "queue {} round {round}", q.index());
                }
                q
            })
        })
        .collect();
    let mut queues: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let s = h.device.stats();
    assert_eq!(s.writes, 80);
    assert_eq!(s.reads, 160);
    assert_eq!(h.device.workers(), 2);
    d.reset();
    for q in &mut queues {
        q.release().unwrap();
    }
}

#[test]
fn a_backend_error_completes_with_ioerr_and_is_counted() {
    let path = std::env::temp_dir().join(format!("softiommu-blk-err-{}.img", std::process::id()));
    let f = std::fs::File::create(&path).expect("create");
    f.set_len(1 << 20).expect("size");
    let h = host(
        DmaPolicy::Deferred,
        BackendConfig::File {
            path: path.clone(),
            direct: false,
            size: None,
        },
        1,
    );
    // The file shrinks under the device: reads past its new end fail.
    f.set_len(4096).expect("truncate");
    let mut d = h.driver(BlkDriverConfig::default()).expect("probe");
    let mut q = d.take_queue(0).expect("queue");
    q.bind_interrupt();
    q.submit(BlkOp::Read, 64, 4096, None).unwrap().unwrap();
    q.submit(BlkOp::Read, 0, 4096, None).unwrap().unwrap();
    let done = complete(&mut q, 2);
    let status = |sector| {
        done.iter()
            .find(|(c, _)| c.sector == sector)
            .unwrap()
            .0
            .status
    };
    assert_eq!(status(64), softiommu_virtio::spec::blk::S_IOERR);
    assert_eq!(status(0), S_OK, "the queue goes on");
    assert_eq!(h.device.stats().io_errors, 1);
    let log = h.device.request_log().drain();
    assert!(matches!(
        log[..],
        [softiommu_virtio::blk::RequestRecord {
            error: softiommu_virtio::blk::RequestError::Backend { op: "read", .. },
            ..
        }]
    ));
    d.reset();
    q.release().unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn small_slots_take_one_page_requests_and_refuse_larger_ones() {
    let h = host(DmaPolicy::Strict, BackendConfig::default(), 1);
    let mut d = h
        .driver(BlkDriverConfig {
            small_slots: 2,
            ..BlkDriverConfig::default()
        })
        .expect("probe");
    let mut q = d.take_queue(0).expect("queue");
    q.bind_interrupt();
    assert_eq!(q.depth(), 66);
    assert!(matches!(
        q.submit_small(BlkOp::Read, 0, 8192, None),
        Err(softiommu_virtio::blk::BlkDriverError::BadRequest {
            reason: "too large",
            ..
        })
    ));
    let a = q.submit_small(BlkOp::Read, 8, 4096, None).unwrap().unwrap();
    let b = q
        .submit_small(BlkOp::Read, 16, 4096, None)
        .unwrap()
        .unwrap();
    assert!(
        a >= 64 && b >= 64,
        "one-page slots come after the full ones"
    );
    assert_eq!(q.submit_small(BlkOp::Read, 24, 4096, None).unwrap(), None);
    assert_eq!(q.in_flight(), 2);
    let done = complete(&mut q, 2);
    assert!(done.iter().all(|(c, _)| c.is_ok()));
    assert_eq!(q.in_flight(), 0);
    d.reset();
    q.release().unwrap();
}
