//! Bad input, one invocation of the binary per row: each exits with status
//! 2, prints one line on stderr that says what was wrong, prints nothing
//! on stdout, and starts no work (every row returns at once: the values
//! are refused while parsing, before any memory is reserved or thread
//! started).

use std::process::{Command, Output};

fn softiommu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softiommu"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the binary runs")
}

/// Asserts a refusal: status 2, nothing on stdout, and one stderr line
/// starting `softiommu: ` and containing `want`.
fn refused(args: &[&str], want: &str) {
    let out = softiommu(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
    assert!(lines[0].starts_with("softiommu: "), "{args:?}: {stderr}");
    assert!(
        lines[0].contains(want),
        "{args:?}: {:?} lacks {want:?}",
        lines[0]
    );
}

#[test]
fn numbers_that_cannot_be_durations_are_refused() {
    for v in ["inf", "nan", "1e300", "0", "-1", "-inf"] {
        refused(
            &["bench", "iova", &format!("--seconds={v}")],
            "is not a finite number in 0.01..=86400",
        );
    }
    refused(
        &["bench", "dma", "--seconds", "ten"],
        "\"ten\" is not a number",
    );
    refused(
        &["lab", "netperf-udp", "--seconds", "nan"],
        "for '--seconds <SECONDS>'",
    );
    refused(&["lab", "iova-aging", "--seconds", "1e300"], "0.01..=86400");
    refused(
        &["lab", "iperf-tcp", "--seconds", "inf"],
        "is not a finite number in 0.01..=86400",
    );
    refused(
        &["bench", "ring", "--seconds", "0"],
        "is not a finite number in 0.01..=86400",
    );
    refused(
        &["lab", "stress", "--seconds", "0.001"],
        "is not a finite number in 0.01..=86400",
    );
}

#[test]
fn sizes_and_counts_out_of_range_are_refused() {
    let rows: &[(&[&str], &str)] = &[
        (
            &["bench", "dma", "--granule", "18446744073709551615"],
            "is not in 1..=512",
        ),
        (&["bench", "dma", "--granule", "0"], "0 is not in 1..=512"),
        (
            &["bench", "translate", "--walk-pages", "4294967296"],
            "is not in 1..=1048576",
        ),
        (
            &["bench", "translate", "--hit-pages", "5000"],
            "5000 is not in 1..=4096",
        ),
        (
            &["bench", "iova", "--threads", "100000"],
            "100000 is not in 1..=256",
        ),
        (&["bench", "iova", "--threads", "0"], "0 is not in 1..=256"),
        (&["bench", "iova", "--rounds", "0"], "0 is not in 1..=1000"),
        (&["bench", "iova", "--live", "0"], "0 is not in 1..=1000000"),
        (
            &["bench", "dma", "--threads", "100000"],
            "is not in 1..=256",
        ),
        (
            &["bench", "dma", "--iters", "0"],
            "0 is not in 1..=1000000000",
        ),
        (&["bench", "access", "--ring", "0"], "0 is not in 1..=16384"),
        (
            &["bench", "access", "--buf-bytes", "0"],
            "0 is not in 1..=4096",
        ),
        (
            &["bench", "pgtable", "--rounds", "0"],
            "0 is not in 1..=1000",
        ),
        (
            &["lab", "netperf-udp", "--msg-size", "0"],
            "0 is not in 1..=32000",
        ),
        (
            &["lab", "netperf-udp", "--msg-size", "65536"],
            "65536 is not in 1..=32000",
        ),
        (
            &["lab", "netperf-udp", "--rounds", "0"],
            "0 is not in 1..=100",
        ),
        (
            &["lab", "netperf-udp", "--mtu", "100"],
            "100 is not in 576..=9000",
        ),
        (
            &["lab", "netperf-udp", "--line-rate-mbit", "99999999"],
            "99999999 is not in 0..=1000000",
        ),
        (
            &["lab", "netperf-udp", "--flush-high-water", "0"],
            "0 is not in 1..=65536",
        ),
        (
            &["lab", "netperf-udp", "--flush-timeout-ms", "0"],
            "0 is not in 1..=10000",
        ),
        (
            &["lab", "iperf-tcp", "--rounds", "101"],
            "101 is not in 1..=100",
        ),
        (
            &["lab", "iperf-tcp", "--mtu", "65536"],
            "65536 is not in 576..=9000",
        ),
        (
            &["lab", "iperf-tcp", "--write-size", "0"],
            "0 is not in 1..=1048576",
        ),
        (
            &["bench", "ring", "--msg-size", "0"],
            "0 is not in 1..=61440",
        ),
        (&["bench", "ring", "--ring", "0"], "0 is not in 2..=4096"),
        (&["bench", "ring", "--streams", "0"], "0 is not in 1..=16"),
        (&["bench", "ring", "--rounds", "0"], "0 is not in 1..=100"),
        (
            &["bench", "ring", "--flush-timeout-ms", "10001"],
            "10001 is not in 1..=10000",
        ),
        (&["lab", "iova-aging", "--jobs", "0"], "0 is not in 1..=256"),
        (
            &["lab", "iova-aging", "--windows", "7"],
            "7 is not in 8..=1000",
        ),
        (
            &["lab", "iova-aging", "--iodepth", "0"],
            "0 is not in 1..=4096",
        ),
        (
            &["lab", "iova-aging", "--slow-pct", "101"],
            "101 is not a finite number in 0..=100",
        ),
        (&["lab", "fio-aging", "--jobs", "0"], "0 is not in 1..=64"),
        (&["lab", "fio-aging", "--jobs", "65"], "65 is not in 1..=64"),
        (
            &["lab", "fio-aging", "--iodepth", "0"],
            "0 is not in 1..=1024",
        ),
        (
            &["lab", "fio-aging", "--iodepth", "100000"],
            "100000 is not in 1..=1024",
        ),
        (
            &["lab", "fio-aging", "--windows", "7"],
            "7 is not in 8..=10000",
        ),
        (
            &["lab", "fio-aging", "--seconds", "0"],
            "is not a finite number in 0.01..=86400",
        ),
        (
            &["lab", "fio-aging", "--bs", "4k:60,16k:30"],
            "block-size mix percentages sum to 90, not 100",
        ),
        (
            &["lab", "fio-aging", "--bs", "0"],
            "block size 0 is not a non-zero multiple of 512",
        ),
        (
            &["lab", "fio-aging", "--dma-bs", "1000"],
            "block size 1000 is not a non-zero multiple of 512",
        ),
        (
            &["lab", "fio-aging", "--bs", "4k:50,32m:50"],
            "block size 33554432 is not a non-zero multiple of 512 up to 16777216",
        ),
        (
            &["lab", "fio-aging", "--bs", "1g"],
            "block-size mix entry \"1g\": not a size (512, 4k, 1m)",
        ),
        (
            &["lab", "fio-aging", "--bs", "4k:sixty"],
            "not a whole percent",
        ),
        (
            &["lab", "fio-aging", "--slow-depth", "0"],
            "0 is not in 1..=10000",
        ),
        (
            &["lab", "fio-aging", "--slow-pct", "101"],
            "101 is not a finite number in 0..=100",
        ),
        (
            &["lab", "fio-aging", "--irq-cpus", "0"],
            "0 is not in 1..=64",
        ),
        (
            &["lab", "fio-aging", "--low-window-mib", "0"],
            "0 is not in 1..=4096",
        ),
        (
            &["lab", "fio-aging", "--low-window-mib", "4097"],
            "4097 is not in 1..=4096",
        ),
        (
            &["lab", "iova-aging", "--low-window-mib", "0"],
            "0 is not in 1..=4096",
        ),
        (
            &["lab", "fio-aging", "--disk-mib", "0"],
            "0 is not in 1..=65536",
        ),
        (&["lab", "fio-aging", "--backend", "file"], "--file <FILE>"),
        (
            &["lab", "fio-aging", "--file", "/tmp/x.img"],
            "--file and --direct are options of --backend file",
        ),
        (
            &["lab", "fio-aging", "--direct"],
            "--file and --direct are options of --backend file",
        ),
        (
            &["lab", "fio-aging", "--seconds", "0.08"],
            "--seconds must be at least 0.2",
        ),
        (
            &["lab", "fio-aging", "--bs", "4k:50,4k:50"],
            "a size named more than once",
        ),
        (
            &["lab", "fio-aging", "--bs", "4k:100,16k:0"],
            "a size at 0 percent",
        ),
        (
            &["lab", "fio-aging", "--backend", "tape"],
            "[possible values: null, memory, file]",
        ),
        (
            &["lab", "fio-aging", "--rw", "seqread"],
            "[possible values: randread, randwrite, randrw]",
        ),
        (
            &["lab", "litmus", "--runs", "0"],
            "0 is not in 1..=10000000000",
        ),
        (&["lab", "stress", "--slots", "0"], "0 is not in 1..=256"),
        (
            &["lab", "stress", "--slots", "257"],
            "257 is not in 1..=256",
        ),
        (
            &["lab", "stress", "--flush-timeout-ms", "0"],
            "0 is not in 1..=1000",
        ),
        (
            &["lab", "stress", "--flush-timeout-ms", "1001"],
            "1001 is not in 1..=1000",
        ),
        (&["lab", "stress", "--switching", "2"], "2 is not in 0..=1"),
        (&["lab", "stress", "--devices", "2"], "2 is not in 0..=1"),
        (
            &["lab", "stress", "--load-nice", "20"],
            "20 is not in 0..=19",
        ),
        (
            &["lab", "stress", "--seed", "4294967296"],
            "4294967296 is not in 0..=4294967295",
        ),
        (
            &["lab", "stress", "--seed=-1"],
            "-1 is not in 0..=4294967295",
        ),
        (
            &["lab", "iopf", "--msg-len", "0"],
            "0 is not in 4096..=268435456",
        ),
        (
            &["lab", "iopf", "--msg-len", "1048576,268439552"],
            "268439552 is not in 4096..=268435456",
        ),
        (
            &["lab", "iopf", "--msg-len", "5000"],
            "5000 is not a multiple of 4096",
        ),
        (
            &["lab", "iopf", "--times", "1,0"],
            "0 is not in 1..=1000000",
        ),
        (
            &["lab", "iopf", "--times", "1000001"],
            "1000001 is not in 1..=1000000",
        ),
        (
            &["lab", "iopf", "--premap-pages", "0"],
            "0 is not in 1..=262144",
        ),
        (
            &["lab", "iopf", "--premap-pages", "262145"],
            "262145 is not in 1..=262144",
        ),
        (
            &["lab", "iopf", "--handler-threads", "17"],
            "17 is not in 1..=16",
        ),
        (&["lab", "iopf", "--repeats", "0"], "0 is not in 1..=100"),
        (
            &["lab", "iopf", "--handler-spin", "67108865"],
            "67108865 is not in 0..=67108864",
        ),
        (
            &["lab", "iopf", "--times", "many"],
            "\"many\" is not a number",
        ),
        (&["bench", "iova", "--threads=-3"], "-3 is not in 1..=256"),
        (
            &["bench", "iova", "--threads", "1.5"],
            "\"1.5\" is not a whole number in 1..=256",
        ),
        (
            &["lab", "litmus", "--max-seconds", "0.5"],
            "\"0.5\" is not a whole number",
        ),
        (
            &["bench", "iova", "--threads", "many"],
            "\"many\" is not a number",
        ),
    ];
    for (args, want) in rows {
        refused(args, want);
    }
}

#[test]
fn unknown_names_in_lists_are_refused_with_the_valid_ones() {
    refused(
        &["bench", "iova", "--impls", "offset-allocator,nope"],
        "[possible values: softiommu, harness, softiommu-batch16, linux-2016, offset-allocator, range-alloc, vm-allocator, magazine-floor, owner-store-floor, contract-floor]",
    );
    refused(
        &["lab", "iopf", "--placement", "nowhere"],
        "[possible values: split, shared, os]",
    );
    refused(
        &["lab", "iopf", "--promote", "maybe"],
        "[possible values: on, off]",
    );
    refused(
        &["bench", "dma", "--policies", "strict,lazy"],
        "unknown DMA policy \"lazy\" (valid: passthrough, strict, deferred, bounce)",
    );
    refused(
        &["lab", "netperf-udp", "--policies", "nope"],
        "unknown DMA policy \"nope\"",
    );
    refused(
        &["lab", "stress", "--policies", "strict,lazy"],
        "unknown DMA policy \"lazy\" (valid: passthrough, strict, deferred, bounce)",
    );
    refused(
        &["lab", "iova-aging", "--policies", "linux-2099"],
        "unknown IOVA policy \"linux-2099\" (valid: ",
    );
    refused(
        &["lab", "netperf-udp", "--latency", "fast"],
        "[possible values: vtd-2015, zero]",
    );
    refused(
        &["lab", "netperf-udp", "--placement", "moon"],
        "[possible values: split, shared, os]",
    );
    refused(
        &["lab", "netperf-udp", "--ordering", "ordered,sloppy"],
        "unknown ordering \"sloppy\" (valid: relaxed, ordered, full)",
    );
    refused(
        &["lab", "iperf-tcp", "--walks", "coherent,sideways"],
        "[possible values: coherent, non-coherent]",
    );
    refused(
        &["lab", "iperf-tcp", "--policies", "strict,lazy"],
        "unknown DMA policy \"lazy\" (valid: passthrough, strict, deferred, bounce)",
    );
    refused(
        &["lab", "iperf-tcp", "--placement", "moon"],
        "[possible values: split, shared, os]",
    );
    refused(
        &["lab", "iperf-tcp", "--latency", "slow"],
        "[possible values: vtd-2015, zero]",
    );
    refused(
        &["bench", "ring", "--placement", "moon"],
        "[possible values: split, shared, os]",
    );
    refused(
        &["bench", "ring", "--policies", "nope"],
        "unknown DMA policy \"nope\"",
    );
    refused(
        &["bench", "dma", "--dir", "sideways"],
        "[possible values: to-device, from-device, bidirectional]",
    );
    refused(&["bogus"], "unrecognized subcommand 'bogus'");
    refused(
        &["bench", "iova", "--no-such-flag"],
        "unexpected argument '--no-such-flag'",
    );
}

#[test]
fn bad_scenarios_and_overrides_are_refused_naming_the_field_file_and_line() {
    let dir = std::env::temp_dir().join(format!("softiommu-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let unknown = write(
        "unknown.toml",
        "about = \"x\"\n\n[lab-litmus]\nruns = 4096\nrunz = 1\n",
    );
    refused(
        &["lab", &unknown],
        &format!("{unknown}:5: field `lab-litmus.runz`: unknown field `runz`"),
    );
    let typed = write("typed.toml", "[lab-netperf-udp]\nmsg_size = \"big\"\n");
    refused(
        &["lab", &typed],
        &format!("{typed}:2: field `lab-netperf-udp.msg_size`: invalid type"),
    );
    let range = write("range.toml", "[bench-iova]\n\nthreads = 100000\n");
    refused(
        &["lab", &range],
        &format!("{range}:3: field `bench-iova.threads`: 100000 is not in 1..=256"),
    );
    let walks = write(
        "walks.toml",
        "[lab-iperf-tcp]\nwalks = [\"coherent\", \"sideways\"]\n",
    );
    refused(
        &["lab", &walks],
        &format!("{walks}:2: field `lab-iperf-tcp.walks`: unknown variant `sideways`"),
    );
    let stream = write("stream.toml", "[lab-netperf-udp]\nstreams = 2\n");
    refused(
        &["lab", &stream],
        &format!("{stream}:2: field `lab-netperf-udp.streams`: unknown field `streams`"),
    );
    let malformed = write("malformed.toml", "[lab-litmus\nruns = 1\n");
    refused(&["lab", &malformed], &format!("{malformed}:1:"));
    let none = write("none.toml", "about = \"nothing\"\n");
    refused(
        &["lab", &none],
        "no bench or lab table (one of: bench-iova,",
    );
    refused(
        &["lab", "/no/such/scenario.toml"],
        "no scenario file \"/no/such/scenario.toml\"",
    );
    refused(
        &["lab", "litmus-ordering", "--set", "runz=5"],
        "--set runz=5: unknown field `runz`, expected one of `runs`, `max_seconds`, `quick`",
    );
    refused(
        &["lab", "litmus-ordering", "--set", "runs=0"],
        "--set runs=0: 0 is not in 1..=10000000000",
    );
    refused(
        &["lab", "page-faults", "--set", "msg_len=[5000]"],
        "5000 is not a multiple of 4096",
    );
    refused(
        &["lab", "page-faults", "--set", "premap_pages=[0]"],
        "0 is not in 1..=262144",
    );
    refused(
        &["lab", "litmus-ordering", "--set", "runs"],
        "--set \"runs\": expected KEY=VALUE",
    );
    refused(
        &["lab", "litmus-ordering", "--set", "nope.runs=1"],
        "unknown table in \"nope.runs\"",
    );
    refused(
        &["lab", "udp-32", "--set", "ordering=ordered,sloppy"],
        "unknown ordering \"sloppy\" (valid: relaxed, ordered, full)",
    );
    refused(
        &["lab", "tcp-64k", "--set", "mtu=50"],
        "--set mtu=50: 50 is not in 576..=9000",
    );
    refused(
        &["lab", "ring", "--set", "ring=1"],
        "--set ring=1: 1 is not in 2..=4096",
    );
    // The [quick] table is applied by --quick before the sets: a set of it
    // was taken and never used (exit 0, whatever its values).
    for q in ["quick={rounds=0}", "quick.rounds=0", "quick={bogus=1}"] {
        refused(
            &["lab", "ring", "--quick", "--set", q],
            "the [quick] table cannot be set",
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A list option repeats its work per value: a value named twice, on the
/// command line or in a scenario table, or a list longer than any run
/// needs, is refused before any work starts (a 1 MiB scenario file could
/// otherwise name one policy 50,000 times and run for hours).
#[test]
fn lists_that_repeat_a_value_or_run_on_are_refused() {
    let rows: &[(&[&str], &str)] = &[
        (
            &["bench", "dma", "--policies", "strict,deferred,strict"],
            "--policies names strict more than once; a list takes each value once",
        ),
        (
            &["bench", "iova", "--impls", "harness,harness"],
            "--impls names harness more than once",
        ),
        (
            &["lab", "netperf-udp", "--ordering", "full,full"],
            "--ordering names full more than once",
        ),
        (
            &["lab", "iperf-tcp", "--walks", "coherent,coherent"],
            "--walks names coherent more than once",
        ),
        (
            &["lab", "iopf", "--times", "1,100,1"],
            "--times names 1 more than once",
        ),
        (
            &["lab", "fio-aging", "--dma-policies", "strict,strict"],
            "--dma-policies names strict more than once",
        ),
        (
            &["lab", "stress", "--policies", "deferred,deferred"],
            "--policies names deferred more than once",
        ),
        (
            &[
                "run",
                "--scenarios",
                "translate,translate",
                "--db",
                "/nonexistent/softiommu.db",
            ],
            "--scenarios names translate more than once",
        ),
    ];
    for (args, want) in rows {
        refused(args, want);
    }
    let many = (1..=65)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    refused(
        &["lab", "iopf", "--times", &many],
        "--times has 65 values, more than the 64 a list takes",
    );

    let dir = std::env::temp_dir().join(format!("softiommu-lists-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("repeats.toml");
    let policies = vec!["\"strict\""; 50_000].join(",");
    std::fs::write(
        &file,
        format!("name = \"x\"\n[bench-dma]\nseconds = 0.01\npolicies = [{policies}]\n"),
    )
    .unwrap();
    let started = std::time::Instant::now();
    refused(
        &["lab", file.to_str().unwrap()],
        "--policies has 50000 values, more than the 64 a list takes",
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    std::fs::write(
        &file,
        "name = \"x\"\n[lab-iova-aging]\npolicies = [\"linux-2016\", \"linux-2016\"]\n",
    )
    .unwrap();
    refused(
        &["lab", file.to_str().unwrap()],
        "--policies names linux-2016 more than once",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--dma-seconds` is documented as 0.1..=86400; below the floor it is
/// refused before any work, on the command line and in a scenario table
/// (the duration type alone takes 0.01).
#[test]
fn a_cost_part_shorter_than_its_documented_floor_is_refused() {
    for v in ["0.09", "0.01"] {
        refused(
            &["lab", "fio-aging", "--dma-seconds", v],
            "lab set-up: --dma-seconds must be at least 0.1",
        );
    }
    refused(
        &["lab", "storage-aging", "--set", "dma_seconds=0.05"],
        "--dma-seconds must be at least 0.1",
    );
}

/// A path or value with a newline (or another control character) in it
/// is named escaped, so that the refusal stays one line on stderr.
#[test]
fn paths_and_values_with_newlines_are_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("softiommu-nl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sub = dir.join("a\nb");
    std::fs::create_dir_all(&sub).unwrap();
    let sub_s = sub.to_str().unwrap();
    let shown = sub_s.replace('\n', "\\n");
    refused(
        &["lab", sub_s],
        &format!("cannot read scenario {shown}: Is a directory"),
    );
    let missing = dir.join("no\nne.db");
    refused(
        &["history", "--db", missing.to_str().unwrap()],
        &format!(
            "no results database at {}",
            missing.to_str().unwrap().replace('\n', "\\n")
        ),
    );
    refused(&["report", "--db", missing.to_str().unwrap()], "no\\nne.db");
    refused(
        &["lab", "iova-alloc", "--set", "threads=a\nb"],
        "--set threads=a\\nb: invalid type",
    );
    refused(
        &["lab", "iova-alloc", "--set", "thr\u{1b}[2Jeads=1"],
        "thr\\u{1b}[2Jeads",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A command given without its subcommand names the ones it takes, not
/// the first line of its help.
#[test]
fn a_missing_subcommand_is_named_with_the_valid_ones() {
    refused(
        &[],
        "softiommu: softiommu needs a subcommand (bench, lab, run, history, compare, report); see `softiommu --help`",
    );
    refused(
        &["bench"],
        "softiommu: softiommu bench needs a subcommand (iova, pgtable, dma, translate, access, ring); see `softiommu bench --help`",
    );
}

/// Help or a version that cannot be written (`> /dev/full`) is no
/// success: exit 1 and one line on stderr (before: exit 0, nothing said).
#[test]
fn help_that_cannot_be_written_is_a_failure() {
    for args in [&["--help"][..], &["-V"], &["lab", "litmus", "--help"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_softiommu"))
            .args(args)
            .stdout(std::fs::File::create("/dev/full").expect("/dev/full"))
            .output()
            .expect("the binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("cannot write to standard output"),
            "{stderr}"
        );
    }
}
