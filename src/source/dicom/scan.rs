//! A pre-scan of the data set's bytes (element headers, lengths, nesting) before the DICOM crates
//! parse it, so that a lying length or an absurd nesting is refused instead of allocated.

use super::*;

/// What the header walk found.
pub(super) struct Scan {
    /// Offset of "DICM" (128 with a preamble, 0 without).
    pub(super) start: usize,
    pub(super) transfer_syntax: String,
}

/// Walk the element headers of a Part 10 file without decoding values: find the file meta group's
/// transfer syntax and check that no element or item declares more bytes than remain in the file.
/// The walk reads headers by the same rules as dicom-rs (an unknown VR has the long form, as UN;
/// implicit VR comes from the standard dictionary; any undefined length other than encapsulated
/// pixel data opens a sequence), so it visits the headers dicom-rs will visit and never rejects a
/// file that dicom-rs would read. A deflated data set is walked inflated.
pub(super) fn prescan(b: &[u8]) -> Result<Scan, Reject> {
    prescan_in(b, None)
}

/// `prescan` of `b`, or, with `file_len`, of the first bytes of a file that long: lengths are
/// checked against the file, and the walk stops where `b` ends. A deflated data set is not walked
/// then (its inflated length is unknown).
pub(super) fn prescan_in(b: &[u8], file_len: Option<u64>) -> Result<Scan, Reject> {
    let total = file_len.map_or(b.len(), |l| {
        usize::try_from(l).unwrap_or(usize::MAX).max(b.len())
    });
    let start = if b.len() >= 132 && &b[128..132] == b"DICM" {
        128
    } else if b.len() >= 4 && &b[0..4] == b"DICM" {
        0
    } else {
        return Err(Reject::new(format!(
            "not a DICOM Part 10 file: no \"DICM\" marker at byte 128 ({} bytes)",
            b.len()
        )));
    };
    let trunc = |what: String| Reject::new(format!("truncated DICOM: {what}"));
    let mut pos = start + 4;
    let mut ts = String::new();
    // File meta group: always explicit VR little endian. dicom-rs reads it as its group length
    // (0002,0000) says: whole elements, of any group, until that many bytes are consumed, and the
    // data set starts after them. Without a group length (which dicom-rs refuses), it ends at the
    // first element of another group. A mutated tag in the group once made this walk start the
    // data set elsewhere than dicom-rs, which then zero-filled 1.5 GB (the dicom fuzz target).
    let group_len = match header(b, pos, Mode::ExplicitLe) {
        Some(h) if (h.group, h.elem, h.len) == (0x0002, 0x0000, Some(4)) => {
            b.get(pos + h.size..pos + h.size + 4).map(|v| {
                (
                    pos + h.size + 4,
                    u32::from_le_bytes([v[0], v[1], v[2], v[3]]) as usize,
                )
            })
        }
        _ => None,
    };
    loop {
        if let Some((from, len)) = group_len {
            if pos >= from && pos - from >= len {
                break;
            }
        }
        if pos == b.len() {
            return Err(trunc("the file ends inside the file meta group".into()));
        }
        let Some(h) = header(b, pos, Mode::ExplicitLe) else {
            return Err(trunc(format!("element header cut off at byte {pos}")));
        };
        if h.group != 0x0002 && group_len.is_none() {
            break;
        }
        let Some(len) = h.len else {
            return Err(Reject::new(
                "invalid DICOM: undefined length in the file meta group",
            ));
        };
        let rem = total - pos - h.size;
        if len > rem {
            return Err(trunc(format!(
                "{} at byte {pos} declares {len} bytes, {rem} remain",
                h.tag_name()
            )));
        }
        if (h.group, h.elem) == (0x0002, 0x0010) {
            let Some(v) = b.get(pos + h.size..pos + h.size + len) else {
                return Err(Reject::new(
                    "the file meta group is longer than the bytes read",
                ));
            };
            ts = String::from_utf8_lossy(v)
                .trim_end_matches(['\0', ' '])
                .to_string();
        }
        pos += h.size + len;
    }
    if ts.is_empty() {
        return Err(Reject::new(
            "invalid DICOM: no Transfer Syntax UID (0002,0010) in the file meta group",
        ));
    }
    let done = |ts: String| {
        Ok(Scan {
            start,
            transfer_syntax: ts,
        })
    };
    let mode = match ts.as_str() {
        "1.2.840.10008.1.2" => Mode::ImplicitLe,
        "1.2.840.10008.1.2.2" => Mode::ExplicitBe,
        "1.2.840.10008.1.2.1.99" if file_len.is_some() => return done(ts),
        "1.2.840.10008.1.2.1.99" => {
            // Deflated: the data set is walked as dicom-rs will read it, inflated (raw deflate,
            // explicit VR little endian). dicom-rs zero-fills each element's declared length
            // before reading it, so a 530-byte file declaring 1.5 GB took 1.5 GB (the dicom fuzz
            // target). Where the stream is corrupt, only what inflates before the error counts.
            use std::io::Read;
            let mut inflated = Vec::new();
            let mut z = flate2::read::DeflateDecoder::new(&b[pos..]).take(MAX_FILE_BYTES + 1);
            let _ = z.read_to_end(&mut inflated);
            if inflated.len() as u64 > MAX_FILE_BYTES {
                return Err(Reject::new(format!(
                    "deflated DICOM data set inflates to more than {MAX_FILE_BYTES} bytes"
                )));
            }
            walk_data_set(&inflated, 0, Mode::ExplicitLe, inflated.len())
                .map_err(|r| Reject::new(format!("{} (in the inflated data set)", r.0)))?;
            return done(ts);
        }
        _ => Mode::ExplicitLe,
    };
    walk_data_set(b, pos, mode, total)?;
    done(ts)
}

