//! Invalidation descriptors: the 128-bit records a driver writes into the
//! invalidation queue, in the bit layout of the Intel VT-d specification,
//! chapter 6.5.2 "Queued Invalidation Interface" (legacy 128-bit
//! descriptors, `IQA_REG.DW` = 0).
//!
//! Qword 0, bits 3:0 and 11:9 together give the type (7 bits). This unit
//! implements three:
//!
//! | type | descriptor | fields used (qword 0 / qword 1) |
//! |---|---|---|
//! | 1 | context-cache invalidate (§6.5.2.1) | G 5:4 (01 global, 10 domain, 11 device), DID 31:16, SID 47:32, FM 49:48 / — |
//! | 2 | IOTLB invalidate (§6.5.2.3) | G 5:4 (01 global, 10 domain, 11 page), DW 6, DR 7, DID 31:16 / AM 5:0, IH 6, ADDR 63:12 |
//! | 5 | invalidation wait (§6.5.2.8) | IF 4, SW 5, FN 6, PD 7, status data 63:32 / status address 63:2 |
//! | 9 | page group response (§6.5.2.9, in its 128-bit form) | PASID present 4, response code 15:12, requester id 31:16, PASID 51:32 / PRGI 11:3 |
//!
//! (The 256-bit form of the page group response also returns the request's
//! private data; this unit's queue has 128-bit descriptors, and the private
//! data is not echoed.)
//!
//! Any other type (device-TLB, interrupt-entry-cache, the PASID-based
//! ones), a granularity of 00, a reserved bit set, a DID beyond the unit's
//! domain count, or an address mask above the unit's maximum (`CAP.MAMV`)
//! is an invalidation-queue error ([`IqeReason`]), as on the hardware.
//! Address bits below a page-selective mask are ignored (the invalidated
//! range is the naturally aligned block of 2^AM pages holding `ADDR`).

use std::fmt;

use super::context::SourceId;
use super::prq::ResponseCode;
use crate::mem::PhysAddr;

/// Bytes per descriptor.
pub const DESCRIPTOR_BYTES: u64 = 16;

/// Descriptor type codes (VT-d §6.5.2).
const TYPE_CONTEXT: u8 = 1;
const TYPE_IOTLB: u8 = 2;
const TYPE_WAIT: u8 = 5;
const TYPE_PAGE_GROUP_RESPONSE: u8 = 9;

/// Which context-cache entries to invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContextScope {
    /// All of them.
    Global,
    /// Those of one domain.
    Domain {
        /// The domain id.
        did: u16,
    },
    /// Those of one device (or its functions, by `function_mask`).
    Device {
        /// The domain id the device had.
        did: u16,
        /// The device.
        source: SourceId,
        /// FM: 0 = exact function, 1/2/3 = ignore function bits 2, 2:1, 2:0.
        function_mask: u8,
    },
}

/// Which IOTLB entries to invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IotlbScope {
    /// All of them.
    Global,
    /// Those of one domain.
    Domain {
        /// The domain id.
        did: u16,
    },
    /// Those of one domain covering the naturally aligned 2^`am` pages
    /// (4 KiB) that hold `addr`.
    Pages {
        /// The domain id.
        did: u16,
        /// An IOVA in the block (bits below the block are ignored).
        addr: u64,
        /// log2 of the number of pages.
        am: u8,
        /// Invalidation hint: only leaf entries changed, paging-structure
        /// caches may be kept. (This unit has none; the hint is recorded.)
        ih: bool,
    },
}

/// Where and what an invalidation wait writes when it completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatusWrite {
    /// Physical address of the 32-bit status word (4-byte aligned).
    pub addr: PhysAddr,
    /// The value written.
    pub data: u32,
}

/// An invalidation wait descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WaitDescriptor {
    /// SW: write `data` to `addr` on completion.
    pub status: Option<StatusWrite>,
    /// FN: later descriptors wait for this one (this unit processes in
    /// order, so every wait behaves as fenced).
    pub fence: bool,
    /// IF: raise the completion event (recorded in the unit's counters).
    pub interrupt: bool,
    /// PD: also drain page requests (no page-request queue yet: accepted).
    pub page_drain: bool,
}

