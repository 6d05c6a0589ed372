//! Page requests and page group responses (I/O page faults).
//!
//! Two fault-capable devices raise page requests by missing in their
//! table; a hostile device injects raw descriptors into the page request
//! queue; software takes them, moves the head, and answers groups: known
//! and unknown, with the wrong requester, twice, with reserved bits.
//! A model of the outstanding groups says what each device's wait must
//! return and how many responses the unit must count as unknown; nothing
//! may panic or hang.

#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use softiommu::hw::{
    Access, ContextEntry, InvDescriptor, PageRequest, QiError, QueueRecovery, ResponseCode,
    SourceId, Taken, TranslateError, Unit, UnitConfig,
};
use softiommu::mem::PhysMemory;
use softiommu::pgtable::{IoPageTable, Perm, VtdConfig, VtdPageTable};

const DEVS: [SourceId; 3] = [SourceId(0x0100), SourceId(0x0101), SourceId(0x0200)];
const MAPPED: u64 = 0x4000_0000;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Code {
    Success,
    Invalid,
    Failure,
}

impl Code {
    fn api(self) -> ResponseCode {
        match self {
            Code::Success => ResponseCode::Success,
            Code::Invalid => ResponseCode::Invalid,
            Code::Failure => ResponseCode::Failure,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Device `dev` misses at page `page` (or hits the mapped one).
    Fault {
        dev: u8,
        page: u16,
        write: bool,
        mapped: bool,
    },
    /// Software answers group `prgi` of device `dev`.
    Respond {
        dev: u8,
        prgi: u16,
        code: Code,
    },
    /// Answer the `k`-th outstanding group as a different requester.
    WrongRequester {
        k: u8,
        code: Code,
    },
    /// Answer the `k`-th outstanding group correctly.
    RespondKnown {
        k: u8,
        code: Code,
    },
    /// A page group response descriptor with bits flipped.
    RawResponse {
        dev: u8,
        prgi: u16,
        code: Code,
        flip: [u64; 2],
    },
    /// Device side: wait for the `k`-th group raised.
    Wait {
        k: u8,
    },
    Inject([u64; 4]),
    /// A well-formed request injected with `xor` applied.
    InjectRequest {
        dev: u8,
        prgi: u16,
        addr: u64,
        bits: u8,
        xor: [u64; 2],
    },
    Take,
    SetHead(u32),
    ReadSlot(u32),
    ClearOverflow,
    Enable {
        dev: u8,
        on: bool,
    },
    Cancel(u8),
}

/// The model: outstanding groups and their first answer.
#[derive(Default)]
struct Model {
    groups: BTreeMap<(u16, u16), Option<Code>>,
    raised: Vec<(u16, u16, u64)>,
    unknown: u64,
    responses: u64,
    /// A raw response was carried out: which group it answered is not
    /// modelled, so outcomes are no longer checked.
    blind: bool,
}

impl Model {
    fn respond(&mut self, sid: SourceId, prgi: u16, code: Code) {
        match self.groups.get_mut(&(sid.0, prgi)) {
            Some(g @ None) => {
                *g = Some(code);
                self.responses += 1;
            }
            _ => self.unknown += 1,
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mem = Arc::new(PhysMemory::new(16 << 20).expect("memory"));
    let unit = Unit::new(
        mem.clone(),
        UnitConfig {
            prq_order: 0,
            page_response_timeout: Duration::from_millis(2),
            ..UnitConfig::default()
        },
    )
    .expect("unit");
    let table = VtdPageTable::new(mem.clone(), VtdConfig::default()).expect("table");
    let frame = mem.alloc_zeroed_frames(0).expect("frame");
    table.map(MAPPED, frame, 4096, Perm::RW).expect("map");
    for d in DEVS {
        unit.attach(
            d,
            ContextEntry::Translated {
                did: 1,
                root: table.root(),
            },
        )
        .expect("attach");
    }
    unit.enable_page_requests(DEVS[0]);
    unit.enable_page_requests(DEVS[1]);
    let mut t = unit.translator().expect("translator");
    let mut m = Model::default();
    let dev = |d: u8| DEVS[usize::from(d) % DEVS.len()];
    for op in ops.into_iter().take(96) {
        match op {
            Op::Fault {
                dev: d,
                page,
                write,
                mapped,
            } => {
                let sid = dev(d);
                let iova = if mapped {
                    MAPPED
                } else {
                    0x1000_0000 + u64::from(page) * 4096
                };
                let access = if write { Access::Write } else { Access::Read };
                match t.translate(sid, iova, 8, access) {
                    Ok(x) => {
                        assert!(mapped, "{sid} {iova:#x} translated: {x:?}");
                        assert_eq!(x.as_slice()[0].phys, frame);
                    }
                    Err(TranslateError::PageRequested { prgi, .. }) => {
                        assert!(unit.page_requests_enabled(sid) && !mapped);
                        assert!(prgi < 512);
                        let fresh = m.groups.insert((sid.0, prgi), None).is_none();
                        assert!(fresh, "{sid} group {prgi} given out twice");
                        m.raised.push((sid.0, prgi, iova));
                    }
                    Err(e) => assert!(
                        !mapped
                            && (!unit.page_requests_enabled(sid)
                                || matches!(e, TranslateError::PageRequestDenied { .. })),
                        "{sid} {iova:#x}: {e:?}"
                    ),
                }
            }
            Op::Respond { dev: d, prgi, code } => {
                let prgi = prgi % 512;
                let r = unit.respond_page_group(dev(d), prgi, code.api());
                assert!(r.is_ok(), "{r:?}");
                m.respond(dev(d), prgi, code);
            }
            Op::WrongRequester { k, code } => {
                let Some((&(sid, prgi), _)) = nth(&m.groups, k) else {
                    continue;
                };
                let other = SourceId(sid ^ 0x0300);
                let r = unit.respond_page_group(other, prgi, code.api());
                assert!(r.is_ok(), "{r:?}");
                m.respond(other, prgi, code);
            }
            Op::RespondKnown { k, code } => {
                let Some((&(sid, prgi), _)) = nth(&m.groups, k) else {
                    continue;
                };
                let r = unit.respond_page_group(SourceId(sid), prgi, code.api());
                assert!(r.is_ok(), "{r:?}");
                m.respond(SourceId(sid), prgi, code);
            }
            Op::RawResponse {
                dev: d,
                prgi,
                code,
                flip,
            } => {
                let mut raw =
                    InvDescriptor::page_group_response(dev(d), prgi % 512, code.api()).encode();
                raw[0] ^= flip[0];
                raw[1] ^= flip[1];
                let before = unit.page_request_stats();
                let r = unit.submit_raw(&[raw]);
                assert!(matches!(r, Ok(()) | Err(QiError::Stopped(_))), "{r:?}");
                if unit.queue_error().is_some() {
                    // Refused: skipped, it answered nothing.
                    let r = unit.recover_queue(QueueRecovery::Skip);
                    assert!(matches!(r, Ok(true)), "{r:?}");
                    let after = unit.page_request_stats();
                    assert_eq!(before.responses, after.responses);
                    assert_eq!(before.unknown_responses, after.unknown_responses);
                } else if flip == [0, 0] {
                    m.respond(dev(d), prgi % 512, code);
                } else {
                    m.blind = true;
                }
            }
            Op::Wait { k } => {
                if m.raised.is_empty() {
                    continue;
                }
                let (sid, prgi, iova) = m.raised.remove(usize::from(k) % m.raised.len());
                let r = t.wait_page_response(SourceId(sid), iova, Access::Read, prgi);
                let want = m.groups.remove(&(sid, prgi)).flatten();
                if !m.blind {
                    match want {
                        Some(Code::Success) => assert!(r.is_ok(), "{r:?}"),
                        _ => assert!(
                            matches!(r, Err(TranslateError::PageRequestDenied { .. })),
                            "{r:?}"
                        ),
                    }
                }
            }
            Op::Inject(raw) => {
                let r = unit.inject_page_request(raw);
                assert!(r.is_ok(), "{r:?}");
            }
            Op::InjectRequest {
                dev: d,
                prgi,
                addr,
                bits,
                xor,
            } => {
                let req = PageRequest {
                    sid: dev(d),
                    pasid: None,
                    read: bits & 1 != 0,
                    write: bits & 2 != 0,
                    exec: bits & 4 != 0,
                    privileged: bits & 8 != 0,
                    last: bits & 16 != 0,
                    prgi: prgi % 512,
                    addr: addr & !0xfff,
                    private: [0, 0],
                };
                let mut raw = req.encode();
                raw[0] ^= xor[0];
                raw[1] ^= xor[1];
                let r = unit.inject_page_request(raw);
                assert!(r.is_ok(), "{r:?}");
            }
            Op::Take => match unit.take_page_request() {
                None => {}
                Some(Ok(Taken::Request(r))) => {
                    assert!(r.read || r.write);
                    assert!(r.prgi < 512);
                    assert_eq!(r.addr & 0xfff, 0);
                    // A well-formed request decodes back to itself.
                    assert_eq!(PageRequest::decode(r.encode()), Ok(r));
                }
                Some(Ok(Taken::Malformed { raw, error })) => {
                    assert_eq!(PageRequest::decode(raw), Err(error));
                }
                Some(Err(e)) => panic!("take: {e:?}"),
            },
            Op::SetHead(h) => {
                // Forward only, over the requests queued: from the head
                // up to the tail in ring order (nothing else moves them
                // here: this thread raises and takes).
                let before = unit.page_request_registers();
                let (len, head, tail) = (before.len, before.head, before.tail);
                let queued = (tail + len - head) % len;
                let want = h < len && (h + len - head) % len <= queued;
                let ok = unit.set_page_request_head(h);
                assert_eq!(ok, want, "head {h} of {len} (head {head}, tail {tail})");
                let after = unit.page_request_registers();
                assert_eq!(after.head, if ok { h } else { head });
            }
            Op::ReadSlot(i) => {
                let len = unit.page_request_registers().len;
                let _ = unit.read_page_request(i % (len + 2));
            }
            Op::ClearOverflow => unit.clear_page_request_overflow(),
            Op::Enable { dev: d, on } => {
                let sid = dev(d);
                if on {
                    unit.enable_page_requests(sid);
                } else {
                    unit.disable_page_requests(sid);
                    cancel(&mut m, sid);
                }
            }
            Op::Cancel(d) => {
                let sid = dev(d);
                unit.cancel_page_requests(sid);
                cancel(&mut m, sid);
            }
        }
        if !m.blind {
            let s = unit.page_request_stats();
            assert_eq!(s.responses, m.responses, "responses");
            assert_eq!(s.unknown_responses, m.unknown, "unknown responses");
        }
    }
});

fn cancel(m: &mut Model, sid: SourceId) {
    m.groups.retain(|&(s, _), _| s != sid.0);
}

fn nth(groups: &BTreeMap<(u16, u16), Option<Code>>, k: u8) -> Option<(&(u16, u16), &Option<Code>)> {
    if groups.is_empty() {
        return None;
    }
    groups.iter().nth(usize::from(k) % groups.len())
}
