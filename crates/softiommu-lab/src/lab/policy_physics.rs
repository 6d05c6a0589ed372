//! Spreads over rounds and the checks a policy's cost must pass: a
//! deferred map+unmap does everything pass-through does and more, and a
//! strict one everything deferred does and more (it waits for each
//! invalidation), so a figure that puts deferred below pass-through, or
//! strict below deferred, beyond the spread of the rounds, is a
//! measurement error, not a finding.

pub use crate::report::Spread;

/// One policy's cost per unit of work, as the checks see it.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyCost<'a> {
    /// The policy's name (`passthrough`, `deferred`, `strict`, ...).
    pub policy: &'a str,
    /// What else must match for two rows to be compared (an ordering).
    pub group: &'a str,
    /// The cost's spread over rounds.
    pub cost: Spread,
}

/// A rule of physics between two rows of one group: `dearer` does all
/// `cheaper` does and more, so it must not cost less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MustCostMore {
    /// The row that does more work (a policy, a walk).
    pub dearer: &'static str,
    /// The row it must not undercut.
    pub cheaper: &'static str,
    /// Why, in words.
    pub because: &'static str,
}

/// The DMA policies' order: pass-through <= deferred <= strict.
pub const POLICIES: [MustCostMore; 2] = [
    MustCostMore {
        dearer: "deferred",
        cheaper: "passthrough",
        because: "a deferred map+unmap does all a pass-through one does and more",
    },
    MustCostMore {
        dearer: "strict",
        cheaper: "deferred",
        because: "a strict unmap does all a deferred one does and waits for its invalidation",
    },
];

/// The page walks' order: a walker that is not cache-coherent costs at
/// least what a coherent one does (every page-table write is flushed
/// from the CPU cache besides).
pub const WALKS: [MustCostMore; 1] = [MustCostMore {
    dearer: "non-coherent",
    cheaper: "coherent",
    because:
        "with a non-coherent walker every page-table update is also flushed from the CPU cache",
}];

/// The guest IOMMU modes' order over a virtio-iommu: none <= lazy <=
/// strict (lazy sends the MAPs and UNMAPs strict sends, with fewer
/// notifications and waits; none sends nothing).
pub const VIOMMU_MODES: [MustCostMore; 3] = [
    MustCostMore {
        dearer: "strict",
        cheaper: "none",
        because: "strict sends a MAP and an UNMAP for every buffer, and no IOMMU sends none",
    },
    MustCostMore {
        dearer: "strict",
        cheaper: "lazy",
        because:
            "strict sends every MAP and UNMAP lazy sends, each with its own notification and wait",
    },
    MustCostMore {
        dearer: "lazy",
        cheaper: "none",
        because: "lazy sends a MAP and an UNMAP for every buffer, and no IOMMU sends none",
    },
];

/// A figure taken round by round ([`paired_ratios`]): the rounds' ratios'
/// spread, how many rounds paired, and the median's interval over them
/// (`seeds::verdict::median_interval`, as `[low, high]`; `None` with
/// fewer than five paired rounds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Lowest, median and highest of the rounds' ratios.
    pub spread: Spread,
    /// Rounds that paired.
    pub rounds: usize,
    /// The median's interval over the rounds' ratios.
    pub interval: Option<[f64; 2]>,
}

/// [`paired_ratios`] of `a` over `b`, summed up as a [`Paired`] figure.
pub fn paired(a: &[f64], b: &[f64]) -> Option<Paired> {
    let ratios = paired_ratios(a, b)?;
    Some(Paired {
        spread: Spread::of(&ratios),
        rounds: ratios.len(),
        interval: crate::seeds::verdict::median_interval(&ratios).map(|(lo, hi)| [lo, hi]),
    })
}

