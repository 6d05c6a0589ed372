//! Tests of `lab guest`.

use softiommu_vhost::guest::{GuestError, GuestRun, IommuMode};

use super::args::*;
use super::run::*;

use softiommu_vhost::guest::HostSide;
use softiommu_vhost::peer::PeerReport;
use softiommu_vhost::{IotlbStats, SessionEnd, SessionReport};

fn net_run(mode: IommuMode, invalidations: u64) -> GuestRun {
    let line = "ok=1 sent=s got=g send_ms=1000 recv_ms=1000";
    let (_, _, wire) = softiommu_virtio::net::wire(Default::default());
    GuestRun {
        device: "virtio-net",
        mode,
        result: line.into(),
        fields: line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        dmesg: Vec::new(),
        report: Some(SessionReport {
            end: SessionEnd::Disconnected,
            iotlb: IotlbStats {
                updates: 400,
                invalidations,
                misses: 400,
                ..Default::default()
            },
            blk: Default::default(),
            net: softiommu_vhost::NetStats {
                tx_frames: 60,
                rx_frames: 40,
                worker_cpu_ns: 150_000,
                ..Default::default()
            },
            rejected_messages: 0,
            last_rejection: None,
            acked_features: 0,
            session_cpu_ns: 50_000,
            fds: Default::default(),
            timing: Default::default(),
        }),
        host: HostSide::Net {
            peer: PeerReport {
                received: 1,
                received_sha256: Some("s".into()),
                sent: 1,
                sent_sha256: Some("g".into()),
                timed_out: false,
            },
            wire,
        },
        wall_seconds: 3.0,
        sched: Default::default(),
    }
}

/// A virtio-net run is a row of its own: frames as I/Os, the device's
/// CPU per frame, its guest time marked as TCG time.
#[test]
fn a_net_run_is_a_row_with_frames_as_ios_and_device_cpu_per_io() {
    let j = row_json(&net_run(IommuMode::Lazy, 20));
    assert_eq!(j["device"], "virtio-net");
    assert_eq!(j["mode"], "lazy");
    assert_eq!(j["ios"], 100);
    assert_eq!(j["io"], "frame (tx + rx)");
    assert_eq!(j["iotlb_invalidations"], 20);
    assert_eq!(j["invalidations_per_io"], 0.2);
    assert_eq!(j["device_cpu_us_per_io"], 2.0);
    assert_eq!(j["guest_seconds"], 2.0);
    assert_eq!(j["guest_seconds_basis"], "tcg");
    assert_eq!(j["checksum_ok"], true);
    let rows = vec![
        row_json(&net_run(IommuMode::Strict, 200)),
        row_json(&net_run(IommuMode::Lazy, 20)),
    ];
    assert_eq!(lazy_over_strict(&rows, "virtio-net"), Some(0.1));
    assert_eq!(lazy_over_strict(&rows, "virtio-blk"), None);
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[1.0, 2.0]), Some(1.5));
    assert_eq!(median(&[]), None);
}

/// The invalidation ratio is the median of each round's own lazy/strict
/// ratio (not the ratio of the median-time runs), and a checksum mismatch
/// in any round is reported, not only in the median runs.
#[test]
fn ratios_are_per_round_medians_and_every_round_is_checksummed() {
    let strict = vec![
        net_run(IommuMode::Strict, 200),
        net_run(IommuMode::Strict, 400),
        net_run(IommuMode::Strict, 100),
    ];
    let lazy = vec![
        net_run(IommuMode::Lazy, 20),
        net_run(IommuMode::Lazy, 20),
        net_run(IommuMode::Lazy, 20),
    ];
    let per_round = per_round_lazy_over_strict(&[strict, lazy], "virtio-net");
    assert_eq!(per_round, vec![0.1, 0.05, 0.2]);
    assert_eq!(median(&per_round), Some(0.1));
    let mut bad = net_run(IommuMode::Lazy, 20);
    bad.result = "ok=0 sent=s got=x".into();
    bad.fields.insert("got".into(), "x".into());
    let good = net_run(IommuMode::Strict, 200);
    assert!(good.checksum_ok());
    assert!(!bad.checksum_ok());
    let lines = checksum_failures([&good, &bad].into_iter());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("virtio-net lazy: checksum mismatch"),
        "{lines:?}"
    );
}

