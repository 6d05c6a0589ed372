//! The fio-like engine: a short run on the `null` back-end verifies its
//! reads against the sector pattern and reports a time line; a back-end
//! that fails is counted per job while the run goes on; every bad setting
//! is its own typed error.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use softiommu::dma::DmaPolicy;
use softiommu_virtio::blk::{
    BackendConfig, BackendError, BlkDeviceConfig, BlkDeviceError, BlkHostConfig, BlkHostError,
};
use softiommu_virtio::workload::fio::{run_fio, BlockSizes, FioConfig, FioError, RwMode, SlowTail};

fn host(backend: BackendConfig) -> BlkHostConfig {
    BlkHostConfig {
        policy: DmaPolicy::Deferred,
        mem_bytes: 512 << 20,
        bounce_bytes: 1 << 20,
        device: BlkDeviceConfig {
            backend,
            ..BlkDeviceConfig::default()
        },
        ..BlkHostConfig::default()
    }
}

fn quick() -> FioConfig {
    FioConfig {
        jobs: 3,
        iodepth: 8,
        runtime: Duration::from_millis(400),
        window: Duration::from_millis(100),
        threads: Some(2),
        verify_every: 4,
        ..FioConfig::default()
    }
}

#[test]
fn a_paced_run_submits_what_the_clock_earns_and_no_more() {
    // Three jobs at 300 requests a second each: about 900 IOPS, where the
    // unpaced run does tens of thousands; never a burst above the rate.
    let cfg = FioConfig {
        rate_iops: Some(300.0),
        runtime: Duration::from_millis(800),
        window: Duration::from_millis(200),
        ..quick()
    };
    let r = run_fio(&host(BackendConfig::default()), &cfg).expect("run");
    let want = 3.0 * 300.0;
    assert!(
        r.iops <= want * 1.15 && r.iops >= want * 0.5,
        "{} IOPS paced at {want}",
        r.iops
    );
    for w in &r.windows {
        assert!(w.iops <= want * 1.5, "{} IOPS in a window", w.iops);
    }
    assert_eq!((r.io_errors, r.verify_failures), (0, 0));
}

#[test]
fn a_null_run_verifies_its_reads_and_reports_windows() {
    let cfg = FioConfig {
        bs: BlockSizes::parse("4k:60,16k:20,64k:15,128k:5").unwrap(),
        irq_cpus: Some(2),
        ..quick()
    };
    let r = run_fio(&host(BackendConfig::default()), &cfg).expect("run");
    assert_eq!(r.backend, "null");
    assert_eq!(r.jobs.len(), 3);
    assert_eq!(r.windows.len(), 4);
    assert!(r.ops > 0 && r.iops > 0.0 && r.gbps > 0.0, "{r:?}");
    assert!(r.jobs.iter().all(|j| j.ops > 0 && j.reads == j.ops));
    assert!(r.verified > 0, "some reads were checked");
    assert_eq!(r.verify_failures, 0);
    assert_eq!(r.io_errors, 0);
    assert!(r.driver_cpu_us_per_req > 0.0 && r.device_cpu_us_per_req > 0.0);
    assert_eq!((r.threads, r.irq_cpus), (2, 2));
    let total: f64 = r.windows.iter().map(|w| w.iops).sum::<f64>() * r.window_s;
    assert!(
        total > 0.5 * r.ops as f64,
        "the windows account for the run"
    );
}

#[test]
fn randrw_on_memory_with_a_slow_tail_runs_both_kinds() {
    let cfg = FioConfig {
        rw: RwMode::RandRw { read_pct: 70 },
        slow: Some(SlowTail {
            pct: 5.0,
            per_s: None,
            depth: 4,
            hold: Duration::from_millis(50),
            mixed: false,
        }),
        ..quick()
    };
    let r = run_fio(&host(BackendConfig::Memory { capacity: 64 << 20 }), &cfg).expect("run");
    let (reads, writes): (u64, u64) = r
        .jobs
        .iter()
        .fold((0, 0), |(a, b), j| (a + j.reads, b + j.writes));
    assert!(
        reads > writes && writes > 0,
        "{reads} reads, {writes} writes"
    );
    assert!(r.jobs.iter().any(|j| j.slow_ops > 0));
    assert_eq!(r.verified, 0, "only null reads are checked");
}

