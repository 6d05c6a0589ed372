//! Units: every figure the lab prints, stores or plots carries one.

use serde::{Deserialize, Serialize};

/// The unit of a figure. Serialised (JSON, the database) as its symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Unit {
    /// Nanoseconds.
    #[serde(rename = "ns")]
    Ns,
    /// Microseconds.
    #[serde(rename = "µs")]
    Us,
    /// Milliseconds.
    #[serde(rename = "ms")]
    Ms,
    /// Seconds.
    #[serde(rename = "s")]
    S,
    /// Microseconds of CPU time per packet (service demand).
    #[serde(rename = "µs/pkt")]
    UsPerPkt,
    /// Million packets per second.
    #[serde(rename = "Mpps")]
    Mpps,
    /// Thousand packets (or datagrams) per second.
    #[serde(rename = "kpps")]
    Kpps,
    /// Million operations per second.
    #[serde(rename = "M ops/s")]
    MopsPerS,
    /// Percent of one CPU's time.
    #[serde(rename = "%CPU")]
    PercentCpu,
    /// Percent.
    #[serde(rename = "%")]
    Percent,
    /// A ratio of two like figures.
    #[serde(rename = "×")]
    Ratio,
    /// A fraction in 0..=1.
    #[serde(rename = "fraction")]
    Fraction,
    /// A count of things.
    #[serde(rename = "count")]
    Count,
    /// Bytes.
    #[serde(rename = "B")]
    Bytes,
    /// Pages of 4 KiB.
    #[serde(rename = "pages")]
    Pages,
    /// Cache lines per operation.
    #[serde(rename = "lines/op")]
    LinesPerOp,
    /// Fences per operation.
    #[serde(rename = "fences/op")]
    FencesPerOp,
    /// Search steps per operation.
    #[serde(rename = "steps/op")]
    StepsPerOp,
    /// Entries (of a queue or ring).
    #[serde(rename = "entries")]
    Entries,
    /// Threads or logical CPUs.
    #[serde(rename = "threads")]
    Threads,
    /// Megabits (10^6 bits) per second.
    #[serde(rename = "Mbit/s")]
    MbitPerS,
    /// CPU seconds per gigabyte (10^9 bytes) moved.
    #[serde(rename = "s/GB")]
    SPerGb,
    /// Cache lines per gigabyte (10^9 bytes) moved.
    #[serde(rename = "lines/GB")]
    LinesPerGb,
    /// Thousand I/O requests per second.
    #[serde(rename = "k IOPS")]
    Kiops,
    /// Gigabytes (10^9 bytes) per second.
    #[serde(rename = "GB/s")]
    GbPerS,
    /// Microseconds of CPU time per I/O request.
    #[serde(rename = "µs/req")]
    UsPerReq,
    /// Kilobytes (10^3 bytes) per second, seed `002`'s unit.
    #[serde(rename = "kB/s")]
    KbPerS,
}

impl Unit {
    /// Every unit.
    #[cfg(test)]
    pub const ALL: [Unit; 27] = [
        Unit::Ns,
        Unit::Us,
        Unit::Ms,
        Unit::S,
        Unit::UsPerPkt,
        Unit::Mpps,
        Unit::MopsPerS,
        Unit::PercentCpu,
        Unit::Percent,
        Unit::Ratio,
        Unit::Fraction,
        Unit::Count,
        Unit::Bytes,
        Unit::Pages,
        Unit::LinesPerOp,
        Unit::FencesPerOp,
        Unit::StepsPerOp,
        Unit::Entries,
        Unit::Threads,
        Unit::MbitPerS,
        Unit::SPerGb,
        Unit::LinesPerGb,
        Unit::Kpps,
        Unit::Kiops,
        Unit::GbPerS,
        Unit::UsPerReq,
        Unit::KbPerS,
    ];

    /// The symbol printed in headers and stored in the database.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::Us => "µs",
            Unit::Ms => "ms",
            Unit::S => "s",
            Unit::UsPerPkt => "µs/pkt",
            Unit::Mpps => "Mpps",
            Unit::Kpps => "kpps",
            Unit::MopsPerS => "M ops/s",
            Unit::PercentCpu => "%CPU",
            Unit::Percent => "%",
            Unit::Ratio => "×",
            Unit::Fraction => "fraction",
            Unit::Count => "count",
            Unit::Bytes => "B",
            Unit::Pages => "pages",
            Unit::LinesPerOp => "lines/op",
            Unit::FencesPerOp => "fences/op",
            Unit::StepsPerOp => "steps/op",
            Unit::Entries => "entries",
            Unit::Threads => "threads",
            Unit::MbitPerS => "Mbit/s",
            Unit::SPerGb => "s/GB",
            Unit::LinesPerGb => "lines/GB",
            Unit::Kiops => "k IOPS",
            Unit::GbPerS => "GB/s",
            Unit::UsPerReq => "µs/req",
            Unit::KbPerS => "kB/s",
        }
    }

    /// The unit with this symbol.
    #[cfg(test)]
    pub fn from_symbol(s: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.symbol() == s)
    }

    /// Whether a bigger figure is better (throughput), worse (time, cost),
    /// or neither; `compare` and the seed verdicts use it.
    pub fn better(self) -> Better {
        match self {
            Unit::Mpps
            | Unit::Kpps
            | Unit::MopsPerS
            | Unit::MbitPerS
            | Unit::Kiops
            | Unit::GbPerS
            | Unit::KbPerS => Better::Higher,
            Unit::Ns
            | Unit::Us
            | Unit::Ms
            | Unit::UsPerPkt
            | Unit::UsPerReq
            | Unit::PercentCpu
            | Unit::SPerGb
            | Unit::LinesPerGb => Better::Lower,
            _ => Better::Neither,
        }
    }
}

/// Which direction of change is an improvement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Throughput-like.
    Higher,
    /// Cost-like.
    Lower,
    /// A count or a parameter.
    Neither,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbol_round_trips_through_serde_and_parsing() {
        for u in Unit::ALL {
            assert_eq!(Unit::from_symbol(u.symbol()), Some(u));
            let json = serde_json::to_string(&u).unwrap();
            assert_eq!(json, format!("\"{}\"", u.symbol()));
        }
    }
}
