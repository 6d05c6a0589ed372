//! The one rule by which the seed summary judges a figure against another.
//!
//! Ours is measured in rounds; theirs (or a line drawn at, such as 1.0) is
//! a point. A verdict is given only where
//!
//! - no row the figure rests on is marked "measurement invalid" (the
//!   physics checks), and
//! - ours' interval lies wholly on one side of the point.
//!
//! **The interval** is the lowest to the highest round of the figure's
//! spread ([`Spread`]; for a ratio of two rows measured one after the other
//! in each round, the spread of the rounds' paired ratios), or, where a
//! lab gives the rounds' own order-statistic interval
//! ([`median_interval`], at no less than the same confidence; with more
//! than eight rounds it leaves the extreme rounds out), that. With
//! [`MIN_ROUNDS`] rounds it is a distribution-free confidence interval for
//! the median at [`CONFIDENCE`]: all five rounds fall on one side of the
//! true median with probability 2 × 2⁻⁵, whatever the noise's shape. The
//! labs whose figures a seed compares this way run at least that many
//! rounds, `--quick` too. One disturbed round can widen the interval (it
//! is the extreme round), which can only withhold a verdict, never give a
//! wrong one. A figure measured once has no interval and gets no verdict.
//!
//! Where ours is compared on size with a seed's own figure (not a line
//! drawn by physics, such as 1.0), the seed's figure is taken to reach
//! [`SEED_MARGIN`] either way ([`judge_near`]): one measurement on other
//! hardware, without a spread.

use std::cmp::Ordering;

use crate::report::{Place, Spread};

/// The rounds a figure judged by [`judge`] is measured in, at least: with
/// five, the lowest and highest round bound the median at [`CONFIDENCE`].
pub const MIN_ROUNDS: usize = 5;

/// The confidence with which the lowest and highest of [`MIN_ROUNDS`]
/// rounds bound the figure's median: 1 − 2 × 2⁻⁵.
pub const CONFIDENCE: f64 = 0.9375;

/// What the rule allows the summary to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A row the figure rests on is marked invalid (`row: why`), or there
    /// is no interval to judge by: no verdict.
    None(String),
    /// Ours' interval holds the point: no verdict either way.
    Within,
    /// Ours' whole interval lies below (`Less`) or above (`Greater`) the
    /// point.
    Beyond(Ordering),
}

impl Verdict {
    /// The words a seed gives this verdict: `below` when ours' whole
    /// interval lies below the point, `above` above it, `within` when it
    /// holds the point; `Err(why)` when there is no verdict.
    pub fn words<'a>(
        &'a self,
        below: &'a str,
        above: &'a str,
        within: &'a str,
    ) -> Result<&'a str, &'a str> {
        match self {
            Verdict::None(why) => Err(why),
            Verdict::Beyond(Ordering::Less) => Ok(below),
            Verdict::Beyond(_) => Ok(above),
            Verdict::Within => Ok(within),
        }
    }
}

/// The most rounds [`median_interval`] takes (its binomial sums stay well
/// inside `f64`: 2^1000 is about 1e301).
pub const MAX_INTERVAL_ROUNDS: usize = 1000;

/// The distribution-free confidence interval for the median of `values`
/// (its rounds) at no less than [`CONFIDENCE`]: the `k`-th lowest to the
/// `k`-th highest round, `k` the largest for which the median lies
/// outside with probability at most 1 − [`CONFIDENCE`] (twice the chance
/// that fewer than `k` of `n` fair coin flips land heads). With five
/// rounds that is the lowest to the highest ([`MIN_ROUNDS`]); with nine,
/// the second lowest to the second highest (96.1 %), so one disturbed
/// round at either end no longer decides the interval. `None` with fewer
/// than [`MIN_ROUNDS`] rounds, more than [`MAX_INTERVAL_ROUNDS`], or any
/// value not finite.
pub fn median_interval(values: &[f64]) -> Option<(f64, f64)> {
    let n = values.len();
    if !(MIN_ROUNDS..=MAX_INTERVAL_ROUNDS).contains(&n) || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    // P(Bin(n, 1/2) <= j) for j = 0, 1, ...: the chance that the median
    // lies below the (j+1)-th lowest round.
    let total = 2f64.powi(n as i32);
    let mut below = 0.0;
    let mut choose = 1.0;
    let mut k = 0;
    for j in 0..n / 2 {
        below += choose / total;
        if 1.0 - 2.0 * below < CONFIDENCE - 1e-12 {
            break;
        }
        k = j + 1;
        choose = choose * (n - j) as f64 / (j + 1) as f64;
    }
    let k = k.max(1);
    Some((*v.get(k - 1)?, *v.get(n - k)?))
}

