//! The few MessagePack forms of the batch script's packed argument, written by hand: the
//! script decodes them with `cmsgpack.unpack`, which Redis ships to Lua. One packed string per
//! batch instead of five ARGV strings per point spares Redis a protocol parse, an object and a
//! Lua string per value, and the script a `tonumber` per number.
//!
//! Only the smallest form of each length is written, as the MessagePack spec asks; every form
//! here is read back by Redis's cmsgpack in `ingest/tests/script.rs`.

/// A MessagePack writer into one buffer.
#[derive(Debug, Default)]
pub struct Packer {
    buf: Vec<u8>,
}

impl Packer {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Packer {
            buf: Vec::with_capacity(bytes),
        }
    }

    /// The header of an array of `len` values (the values follow).
    pub fn array(&mut self, len: usize) {
        if len < 16 {
            self.buf.push(0x90 | len as u8);
        } else if let Ok(n) = u16::try_from(len) {
            self.buf.push(0xdc);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else {
            self.buf.push(0xdd);
            self.buf
                .extend_from_slice(&u32::try_from(len).expect("array too long").to_be_bytes());
        }
    }

    /// A string (raw bytes; Lua strings are bytes).
    pub fn str(&mut self, s: &[u8]) {
        let len = s.len();
        if len < 32 {
            self.buf.push(0xa0 | len as u8);
        } else if let Ok(n) = u8::try_from(len) {
            self.buf.extend_from_slice(&[0xd9, n]);
        } else if let Ok(n) = u16::try_from(len) {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf
                .extend_from_slice(&u32::try_from(len).expect("string too long").to_be_bytes());
        }
        self.buf.extend_from_slice(s);
    }

    /// An unsigned integer. Lua numbers are doubles: exact up to 2^53, which validation
    /// enforces for seq.
    pub fn uint(&mut self, v: u64) {
        if v < 128 {
            self.buf.push(v as u8);
        } else if let Ok(n) = u8::try_from(v) {
            self.buf.extend_from_slice(&[0xcc, n]);
        } else if let Ok(n) = u16::try_from(v) {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else if let Ok(n) = u32::try_from(v) {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// A float64: every double exactly.
    pub fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(if v { 0xc3 } else { 0xc2 });
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(f: impl FnOnce(&mut Packer)) -> Vec<u8> {
        let mut p = Packer::default();
        f(&mut p);
        p.into_bytes()
    }

    #[test]
    fn smallest_forms_at_their_edges() {
        assert_eq!(packed(|p| p.array(0)), [0x90]);
        assert_eq!(packed(|p| p.array(15)), [0x9f]);
        assert_eq!(packed(|p| p.array(16)), [0xdc, 0, 16]);
        assert_eq!(packed(|p| p.array(65_536)), [0xdd, 0, 1, 0, 0]);
        assert_eq!(packed(|p| p.str(b"")), [0xa0]);
        assert_eq!(packed(|p| p.str(b"c1")), [0xa2, b'c', b'1']);
        let s31 = [b'x'; 31];
        assert_eq!(packed(|p| p.str(&s31))[0], 0xbf);
        let s32 = [b'x'; 32];
        assert_eq!(packed(|p| p.str(&s32))[..2], [0xd9, 32]);
        let s256 = vec![b'x'; 256];
        assert_eq!(packed(|p| p.str(&s256))[..3], [0xda, 1, 0]);
        let s65536 = vec![b'x'; 65_536];
        assert_eq!(packed(|p| p.str(&s65536))[..5], [0xdb, 0, 1, 0, 0]);
        assert_eq!(packed(|p| p.uint(0)), [0]);
        assert_eq!(packed(|p| p.uint(127)), [127]);
        assert_eq!(packed(|p| p.uint(128)), [0xcc, 128]);
        assert_eq!(packed(|p| p.uint(256)), [0xcd, 1, 0]);
        assert_eq!(packed(|p| p.uint(65_536)), [0xce, 0, 1, 0, 0]);
        assert_eq!(
            packed(|p| p.uint(1 << 53)),
            [0xcf, 0, 0x20, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(packed(|p| p.f64(1.5)), [0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
        assert_eq!(packed(|p| p.bool(false)), [0xc2]);
        assert_eq!(packed(|p| p.bool(true)), [0xc3]);
    }

    #[test]
    fn values_follow_each_other() {
        let b = packed(|p| {
            p.array(3);
            p.str(b"a");
            p.uint(7);
            p.bool(false);
        });
        assert_eq!(b, [0x93, 0xa1, b'a', 7, 0xc2]);
    }
}
