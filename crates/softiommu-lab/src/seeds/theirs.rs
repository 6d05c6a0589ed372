//! The tables the seeds printed, as data (their hardware, their kernel):
//! the HTML report shows each beside ours. Sources: `shared/seeds/` and
//! the mission's "Figures from the seeds".

use crate::report::{Cell, Column, Table, Unit};

fn theirs(key: &str, label: &str, unit: Unit, decimals: u8) -> Column {
    Column::metric(key, label, unit, decimals).theirs()
}

/// The seed's own table, if it printed one.
pub fn their_table(seed: &str) -> Option<Table> {
    match seed {
        "000" => {
            let mut t = Table::new(
                "theirs",
                "seed 000 (2008): 32-byte UDP stream, netperf; throughput in the units the thread printed, CPU %; service demand = CPU % / throughput, relative to no IOMMU",
                vec![
                    Column::label("policy"),
                    theirs("throughput", "throughput (as printed)", Unit::Count, 0),
                    theirs("cpu_pct", "CPU", Unit::PercentCpu, 0),
                    theirs("vs_none", "service demand vs none", Unit::Ratio, 2),
                ],
            );
            let none = 42.0 / 74.0;
            for (p, x, c) in [
                ("none (no IOMMU)", 74.0, 42.0),
                ("strict", 73.0, 75.0),
                ("array batched (deferred)", 72.0, 62.0),
            ] {
                t.row(vec![
                    p.into(),
                    Cell::Num(x),
                    Cell::Num(c),
                    Cell::Num(c / x / none),
                ]);
            }
            Some(t)
        }
        "001" => {
            let mut t = Table::new(
                "theirs",
                "seed 001 (2012): netperf TCP_STREAM to an emulated e1000, mean of 4 runs each; \"all in the noise\"",
                vec![
                    Column::label("accessors"),
                    theirs("mbit_s", "throughput", Unit::Count, 1),
                    theirs("vs_none", "cost vs no barrier", Unit::Ratio, 3),
                ],
            );
            let none = (880.31 + 876.73 + 880.73 + 878.63) / 4.0;
            for (p, x) in [
                ("no barrier", none),
                ("barrier", (869.39 + 864.99 + 886.13 + 872.90) / 4.0),
                ("barrier + map", (867.45 + 868.51 + 888.94 + 888.19) / 4.0),
            ] {
                t.row(vec![p.into(), Cell::Num(x), Cell::Num(none / x)]);
            }
            Some(t)
        }
        "002" => {
            let mut t = Table::new(
                "theirs",
                "seed 002 (2021): speed with IOPF / without, and page faults",
                vec![
                    Column::label("msg_len"),
                    Column::label("premap_pages"),
                    Column::label("times"),
                    theirs("ratio_pct", "with / without", Unit::Percent, 1),
                    theirs("faults", "faults", Unit::Count, 0),
                ],
            );
            for (l, p, n, r, f) in [
                ("1 MB", "1", "1", 36.6, 518.0),
                ("1 MB", "1", "100", 77.1, 1058.0),
                ("1 MB", "1", "1000", 97.4, 1071.0),
                ("1 MB", "1", "5000", 99.1, 1216.0),
                ("10 MB", "512", "1", 67.4, 13.0),
                ("10 MB", "512", "100", 96.5, 26.0),
                ("10 MB", "512", "1000", 98.4, 26.0),
            ] {
                t.row(vec![
                    l.into(),
                    p.into(),
                    n.into(),
                    Cell::Num(r),
                    Cell::Num(f),
                ]);
            }
            Some(t)
        }
        "003" => {
            let mut t = Table::new(
                "theirs",
                "seed 003 (2013): be2net TCP with the IOMMU's walk not cache-coherent (clflush_cache_range 5.86 % of CPU)",
                vec![
                    Column::label("stream"),
                    theirs("coherent", "without flushing", Unit::Count, 0),
                    theirs("non_coherent", "with flushing", Unit::Count, 0),
                    theirs("ratio", "ratio", Unit::Ratio, 2),
                ],
            );
            for (s, a, b) in [
                ("unidirectional (Mbit/s)", 7908.0, 4380.0),
                ("bidirectional (Mbit/s)", 5464.0, 2915.0),
            ] {
                t.row(vec![s.into(), Cell::Num(a), Cell::Num(b), Cell::Num(b / a)]);
            }
            Some(t)
        }
        "004" => {
            let mut t = Table::new(
                "theirs",
                "seed 004 (2020): 12 fio jobs, 4 KiB random reads, non-strict mode",
                vec![
                    Column::label("when"),
                    theirs("gb_s_low", "GB/s low", Unit::Count, 1),
                    theirs("gb_s_high", "GB/s high", Unit::Count, 1),
                ],
            );
            t.row(vec!["start".into(), Cell::Num(6.0), Cell::Num(6.7)]);
            t.row(vec![
                "after ~16 h (never recovers)".into(),
                Cell::Num(1.3),
                Cell::Num(2.7),
            ]);
            Some(t)
        }
        _ => None,
    }
}
