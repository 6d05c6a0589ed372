use std::time::Duration;

use softiommu::dma::DmaPolicy;
use softiommu::iova::IovaPolicy;
use softiommu_virtio::workload::fio::{run_fio, FioConfig, FioResult, MIN_WINDOW};

use crate::args::{iova_policies, Percent, Ranged, Seconds};
use crate::error::{LabError, LabResult};
use crate::metrics::aging::{AgingSummary, PairedSeries, VsFresh};
use crate::report::Report;

use super::args::{
    cost_policies, host, low_window_mib, rate_iops, slow_depth, slow_tail, BackendName,
    FioAgingArgs, SlowSizes,
};
use super::out::{AgingPolicy, DmaCost, FioAgingReport, FioWindowOut};
use super::render::report;

/// The deferred-flush timeout of the aging part, the longest the domain
/// takes (`softiommu::dma::MAX_TIMEOUT`, 60 s): each interrupt CPU's
/// flush queue is flushed when it holds 256 entries (Linux's
/// `IOVA_FQ_SIZE`), inside the completion that filled it, at any request
/// rate the lab sees (an interrupt CPU completing 1,000 requests a second
/// fills its queue in a quarter of a second). With Linux's 10 ms a queue
/// is flushed by the timer when its oldest entry ages out, with fewer
/// entries the slower the requests come, so the flush's fixed cost per
/// request follows the device's pace; measured, the driver's CPU per
/// request moved 0.7-2.7 µs with it (9 k-33 k IOPS) while the allocator's
/// state did not change. With 2 s the timer still flushed every second,
/// 2-10 ms of CPU in one window of four, beside 7 ms of request work.
pub const AGING_FLUSH_TIMEOUT: Duration = softiommu::dma::MAX_TIMEOUT;

