//! Validated option values, shared by the command line (clap parses them
//! with `FromStr`) and scenario files (serde deserialises them through
//! `TryFrom`), so a bad value is refused the same way in both, before any
//! work starts: zero where zero is meaningless, `inf`, `nan`, `1e300`,
//! counts that would exhaust the machine, and unknown names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use softiommu::access::OrderMode;
use softiommu::dma::DmaPolicy;
use softiommu::hw::LatencyModel;
use softiommu::iova::IovaPolicy;
use softiommu_virtio::workload::Cpus;

/// Why an option's value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgError {
    /// Not a number at all.
    #[error("{text:?} is not a number")]
    NotANumber {
        /// What was given.
        text: String,
    },
    /// A number where a whole one is wanted (`0.5`, `1e3`).
    #[error("{text:?} is not a whole number in {min}..={max}")]
    NotWhole {
        /// What was given.
        text: String,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// An integer outside its documented range.
    #[error("{value} is not in {min}..={max}")]
    OutOfRange {
        /// What was given.
        value: String,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// A real number that is not finite or outside its range.
    #[error("{value} is not a finite number in {min}..={max}")]
    RealOutOfRange {
        /// What was given.
        value: String,
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
    },
    /// An integer that must be a multiple of something and is not.
    #[error("{value} is not a multiple of {of}")]
    NotAMultiple {
        /// What was given.
        value: String,
        /// What it must be a multiple of.
        of: u64,
    },
    /// A name that is not one of the valid ones.
    #[error("unknown {what} {name:?} (valid: {valid})")]
    UnknownName {
        /// What kind of name.
        what: &'static str,
        /// What was given.
        name: String,
        /// The valid names, comma-separated.
        valid: String,
    },
}

/// An integer option in `MIN..=MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Ranged<const MIN: u64, const MAX: u64>(u64);

impl<const MIN: u64, const MAX: u64> Ranged<MIN, MAX> {
    /// The value; panics at compile time of the caller's constant if out
    /// of range (use for defaults).
    pub const fn new(v: u64) -> Self {
        assert!(v >= MIN && v <= MAX, "default out of range");
        Self(v)
    }

    /// The value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The value as a `usize` (every range here fits).
    pub fn us(self) -> usize {
        self.0 as usize
    }
}

impl<const MIN: u64, const MAX: u64> TryFrom<u64> for Ranged<MIN, MAX> {
    type Error = ArgError;
    fn try_from(v: u64) -> Result<Self, ArgError> {
        if (MIN..=MAX).contains(&v) {
            Ok(Self(v))
        } else {
            Err(ArgError::OutOfRange {
                value: v.to_string(),
                min: MIN,
                max: MAX,
            })
        }
    }
}

impl<const MIN: u64, const MAX: u64> From<Ranged<MIN, MAX>> for u64 {
    fn from(v: Ranged<MIN, MAX>) -> u64 {
        v.0
    }
}

impl<const MIN: u64, const MAX: u64> FromStr for Ranged<MIN, MAX> {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        let t = s.trim().replace('_', "");
        match t.parse::<u64>() {
            Ok(v) => Self::try_from(v),
            // A negative or oversized integer is out of range, not "not a number".
            Err(_)
                if !t.is_empty()
                    && t.trim_start_matches('-')
                        .bytes()
                        .all(|b| b.is_ascii_digit()) =>
            {
                Err(ArgError::OutOfRange {
                    value: s.to_string(),
                    min: MIN,
                    max: MAX,
                })
            }
            Err(_) if t.parse::<f64>().is_ok_and(f64::is_finite) => Err(ArgError::NotWhole {
                text: s.to_string(),
                min: MIN,
                max: MAX,
            }),
            Err(_) => Err(ArgError::NotANumber {
                text: s.to_string(),
            }),
        }
    }
}

impl<const MIN: u64, const MAX: u64> fmt::Display for Ranged<MIN, MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A duration in seconds: finite, at least 10 ms, at most a day.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Seconds(f64);

impl Seconds {
    /// Smallest accepted: 10 ms (shorter runs measure the clock).
    pub const MIN: f64 = 0.01;
    /// Largest accepted: one day.
    pub const MAX: f64 = 86_400.0;

    /// A constant default.
    pub const fn new(v: f64) -> Self {
        Self(v)
    }

    /// The seconds.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for Seconds {
    type Error = ArgError;
    fn try_from(v: f64) -> Result<Self, ArgError> {
        if v.is_finite() && (Self::MIN..=Self::MAX).contains(&v) {
            Ok(Self(v))
        } else {
            Err(ArgError::RealOutOfRange {
                value: v.to_string(),
                min: Self::MIN,
                max: Self::MAX,
            })
        }
    }
}

impl From<Seconds> for f64 {
    fn from(v: Seconds) -> f64 {
        v.0
    }
}

impl FromStr for Seconds {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        let v: f64 = s.trim().parse().map_err(|_| ArgError::NotANumber {
            text: s.to_string(),
        })?;
        Self::try_from(v).map_err(|_| ArgError::RealOutOfRange {
            value: s.to_string(),
            min: Self::MIN,
            max: Self::MAX,
        })
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A percentage in 0..=100.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Percent(f64);

impl Percent {
    /// A constant default.
    pub const fn new(v: f64) -> Self {
        Self(v)
    }

