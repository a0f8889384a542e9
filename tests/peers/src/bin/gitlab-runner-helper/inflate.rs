//! A small DEFLATE decoder (RFC 1951), so archives the real helper wrote (it deflates every
//! regular file: `helpers/archives/zip_create.go` `createZipFileEntry`) can be extracted.
//! Streaming both ways: input through a buffered bit reader, output through a 32 KiB window.
//! Canonical Huffman codes are decoded one bit at a time (as zlib's `puff` does): simple and
//! fast enough for test archives, not for gigabytes.
//!
//! Owns: decoding. Must not know: zip or gzip framing.

use std::io::{Read, Write};

const WINDOW: usize = 32 * 1024;
const MAX_BITS: usize = 15;

const LENGTH_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LENGTH_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
const CODE_LENGTH_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Decodes one DEFLATE stream from `input` into `out`; the number of bytes written.
pub fn inflate<R: Read, W: Write>(input: R, out: &mut W) -> Result<u64, String> {
    let mut bits = Bits {
        input,
        buffer: 0,
        count: 0,
        chunk: vec![0; 16 * 1024],
        at: 0,
        len: 0,
    };
    let mut window = Window {
        out,
        history: vec![0; WINDOW],
        total: 0,
        pending: Vec::new(),
    };
    loop {
        let last = bits.take(1)? == 1;
        match bits.take(2)? {
            0 => stored(&mut bits, &mut window)?,
            1 => {
                let (literals, distances) = fixed_codes()?;
                codes(&mut bits, &mut window, &literals, &distances)?;
            }
            2 => {
                let (literals, distances) = dynamic_codes(&mut bits)?;
                codes(&mut bits, &mut window, &literals, &distances)?;
            }
            _ => return Err("flate: corrupt input (invalid block type)".into()),
        }
        if last {
            break;
        }
    }
    window.flush()?;
    Ok(window.total)
}

struct Bits<R> {
    input: R,
    buffer: u64,
    count: u32,
    chunk: Vec<u8>,
    at: usize,
    len: usize,
}

impl<R: Read> Bits<R> {
    fn byte(&mut self) -> Result<u8, String> {
        if self.at >= self.len {
            self.len = self
                .input
                .read(&mut self.chunk)
                .map_err(|e| format!("flate: {e}"))?;
            self.at = 0;
            if self.len == 0 {
                return Err("flate: unexpected EOF".into());
            }
        }
        let b = self
            .chunk
            .get(self.at)
            .copied()
            .ok_or("flate: internal buffer")?;
        self.at += 1;
        Ok(b)
    }

    /// The next `n` (at most 16) bits, least significant first.
    fn take(&mut self, n: u32) -> Result<u32, String> {
        while self.count < n {
            self.buffer |= u64::from(self.byte()?) << self.count;
            self.count += 8;
        }
        let value = (self.buffer & ((1u64 << n) - 1)) as u32;
        self.buffer >>= n;
        self.count -= n;
        Ok(value)
    }

    fn align(&mut self) {
        let drop = self.count % 8;
        self.buffer >>= drop;
        self.count -= drop;
    }
}

struct Window<'w, W> {
    out: &'w mut W,
    history: Vec<u8>,
    total: u64,
    pending: Vec<u8>,
}

impl<W: Write> Window<'_, W> {
    fn push(&mut self, b: u8) -> Result<(), String> {
        let slot = (self.total as usize) % WINDOW;
        if let Some(cell) = self.history.get_mut(slot) {
            *cell = b;
        }
        self.total += 1;
        self.pending.push(b);
        if self.pending.len() >= 64 * 1024 {
            self.flush()?;
        }
        Ok(())
    }

    fn copy(&mut self, distance: usize, length: usize) -> Result<(), String> {
        if distance == 0 || distance > WINDOW || distance as u64 > self.total {
            return Err("flate: corrupt input (distance too far back)".into());
        }
        for _ in 0..length {
            let slot = ((self.total - distance as u64) as usize) % WINDOW;
            let b = self
                .history
                .get(slot)
                .copied()
                .ok_or("flate: internal window")?;
            self.push(b)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), String> {
        self.out
            .write_all(&self.pending)
            .map_err(|e| format!("write: {e}"))?;
        self.pending.clear();
        Ok(())
    }
}