/// Walk the data set in `b` from `pos`: every element, item and delimiter header must declare no
/// more bytes than remain of `total` (`b.len()`, or the file's length when `b` is its first bytes;
/// then the walk stops where `b` ends).
///
/// The walk is dicom-parser 0.10's `DataSetReader` without the values: the same states (element
/// level, sequence level, encapsulated fragments), the same sequence and item ends (a defined
/// length ends where dicom-rs's own count of bytes reaches it), and the same bytes consumed. It
/// must visit exactly the headers dicom-rs will, because dicom-rs allocates whatever a header
/// declares before reading: each place where the two once parted (a value shorter than its VR's
/// unit, an item header at element level) let a file of a few hundred bytes take gigabytes (the
/// dicom fuzz target). Where dicom-rs would stop with an error, the walk stops too, accepting:
/// dicom-rs then says what is wrong.
pub(super) fn walk_data_set(b: &[u8], pos: usize, mode: Mode, total: usize) -> Result<(), Reject> {
    let mut w = Walk {
        b,
        mode,
        total,
        prefix: total > b.len(),
        pos,
        count: pos,
        open: Vec::new(),
        in_sequence: false,
        check_ends: false,
        fragments_next: false,
        offset_table_next: false,
    };
    loop {
        match w.step()? {
            Step::On => {}
            Step::End => break,
            Step::Stop => return Ok(()),
        }
    }
    w.check_pixel_data_closed()
}

/// A truncation reject: "truncated DICOM: `what`".
fn truncated(what: String) -> Reject {
    Reject::new(format!("truncated DICOM: {what}"))
}

/// An open sequence or item: dicom-rs's `SeqToken`.
struct Open {
    item: bool,
    pixel_data: bool,
    len: Option<usize>,
    /// dicom-rs's count of bytes where its content starts.
    base: usize,
}