    /// The percentage.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl TryFrom<f64> for Percent {
    type Error = ArgError;
    fn try_from(v: f64) -> Result<Self, ArgError> {
        if v.is_finite() && (0.0..=100.0).contains(&v) {
            Ok(Self(v))
        } else {
            Err(ArgError::RealOutOfRange {
                value: v.to_string(),
                min: 0.0,
                max: 100.0,
            })
        }
    }
}

impl From<Percent> for f64 {
    fn from(v: Percent) -> f64 {
        v.0
    }
}

impl FromStr for Percent {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        let v: f64 = s.trim().parse().map_err(|_| ArgError::NotANumber {
            text: s.to_string(),
        })?;
        Self::try_from(v)
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A DMA policy named on the command line or in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DmaPolicyName(pub DmaPolicy);

impl FromStr for DmaPolicyName {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        DmaPolicy::from_name(s.trim())
            .map(Self)
            .ok_or_else(|| ArgError::UnknownName {
                what: "DMA policy",
                name: s.to_string(),
                valid: names(DmaPolicy::ALL.iter().map(|p| p.name())),
            })
    }
}

impl TryFrom<String> for DmaPolicyName {
    type Error = ArgError;
    fn try_from(s: String) -> Result<Self, ArgError> {
        s.parse()
    }
}

impl From<DmaPolicyName> for String {
    fn from(p: DmaPolicyName) -> String {
        p.0.name().to_string()
    }
}

/// An IOVA allocator policy named on the command line or in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IovaPolicyName(pub IovaPolicy);

impl FromStr for IovaPolicyName {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        IovaPolicy::from_name(s.trim())
            .map(Self)
            .ok_or_else(|| ArgError::UnknownName {
                what: "IOVA policy",
                name: s.to_string(),
                valid: names(IovaPolicy::ALL.iter().map(|p| p.name())),
            })
    }
}

impl TryFrom<String> for IovaPolicyName {
    type Error = ArgError;
    fn try_from(s: String) -> Result<Self, ArgError> {
        s.parse()
    }
}

impl From<IovaPolicyName> for String {
    fn from(p: IovaPolicyName) -> String {
        p.0.name().to_string()
    }
}

/// A device ordering mode (seed `001`) named on the command line or in a
/// scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OrderModeName(pub OrderMode);

impl FromStr for OrderModeName {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        OrderMode::from_name(s.trim())
            .map(Self)
            .ok_or_else(|| ArgError::UnknownName {
                what: "ordering",
                name: s.to_string(),
                valid: names(OrderMode::ALL.iter().map(|o| o.name())),
            })
    }
}

impl TryFrom<String> for OrderModeName {
    type Error = ArgError;
    fn try_from(s: String) -> Result<Self, ArgError> {
        s.parse()
    }
}

impl From<OrderModeName> for String {
    fn from(o: OrderModeName) -> String {
        o.0.name().to_string()
    }
}

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

/// The latency models a run can choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
pub enum Latency {
    /// VT-d as measured around 2015 (rIOMMU, ASPLOS 2015).
    #[default]
    #[value(name = "vtd-2015")]
    #[serde(rename = "vtd-2015")]
    Vtd2015,
    /// Nothing modelled.
    #[value(name = "zero")]
    #[serde(rename = "zero")]
    Zero,
}

impl Latency {
    /// The model.
    pub fn model(self) -> LatencyModel {
        match self {
            Latency::Vtd2015 => LatencyModel::vtd_2015(),
            Latency::Zero => LatencyModel::zero(),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Latency::Vtd2015 => "vtd-2015",
            Latency::Zero => "zero",
        }
    }
}

/// Where a workload's threads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Every driver (sender, receiver) thread and every device thread on a
    /// CPU of its own, as a NIC is hardware of its own; with fewer CPUs
    /// than threads, the drivers share the first CPUs and the devices the
    /// next ones (on 2 CPUs: drivers on one, devices on the other).
    Split,
    /// Each host's driver and its device on one CPU.
    Shared,
    /// No pinning: the scheduler decides (and may change its mind mid-run).
    Os,
}

