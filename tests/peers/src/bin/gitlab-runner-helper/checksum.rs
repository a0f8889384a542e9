//! CRC-32 (IEEE, the zip and gzip checksum), and a writer that computes it on the way
//! through.
//!
//! Owns: the checksum. Must not know: archive layouts.

use std::io::{self, Write};
use std::sync::OnceLock;

fn table() -> &'static [u32; 256] {
    static TABLE: OnceLock<[u32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        std::array::from_fn(|n| {
            let mut c = n as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            c
        })
    })
}

/// A running CRC-32.
#[derive(Debug, Clone, Copy, Default)]
pub struct Crc32(u32);

impl Crc32 {
    pub fn update(&mut self, bytes: &[u8]) {
        let table = table();
        let mut c = !self.0;
        for &b in bytes {
            let slot = usize::from((c as u8) ^ b);
            c = table.get(slot).copied().unwrap_or(0) ^ (c >> 8);
        }
        self.0 = !c;
    }

    pub fn value(self) -> u32 {
        self.0
    }
}

/// Passes bytes to `inner`, counting them and computing their CRC-32.
pub struct CrcWriter<W> {
    pub inner: W,
    pub crc: Crc32,
    pub written: u64,
}

impl<W: Write> CrcWriter<W> {
    pub fn new(inner: W) -> CrcWriter<W> {
        CrcWriter {
            inner,
            crc: Crc32::default(),
            written: 0,
        }
    }
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        let done = buf.get(..n).unwrap_or(buf);
        self.crc.update(done);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_value_of_crc32_is_cbf43926() {
        let mut crc = Crc32::default();
        crc.update(b"123456789");
        assert_eq!(crc.value(), 0xCBF4_3926);
    }
}