/// Where a step of the walk leads.
enum Step {
    /// On to the next header.
    On,
    /// The data set ends here (where a tag cannot be read).
    End,
    /// dicom-rs stops here (with an error of its own, or the bytes read end): accepted.
    Stop,
}

/// The walk's state: dicom-rs's `DataSetReader` state, and where the bytes are really read.
struct Walk<'a> {
    b: &'a [u8],
    mode: Mode,
    total: usize,
    /// `b` is the first bytes of a longer file.
    prefix: bool,
    pos: usize,
    /// dicom-rs's count of bytes read, which adds a value's declared length where it consumed
    /// whole values only; `pos` is where the next bytes are really read.
    count: usize,
    open: Vec<Open>,
    in_sequence: bool,
    check_ends: bool,
    fragments_next: bool,
    offset_table_next: bool,
}

impl Walk<'_> {
    /// One step: close an ended sequence or item, or read the next item header, fragment or
    /// element header.
    fn step(&mut self) -> Result<Step, Reject> {
        if self.check_ends {
            if let Some(step) = self.close_ended() {
                return Ok(step);
            }
        }
        let (b, pos) = (self.b, self.pos);
        if pos >= b.len() || b.len() - pos < 4 {
            return Ok(Step::End); // dicom-rs ends the data set where a tag cannot be read
        }
        let fragment = self
            .open
            .last()
            .filter(|o| o.item && o.pixel_data)
            .map(|o| o.len);
        if self.in_sequence || self.fragments_next {
            return self.item_header();
        }
        if let Some(len) = fragment {
            return Ok(self.fragment(len));
        }
        self.element_header()
    }

    /// Close the innermost sequence or item where dicom-rs's count reaches its defined length;
    /// None (and no more checking) where it does not end here.
    fn close_ended(&mut self) -> Option<Step> {
        match self.open.last() {
            Some(o) if o.len.is_some_and(|l| o.base + l == self.count) => {
                self.in_sequence = o.item;
                self.open.pop();
                Some(Step::On)
            }
            // dicom-rs: "inconsistent sequence end"
            Some(o) if o.len.is_some_and(|l| o.base + l < self.count) => Some(Step::Stop),
            _ => {
                self.check_ends = false;
                None
            }
        }
    }

    /// An item header: tag and length, in every transfer syntax.
    fn item_header(&mut self) -> Result<Step, Reject> {
        let (b, pos) = (self.b, self.pos);
        let Some(h) = header(b, pos, Mode::ExplicitLe).filter(|h| h.group == 0xFFFE) else {
            if header(b, pos, self.mode).is_none() && !self.prefix {
                return Err(truncated(format!("item header cut off at byte {pos}")));
            }
            return Ok(Step::Stop); // dicom-rs: not an item header, or the file ends
        };
        let (size, len) = (8, h.len);
        if let Some(l) = len {
            let rem = self.total - pos - size;
            if l > rem {
                return Err(truncated(format!(
                    "item at byte {pos} declares {l} bytes, {rem} remain"
                )));
            }
        }
        let first = self.fragments_next;
        let pixel_data = first || self.open.last().is_some_and(|o| o.pixel_data);
        if first {
            if h.elem == 0xE00D {
                return Ok(Step::Stop); // dicom-rs: an item end where the offset table was expected
            }
            self.fragments_next = false;
            self.open.push(Open {
                item: false,
                pixel_data: true,
                len: None,
                base: self.count,
            });
        }
        self.pos += size;
        self.count += size;
        Ok(self.item_tag(h.elem, len, first, pixel_data))
    }

    /// After an item header: open the item, or close the item or sequence its tag ends.
    fn item_tag(&mut self, elem: u16, len: Option<usize>, first: bool, pixel_data: bool) -> Step {
        match elem {
            0xE000 => {
                if self.open.is_empty() {
                    return Step::Stop; // dicom-rs: an item header outside a sequence
                }
                self.in_sequence = false;
                self.open.push(Open {
                    item: true,
                    pixel_data,
                    len,
                    base: self.count,
                });
                if len == Some(0) {
                    self.check_ends = true;
                } else if first {
                    // The first item of encapsulated pixel data: the offset table.
                    self.offset_table_next = true;
                }
            }
            0xE00D => {
                self.open.pop();
                self.in_sequence = true;
                self.check_ends = true;
            }
            0xE0DD => {
                self.open.pop();
                self.in_sequence = false;
                self.check_ends = true;
            }
            _ => return Step::Stop, // dicom-rs: a bad item header
        }
        Step::On
    }

    /// A fragment's bytes (or the offset table's, read as whole 32-bit values).
    fn fragment(&mut self, len: Option<usize>) -> Step {
        let Some(len) = len else {
            return Step::Stop; // dicom-rs: an undefined item length
        };
        let n = if self.offset_table_next {
            len - len % 4
        } else {
            len
        };
        self.offset_table_next = false;
        self.pos += n;
        self.count += n;
        self.check_ends = true;
        Step::On
    }

    /// An element header: its length checked against the bytes that remain.
    fn element_header(&mut self) -> Result<Step, Reject> {
        let pos = self.pos;
        let Some(h) = header(self.b, pos, self.mode) else {
            if self.prefix {
                return Ok(Step::Stop); // the bytes read end here, not the file
            }
            return Err(truncated(format!("element header cut off at byte {pos}")));
        };
        let rem = self.total - pos - h.size;
        if let Some(len) = h.len {
            if len > rem {
                let what = if h.group == 0xFFFE {
                    "item".to_string()
                } else {
                    h.tag_name()
                };
                return Err(truncated(format!(
                    "{what} at byte {pos} declares {len} bytes, {rem} remain"
                )));
            }
        }
        self.pos += h.size;
        self.count += h.size;
        self.element_value(&h);
        Ok(Step::On)
    }

    /// After an element header: open a sequence, close an item, expect encapsulated fragments,
    /// or step over the value.
    fn element_value(&mut self, h: &Header) {
        if h.sq && h.group != 0xFFFE {
            self.in_sequence = true;
            self.open.push(Open {
                item: false,
                pixel_data: false,
                len: h.len,
                base: self.count,
            });
            self.check_ends = h.len == Some(0);
        } else if (h.group, h.elem) == (0xFFFE, 0xE00D) {
            if !self.open.is_empty() {
                self.in_sequence = true;
                self.open.pop();
                self.check_ends = true;
            }
        } else if (h.group, h.elem) == (0x7FE0, 0x0010) && h.len.is_none() {
            self.fragments_next = true;
        } else if let Some(len) = h.len {
            // A value: dicom-rs reads a binary VR as `len / unit` whole values and consumes
            // only those bytes, but counts all `len`.
            self.pos += len - len % h.unit;
            self.count += len;
            self.check_ends = true;
        } else {
            // Any other undefined length opens a sequence.
            self.in_sequence = true;
            self.open.push(Open {
                item: false,
                pixel_data: false,
                len: None,
                base: self.count,
            });
        }
    }

    /// Where the data set ends: encapsulated pixel data must have ended with its delimiter.
    fn check_pixel_data_closed(&self) -> Result<(), Reject> {
        if !self.prefix && (self.fragments_next || self.open.iter().any(|o| o.pixel_data)) {
            return Err(truncated(
                "the encapsulated pixel data ends without its sequence delimiter".into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    ImplicitLe,
    ExplicitLe,
    ExplicitBe,
}

pub(super) struct Header {
    pub(super) group: u16,
    pub(super) elem: u16,
    /// A sequence (VR SQ, explicit or from the dictionary).
    pub(super) sq: bool,
    /// None: undefined length.
    pub(super) len: Option<usize>,
    /// Header bytes.
    pub(super) size: usize,
    /// The size of one value of the element's VR as dicom-rs reads it (1 for strings and bytes).
    pub(super) unit: usize,
}

impl Header {
    pub(super) fn tag_name(&self) -> String {
        format!("element ({:04X},{:04X})", self.group, self.elem)
    }
}

/// The element header at `pos`, read as dicom-rs reads it; None where the file ends inside it.
pub(super) fn header(b: &[u8], pos: usize, mode: Mode) -> Option<Header> {
    use dicom_core::dictionary::{DataDictionary, DataDictionaryEntry};
    let be = mode == Mode::ExplicitBe;
    let at = |p: usize, n: usize| b.get(p..p + n);
    let u16_at = |p: usize| {
        at(p, 2).map(|s| {
            if be {
                u16::from_be_bytes([s[0], s[1]])
            } else {
                u16::from_le_bytes([s[0], s[1]])
            }
        })
    };
    let u32_at = |p: usize| {
        at(p, 4).map(|s| {
            let a = [s[0], s[1], s[2], s[3]];
            if be {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }
        })
    };
    let (group, elem) = (u16_at(pos)?, u16_at(pos + 2)?);
    let len = |l: u32| {
        if l == u32::MAX {
            None
        } else {
            Some(l as usize)
        }
    };
    // Items and delimiters have no VR in any transfer syntax.
    if group == 0xFFFE {
        return Some(Header {
            group,
            elem,
            sq: false,
            len: len(u32_at(pos + 4)?),
            size: 8,
            unit: 1,
        });
    }
    if mode == Mode::ImplicitLe {
        // As dicom-rs's implicit VR decoder: OW for pixel and overlay data, else the dictionary's
        // VR, else UN.
        let is_pixels = (group, elem) == (0x7FE0, 0x0010) || (group >> 8 == 0x60 && elem == 0x3000);
        let vr = if is_pixels {
            dicom_core::VR::OW
        } else {
            dicom_dictionary_std::StandardDataDictionary
                .by_tag(dicom_core::Tag(group, elem))
                .map_or(dicom_core::VR::UN, |e| e.vr().relaxed())
        };
        return Some(Header {
            group,
            elem,
            sq: vr == dicom_core::VR::SQ,
            len: len(u32_at(pos + 4)?),
            size: 8,
            unit: value_unit(vr.to_bytes()),
        });
    }
    let vr = at(pos + 4, 2)?;
    // The VRs with a 16-bit length (PS3.5 7.1.2); dicom-rs reads every other VR, unknown ones
    // included (as UN), with 2 reserved bytes and a 32-bit length.
    const SHORT: [&[u8; 2]; 21] = [
        b"AE", b"AS", b"AT", b"CS", b"DA", b"DS", b"DT", b"FL", b"FD", b"IS", b"LO", b"LT", b"PN",
        b"SH", b"SL", b"SS", b"ST", b"TM", b"UI", b"UL", b"US",
    ];
    if SHORT.iter().any(|s| &s[..] == vr) {
        Some(Header {
            group,
            elem,
            sq: false,
            len: Some(u16_at(pos + 6)? as usize),
            size: 8,
            unit: value_unit([vr[0], vr[1]]),
        })
    } else {
        Some(Header {
            group,
            elem,
            sq: vr == b"SQ",
            len: len(u32_at(pos + 8)?),
            size: 12,
            unit: value_unit([vr[0], vr[1]]),
        })
    }
}

/// The bytes of one value of a VR as dicom-parser's `read_value` reads it: binary VRs are read as
/// arrays of whole values; strings, bytes and unknown VRs (read as UN) byte by byte.
pub(super) fn value_unit(vr: [u8; 2]) -> usize {
    match &vr {
        b"US" | b"SS" | b"OW" => 2,
        b"AT" | b"FL" | b"OF" | b"SL" | b"UL" | b"OL" => 4,
        b"FD" | b"OD" | b"SV" | b"UV" | b"OV" => 8,
        _ => 1,
    }
}