/// How far a seed's own figure is taken to reach, as a factor either way,
/// where ours is compared with it on size ([`judge_near`]). A seed's
/// figure is one measurement on other hardware, without a spread; ours
/// moves from run to run by more than its own interval says (seed 003's
/// median 0.54-0.67 and seed 000's 1.27-1.59 over 2026-11-30's quiet and
/// busy `run --quick` pairs, each pair's move 3-16 %), and the project
/// allows a figure to move 15 % between a quiet run and one beside two
/// busy processes. Ours is called larger or smaller only where its
/// interval clears the seed's by more than that factor, so a figure of
/// ours that lies near the seed's does not get opposite verdicts from two
/// runs whose intervals each barely reach or miss the seed's point.
pub const SEED_MARGIN: f64 = 1.15;

/// [`judge`] against a seed's figure `point` taken to reach from
/// `point / margin` to `point * margin`: `Beyond` only where ours'
/// whole interval lies below the low end or above the high end, `Within`
/// where it meets the band. `margin` is at least 1 (a smaller one is
/// taken as 1, the point itself).
pub fn judge_near(
    spread: Option<Spread>,
    point: f64,
    margin: f64,
    invalid: Option<String>,
) -> Verdict {
    let m = if margin.is_finite() {
        margin.max(1.0)
    } else {
        1.0
    };
    // The band's low and high ends whatever the point's sign.
    let (lo, hi) = ((point / m).min(point * m), (point / m).max(point * m));
    match (
        judge(spread, lo, invalid.clone()),
        judge(spread, hi, invalid),
    ) {
        (Verdict::Beyond(Ordering::Less), _) => Verdict::Beyond(Ordering::Less),
        (_, Verdict::Beyond(Ordering::Greater)) => Verdict::Beyond(Ordering::Greater),
        (Verdict::None(why), _) | (_, Verdict::None(why)) => Verdict::None(why),
        _ => Verdict::Within,
    }
}

/// Why a figure measured once gets no verdict.
pub const NO_SPREAD: &str = "measured once, so it has no spread to judge by";