impl Placement {
    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Split => "split",
            Placement::Shared => "shared",
            Placement::Os => "os",
        }
    }

    /// The CPUs (sender, device) of stream `i` of a one-host ring, if
    /// pinned: split puts sender `i` on the allowed CPU `2i` and its
    /// device on `2i + 1` (wrapping), shared both on CPU `i`.
    pub fn stream_cpus(self, i: usize, allowed: &[usize]) -> Option<(usize, usize)> {
        let n = allowed.len();
        if n == 0 {
            return None;
        }
        match self {
            Placement::Split => Some((allowed[(2 * i) % n], allowed[(2 * i + 1) % n])),
            Placement::Shared => Some((allowed[i % n], allowed[i % n])),
            Placement::Os => None,
        }
    }

    /// The CPUs of a two-host workload's threads (sender, receiver, and
    /// each host's device). Split: with four CPUs or more each thread
    /// has its own; with two or three, the sender and the receiver share
    /// the first and the devices the second (and third). Shared: host A's
    /// sender and device on the first CPU, host B's receiver and device
    /// on the second.
    pub fn pair_cpus(self, allowed: &[usize]) -> Cpus {
        let n = allowed.len();
        let at = |i: usize| Some(allowed[i % n]);
        match self {
            _ if n == 0 => Cpus::default(),
            Placement::Os => Cpus::default(),
            Placement::Split if n >= 4 => Cpus {
                sender: at(0),
                receiver: at(1),
                device_a: at(2),
                device_b: at(3),
            },
            Placement::Split => Cpus {
                sender: at(0),
                receiver: at(0),
                device_a: at(1),
                device_b: at(n - 1),
            },
            Placement::Shared => Cpus {
                sender: at(0),
                receiver: at(1),
                device_a: at(0),
                device_b: at(1),
            },
        }
    }

    /// The pinning as words, for a report's parameters.
    pub fn describe(self, cpus: &Cpus) -> String {
        let c = |x: Option<usize>| x.map_or("any".to_string(), |c| c.to_string());
        format!(
            "{}: sender CPU {}, receiver CPU {}, device A CPU {}, device B CPU {}",
            self.name(),
            c(cpus.sender),
            c(cpus.receiver),
            c(cpus.device_a),
            c(cpus.device_b)
        )
    }
}

/// A page walk's coherence (seed `003`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Walk {
    /// The IOMMU snoops the CPU's caches: nothing is flushed.
    Coherent,
    /// It does not: every page-table line written is flushed.
    NonCoherent,
}

impl Walk {
    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Walk::Coherent => "coherent",
            Walk::NonCoherent => "non-coherent",
        }
    }
}

/// The DMA policies of a list option; none named means all.
pub fn dma_policies(named: &[DmaPolicyName]) -> Vec<DmaPolicy> {
    if named.is_empty() {
        DmaPolicy::ALL.to_vec()
    } else {
        named.iter().map(|p| p.0).collect()
    }
}

/// The IOVA policies of a list option; none named means all.
pub fn iova_policies(named: &[IovaPolicyName]) -> Vec<IovaPolicy> {
    if named.is_empty() {
        IovaPolicy::ALL.to_vec()
    } else {
        named.iter().map(|p| p.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_placement_keeps_drivers_and_devices_apart() {
        let two = Placement::Split.pair_cpus(&[0, 1]);
        assert_eq!((two.sender, two.receiver), (Some(0), Some(0)));
        assert_eq!((two.device_a, two.device_b), (Some(1), Some(1)));
        let four = Placement::Split.pair_cpus(&[0, 1, 2, 3]);
        assert_eq!(
            [four.sender, four.receiver, four.device_a, four.device_b],
            [Some(0), Some(1), Some(2), Some(3)]
        );
        let shared = Placement::Shared.pair_cpus(&[4, 5]);
        assert_eq!((shared.sender, shared.device_a), (Some(4), Some(4)));
        assert_eq!((shared.receiver, shared.device_b), (Some(5), Some(5)));
        assert_eq!(Placement::Os.pair_cpus(&[0, 1]), Cpus::default());
        assert_eq!(Placement::Split.pair_cpus(&[]), Cpus::default());
        assert_eq!(Placement::Split.stream_cpus(0, &[0, 1]), Some((0, 1)));
    }

    #[test]
    fn seconds_refuse_what_cannot_be_a_duration() {
        for bad in ["inf", "nan", "1e300", "0", "-1", "NaN", "-inf"] {
            assert!(
                matches!(bad.parse::<Seconds>(), Err(ArgError::RealOutOfRange { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            "abc".parse::<Seconds>(),
            Err(ArgError::NotANumber { .. })
        ));
        assert_eq!("0.5".parse::<Seconds>(), Ok(Seconds(0.5)));
    }

    #[test]
    fn ranges_refuse_zero_and_huge() {
        type T = Ranged<1, 256>;
        assert!(matches!(
            "0".parse::<T>(),
            Err(ArgError::OutOfRange {
                min: 1,
                max: 256,
                ..
            })
        ));
        assert!(matches!(
            "18446744073709551615".parse::<T>(),
            Err(ArgError::OutOfRange { .. })
        ));
        assert!(matches!(
            "99999999999999999999999".parse::<T>(),
            Err(ArgError::OutOfRange { .. })
        ));
        assert!(matches!(
            "-3".parse::<T>(),
            Err(ArgError::OutOfRange { .. })
        ));
        assert_eq!("256".parse::<T>(), Ok(Ranged(256)));
    }

    #[test]
    fn unknown_policies_list_the_valid_ones() {
        let e = "lazy".parse::<DmaPolicyName>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown DMA policy \"lazy\" (valid: passthrough, strict, deferred, bounce)"
        );
        assert!(matches!(
            "x".parse::<IovaPolicyName>(),
            Err(ArgError::UnknownName {
                what: "IOVA policy",
                ..
            })
        ));
    }
}