#[test]
fn a_fresh_arm_runs_beside_the_jobs_on_devices_it_replaces_and_is_timed_apart() {
    // Unpaced, so each thread's fresh device serves its 400 requests per
    // job within the run more than once (two threads: two first lives).
    // How many lives fit depends on the machine's speed, not on what is
    // tested: a slow or shared machine gets a longer run (at most 8 s).
    let cfg_at = |ms: u64| FioConfig {
        bs: BlockSizes::parse("4k:60,16k:20,64k:15,128k:5").unwrap(),
        irq_cpus: Some(2),
        sample_work: true,
        fresh_arm: true,
        slow: Some(SlowTail {
            pct: 2.0,
            per_s: None,
            depth: 16,
            hold: Duration::from_secs(10),
            mixed: true,
        }),
        runtime: Duration::from_millis(ms),
        window: Duration::from_millis(500),
        ..quick()
    };
    let run = |ms: u64| run_fio(&host(BackendConfig::default()), &cfg_at(ms)).expect("run");
    let mut r = run(2000);
    for ms in [4000, 8000] {
        if r.fresh_lives >= 3 {
            break;
        }
        r = run(ms);
    }
    assert_eq!((r.io_errors, r.verify_failures), (0, 0), "{r:?}");
    assert!(r.fresh_lives >= 3, "{} fresh lives", r.fresh_lives);
    let fresh = r.fresh_work_windows();
    assert_eq!(fresh.len(), r.windows.len());
    // Every window past the first (which holds the first build and
    // warm-up) timed fresh requests.
    assert!(
        fresh[1..].iter().all(|w| w.ops > 0.0 && w.cpu_s > 0.0),
        "{fresh:?}"
    );
    // The aged jobs' own count and time are not the fresh arm's.
    assert!(r.windows.iter().all(|w| w.ops > 0 && w.driver_cpu_s > 0.0));
    assert!(r.jobs.iter().all(|j| j.ops > 0 && j.slow_ops > 0));
    // Without it: nothing of the kind.
    let r = run_fio(
        &host(BackendConfig::default()),
        &FioConfig {
            fresh_arm: false,
            ..cfg_at(2000)
        },
    )
    .expect("run");
    assert_eq!(r.fresh_lives, 0);
    assert!(r
        .windows
        .iter()
        .all(|w| w.fresh_ops == 0 && w.fresh_cpu_s == 0.0));
}

#[test]
fn a_slow_tail_of_the_mix_holds_full_size_requests_in_shared_pages() {
    // Every request is 64 KiB: a one-page slow slot could not take one.
    let cfg = FioConfig {
        bs: BlockSizes::parse("64k").unwrap(),
        slow: Some(SlowTail {
            pct: 20.0,
            per_s: None,
            depth: 16,
            hold: Duration::from_millis(50),
            mixed: true,
        }),
        ..quick()
    };
    let r = run_fio(&host(BackendConfig::default()), &cfg).expect("run");
    assert_eq!(r.io_errors, 0, "{r:?}");
    for j in &r.jobs {
        assert!(j.slow_ops > 0, "{j:?}");
        assert_eq!(j.bytes, j.ops * 65536, "slow requests are full size: {j:?}");
    }
    // Fast reads are still checked against the pattern; slow ones, whose
    // pages other slow requests share, are not.
    assert!(r.verified > 0);
    assert_eq!(r.verify_failures, 0);
}

#[test]
fn a_rate_based_slow_tail_sends_its_rate_whatever_the_percentage() {
    // 0 %: a percentage would send nothing; 250 a second per job does.
    let rate = 250.0;
    let cfg = FioConfig {
        slow: Some(SlowTail {
            pct: 0.0,
            per_s: Some(rate),
            depth: 1000,
            hold: Duration::from_secs(5),
            mixed: false,
        }),
        ..quick()
    };
    let r = run_fio(&host(BackendConfig::default()), &cfg).expect("run");
    let secs = cfg.runtime.as_secs_f64();
    for j in &r.jobs {
        // At most what the run and a second of set-up earn, and at most
        // one per three fast requests (which all completed: `ops`, the
        // slow ones being held past the end); at least a quarter of what
        // the run earns, unless the share was the bound (a slow machine).
        let sent = j.slow_ops as f64;
        let share = j.ops as f64 / 3.0 + 1.0;
        assert!(
            sent <= rate * (secs + 1.0) && sent <= share,
            "{sent} slow requests in {secs} s at {rate}/s: {j:?}"
        );
        assert!(
            sent >= (0.25 * rate * secs).min(share - 2.0),
            "{sent} slow requests in {secs} s at {rate}/s: {j:?}"
        );
    }
    assert_eq!(r.io_errors, 0);
}