/// Why a run's figures do not measure its policy: requests the device
/// failed, or reads whose data was wrong. `None` when there were none.
pub(super) fn failed_work(io_errors: u64, verify_failures: u64) -> Option<String> {
    let mut why = Vec::new();
    if io_errors > 0 {
        why.push(format!(
            "{io_errors} I/O error(s): the back-end failed requests (a file that shrank or failed under the run), so throughput and aging are not the policy's"
        ));
    }
    if verify_failures > 0 {
        why.push(format!("{verify_failures} read(s) returned wrong data"));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

pub(super) fn fio_err(
    run: String,
) -> impl FnOnce(softiommu_virtio::workload::fio::FioError) -> LabError {
    move |source| LabError::Fio { run, source }
}

pub(super) fn windows_out(
    r: &FioResult,
    rates: &[f64],
    paired: &PairedSeries,
) -> Vec<FioWindowOut> {
    r.windows
        .iter()
        .zip(rates)
        .enumerate()
        .map(|(i, (w, &rate))| FioWindowOut {
            t_s: w.t_s,
            iops: w.iops,
            driver_cpu_s: w.driver_cpu_s,
            work_cpu_us_per_req: w.work_cpu_us_per_req,
            submit_cpu_us_per_req: w.submit_cpu_us_per_req,
            reap_cpu_us_per_req: w.reap_cpu_us_per_req,
            timer_cpu_s: w.timer_cpu_s,
            iops_per_cpu_s: rate,
            fresh_ops: w.fresh_ops,
            fresh_cpu_s: w.fresh_cpu_s,
            fresh_iops_per_cpu_s: paired.fresh.get(i).copied().unwrap_or(f64::NAN),
            vs_fresh: paired.ratio.get(i).copied().unwrap_or(f64::NAN),
            gbps: w.gbps,
            errors: w.errors,
            tree_allocs: w.tree_allocs,
            tree_frees: w.tree_frees,
            magazines_freed: w.magazines_freed,
            tree_nodes: w.tree_nodes,
            cached_iovas: w.cached_iovas,
            table_pages: w.table_pages,
            tables_allocated: w.tables_allocated,
        })
        .collect()
}

/// The headline figure of an aging run: its requests per driver
/// CPU-second against its fresh control arm's, window by window
/// (`VsFresh`), with the series it was taken on. A fresh arm that ran in
/// too few windows (a debug build of a slow policy) gives no paired
/// figure: null, the aged arm's own figures beside.
pub(super) fn paired_figure(r: &FioResult) -> (VsFresh, PairedSeries) {
    VsFresh::of_or_absent(
        &r.work_windows(),
        &r.fresh_work_windows(),
        r.window_s,
        r.runtime_s,
    )
}

/// The shortest cost part per DMA policy, seconds (`--dma-seconds`).
const MIN_DMA_SECONDS: f64 = 0.1;

/// The shortest aging run per policy, seconds.
const MIN_AGING_SECONDS: f64 = 0.2;

/// Runs the lab; `progress` hears of each run as it finishes.
pub fn run(args: &FioAgingArgs, mut progress: impl FnMut(&str)) -> LabResult<Report> {
    let rw = args.rw.mode();
    let bs = args.bs.sizes.clone();
    let dma_bs = args.dma_bs.sizes.clone();
    if matches!(args.backend, BackendName::File) && args.file.is_none() {
        return Err(LabError::Setup(
            "--backend file needs --file PATH (an existing file)",
        ));
    }
    // The file's options without the file back-end would be dropped
    // unsaid (the run would read `null`).
    if args.backend != BackendName::File && (args.file.is_some() || args.direct) {
        return Err(LabError::Setup(
            "--file and --direct are options of --backend file",
        ));
    }
    let seconds = args
        .seconds
        .map_or(if args.quick { 6.0 } else { 60.0 }, Seconds::get);
    // At 0.08 s (eight 10 ms windows) the jobs' start-up took the run:
    // "no throughput after the warm-up", three runs of three; 0.2 s
    // measured six of six.
    if seconds < MIN_AGING_SECONDS {
        return Err(LabError::Setup(
            "--seconds must be at least 0.2 (eight windows past the jobs' start-up)",
        ));
    }
    // Windows of at least the fio engine's 10 ms, and at least 8 of them.
    let n_windows = args
        .windows
        .map_or(if args.quick { 24 } else { 120 }, Ranged::us)
        .min((seconds / MIN_WINDOW.as_secs_f64()) as usize);
    if n_windows < 8 {
        return Err(LabError::Setup(
            "--windows: 8 windows of at least 10 ms (fewer fit in --seconds)",
        ));
    }
    let window = Duration::from_secs_f64(seconds / n_windows as f64);
    let dma_seconds = args
        .dma_seconds
        .map_or(if args.quick { 1.5 } else { 10.0 }, Seconds::get);
    // The documented floor of the cost part: the option's type takes
    // 0.01, as every duration does.
    if dma_seconds < MIN_DMA_SECONDS {
        return Err(LabError::Setup("--dma-seconds must be at least 0.1"));
    }
    let slow_hold = args.slow_hold.map_or(seconds, Seconds::get);
    let jobs = args.jobs.us();
    let dma = cost_policies(args);

    // The aging part's configuration, checked before anything runs.
    let tail = slow_tail(args, jobs, slow_hold, &bs);
    let aging_cfg = FioConfig {
        jobs,
        iodepth: args.iodepth.us(),
        rw,
        bs,
        runtime: Duration::from_secs_f64(seconds),
        window,
        irq_cpus: Some(args.irq_cpus.us()),
        slow: tail,
        sample_work: true,
        flush_timeout: Some(AGING_FLUSH_TIMEOUT),
        rate_iops: rate_iops(args),
        fresh_arm: true,
        ..FioConfig::default()
    };
    aging_cfg
        .check()
        .map_err(fio_err("fio-aging".to_string()))?;

    // Part 1: the cost of each DMA policy on the seed's 4 KiB random reads.
    let cost_cfg = FioConfig {
        jobs,
        iodepth: args.iodepth.us(),
        rw,
        bs: dma_bs,
        runtime: Duration::from_secs_f64(dma_seconds),
        window: Duration::from_secs_f64(dma_seconds / 4.0)
            .clamp(MIN_WINDOW, Duration::from_secs_f64(dma_seconds)),
        ..FioConfig::default()
    };
    let mut costs: Vec<DmaCost> = Vec::new();
    for p in dma {
        let run = format!("fio-aging {}", p.name());
        let r = run_fio(&host(args, p, IovaPolicy::Softiommu)?, &cost_cfg).map_err(fio_err(run))?;
        progress(&format!(
            "{}: {:.0} IOPS, {:.2} µs/req",
            p.name(),
            r.iops,
            r.driver_cpu_us_per_req
        ));
        costs.push(DmaCost {
            policy: p.name().to_string(),
            iops: r.iops,
            gbps: r.gbps,
            driver_cpu_us_per_req: r.driver_cpu_us_per_req,
            flush_timer_cpu_us_per_req: r.flush_timer_cpu_us_per_req,
            device_cpu_us_per_req: r.device_cpu_us_per_req,
            cpu_ratio_to_passthrough: None,
            io_errors: r.io_errors,
            verify_failures: r.verify_failures,
            valid: failed_work(r.io_errors, r.verify_failures).is_none(),
            why: failed_work(r.io_errors, r.verify_failures),
        });
    }
    let pt = costs
        .iter()
        .find(|c| c.policy == DmaPolicy::Passthrough.name())
        .map(|c| c.driver_cpu_us_per_req);
    for c in &mut costs {
        c.cpu_ratio_to_passthrough = pt.filter(|&b| b > 0.0).map(|b| c.driver_cpu_us_per_req / b);
    }

    // Part 2: aging per IOVA policy, deferred. The device threads of
    // both arms share one CPU: the fresh arm's devices are new threads
    // every life, placed afresh by the scheduler, while the aged one's
    // keep their place for seconds, so unpinned the two arms' devices sat
    // on their driver's core, or not, at different times, and the ratio
    // of the arms stepped with it (measured beside two busy loops, four
    // runs each: `retained_vs_fresh` 0.81, 0.94, 1.01, 1.07 unpinned;
    // 0.96, 0.98, 0.98, 1.01 pinned).
    let device_cpu = softiommu_virtio::affinity::allowed_cpus().last().copied();
    let mut out = Vec::new();
    for ip in iova_policies(&args.policies) {
        let run = format!("fio-aging {}", ip.name());
        let mut aged = host(args, DmaPolicy::Deferred, ip)?;
        aged.device.cpu = device_cpu;
        let r = run_fio(&aged, &aging_cfg).map_err(fio_err(run.clone()))?;
        let why = failed_work(r.io_errors, r.verify_failures);
        let work = r.work_windows();
        let (aging, rates) =
            match AgingSummary::of(&run, &r.iops_series(), &work, r.window_s, r.runtime_s) {
                Ok(a) => a,
                // Failed requests can leave no throughput to age: the
                // figure is absent (null), and the run is marked invalid
                // below.
                Err(_) if why.is_some() => (AgingSummary::absent(), vec![f64::NAN; work.len()]),
                Err(e) => return Err(e),
            };
        let (vs_fresh, paired) = paired_figure(&r);
        match &why {
            None => progress(&format!(
                "{} retained {:.2} vs a fresh arm, {:.2} per CPU-s alone (the fresh arm alone {:.2}: the machine), {:.2} wall",
                ip.name(),
                vs_fresh.retained_vs_fresh,
                aging.retained,
                vs_fresh.retained_fresh,
                aging.retained_wall
            )),
            Some(w) => progress(&format!("{} INVALID: {w}", ip.name())),
        }
        out.push(AgingPolicy {
            policy: ip.name().to_string(),
            aging,
            vs_fresh,
            fresh_lives: r.fresh_lives,
            iops: r.iops,
            gbps: r.gbps,
            driver_cpu_us_per_req: r.driver_cpu_us_per_req,
            flush_timer_cpu_us_per_req: r.flush_timer_cpu_us_per_req,
            work_cpu_us_per_req: r.work_cpu_us_per_req,
            io_errors: r.io_errors,
            verified: r.verified,
            verify_failures: r.verify_failures,
            valid: why.is_none(),
            why,
            peak_tree_nodes: r.iova.peak_tree_nodes,
            cached_iovas: r.iova.cached_iovas,
            scan_steps: r.iova.scan_steps,
            tree_allocs: r.iova.tree_allocs,
            tree_frees: r.iova.tree_frees,
            magazines_freed: r.iova.magazines_freed,
            windows: windows_out(&r, &rates, &paired),
        });
    }
    let why: Vec<String> = costs
        .iter()
        .filter_map(|c| c.why.as_ref().map(|w| format!("{} (cost): {w}", c.policy)))
        .chain(
            out.iter()
                .filter_map(|p| p.why.as_ref().map(|w| format!("{} (aging): {w}", p.policy))),
        )
        .collect();
    let rep = FioAgingReport {
        lab: "fio-aging",
        device: "virtio-blk",
        backend: args.backend.name(),
        jobs,
        iodepth: args.iodepth.us(),
        rw: rw.name(),
        bs: args.bs.text.clone(),
        irq_cpus: args.irq_cpus.us(),
        slow_pct: args.slow_pct.map(Percent::get),
        slow_per_s: tail.and_then(|t| t.per_s),
        slow_depth: slow_depth(args),
        slow_hold_s: slow_hold,
        slow_sizes: match args.slow_sizes {
            SlowSizes::Small => "small",
            SlowSizes::Mix => "mix",
        },
        low_window_mib: low_window_mib(args),
        low_window_first: !args.forcedac,
        seconds,
        rate_iops: rate_iops(args),
        window_s: window.as_secs_f64(),
        device_cpu,
        policies: out,
        dma: costs,
        valid: why.is_empty(),
        why: (!why.is_empty()).then(|| why.join("; ")),
    };
    Ok(report(&rep, args))
}