fn stored<R: Read, W: Write>(bits: &mut Bits<R>, window: &mut Window<'_, W>) -> Result<(), String> {
    bits.align();
    let len = bits.take(16)?;
    let nlen = bits.take(16)?;
    if len != !nlen & 0xFFFF {
        return Err("flate: corrupt input (stored block length)".into());
    }
    for _ in 0..len {
        let b = bits.take(8)? as u8;
        window.push(b)?;
    }
    Ok(())
}

/// A canonical Huffman code: how many codes of each length, and the symbols in code order.
struct Huffman {
    counts: [u16; MAX_BITS + 1],
    symbols: Vec<u16>,
}

impl Huffman {
    fn new(lengths: &[u8]) -> Result<Huffman, String> {
        let mut counts = [0u16; MAX_BITS + 1];
        for &len in lengths {
            let slot = counts
                .get_mut(usize::from(len))
                .ok_or("flate: code length too long")?;
            *slot += 1;
        }
        let mut left: i32 = 1;
        for len in 1..=MAX_BITS {
            left = (left << 1) - i32::from(counts.get(len).copied().unwrap_or(0));
            if left < 0 {
                return Err("flate: corrupt input (over-subscribed code)".into());
            }
        }
        let mut offsets = [0u16; MAX_BITS + 2];
        for len in 1..=MAX_BITS {
            let next =
                offsets.get(len).copied().unwrap_or(0) + counts.get(len).copied().unwrap_or(0);
            if let Some(slot) = offsets.get_mut(len + 1) {
                *slot = next;
            }
        }
        let mut symbols = vec![0u16; lengths.len()];
        for (symbol, &len) in lengths.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let offset = offsets
                .get_mut(usize::from(len))
                .ok_or("flate: code length")?;
            if let Some(slot) = symbols.get_mut(usize::from(*offset)) {
                *slot = symbol as u16;
            }
            *offset += 1;
        }
        Ok(Huffman { counts, symbols })
    }

    fn decode<R: Read>(&self, bits: &mut Bits<R>) -> Result<u16, String> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for len in 1..=MAX_BITS {
            code |= bits.take(1)? as i32;
            let count = i32::from(self.counts.get(len).copied().unwrap_or(0));
            if code - first < count {
                let at = (index + code - first) as usize;
                return self
                    .symbols
                    .get(at)
                    .copied()
                    .ok_or_else(|| "flate: bad code".into());
            }
            index += count;
            first += count;
            first <<= 1;
            code <<= 1;
        }
        Err("flate: corrupt input (invalid code)".into())
    }
}

fn fixed_codes() -> Result<(Huffman, Huffman), String> {
    let mut lengths = [0u8; 288];
    for (symbol, len) in lengths.iter_mut().enumerate() {
        *len = match symbol {
            0..=143 => 8,
            144..=255 => 9,
            256..=279 => 7,
            _ => 8,
        };
    }
    Ok((Huffman::new(&lengths)?, Huffman::new(&[5u8; 30])?))
}

fn dynamic_codes<R: Read>(bits: &mut Bits<R>) -> Result<(Huffman, Huffman), String> {
    let literal_count = bits.take(5)? as usize + 257;
    let distance_count = bits.take(5)? as usize + 1;
    let code_count = bits.take(4)? as usize + 4;
    let mut code_lengths = [0u8; 19];
    for &slot in CODE_LENGTH_ORDER.iter().take(code_count) {
        if let Some(cell) = code_lengths.get_mut(slot) {
            *cell = bits.take(3)? as u8;
        }
    }
    let code_code = Huffman::new(&code_lengths)?;
    let mut lengths: Vec<u8> = Vec::with_capacity(literal_count + distance_count);
    while lengths.len() < literal_count + distance_count {
        let symbol = code_code.decode(bits)?;
        let (value, repeat) = match symbol {
            0..=15 => (symbol as u8, 1),
            16 => {
                let previous = *lengths
                    .last()
                    .ok_or("flate: corrupt input (repeat with no length)")?;
                (previous, 3 + bits.take(2)?)
            }
            17 => (0, 3 + bits.take(3)?),
            _ => (0, 11 + bits.take(7)?),
        };
        for _ in 0..repeat {
            lengths.push(value);
        }
    }
    if lengths.len() > literal_count + distance_count {
        return Err("flate: corrupt input (too many code lengths)".into());
    }
    let (literal_lengths, distance_lengths) = lengths.split_at(literal_count);
    if literal_lengths.get(256).copied().unwrap_or(0) == 0 {
        return Err("flate: corrupt input (no end-of-block code)".into());
    }
    Ok((
        Huffman::new(literal_lengths)?,
        Huffman::new(distance_lengths)?,
    ))
}

