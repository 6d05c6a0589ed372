//! The requests of §5.13.6 encoded, and [`ViommuDriver`]'s typed calls
//! over them: each sends one request (strict) or queues it (lazy).

use super::driver::{Completion, ViommuDriver, ViommuDriverError};
use super::status::Status;
use crate::spec::iommu as s;

/// Encoders of the device-readable part of each request type.
pub mod encode {
    use super::s;

    fn head(ty: u8, out: &mut [u8]) {
        out[0] = ty;
    }

    /// ATTACH (§5.13.6.1).
    pub fn attach(domain: u32, endpoint: u32, flags: u32) -> [u8; s::ATTACH_LEN] {
        let mut b = [0u8; s::ATTACH_LEN];
        head(s::T_ATTACH, &mut b);
        b[4..8].copy_from_slice(&domain.to_le_bytes());
        b[8..12].copy_from_slice(&endpoint.to_le_bytes());
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b
    }

    /// DETACH (§5.13.6.2).
    pub fn detach(domain: u32, endpoint: u32) -> [u8; s::DETACH_LEN] {
        let mut b = [0u8; s::DETACH_LEN];
        head(s::T_DETACH, &mut b);
        b[4..8].copy_from_slice(&domain.to_le_bytes());
        b[8..12].copy_from_slice(&endpoint.to_le_bytes());
        b
    }

    /// MAP (§5.13.6.3): `[start, end]` inclusive.
    pub fn map(domain: u32, start: u64, end: u64, phys: u64, flags: u32) -> [u8; s::MAP_LEN] {
        let mut b = [0u8; s::MAP_LEN];
        head(s::T_MAP, &mut b);
        b[4..8].copy_from_slice(&domain.to_le_bytes());
        b[8..16].copy_from_slice(&start.to_le_bytes());
        b[16..24].copy_from_slice(&end.to_le_bytes());
        b[24..32].copy_from_slice(&phys.to_le_bytes());
        b[32..36].copy_from_slice(&flags.to_le_bytes());
        b
    }

    /// UNMAP (§5.13.6.4): `[start, end]` inclusive.
    pub fn unmap(domain: u32, start: u64, end: u64) -> [u8; s::UNMAP_LEN] {
        let mut b = [0u8; s::UNMAP_LEN];
        head(s::T_UNMAP, &mut b);
        b[4..8].copy_from_slice(&domain.to_le_bytes());
        b[8..16].copy_from_slice(&start.to_le_bytes());
        b[16..24].copy_from_slice(&end.to_le_bytes());
        b
    }

    /// PROBE (§5.13.6.5).
    pub fn probe(endpoint: u32) -> [u8; s::PROBE_LEN] {
        let mut b = [0u8; s::PROBE_LEN];
        head(s::T_PROBE, &mut b);
        b[4..8].copy_from_slice(&endpoint.to_le_bytes());
        b
    }
}

/// A completion's status; a request returned unwritten is `None`.
fn status(c: &Completion) -> Option<Status> {
    c.status()
}

impl ViommuDriver {
    /// Sends `readable` with a bare tail and waits: the status, `None` if
    /// the device wrote none.
    pub fn request(&mut self, readable: &[u8]) -> Result<Option<Status>, ViommuDriverError> {
        self.call_status(readable)
    }

    /// ATTACH, waited for.
    pub fn attach(
        &mut self,
        domain: u32,
        endpoint: u32,
        flags: u32,
    ) -> Result<Option<Status>, ViommuDriverError> {
        self.request(&encode::attach(domain, endpoint, flags))
    }

    /// DETACH, waited for.
    pub fn detach(
        &mut self,
        domain: u32,
        endpoint: u32,
    ) -> Result<Option<Status>, ViommuDriverError> {
        self.request(&encode::detach(domain, endpoint))
    }

    /// MAP of `[start, end]`, waited for.
    pub fn map(
        &mut self,
        domain: u32,
        start: u64,
        end: u64,
        phys: u64,
        flags: u32,
    ) -> Result<Option<Status>, ViommuDriverError> {
        self.request(&encode::map(domain, start, end, phys, flags))
    }

    /// UNMAP of `[start, end]`, waited for: when it returns `OK`, the
    /// unit's invalidation of the range has completed.
    pub fn unmap(
        &mut self,
        domain: u32,
        start: u64,
        end: u64,
    ) -> Result<Option<Status>, ViommuDriverError> {
        self.request(&encode::unmap(domain, start, end))
    }

    /// PROBE of `endpoint` with a properties part of `probe_size` bytes:
    /// the status and the properties.
    pub fn probe_endpoint(
        &mut self,
        endpoint: u32,
    ) -> Result<(Option<Status>, Vec<u8>), ViommuDriverError> {
        let size = self.geometry().probe_size;
        let c = self.call(&encode::probe(endpoint), size + s::TAIL_LEN as u32)?;
        let st = status(&c);
        let mut props = c.writable;
        props.truncate(size as usize);
        Ok((st, props))
    }
}
