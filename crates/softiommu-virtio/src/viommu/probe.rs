//! The PROBE properties of an endpoint (§5.13.6.5, §5.13.6.6): one
//! RESV_MEM property per reserved region, the MSI window first, then
//! zeroes to `probe_size`.

use super::config::RESV_MEM_PROP;
use crate::spec::iommu as s;

/// Fills `out` (`probe_size` bytes, which the configuration checked can
/// hold every region) with a RESV_MEM property per `(start, end,
/// subtype)`, each `length + 4` bytes after the one before, and zeroes.
pub(crate) fn properties(regions: &[(u64, u64, u8)], out: &mut [u8]) {
    out.fill(0);
    for (i, &(start, end, subtype)) in regions.iter().enumerate() {
        let at = i * RESV_MEM_PROP;
        let Some(p) = out.get_mut(at..at + RESV_MEM_PROP) else {
            return;
        };
        p[0..2].copy_from_slice(&(s::PROBE_T_RESV_MEM & s::PROBE_TYPE_MASK).to_le_bytes());
        p[2..4].copy_from_slice(&(s::RESV_MEM_LEN as u16).to_le_bytes());
        p[4] = subtype;
        p[8..16].copy_from_slice(&start.to_le_bytes());
        p[16..24].copy_from_slice(&end.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msi_window_in_the_spec_layout() {
        let mut out = [0xaau8; 64];
        properties(&[(s::MSI_START, s::MSI_END, s::RESV_MEM_T_MSI)], &mut out);
        assert_eq!(&out[0..4], &[1, 0, 20, 0]);
        assert_eq!(&out[4..8], &[1, 0, 0, 0]);
        assert_eq!(&out[8..16], &0xfee0_0000u64.to_le_bytes());
        assert_eq!(&out[16..24], &0xfeef_ffffu64.to_le_bytes());
        assert!(out[24..].iter().all(|&b| b == 0));
    }
}
