//! `softiommu run`: the headline suite, every bench and lab in its quick
//! form, in one process, printed as tables or as one JSON object.

use crate::error::LabResult;
use crate::report::Report;
use crate::{bench, lab};

/// Runs the suite.
pub fn run(json: bool) -> LabResult<()> {
    let host = crate::host::Host::detect();
    let mut reports: Vec<Report> = Vec::new();
    let mut emit = |r: Report| {
        if !json {
            println!("{}", crate::render::render_report(&r, &host));
        }
        reports.push(r);
    };
    let iova = bench::iova::IovaBenchArgs::default();
    emit(bench::iova::run(&iova)?);
    emit(bench::pgtable::run(&Default::default())?);
    emit(bench::translate::run(&Default::default())?);
    emit(bench::dma::run(&Default::default())?);
    emit(bench::access::run(&Default::default())?);
    emit(lab::litmus::run(&lab::litmus::LitmusArgs {
        quick: true,
        ..Default::default()
    })?);
    emit(lab::netperf_udp::run(&lab::netperf_udp::NetperfArgs {
        quick: true,
        ..Default::default()
    })?);
    emit(lab::iova_aging::run(
        &lab::iova_aging::AgingArgs {
            quick: true,
            ..Default::default()
        },
        |_| {},
    )?);
    if json {
        let all: Vec<_> = reports.iter().map(|r| r.contract.clone()).collect();
        println!(
            "{}",
            serde_json::json!({ "run": "headline", "reports": all })
        );
    }
    Ok(())
}