/// One queued-invalidation descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvDescriptor {
    /// Context-cache invalidate (type 1).
    ContextCache(ContextScope),
    /// IOTLB invalidate (type 2).
    Iotlb {
        /// What to invalidate.
        scope: IotlbScope,
        /// DR: drain reads before completing (always done here).
        drain_reads: bool,
        /// DW: drain writes before completing (always done here).
        drain_writes: bool,
    },
    /// Invalidation wait (type 5).
    Wait(WaitDescriptor),
    /// Page group response (type 9): answers a page request group.
    PageGroupResponse {
        /// The requester whose group is answered.
        sid: SourceId,
        /// The PASID the request carried, if any.
        pasid: Option<u32>,
        /// The page request group index (9 bits).
        prgi: u16,
        /// The answer.
        code: ResponseCode,
    },
}

/// Why the queue stopped: the invalidation-queue error (`FSTS.IQE`) and,
/// where VT-d defines one, its `IQERCD_REG.IQEI` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum IqeReason {
    /// A type this unit does not implement (IQEI 3).
    #[error("descriptor type {ty:#x} is not supported")]
    InvalidType {
        /// The 7-bit type.
        ty: u8,
    },
    /// A reserved bit is set (IQEI 4).
    #[error("reserved bits {bits:#x} set in qword {qword}")]
    ReservedBits {
        /// 0 or 1.
        qword: u8,
        /// The offending bits.
        bits: u64,
    },
    /// The granularity field holds the reserved value 00 (IQEI 4).
    #[error("granularity 00 is reserved")]
    ReservedGranularity,
    /// The DID is beyond the domains the unit supports (IQEI 4).
    #[error("domain id {did} is beyond the unit's {max} domains")]
    DomainOutOfRange {
        /// The DID.
        did: u16,
        /// The number of domains.
        max: u32,
    },
    /// The address mask exceeds `CAP.MAMV` (IQEI 4).
    #[error("address mask {am} exceeds the maximum {max}")]
    MaskTooLarge {
        /// The AM field.
        am: u8,
        /// The unit's maximum.
        max: u8,
    },
    /// A wait's status address lies outside memory (no IQEI code: real
    /// hardware would report a fault on the write). An unaligned one never
    /// gets here: its bits 1:0 are reserved in the descriptor
    /// ([`ReservedBits`](Self::ReservedBits), IQEI 4).
    #[error("status address {addr:#x} is outside memory")]
    StatusAddress {
        /// The address.
        addr: PhysAddr,
    },
    /// A wait's status address lies in a frame of the IOMMU's own (the
    /// invalidation ring, a page-table page, a bounce pool): the write
    /// would let a descriptor change what the unit relies on (no IQEI
    /// code).
    #[error("status address {addr:#x} lies in memory the IOMMU owns")]
    StatusAddressProtected {
        /// The address.
        addr: PhysAddr,
    },
    /// A tail written past the queue's end (IQEI 1).
    #[error("tail {tail} is beyond the {len}-descriptor queue")]
    TailOutOfRange {
        /// The tail written.
        tail: u32,
        /// Descriptors in the queue.
        len: u32,
    },
    /// A tail written in `[head, current)`, where a move from the current
    /// tail would cross the head (IQEI 1, "invalid tail pointer"; which
    /// tails are invalid VT-d leaves to the hardware, and this is the
    /// emulator's choice): it would drop descriptors queued and not yet
    /// run (the unit's own waits among them), or run old slots again. A
    /// tail anywhere else in the ring is a forward move over free slots.
    #[error(
        "tail {tail} is not a forward move from {current} within the free slots (head {head})"
    )]
    TailNotForward {
        /// The tail written.
        tail: u32,
        /// The tail before the write.
        current: u32,
        /// The head when it was checked.
        head: u32,
    },
    /// The descriptor could not be read from memory (IQEI 2).
    #[error("descriptor fetch failed")]
    Fetch,
}

