//! `softiommu bench ring`: the hand-built NIC ring with no network stack —
//! what `lab netperf-udp` measured before it ran on smoltcp and
//! virtio-net. Frames are built by hand, mapped, posted on a plain
//! descriptor ring and checked by a device thread: the floor of a policy's
//! per-packet cost with nothing else around it. The scenario itself is
//! `lab::netperf_udp` (unchanged); this names it as the bench it now is.

use crate::lab::netperf_udp::{self, NetperfArgs};

/// Options: those of the old lab.
pub type RingArgs = NetperfArgs;

/// Runs the ring and returns its report as JSON, keyed `"bench": "ring"`.
pub fn run(args: &RingArgs) -> Result<(serde_json::Value, String), String> {
    let r = netperf_udp::run(args)?;
    let text = netperf_udp::render(&r).replacen("lab netperf-udp", "bench ring", 1);
    let mut v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
    if let Some(o) = v.as_object_mut() {
        o.remove("lab");
        o.insert("bench".into(), "ring".into());
    }
    Ok((v, text))
}
