//! [`Request`]: a request's device-readable bytes parsed (§5.13.6), with
//! every field the device must check kept (reserved bytes included).

use crate::spec::iommu as s;

/// The most device-readable bytes the device reads of one request: the
/// largest request (PROBE); bytes past it are ignored.
pub(crate) const MAX_REQUEST: usize = s::PROBE_LEN;

/// A parsed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// §5.13.6.1.
    Attach {
        domain: u32,
        endpoint: u32,
        flags: u32,
        reserved_set: bool,
    },
    /// §5.13.6.2 (`reserved` is ignored).
    Detach { domain: u32, endpoint: u32 },
    /// §5.13.6.3.
    Map {
        domain: u32,
        start: u64,
        end: u64,
        phys: u64,
        flags: u32,
    },
    /// §5.13.6.4.
    Unmap {
        domain: u32,
        start: u64,
        end: u64,
        reserved_set: bool,
    },
    /// §5.13.6.5 (`reserved` is ignored).
    Probe { endpoint: u32 },
}

/// Why the readable part is no request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParseError {
    /// Shorter than the head: the type is unknown.
    NoHead,
    /// A type §5.13.6 does not define.
    UnknownType(u8),
    /// Shorter than its type's layout.
    Short { ty: u8, len: usize },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Request {
    /// Parses the first `len` readable bytes in `b` (`len` is the
    /// readable part's whole length; `b` holds its first bytes, up to
    /// [`MAX_REQUEST`]). The head's `reserved` bytes are ignored
    /// (§5.13.6.2: the device MUST ignore them).
    pub(crate) fn parse(b: &[u8], len: usize) -> Result<Self, ParseError> {
        // The type first: a readable part of 1 to 3 bytes whose type is
        // not one the device knows is returned unwritten as any unknown
        // type is (§5.13.6.2), not answered INVAL.
        let Some(&ty) = b.first() else {
            return Err(ParseError::NoHead);
        };
        let need = match ty {
            s::T_ATTACH => s::ATTACH_LEN,
            s::T_DETACH => s::DETACH_LEN,
            s::T_MAP => s::MAP_LEN,
            s::T_UNMAP => s::UNMAP_LEN,
            s::T_PROBE => s::PROBE_LEN,
            _ => return Err(ParseError::UnknownType(ty)),
        };
        if len < s::HEAD_LEN || b.len() < s::HEAD_LEN {
            return Err(ParseError::NoHead);
        }
        if len < need || b.len() < need {
            return Err(ParseError::Short { ty, len });
        }
        let h = s::HEAD_LEN;
        Ok(match ty {
            s::T_ATTACH => Request::Attach {
                domain: u32_at(b, h),
                endpoint: u32_at(b, h + 4),
                flags: u32_at(b, h + 8),
                reserved_set: b[h + 12..h + 16].iter().any(|&x| x != 0),
            },
            s::T_DETACH => Request::Detach {
                domain: u32_at(b, h),
                endpoint: u32_at(b, h + 4),
            },
            s::T_MAP => Request::Map {
                domain: u32_at(b, h),
                start: u64_at(b, h + 4),
                end: u64_at(b, h + 12),
                phys: u64_at(b, h + 20),
                flags: u32_at(b, h + 28),
            },
            s::T_UNMAP => Request::Unmap {
                domain: u32_at(b, h),
                start: u64_at(b, h + 4),
                end: u64_at(b, h + 12),
                reserved_set: b[h + 20..h + 24].iter().any(|&x| x != 0),
            },
            _ => Request::Probe {
                endpoint: u32_at(b, h),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_unknown_and_whole_requests() {
        let mut b = [0u8; MAX_REQUEST];
        assert_eq!(Request::parse(&b[..0], 0), Err(ParseError::NoHead));
        b[0] = s::T_ATTACH;
        assert_eq!(Request::parse(&b, 3), Err(ParseError::NoHead));
        // A known type too short for a head is `NoHead` (INVAL); an unknown
        // one is unknown however short (returned unwritten).
        assert_eq!(Request::parse(&b[..3], 3), Err(ParseError::NoHead));
        b[0] = 9;
        assert_eq!(Request::parse(&b[..1], 1), Err(ParseError::UnknownType(9)));
        b[0] = 9;
        assert_eq!(Request::parse(&b, 80), Err(ParseError::UnknownType(9)));
        b[0] = s::T_MAP;
        assert_eq!(
            Request::parse(&b, s::MAP_LEN - 1),
            Err(ParseError::Short {
                ty: s::T_MAP,
                len: s::MAP_LEN - 1
            })
        );
        b[4] = 7;
        b[8] = 0x10;
        b[16] = 0x1f;
        b[17] = 0x10;
        b[24] = 0x20;
        b[32] = 3;
        assert_eq!(
            Request::parse(&b, s::MAP_LEN),
            Ok(Request::Map {
                domain: 7,
                start: 0x10,
                end: 0x101f,
                phys: 0x20,
                flags: 3
            })
        );
    }
}