impl IqeReason {
    /// The `IQERCD_REG.IQEI` value the hardware would report (0: no
    /// information).
    pub fn iqei(&self) -> u8 {
        match self {
            IqeReason::TailOutOfRange { .. } | IqeReason::TailNotForward { .. } => 1,
            IqeReason::Fetch => 2,
            IqeReason::InvalidType { .. } => 3,
            IqeReason::ReservedBits { .. }
            | IqeReason::ReservedGranularity
            | IqeReason::DomainOutOfRange { .. }
            | IqeReason::MaskTooLarge { .. } => 4,
            IqeReason::StatusAddress { .. } | IqeReason::StatusAddressProtected { .. } => 0,
        }
    }
}

/// What the decoder checks against: the unit's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Number of domain ids (2^ND).
    pub(crate) domains: u32,
    /// Largest address mask (`CAP.MAMV`).
    pub(crate) mamv: u8,
}

const G_SHIFT: u32 = 4;
const DID_SHIFT: u32 = 16;
const CC_SID_SHIFT: u32 = 32;
const CC_FM_SHIFT: u32 = 48;
const IOTLB_DW: u64 = 1 << 6;
const IOTLB_DR: u64 = 1 << 7;
const IOTLB_IH: u64 = 1 << 6;
const ADDR_MASK: u64 = !0xfff;
const WAIT_IF: u64 = 1 << 4;
const WAIT_SW: u64 = 1 << 5;
const WAIT_FN: u64 = 1 << 6;
const WAIT_PD: u64 = 1 << 7;
const WAIT_DATA_SHIFT: u32 = 32;

/// Reserved bits per type: (qword 0, qword 1).
const CC_RSVD: (u64, u64) = (0x1c0 | 0xf000 | 0xfffc_0000_0000_0000, !0);
const IOTLB_RSVD: (u64, u64) = (0x100 | 0xf000 | 0xffff_ffff_0000_0000, 0xf80);
const WAIT_RSVD: (u64, u64) = (0x100 | 0xffff_f000, 0x3);
const PGR_RSVD: (u64, u64) = (0x0fe0 | 0xfff0_0000_0000_0000, !0xff8);
const PGR_PASID_P: u64 = 1 << 4;
const PGR_CODE_SHIFT: u32 = 12;
const PGR_RID_SHIFT: u32 = 16;
const PGR_PASID_SHIFT: u32 = 32;
const PGR_PRGI_SHIFT: u32 = 3;

fn type_bits(ty: u8) -> u64 {
    u64::from(ty & 0xf) | u64::from(ty >> 4 & 7) << 9
}

fn check_reserved(raw: [u64; 2], rsvd: (u64, u64)) -> Result<(), IqeReason> {
    if raw[0] & rsvd.0 != 0 {
        return Err(IqeReason::ReservedBits {
            qword: 0,
            bits: raw[0] & rsvd.0,
        });
    }
    if raw[1] & rsvd.1 != 0 {
        return Err(IqeReason::ReservedBits {
            qword: 1,
            bits: raw[1] & rsvd.1,
        });
    }
    Ok(())
}

fn check_did(did: u16, limits: &Limits) -> Result<u16, IqeReason> {
    if u32::from(did) < limits.domains {
        Ok(did)
    } else {
        Err(IqeReason::DomainOutOfRange {
            did,
            max: limits.domains,
        })
    }
}

impl InvDescriptor {
    /// An IOTLB invalidation of everything.
    pub fn iotlb_global() -> Self {
        Self::iotlb(IotlbScope::Global)
    }

    /// An IOTLB invalidation of one domain.
    pub fn iotlb_domain(did: u16) -> Self {
        Self::iotlb(IotlbScope::Domain { did })
    }

    /// An IOTLB invalidation of the 2^`am` pages holding `addr` in `did`.
    pub fn iotlb_pages(did: u16, addr: u64, am: u8, ih: bool) -> Self {
        Self::iotlb(IotlbScope::Pages { did, addr, am, ih })
    }