/// The one rule: ours (`spread` over its rounds, `None` when measured
/// once) against `point`, given why a row it rests on is invalid
/// (`invalid`, `None` when all stand).
pub fn judge(spread: Option<Spread>, point: f64, invalid: Option<String>) -> Verdict {
    if let Some(why) = invalid {
        return Verdict::None(why);
    }
    let Some(s) = spread else {
        return Verdict::None(NO_SPREAD.into());
    };
    if [s.min, s.median, s.max, point]
        .iter()
        .any(|v| !v.is_finite())
    {
        return Verdict::None("a figure is not a number".into());
    }
    match s.place(point) {
        Place::Above => Verdict::Beyond(Ordering::Less),
        Place::Below => Verdict::Beyond(Ordering::Greater),
        Place::Within => Verdict::Within,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_only_where_the_interval_separates_ours_from_the_point() {
        // Separated: every round above, or below.
        let s = Spread::of(&[0.62, 0.64, 0.65, 0.66, 0.70]);
        assert_eq!(
            judge(Some(s), 0.554, None),
            Verdict::Beyond(Ordering::Greater)
        );
        assert_eq!(judge(Some(s), 0.8, None), Verdict::Beyond(Ordering::Less));
        // Overlapping: the point lies within, ends included.
        assert_eq!(judge(Some(s), 0.64, None), Verdict::Within);
        assert_eq!(judge(Some(s), 0.62, None), Verdict::Within);
        assert_eq!(judge(Some(s), 0.70, None), Verdict::Within);
    }

    #[test]
    fn near_a_seeds_figure_a_verdict_only_where_the_interval_clears_its_margin() {
        let near = |lo: f64, hi: f64| {
            judge_near(
                Some(Spread::of(&[lo, (lo + hi) / 2.0, hi])),
                0.554,
                SEED_MARGIN,
                None,
            )
        };
        // The quiet and busy runs that had flipped on the point itself:
        // 0.59-0.73 missed 0.554, 0.53-0.72 held it. Both meet the band.
        assert_eq!(near(0.59, 0.73), Verdict::Within);
        assert_eq!(near(0.53, 0.72), Verdict::Within);
        assert_eq!(
            judge(Some(Spread::of(&[0.59, 0.66, 0.73])), 0.554, None),
            Verdict::Beyond(Ordering::Greater)
        );
        // Clear of the band (0.554 x 1.15 = 0.637; / 1.15 = 0.482).
        assert_eq!(near(0.65, 0.78), Verdict::Beyond(Ordering::Greater));
        assert_eq!(near(0.40, 0.47), Verdict::Beyond(Ordering::Less));
        // A margin below 1 is the point itself; an invalid row, none.
        let s = Some(Spread::of(&[0.56, 0.58, 0.60]));
        assert_eq!(
            judge_near(s, 0.554, 0.5, None),
            Verdict::Beyond(Ordering::Greater)
        );
        assert!(matches!(
            judge_near(s, 0.554, SEED_MARGIN, Some("bad row".into())),
            Verdict::None(w) if w == "bad row"
        ));
        assert!(matches!(
            judge_near(None, 0.554, SEED_MARGIN, None),
            Verdict::None(w) if w == NO_SPREAD
        ));
        // A negative point: the band is still its low to high end.
        let neg = Some(Spread::of(&[-1.0, -0.95, -0.9]));
        assert_eq!(judge_near(neg, -1.0, SEED_MARGIN, None), Verdict::Within);
    }

    #[test]
    fn an_invalid_row_or_a_single_round_gets_no_verdict() {
        let s = Spread::of(&[0.62, 0.64, 0.65, 0.66, 0.70]);
        assert_eq!(
            judge(Some(s), 0.554, Some("deferred: measurement invalid".into())),
            Verdict::None("deferred: measurement invalid".into())
        );
        assert_eq!(judge(None, 0.554, None), Verdict::None(NO_SPREAD.into()));
        let nan = Spread::of(&[f64::NAN, 1.0]);
        assert!(matches!(judge(Some(nan), 1.0, None), Verdict::None(_)));
    }

    #[test]
    fn the_median_interval_drops_extreme_rounds_only_where_the_confidence_allows() {
        // Five rounds: lowest to highest, as `judge` takes a spread.
        let five = [1.3, 1.1, 1.2, 2.6, 1.25];
        assert_eq!(median_interval(&five), Some((1.1, 2.6)));
        // Nine: the second lowest to the second highest (96.1 %); eight
        // would fall short (93.0 %) and keep the extremes.
        let nine = [1.3, 1.1, 1.2, 2.6, 1.25, 1.28, 1.22, 1.31, 0.5];
        assert_eq!(median_interval(&nine), Some((1.1, 1.31)));
        assert_eq!(median_interval(&nine[..8]), Some((1.1, 2.6)));
        // Twelve: the third (96.1 %).
        let twelve: Vec<f64> = (1..=12).map(f64::from).collect();
        assert_eq!(median_interval(&twelve), Some((3.0, 10.0)));
        // Too few rounds, or a round not a number: none.
        assert_eq!(median_interval(&five[..4]), None);
        assert_eq!(median_interval(&[1.0, 2.0, f64::NAN, 3.0, 4.0]), None);
    }

    #[test]
    fn five_rounds_bound_the_median_at_the_stated_confidence() {
        // All rounds on one side of the median: 2 of the 2^n equally likely
        // sign patterns.
        let miss = 2.0 / f64::from(1u32 << MIN_ROUNDS);
        assert!((1.0 - miss - CONFIDENCE).abs() < 1e-12);
    }
}
