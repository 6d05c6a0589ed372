//! One shape for every experiment: a [`Report`] of typed parameters,
//! tables of figures with units, plots, and the modelled figures in force.

mod model;
mod spread;
mod unit;

pub use model::{
    contract, Axis, Cell, Column, Modelled, Param, Plot, PlotKind, Provenance, Report, Series,
    Table, MODELLED_MARK,
};
pub use spread::{Place, Spread};
pub use unit::{Better, Unit};