    fn iotlb(scope: IotlbScope) -> Self {
        // Linux sets DR and DW whenever the unit supports draining.
        InvDescriptor::Iotlb {
            scope,
            drain_reads: true,
            drain_writes: true,
        }
    }

    /// A page group response: `code` for group `prgi` of `sid`. The
    /// descriptor's index field is 9 bits: `encode` keeps only those, so a
    /// `prgi` of 512 or more would answer another group
    /// ([`Unit::respond_page_group`](super::Unit::respond_page_group)
    /// refuses one).
    pub fn page_group_response(sid: SourceId, prgi: u16, code: ResponseCode) -> Self {
        InvDescriptor::PageGroupResponse {
            sid,
            pasid: None,
            prgi,
            code,
        }
    }

    /// A context-cache invalidation.
    pub fn context(scope: ContextScope) -> Self {
        InvDescriptor::ContextCache(scope)
    }

    /// A fenced wait that raises the completion event and writes nothing:
    /// the unit's own waits (their ticket is kept privately).
    pub fn wait_event() -> Self {
        InvDescriptor::Wait(WaitDescriptor {
            status: None,
            fence: true,
            interrupt: true,
            page_drain: false,
        })
    }

    /// A fenced wait that writes `data` at `addr` on completion. `addr`
    /// must be 4-byte aligned (VT-d's status address is bits 63:2): an
    /// unaligned one is encoded as given, with the reserved bits 1:0 set,
    /// and the unit stops the queue at it with
    /// [`IqeReason::ReservedBits`] (qword 1) instead of writing elsewhere.
    pub fn wait_status(addr: PhysAddr, data: u32) -> Self {
        InvDescriptor::Wait(WaitDescriptor {
            status: Some(StatusWrite { addr, data }),
            fence: true,
            ..WaitDescriptor::default()
        })
    }

    /// The descriptor's 128 bits, as the hardware reads them.
    pub fn encode(&self) -> [u64; 2] {
        match *self {
            InvDescriptor::ContextCache(scope) => {
                let (g, did, sid, fm) = match scope {
                    ContextScope::Global => (1u64, 0u16, 0u16, 0u8),
                    ContextScope::Domain { did } => (2, did, 0, 0),
                    ContextScope::Device {
                        did,
                        source,
                        function_mask,
                    } => (3, did, source.0, function_mask & 3),
                };
                let lo = type_bits(TYPE_CONTEXT)
                    | g << G_SHIFT
                    | u64::from(did) << DID_SHIFT
                    | u64::from(sid) << CC_SID_SHIFT
                    | u64::from(fm) << CC_FM_SHIFT;
                [lo, 0]
            }
            InvDescriptor::Iotlb {
                scope,
                drain_reads,
                drain_writes,
            } => {
                let (g, did, hi) = match scope {
                    IotlbScope::Global => (1u64, 0u16, 0u64),
                    IotlbScope::Domain { did } => (2, did, 0),
                    IotlbScope::Pages { did, addr, am, ih } => (
                        3,
                        did,
                        addr & ADDR_MASK | if ih { IOTLB_IH } else { 0 } | u64::from(am & 0x3f),
                    ),
                };
                let lo = type_bits(TYPE_IOTLB)
                    | g << G_SHIFT
                    | if drain_writes { IOTLB_DW } else { 0 }
                    | if drain_reads { IOTLB_DR } else { 0 }
                    | u64::from(did) << DID_SHIFT;
                [lo, hi]
            }
            InvDescriptor::Wait(w) => {
                let mut lo = type_bits(TYPE_WAIT)
                    | if w.interrupt { WAIT_IF } else { 0 }
                    | if w.fence { WAIT_FN } else { 0 }
                    | if w.page_drain { WAIT_PD } else { 0 };
                let mut hi = 0;
                if let Some(s) = w.status {
                    lo |= WAIT_SW | u64::from(s.data) << WAIT_DATA_SHIFT;
                    // As given: an unaligned address sets the reserved
                    // bits 1:0 and the unit refuses the descriptor, rather
                    // than write a word the caller did not name.
                    hi = s.addr;
                }
                [lo, hi]
            }
            InvDescriptor::PageGroupResponse {
                sid,
                pasid,
                prgi,
                code,
            } => {
                let mut lo = type_bits(TYPE_PAGE_GROUP_RESPONSE)
                    | u64::from(code.bits()) << PGR_CODE_SHIFT
                    | u64::from(sid.0) << PGR_RID_SHIFT;
                if let Some(p) = pasid {
                    lo |= PGR_PASID_P | (u64::from(p) & 0xf_ffff) << PGR_PASID_SHIFT;
                }
                [lo, (u64::from(prgi) & 0x1ff) << PGR_PRGI_SHIFT]
            }
        }
    }

