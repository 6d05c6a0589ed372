//! A figure's spread over rounds: every headline figure measured in
//! rounds carries one, so that a reader, `compare` and the seed summary
//! can tell a difference from the noise between rounds.

use serde::{Deserialize, Serialize};

/// A figure's spread over rounds: the lowest, the median and the highest
/// round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The lowest round.
    pub min: f64,
    /// The median round (the lower middle one of an even count).
    pub median: f64,
    /// The highest round.
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero when there are none).
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => Spread {
                min: 0.0,
                median: 0.0,
                max: 0.0,
            },
            n => Spread {
                min: v[0],
                median: v[(n - 1) / 2],
                max: v[n - 1],
            },
        }
    }

    /// The spread of `values`, `None` when there are fewer than two (one
    /// round has no spread; none is invented for it).
    pub fn of_rounds(values: &[f64]) -> Option<Self> {
        (values.len() >= 2).then(|| Self::of(values))
    }

    /// `self` over `base`, its spread the widest the two allow: the lowest
    /// round over the highest and the highest over the lowest. `None` when
    /// `base` has a round at or below zero.
    pub fn ratio(&self, base: &Spread) -> Option<Spread> {
        (base.min > 0.0).then(|| Spread {
            min: self.min / base.max,
            median: self.median / base.median,
            max: self.max / base.min,
        })
    }

    /// Whether every round of `self` is below every round of `other`.
    pub fn wholly_below(&self, other: &Spread) -> bool {
        self.max < other.min
    }

    /// Whether the two spreads share no value: a change from one to the
    /// other is beyond the rounds' noise.
    pub fn separate(&self, other: &Spread) -> bool {
        self.wholly_below(other) || other.wholly_below(self)
    }

    /// Where a point figure (a published one) lies against the spread.
    pub fn place(&self, point: f64) -> Place {
        if point < self.min {
            Place::Below
        } else if point > self.max {
            Place::Above
        } else {
            Place::Within
        }
    }
}

/// Where a point lies against a spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Below every round.
    Below,
    /// Between the lowest and the highest round, both included.
    Within,
    /// Above every round.
    Above,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_round_has_no_spread() {
        assert_eq!(Spread::of_rounds(&[1.0]), None);
        assert_eq!(
            Spread::of_rounds(&[2.0, 1.0]),
            Some(Spread {
                min: 1.0,
                median: 1.0,
                max: 2.0
            })
        );
    }

    #[test]
    fn spreads_separate_only_without_overlap_and_points_are_placed() {
        let a = Spread::of(&[1.0, 1.1, 1.2]);
        let b = Spread::of(&[1.2, 1.3]);
        let c = Spread::of(&[1.25, 1.3]);
        assert!(!a.separate(&b), "they share 1.2");
        assert!(a.separate(&c) && c.separate(&a));
        assert_eq!(a.place(0.9), Place::Below);
        assert_eq!(a.place(1.2), Place::Within);
        assert_eq!(a.place(1.3), Place::Above);
    }
}