/// An inotify descriptor watching `path` for reads (`IN_ACCESS`).
fn watch_reads(path: &std::path::Path) -> OwnedFd {
    // SAFETY: no pointer arguments; the result is checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(
        fd >= 0,
        "inotify_init1: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_ACCESS) };
    assert!(
        wd >= 0,
        "inotify_add_watch: {}",
        std::io::Error::last_os_error()
    );
    fd
}

/// Whether the watched file was read within `limit`.
fn read_within(fd: &OwnedFd, limit: Duration) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, valid for the call.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return true;
        }
        let interrupted = std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
        if !(n < 0 && interrupted && !left.is_zero()) {
            return false;
        }
    }
}

#[test]
fn backend_errors_are_counted_per_job_and_the_run_goes_on() {
    // The disk says 4 MiB; once the back-end has read from the file (so
    // it has opened it and checked its size) the file is cut to its first
    // half: reads past it fail (end of file), reads before it succeed.
    // Cut at a time instead, it could land before the open or between
    // the open and the size check on a loaded machine, and the back-end
    // refused the file as too small.
    let path =
        std::env::temp_dir().join(format!("softiommu-fio-{}-shrink.img", std::process::id()));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(4 << 20).unwrap();
    let cfg = host(BackendConfig::File {
        path: path.clone(),
        direct: false,
        size: Some(4 << 20),
    });
    let reads = watch_reads(&path);
    let shrink = std::thread::spawn(move || {
        let read = read_within(&reads, Duration::from_secs(60));
        if read {
            f.set_len(2 << 20).unwrap();
        }
        read
    });
    let r = run_fio(&cfg, &quick());
    let shrunk = shrink.join().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(shrunk, "the back-end never read the file");
    let r = r.expect("run");
    assert!(r.io_errors > 0, "{r:?}");
    assert!(r.ops > 0, "the run went on");
    assert!(r.jobs.iter().all(|j| j.io_errors > 0 && j.ops > 0));
}