    /// Decodes and checks `raw` as the unit with `limits` would.
    pub(crate) fn decode(raw: [u64; 2], limits: &Limits) -> Result<Self, IqeReason> {
        let lo = raw[0];
        let ty = (lo & 0xf) as u8 | ((lo >> 9 & 7) as u8) << 4;
        let g = lo >> G_SHIFT & 3;
        let did = (lo >> DID_SHIFT) as u16;
        match ty {
            TYPE_CONTEXT => {
                check_reserved(raw, CC_RSVD)?;
                let scope = match g {
                    1 => ContextScope::Global,
                    2 => ContextScope::Domain {
                        did: check_did(did, limits)?,
                    },
                    3 => ContextScope::Device {
                        did: check_did(did, limits)?,
                        source: SourceId((lo >> CC_SID_SHIFT) as u16),
                        function_mask: (lo >> CC_FM_SHIFT & 3) as u8,
                    },
                    _ => return Err(IqeReason::ReservedGranularity),
                };
                Ok(InvDescriptor::ContextCache(scope))
            }
            TYPE_IOTLB => {
                check_reserved(raw, IOTLB_RSVD)?;
                let scope = match g {
                    1 => IotlbScope::Global,
                    2 => IotlbScope::Domain {
                        did: check_did(did, limits)?,
                    },
                    3 => {
                        let am = (raw[1] & 0x3f) as u8;
                        if am > limits.mamv {
                            return Err(IqeReason::MaskTooLarge {
                                am,
                                max: limits.mamv,
                            });
                        }
                        IotlbScope::Pages {
                            did: check_did(did, limits)?,
                            addr: raw[1] & ADDR_MASK,
                            am,
                            ih: raw[1] & IOTLB_IH != 0,
                        }
                    }
                    _ => return Err(IqeReason::ReservedGranularity),
                };
                Ok(InvDescriptor::Iotlb {
                    scope,
                    drain_reads: lo & IOTLB_DR != 0,
                    drain_writes: lo & IOTLB_DW != 0,
                })
            }
            TYPE_WAIT => {
                check_reserved(raw, WAIT_RSVD)?;
                let status = (lo & WAIT_SW != 0).then(|| StatusWrite {
                    addr: raw[1] & !3,
                    data: (lo >> WAIT_DATA_SHIFT) as u32,
                });
                Ok(InvDescriptor::Wait(WaitDescriptor {
                    status,
                    fence: lo & WAIT_FN != 0,
                    interrupt: lo & WAIT_IF != 0,
                    page_drain: lo & WAIT_PD != 0,
                }))
            }
            TYPE_PAGE_GROUP_RESPONSE => {
                check_reserved(raw, PGR_RSVD)?;
                let bits = (lo >> PGR_CODE_SHIFT & 0xf) as u8;
                let code = ResponseCode::from_bits(bits).ok_or(IqeReason::ReservedBits {
                    qword: 0,
                    bits: u64::from(bits) << PGR_CODE_SHIFT,
                })?;
                let pasid_present = lo & PGR_PASID_P != 0;
                let pasid = (lo >> PGR_PASID_SHIFT & 0xf_ffff) as u32;
                if !pasid_present && pasid != 0 {
                    return Err(IqeReason::ReservedBits {
                        qword: 0,
                        bits: u64::from(pasid) << PGR_PASID_SHIFT,
                    });
                }
                Ok(InvDescriptor::PageGroupResponse {
                    sid: SourceId((lo >> PGR_RID_SHIFT) as u16),
                    pasid: pasid_present.then_some(pasid),
                    prgi: (raw[1] >> PGR_PRGI_SHIFT & 0x1ff) as u16,
                    code,
                })
            }
            ty => Err(IqeReason::InvalidType { ty }),
        }
    }
}