fn codes<R: Read, W: Write>(
    bits: &mut Bits<R>,
    window: &mut Window<'_, W>,
    literals: &Huffman,
    distances: &Huffman,
) -> Result<(), String> {
    loop {
        let symbol = literals.decode(bits)?;
        match symbol {
            0..=255 => window.push(symbol as u8)?,
            256 => return Ok(()),
            _ => {
                let slot = usize::from(symbol - 257);
                let base = LENGTH_BASE
                    .get(slot)
                    .ok_or("flate: corrupt input (bad length)")?;
                let extra = LENGTH_EXTRA.get(slot).copied().unwrap_or(0);
                let length = usize::from(*base) + bits.take(u32::from(extra))? as usize;
                let dist_slot = usize::from(distances.decode(bits)?);
                let base = DIST_BASE
                    .get(dist_slot)
                    .ok_or("flate: corrupt input (bad distance)")?;
                let extra = DIST_EXTRA.get(dist_slot).copied().unwrap_or(0);
                let distance = usize::from(*base) + bits.take(u32::from(extra))? as usize;
                window.copy(distance, length)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inflate_vec(data: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        inflate(data, &mut out)?;
        Ok(out)
    }

    #[test]
    fn a_stored_block_passes_through() {
        let data = [0x01, 0x05, 0x00, 0xFA, 0xFF, b'h', b'e', b'l', b'l', b'o'];
        assert_eq!(inflate_vec(&data).expect("valid stream"), b"hello");
    }

    #[test]
    fn fixed_and_dynamic_blocks_from_git_decode() {
        // `git` writes zlib streams; strip the 2-byte header and the Adler-32 trailer to get
        // raw DEFLATE, for a short (fixed codes) and a long, repetitive (dynamic codes) text.
        let texts = [
            b"hello hello hello hello".to_vec(),
            (0..20_000u32).map(|i| (i % 251) as u8 ^ b'a').collect(),
        ];
        for text in texts {
            let dir = tempfile::tempdir().expect("temp dir");
            let repo = dir.path().join("repo");
            let blob = dir.path().join("blob");
            std::fs::write(&blob, &text).expect("blob");
            let git = |args: &[&str]| {
                std::process::Command::new("git")
                    .args(args)
                    .env("GIT_DIR", &repo)
                    .output()
                    .expect("git runs")
            };
            assert!(git(&["init", "-q", "--bare"]).status.success());
            let out = git(&["hash-object", "-w", "--no-filters", &blob.to_string_lossy()]);
            let id = String::from_utf8(out.stdout)
                .expect("hex")
                .trim()
                .to_string();
            let (a, b) = id.split_at(2);
            let object = std::fs::read(repo.join("objects").join(a).join(b)).expect("object");
            let raw = object.get(2..object.len() - 4).expect("zlib framing");
            let inflated = inflate_vec(raw).expect("git's deflate decodes");
            let header = format!("blob {}\0", text.len());
            assert_eq!(&inflated[..header.len()], header.as_bytes());
            assert_eq!(&inflated[header.len()..], &text[..]);
        }
    }

    #[test]
    fn a_truncated_stream_is_an_error_not_a_panic() {
        assert!(inflate_vec(&[0x04]).is_err());
        assert!(inflate_vec(&[]).is_err());
    }
}