#[test]
fn bad_settings_are_typed_errors() {
    let h = host(BackendConfig::default());
    let field = |cfg: FioConfig| match run_fio(&h, &cfg) {
        Err(FioError::OutOfRange { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(FioConfig { jobs: 0, ..quick() }), "jobs");
    for r in [0.0, f64::NAN, 2e7] {
        assert_eq!(
            field(FioConfig {
                rate_iops: Some(r),
                ..quick()
            }),
            "rate_iops"
        );
    }
    assert_eq!(
        field(FioConfig {
            flush_timeout: Some(Duration::from_secs(61)),
            ..quick()
        }),
        "flush_timeout_s"
    );
    assert_eq!(
        field(FioConfig {
            flush_timeout: Some(Duration::from_micros(99)),
            ..quick()
        }),
        "flush_timeout_s"
    );
    assert_eq!(
        field(FioConfig {
            jobs: 65,
            ..quick()
        }),
        "jobs"
    );
    assert_eq!(
        field(FioConfig {
            iodepth: 0,
            ..quick()
        }),
        "iodepth"
    );
    assert_eq!(
        field(FioConfig {
            iodepth: 1 << 20,
            ..quick()
        }),
        "iodepth"
    );
    assert_eq!(
        field(FioConfig {
            window: Duration::from_secs(5),
            ..quick()
        }),
        "window_s"
    );
    assert_eq!(
        field(FioConfig {
            threads: Some(9),
            ..quick()
        }),
        "threads"
    );
    let slow = |depth| {
        Some(SlowTail {
            pct: 1.0,
            per_s: None,
            depth,
            hold: Duration::from_millis(10),
            mixed: false,
        })
    };
    assert_eq!(
        field(FioConfig {
            slow: slow(10_001),
            ..quick()
        }),
        "slow_depth"
    );
    assert_eq!(
        field(FioConfig {
            iodepth: 1000,
            slow: slow(10_000),
            ..quick()
        }),
        "iodepth + slow_depth"
    );
    for bad in [-1.0, f64::NAN, 2e6] {
        assert_eq!(
            field(FioConfig {
                slow: slow(16).map(|t| SlowTail {
                    per_s: Some(bad),
                    ..t
                }),
                ..quick()
            }),
            "slow_per_s",
            "{bad}"
        );
    }
    assert!(matches!(
        run_fio(
            &h,
            &FioConfig {
                runtime: Duration::ZERO,
                ..quick()
            }
        ),
        Err(FioError::RuntimeZero)
    ));
    assert!(matches!(
        BlockSizes::parse("4k:60,16k:20,64k:15"),
        Err(FioError::MixSum { sum: 95 })
    ));
    assert!(matches!(
        BlockSizes::parse("4k:60,huge:40"),
        Err(FioError::MixSyntax { .. })
    ));
    assert!(matches!(
        BlockSizes::parse("0"),
        Err(FioError::BlockSize { bytes: 0, .. })
    ));
    assert!(matches!(
        BlockSizes::parse("1000"),
        Err(FioError::BlockSize { bytes: 1000, .. })
    ));
    assert!(matches!(
        BlockSizes::parse("64m"),
        Err(FioError::BlockSize { .. })
    ));
    // A file that cannot be opened, and one too small for the jobs.
    let missing = host(BackendConfig::File {
        path: "/nonexistent/softiommu.img".into(),
        direct: false,
        size: None,
    });
    assert!(matches!(
        run_fio(&missing, &quick()),
        Err(FioError::Host(BlkHostError::Device(
            BlkDeviceError::Backend(BackendError::Open { .. })
        )))
    ));
    let path = std::env::temp_dir().join(format!("softiommu-fio-small-{}.img", std::process::id()));
    std::fs::File::create(&path).unwrap().set_len(8192).unwrap();
    let small = host(BackendConfig::File {
        path: path.clone(),
        direct: false,
        size: None,
    });
    assert!(matches!(
        run_fio(&small, &quick()),
        Err(FioError::DiskTooSmall { capacity: 8192, .. })
    ));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn sampled_work_gives_each_window_its_cpu_per_request_and_the_flush_timer_is_driver_cpu() {
    let cfg = FioConfig {
        bs: BlockSizes::parse("4k:60,16k:20,64k:15,128k:5").unwrap(),
        irq_cpus: Some(2),
        sample_work: true,
        flush_timeout: Some(Duration::from_secs(2)),
        ..quick()
    };
    let r = run_fio(&host(BackendConfig::default()), &cfg).expect("run");
    assert_eq!(r.io_errors, 0);
    assert!(r.work_cpu_us_per_req > 0.0, "{r:?}");
    // The flush timer's CPU is inside the driver's, and reported apart.
    assert!(r.flush_timer_cpu_us_per_req >= 0.0);
    assert!(
        r.flush_timer_cpu_us_per_req < r.driver_cpu_us_per_req,
        "{r:?}"
    );
    for w in r.windows.iter().filter(|w| w.ops > 0) {
        assert!(w.work_cpu_us_per_req > 0.0, "{w:?}");
        // Requests at their sampled cost, the timer's CPU, and the
        // allocator's background work (never negative).
        let work = w.ops as f64 * w.work_cpu_us_per_req / 1e6;
        assert!(w.driver_cpu_s >= work + w.timer_cpu_s - 1e-12, "{w:?}");
        assert!(w.driver_cpu_s < work + w.timer_cpu_s + 0.05, "{w:?}");
    }
    // Without sampling the windows carry no per-request figure.
    let r = run_fio(
        &host(BackendConfig::default()),
        &FioConfig {
            sample_work: false,
            ..cfg
        },
    )
    .expect("run");
    assert!(r.windows.iter().all(|w| w.work_cpu_us_per_req == 0.0));
    assert_eq!(r.work_cpu_us_per_req, 0.0);
}