/// For each row, why its figure contradicts what its DMA policy must cost
/// ([`POLICIES`]; `None`: it stands). A row is invalid when every round of
/// it is below every round of the policy it must cost more than, in its
/// group.
pub fn check(rows: &[PolicyCost<'_>], what: &str) -> Vec<Option<String>> {
    check_by(rows, &POLICIES, what)
}

/// For each row, why its figure contradicts one of `rules` (`None`: it
/// stands): every round of it below every round of the row it must cost
/// more than, in its group. `cost` must be a cost per unit of work (time
/// or CPU per operation or per byte, lower is cheaper): a throughput's
/// rounds are passed as their reciprocals. A row measured once has a
/// point spread (`Spread::of(&[v])`), compared as such.
pub fn check_by(
    rows: &[PolicyCost<'_>],
    rules: &[MustCostMore],
    what: &str,
) -> Vec<Option<String>> {
    check_by_with(rows, rules, |rule, r, base| {
        spread_why(rule, what, r.cost.max, base.cost.min)
    })
}

/// The reason a row whose every round lies below every round of the row
/// it must cost more than (`max`: its highest round; `min`: the other's
/// lowest) is invalid.
fn spread_why(rule: &MustCostMore, what: &str, max: f64, min: f64) -> String {
    format!(
        "measurement invalid: {}'s {what} (at most {max:.3} over the rounds) is below {}'s (at least {min:.3}), but {}",
        rule.dearer, rule.cheaper, rule.because
    )
}

/// For each row, the first of `rules` it breaks, as `broken` judges a row
/// against the row of its group it must cost more than (`None`: it
/// stands, or no such row was run).
fn first_broken<T>(
    rows: &[T],
    rules: &[MustCostMore],
    key: impl Fn(&T) -> (&str, &str),
    broken: impl Fn(&MustCostMore, &T, &T) -> Option<String>,
) -> Vec<Option<String>> {
    rows.iter()
        .map(|r| {
            let (policy, group) = key(r);
            rules
                .iter()
                .filter(|rule| rule.dearer == policy)
                .find_map(|rule| {
                    let base = rows.iter().find(|b| key(b) == (rule.cheaper, group))?;
                    broken(rule, r, base)
                })
        })
        .collect()
}

/// As [`check_by`], the message of a broken rule written by `why` (from
/// the rule, the row and the row it undercut): for a lab whose report
/// words it in its own terms. The first rule of `rules` a row breaks is
/// the one reported.
pub fn check_by_with(
    rows: &[PolicyCost<'_>],
    rules: &[MustCostMore],
    why: impl Fn(&MustCostMore, &PolicyCost<'_>, &PolicyCost<'_>) -> String,
) -> Vec<Option<String>> {
    first_broken(
        rows,
        rules,
        |r| (r.policy, r.group),
        |rule, r, base| r.cost.wholly_below(&base.cost).then(|| why(rule, r, base)),
    )
}

/// One policy's cost in each round, as [`check_paired`] sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedCost<'a> {
    /// The policy's name (`passthrough`, `deferred`, `strict`, ...).
    pub policy: &'a str,
    /// What else must match for two rows to be compared (an ordering).
    pub group: &'a str,
    /// The cost per unit of work of each round, in the order the rounds
    /// ran. The rows of one round run one after the other, so round `i`
    /// of two rows is a pair measured under the same load of the machine.
    pub rounds: &'a [f64],
}

/// Each round's `a` over the same round's `b`, leaving out a round in
/// which either is not above zero (a round that delivered nothing has no
/// cost per unit of work): `None` unless both have the same number of
/// rounds and at least one pair remains.
pub fn paired_ratios(a: &[f64], b: &[f64]) -> Option<Vec<f64>> {
    if a.len() != b.len() {
        return None;
    }
    let v: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| **x > 0.0 && **y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    (!v.is_empty()).then_some(v)
}

/// For each row, why its figure contradicts what its DMA policy must cost
/// ([`POLICIES`]; `None`: it stands), judged round by round: a row is
/// invalid when in every round it cost less than the row it must cost
/// more than did in that same round. A drift of the machine's speed
/// between rounds falls on both rows of a round, so this catches what a
/// comparison of the two spreads ([`check`]) hides in that drift: one
/// row below the other in every round, by less than the rounds spread.
/// Rows whose round counts differ are compared as spreads, by [`check`].
pub fn check_paired(rows: &[PairedCost<'_>], what: &str) -> Vec<Option<String>> {
    first_broken(
        rows,
        &POLICIES,
        |r| (r.policy, r.group),
        |rule, r, base| {
            let Some(ratios) = paired_ratios(r.rounds, base.rounds) else {
                let (a, b) = (Spread::of(r.rounds), Spread::of(base.rounds));
                return a
                    .wholly_below(&b)
                    .then(|| spread_why(rule, what, a.max, b.min));
            };
            let worst = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (worst < 1.0).then(|| {
                format!(
                    "measurement invalid: {}'s {what} is below {}'s in every one of the {} rounds (at most {worst:.3}× it in a round), but {}",
                    rule.dearer,
                    rule.cheaper,
                    ratios.len(),
                    rule.because
                )
            })
        },
    )
}

/// One page walk's cost per unit of work under one DMA policy, as
/// [`check_walks`] sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct WalkCost<'a> {
    /// "coherent" or "non-coherent".
    pub walk: &'a str,
    /// The DMA policy: only rows of one policy are compared.
    pub policy: &'a str,
    /// The cost's spread over rounds.
    pub cost: Spread,
}

/// For each row, why its figure contradicts what its page walk must cost
/// (`None`: it stands): a non-coherent walk does all a coherent one does
/// and flushes each page-table line it writes, so a non-coherent row
/// whose every round is below every round of the coherent row of its
/// policy is a measurement error.
pub fn check_walks(rows: &[WalkCost<'_>], what: &str) -> Vec<Option<String>> {
    rows.iter()
        .map(|r| {
            if r.walk != "non-coherent" {
                return None;
            }
            let base = rows
                .iter()
                .find(|b| b.walk == "coherent" && b.policy == r.policy)?;
            r.cost.wholly_below(&base.cost).then(|| {
                format!(
                    "measurement invalid: the non-coherent walk's {what} under {} (at most {:.3} over the rounds) is below the coherent walk's (at least {:.3}), but a non-coherent walk does all a coherent one does and flushes the lines it writes",
                    r.policy, r.cost.max, base.cost.min
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost<'a>(policy: &'a str, values: &[f64]) -> PolicyCost<'a> {
        PolicyCost {
            policy,
            group: "ordered",
            cost: Spread::of(values),
        }
    }

    #[test]
    fn a_spread_is_min_median_max_and_a_ratio_takes_the_widest() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.0, 3.0));
        let r = Spread::of(&[2.0, 4.0, 6.0]).ratio(&s).unwrap();
        assert_eq!((r.min, r.median, r.max), (2.0 / 3.0, 2.0, 6.0));
        assert_eq!(Spread::of(&[1.0]).ratio(&Spread::of(&[0.0])), None);
    }

    #[test]
    fn paired_rounds_are_judged_round_by_round_and_unpaired_ones_as_spreads() {
        let paired = |policy, rounds| PairedCost {
            policy,
            group: "ordered",
            rounds,
        };
        let pt = [1.0, 2.0, 3.0];
        let below = [0.95, 1.9, 2.9];
        let why = check_paired(
            &[paired("passthrough", &pt), paired("deferred", &below)],
            "cost",
        );
        assert!(
            matches!(&why[1], Some(w) if w.starts_with("measurement invalid: deferred's cost is below passthrough's in every one of the 3 rounds (at most 0.967")),
            "{why:?}"
        );
        assert_eq!(why[0], None);
        // Two rounds against three: no pairs, so the spreads decide, and
        // these overlap.
        let why = check_paired(
            &[paired("passthrough", &pt), paired("deferred", &below[..2])],
            "cost",
        );
        assert_eq!(why, vec![None, None]);
        let why = check_paired(
            &[paired("passthrough", &pt), paired("deferred", &[0.5, 0.6])],
            "cost",
        );
        assert!(
            matches!(&why[1], Some(w) if w.starts_with("measurement invalid: deferred's cost (at most 0.600 over the rounds) is below passthrough's (at least 1.000)")),
            "{why:?}"
        );
        assert_eq!(paired_ratios(&[1.0], &[0.0]), None);
        assert_eq!(paired_ratios(&[1.0, 3.0], &[0.0, 1.5]), Some(vec![2.0]));
        assert_eq!(paired_ratios(&[0.0, 3.0], &[1.0, 1.5]), Some(vec![2.0]));
        assert_eq!(paired_ratios(&[], &[]), None);
        assert_eq!(
            paired_ratios(&[3.0, 4.0], &[1.5, 2.0]),
            Some(vec![2.0, 2.0])
        );
    }

    #[test]
    fn deferred_below_passthrough_beyond_the_spread_is_invalid() {
        let rows = [
            cost("passthrough", &[2.4, 2.5, 2.6]),
            cost("deferred", &[2.1, 2.2, 2.3]),
            cost("strict", &[7.0, 7.2, 7.4]),
        ];
        let why = check(&rows, "service demand");
        assert_eq!(why[0], None);
        assert!(
            matches!(&why[1], Some(w) if w.starts_with("measurement invalid: deferred's service demand") && w.contains("below passthrough's")),
            "{why:?}"
        );
        assert_eq!(why[2], None, "strict is above deferred");
    }

    #[test]
    fn deferred_below_passthrough_within_the_spread_stands() {
        let rows = [
            cost("passthrough", &[2.3, 2.5, 2.7]),
            cost("deferred", &[2.2, 2.4, 2.6]),
        ];
        assert_eq!(check(&rows, "service demand"), vec![None, None]);
    }

    #[test]
    fn strict_below_deferred_beyond_the_spread_is_invalid() {
        let rows = [
            cost("passthrough", &[2.0, 2.1, 2.2]),
            cost("deferred", &[3.0, 3.1, 3.2]),
            cost("strict", &[2.5, 2.6, 2.7]),
        ];
        let why = check(&rows, "service demand");
        assert_eq!(why[..2], [None, None]);
        assert!(
            matches!(&why[2], Some(w) if w.starts_with("measurement invalid: strict's service demand") && w.contains("below deferred's")),
            "{why:?}"
        );
    }

    #[test]
    fn a_non_coherent_walk_cheaper_than_a_coherent_one_is_invalid() {
        let mut rows = [
            cost("coherent", &[100.0, 101.0]),
            cost("non-coherent", &[90.0, 92.0]),
        ];
        rows[0].group = "4k";
        rows[1].group = "4k";
        let why = check_by(&rows, &WALKS, "time per map+unmap");
        assert_eq!(why[0], None);
        assert!(
            matches!(&why[1], Some(w) if w.starts_with("measurement invalid: non-coherent's time per map+unmap") && w.contains("below coherent's")),
            "{why:?}"
        );
        // A throughput is checked as its reciprocal: more throughput,
        // less cost per byte.
        let per_byte = |mbit: &[f64]| Spread::of(&mbit.iter().map(|m| 1.0 / m).collect::<Vec<_>>());
        let tput = [
            PolicyCost {
                policy: "coherent",
                group: "",
                cost: per_byte(&[1000.0, 1010.0]),
            },
            PolicyCost {
                policy: "non-coherent",
                group: "",
                cost: per_byte(&[1080.0, 1090.0]),
            },
        ];
        assert!(check_by(&tput, &WALKS, "time per byte")[1].is_some());
    }

    #[test]
    fn rows_of_another_group_are_not_compared() {
        let mut pt = cost("passthrough", &[5.0]);
        pt.group = "relaxed";
        let rows = [pt, cost("deferred", &[1.0])];
        assert_eq!(check(&rows, "service demand"), vec![None, None]);
    }

    fn walk<'a>(walk: &'a str, policy: &'a str, values: &[f64]) -> WalkCost<'a> {
        WalkCost {
            walk,
            policy,
            cost: Spread::of(values),
        }
    }

    #[test]
    fn a_non_coherent_walk_cheaper_than_a_coherent_one_beyond_the_spread_is_invalid() {
        let rows = [
            walk("coherent", "strict", &[2.0, 2.1, 2.2]),
            walk("coherent", "deferred", &[1.6, 1.64, 1.7]),
            walk("non-coherent", "strict", &[2.6, 2.7, 2.8]),
            walk("non-coherent", "deferred", &[1.4, 1.45, 1.5]),
        ];
        let why = check_walks(&rows, "driver CPU per GB");
        assert_eq!(why[..3], [None, None, None]);
        assert!(
            matches!(&why[3], Some(w) if w.starts_with("measurement invalid: the non-coherent walk's driver CPU per GB under deferred") && w.contains("(at least 1.600)")),
            "{why:?}"
        );
        // Within the spread it stands; another policy's coherent row is
        // not its base.
        let rows = [
            walk("coherent", "deferred", &[1.6, 1.7, 1.8]),
            walk("non-coherent", "deferred", &[1.5, 1.65, 1.75]),
            walk("non-coherent", "strict", &[0.1]),
        ];
        assert_eq!(check_walks(&rows, "x"), vec![None, None, None]);
    }
}
