//! `softiommu run`: the headline suite, every bench and lab in its quick
//! form, in one process, printed as tables or as one JSON object.

use serde::Serialize;

use crate::{bench, lab};

/// Collects each step's terminal text and JSON value.
struct Suite {
    json: bool,
    reports: Vec<serde_json::Value>,
}

impl Suite {
    fn emit<T: Serialize>(&mut self, text: String, value: &T) -> Result<(), String> {
        if !self.json {
            println!("{text}");
        }
        self.reports
            .push(serde_json::to_value(value).map_err(|e| e.to_string())?);
        Ok(())
    }
}

/// Runs the suite.
pub fn run(json: bool) -> Result<(), String> {
    let mut s = Suite {
        json,
        reports: Vec::new(),
    };
    let iova = bench::iova::IovaBenchArgs {
        threads: 1,
        live: 4096,
        seconds: 1.0,
        rounds: 5,
        impls: Vec::new(),
        json,
    };
    let r = bench::iova::run(&iova);
    s.emit(bench::iova::render(&r), &r)?;
    let r = bench::iova::run(&bench::iova::IovaBenchArgs { threads: 2, ..iova });
    s.emit(bench::iova::render(&r), &r)?;
    let r = bench::pgtable::run(&bench::pgtable::PgtableBenchArgs {
        seconds: 0.5,
        rounds: 5,
        json,
    })?;
    s.emit(bench::pgtable::render(&r), &r)?;
    let r = bench::translate::run(&bench::translate::TranslateBenchArgs {
        hit_pages: 2048,
        walk_pages: 65536,
        seconds: 1.0,
        rounds: 5,
        json,
    })?;
    s.emit(bench::translate::render(&r), &r)?;
    let r = bench::dma::run(&bench::dma::DmaBenchArgs {
        threads: 1,
        seconds: 0.5,
        iters: None,
        granule: 1,
        dir: "bidirectional".into(),
        dma_trans_ns: 0,
        run: Default::default(),
        json,
    })?;
    s.emit(bench::dma::render(&r), &r)?;
    let r = bench::access::run(&bench::access::AccessBenchArgs {
        ring: 256,
        buf_bytes: 64,
        seconds: 1.0,
        rounds: 41,
        json,
    })?;
    s.emit(bench::access::render(&r), &r)?;
    let r = lab::litmus::run(&lab::litmus::LitmusArgs {
        runs: 1_000_000,
        quick: true,
        json,
    })?;
    s.emit(lab::litmus::render(&r), &r)?;
    for msg_size in [32, 16384] {
        let r = lab::udp_stream::run(&lab::udp_stream::NetperfUdpArgs {
            msg_size,
            ordering: vec!["ordered".into()],
            seconds: None,
            rounds: None,
            quick: true,
            mtu: 1500,
            line_rate_mbit: 0,
            run: Default::default(),
            json,
        })?;
        s.emit(lab::udp_stream::render(&r), &r)?;
    }
    let r = lab::iperf_tcp::run(&lab::iperf_tcp::IperfTcpArgs {
        seconds: None,
        rounds: None,
        quick: true,
        walks: vec!["coherent".into(), "non-coherent".into()],
        policies: vec!["strict".into(), "deferred".into()],
        mtu: 1500,
        write_size: 65536,
        latency: "vtd-2015".into(),
        json,
    })?;
    s.emit(lab::iperf_tcp::render(&r), &r)?;
    let aging = lab::iova_aging::AgingArgs {
        quick: true,
        seconds: None,
        windows: None,
        jobs: 12,
        irq_cpus: 4,
        threads: None,
        iodepth: 32,
        slow_pct: 2.0,
        slow_hold: 1_000_000,
        policies: Vec::new(),
        json,
    };
    let r = lab::iova_aging::run(&aging, |p| {
        if !json {
            print!("{}", lab::iova_aging::render_timeline(p, 12));
        }
    })?;
    s.emit(lab::iova_aging::render_summary(&r), &r)?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({ "run": "headline", "reports": s.reports }))
                .map_err(|e| e.to_string())?
        );
    }
    Ok(())
}
