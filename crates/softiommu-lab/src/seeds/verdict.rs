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
//! in each round, the spread of the rounds' paired ratios). With
//! [`MIN_ROUNDS`] rounds it is a distribution-free confidence interval for
//! the median at [`CONFIDENCE`]: all five rounds fall on one side of the
//! true median with probability 2 × 2⁻⁵, whatever the noise's shape. The
//! labs whose figures a seed compares this way run at least that many
//! rounds, `--quick` too. One disturbed round can widen the interval (it
//! is the extreme round), which can only withhold a verdict, never give a
//! wrong one. A figure measured once has no interval and gets no verdict.

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
    fn five_rounds_bound_the_median_at_the_stated_confidence() {
        // All rounds on one side of the median: 2 of the 2^n equally likely
        // sign patterns.
        let miss = 2.0 / f64::from(1u32 << MIN_ROUNDS);
        assert!((1.0 - miss - CONFIDENCE).abs() < 1e-12);
    }
}