/// Three rounds by default, one with `--quick`, as given otherwise.
#[test]
fn three_rounds_by_default_one_when_quick() {
    let mut a = GuestArgs::default();
    assert_eq!(a.rounds(), 3);
    a.quick = true;
    assert_eq!(a.rounds(), 1);
    a.rounds = Some(crate::args::Ranged::new(5));
    assert_eq!(a.rounds(), 5);
}

/// Without the kit the lab still reports: one line saying it was
/// skipped, why and how to get the kit, and a contract saying so
/// (which `run` turns into the scenario's one progress line).
#[test]
fn a_missing_kit_is_one_skipped_line_not_a_silent_pass() {
    let mut lines = Vec::new();
    let rep = run_with(
        &GuestArgs::default(),
        Err(GuestError::NotInstalled {
            dir: "/nowhere".into(),
        }),
        &mut |l| lines.push(l.to_string()),
    )
    .expect("a skip is a report");
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(rep.notes.len(), 1, "{:?}", rep.notes);
    assert!(
        rep.notes[0].starts_with("lab guest skipped: no guest kit at /nowhere")
            && rep.notes[0].contains("scripts/guest-kit.sh"),
        "{:?}",
        rep.notes
    );
    let why = crate::cmd::run::skipped_why(&rep).expect("skipped");
    assert!(why.contains("scripts/guest-kit.sh"), "{why}");
    assert!(rep.tables.is_empty());
    assert!(crate::validity::invalid(&rep).is_none());
}

/// The autogroup file's nice value is read from its `nice V` field; a
/// raise to a value no lower than the current one is not made, and says
/// why (so the JSON never claims a raise that did not happen); a group
/// file that cannot be read falls back to the thread's nice.
#[test]
fn priority_reads_the_autogroup_nice_and_never_claims_a_raise_it_did_not_make() {
    use super::priority::{autogroup_nice, plan, Plan, Priority};
    assert_eq!(autogroup_nice("/autogroup-586 nice 0\n"), Some(0));
    assert_eq!(autogroup_nice("/autogroup-7 nice -10"), Some(-10));
    assert_eq!(autogroup_nice("/autogroup-7 weight 3"), None);
    assert_eq!(autogroup_nice(""), None);
    let group = Some("/autogroup-7 nice 0\n");
    assert_eq!(plan(-10, true, group, 0), Plan::Autogroup { old: 0 });
    assert_eq!(
        plan(-10, true, Some("/autogroup-7 nice -10"), 0),
        Plan::Not("autogroup nice already -10".into())
    );
    // Autogroups on but this process in no autogroup of its own (its file
    // is empty), or the file unreadable or garbled: the thread.
    assert_eq!(plan(-10, true, Some(""), 0), Plan::Thread { old: 0 });
    assert_eq!(plan(-10, true, None, 0), Plan::Thread { old: 0 });
    assert_eq!(plan(-10, true, Some("garbage"), 5), Plan::Thread { old: 5 });
    // Autogroups off: the group's text is not consulted.
    assert_eq!(plan(-10, false, group, 0), Plan::Thread { old: 0 });
    assert_eq!(
        plan(-10, false, None, -12),
        Plan::Not("nice already -12".into())
    );
    // On this machine, whatever it offers: nice 19 is the lowest priority,
    // never below the current one, so nothing is raised and the reason says so.
    let p = Priority::raise(19);
    assert_eq!(p.how, None);
    assert!(
        p.why.as_deref().is_some_and(|w| w.contains("already")),
        "{:?}",
        p.why
    );
}

/// Each round's figures come with their spread: `[min, max]` of the
/// rounds' ratios.
#[test]
fn the_spread_is_min_and_max_of_the_rounds() {
    assert_eq!(spread(&[1.1, 0.9, 1.3]), vec![0.9, 1.3]);
    assert_eq!(spread(&[]), Vec::<f64>::new());
}