impl fmt::Display for InvDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvDescriptor::ContextCache(s) => write!(f, "cc-inv {s:?}"),
            InvDescriptor::Iotlb { scope, .. } => match scope {
                IotlbScope::Global => write!(f, "iotlb-inv global"),
                IotlbScope::Domain { did } => write!(f, "iotlb-inv did={did}"),
                IotlbScope::Pages { did, addr, am, ih } => {
                    write!(f, "iotlb-inv did={did} addr={addr:#x} am={am} ih={ih}")
                }
            },
            InvDescriptor::Wait(w) => match w.status {
                Some(s) => write!(f, "inv-wait sw {:#x}<-{:#x}", s.addr, s.data),
                None => write!(f, "inv-wait"),
            },
            InvDescriptor::PageGroupResponse {
                sid, prgi, code, ..
            } => write!(f, "page-group-response {sid} prgi={prgi} {code:?}"),
        }
    }
}

/// The page-selective invalidations covering `[iova, iova + len)` the way
/// Linux computes them (`calculate_psi_aligned_address`): the smallest
/// naturally aligned block of 2^AM pages holding the whole range, or `None`
/// if AM would exceed `mamv` (then a domain-selective invalidation is due).
pub fn covering_mask(iova: u64, len: u64, mamv: u8) -> Option<(u64, u8)> {
    let first = iova >> 12;
    let last = iova.saturating_add(len.max(1) - 1) >> 12;
    let pages = last - first + 1;
    let mut am = pages.next_power_of_two().trailing_zeros();
    if first & ((1u64 << am) - 1) != 0 {
        // Not aligned: the block must reach up to the highest bit in which
        // first and last differ.
        am = 64 - (first ^ last).leading_zeros();
    }
    if am > u32::from(mamv) {
        return None;
    }
    Some((first >> am << am << 12, am as u8))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const L: Limits = Limits {
        domains: 256,
        mamv: 18,
    };

    #[test]
    fn every_descriptor_round_trips() {
        let all = [
            InvDescriptor::context(ContextScope::Global),
            InvDescriptor::context(ContextScope::Domain { did: 9 }),
            InvDescriptor::context(ContextScope::Device {
                did: 3,
                source: SourceId(0x1234),
                function_mask: 2,
            }),
            InvDescriptor::iotlb_global(),
            InvDescriptor::iotlb_domain(255),
            InvDescriptor::iotlb_pages(7, 0x1234_5000, 3, true),
            InvDescriptor::Iotlb {
                scope: IotlbScope::Domain { did: 1 },
                drain_reads: false,
                drain_writes: true,
            },
            InvDescriptor::wait_status(0x8004, 0xdead_beef),
            InvDescriptor::Wait(WaitDescriptor::default()),
            InvDescriptor::Wait(WaitDescriptor {
                status: None,
                fence: true,
                interrupt: true,
                page_drain: true,
            }),
        ];
        for d in all {
            assert_eq!(InvDescriptor::decode(d.encode(), &L), Ok(d), "{d}");
        }
    }

    #[test]
    fn the_bits_are_where_the_specification_puts_them() {
        // IOTLB page-selective: type 2, G = 11b, DR|DW, DID 31:16 / ADDR, IH, AM.
        let [lo, hi] = InvDescriptor::iotlb_pages(0x42, 0xabc_d000, 5, true).encode();
        assert_eq!(lo, 0x2 | 0x30 | 0x40 | 0x80 | 0x42 << 16);
        assert_eq!(hi, 0xabc_d000 | 1 << 6 | 5);
        // Wait with status write: type 5, SW, FN, data 63:32 / address 63:2.
        let [lo, hi] = InvDescriptor::wait_status(0x1000, 7).encode();
        assert_eq!(lo, 0x5 | 0x20 | 0x40 | 7 << 32);
        assert_eq!(hi, 0x1000);
        // Context-cache device-selective: type 1, G = 11b, DID, SID, FM.
        let [lo, hi] = InvDescriptor::context(ContextScope::Device {
            did: 1,
            source: SourceId(0x0208),
            function_mask: 3,
        })
        .encode();
        assert_eq!(lo, 0x1 | 0x30 | 1 << 16 | 0x0208 << 32 | 3 << 48);
        assert_eq!(hi, 0);
    }

    #[test]
    fn malformed_descriptors_are_queue_errors() {
        let dec = |raw| InvDescriptor::decode(raw, &L);
        assert_eq!(dec([0, 0]), Err(IqeReason::InvalidType { ty: 0 }));
        assert_eq!(dec([3, 0]), Err(IqeReason::InvalidType { ty: 3 }));
        assert_eq!(
            dec([2 | 1 << 9, 0]),
            Err(IqeReason::InvalidType { ty: 0x12 })
        );
        assert_eq!(dec([2, 0]), Err(IqeReason::ReservedGranularity));
        assert_eq!(dec([1, 0]), Err(IqeReason::ReservedGranularity));
        assert_eq!(
            dec([2 | 0x10 | 1 << 40, 0]),
            Err(IqeReason::ReservedBits {
                qword: 0,
                bits: 1 << 40
            })
        );
        assert_eq!(
            dec([2 | 0x30, 1 << 8]),
            Err(IqeReason::ReservedBits {
                qword: 1,
                bits: 1 << 8
            })
        );
        assert_eq!(
            dec([1 | 0x10, 5]),
            Err(IqeReason::ReservedBits { qword: 1, bits: 5 })
        );
        assert_eq!(
            dec([5 | 0x20, 0x1001]),
            Err(IqeReason::ReservedBits { qword: 1, bits: 1 })
        );
        assert_eq!(
            dec(InvDescriptor::iotlb_domain(256).encode()),
            Err(IqeReason::DomainOutOfRange { did: 256, max: 256 })
        );
        assert_eq!(
            dec(InvDescriptor::iotlb_pages(1, 0, 19, false).encode()),
            Err(IqeReason::MaskTooLarge { am: 19, max: 18 })
        );
        assert_eq!(IqeReason::InvalidType { ty: 3 }.iqei(), 3);
        assert_eq!(IqeReason::ReservedGranularity.iqei(), 4);
    }

    #[test]
    fn covering_masks_follow_linux() {
        assert_eq!(covering_mask(0x5000, 0x1000, 18), Some((0x5000, 0)));
        assert_eq!(covering_mask(0x4000, 0x4000, 18), Some((0x4000, 2)));
        // 3 pages at 0x5000: rounded to 4, unaligned, so the block grows
        // until it holds pages 5..=7: [4, 8), am 2.
        assert_eq!(covering_mask(0x5000, 0x3000, 18), Some((0x4000, 2)));
        // Pages 7..=8 straddle an 8-page boundary: [0, 16), am 4.
        assert_eq!(covering_mask(0x7000, 0x2000, 18), Some((0, 4)));
        assert_eq!(covering_mask(0, 1 << 40, 18), None);
        for (iova, len) in [(0x7000u64, 0x2000u64), (0x12_3000, 0x9_9000), (0, 1)] {
            let (base, am) = covering_mask(iova, len, 63).unwrap();
            assert!(base <= iova && iova + len <= base + (0x1000 << am));
            assert_eq!(base % (0x1000 << am), 0);
        }
    }
}
