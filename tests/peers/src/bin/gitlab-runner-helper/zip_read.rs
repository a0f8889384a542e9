//! Reading zip archives through their central directory, as Go's `archive/zip` `NewReader`
//! does for the runner's extractor (`commands/helpers/archive/ziplegacy/zip_legacy_extractor.go`):
//! entry names, modes (`FileHeader.Mode`: Unix mode for Unix/macOS creators, MS-DOS
//! attributes otherwise, a trailing `/` meaning a directory), extra fields, and the data of
//! stored and deflated entries, checked against their CRC-32.
//!
//! Limits: ZIP64, multi-disk and encrypted archives, and compression methods other than
//! store (0) and deflate (8), are refused with a message saying so.
//!
//! Owns: the zip layout on the read side. Must not know: where entries are written.

use std::io::{self, Read, Seek, SeekFrom, Write};

use crate::checksum::CrcWriter;

/// What an entry is, from its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Symlink,
    Regular,
    /// Pipes, sockets and devices: skipped on extraction, as the runner skips them.
    Other,
}

/// One central-directory record.
#[derive(Debug, Clone)]
pub struct ZipEntry {
    pub name: String,
    method: u16,
    flags: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    local_offset: u64,
    external: u32,
    creator: u16,
    /// The central directory's extra fields (where the runner's UID/GID and time live).
    pub extra: Vec<u8>,
}

impl ZipEntry {
    /// Go's `FileHeader.Mode`: the kind and the permission bits (`0o777`).
    pub fn mode(&self) -> (Kind, u32) {
        let (mut kind, mut perm) = match self.creator {
            3 | 19 => unix_mode(self.external >> 16),
            0 | 11 | 14 => msdos_mode(self.external),
            _ => (Kind::Regular, 0),
        };
        if self.name.ends_with('/') {
            kind = Kind::Dir;
            if perm == 0 && self.creator != 3 && self.creator != 19 {
                perm = 0o777;
            }
        }
        (kind, perm)
    }
}

fn unix_mode(mode: u32) -> (Kind, u32) {
    let kind = match mode & 0o170_000 {
        0o040_000 => Kind::Dir,
        0o120_000 => Kind::Symlink,
        0o100_000 | 0 => Kind::Regular,
        _ => Kind::Other,
    };
    (kind, mode & 0o777)
}

fn msdos_mode(attributes: u32) -> (Kind, u32) {
    let (kind, mut perm) = if attributes & 0x10 != 0 {
        (Kind::Dir, 0o777)
    } else {
        (Kind::Regular, 0o666)
    };
    if attributes & 0x01 != 0 {
        perm &= !0o222;
    }
    (kind, perm)
}

/// An open archive.
pub struct ZipArchive<R> {
    reader: R,
    pub entries: Vec<ZipEntry>,
}

const NOT_VALID: &str = "zip: not a valid zip file";
const NO_ZIP64: &str =
    "zip: ZIP64 archives are not supported by this gitlab-runner-helper stand-in";

fn u16_at(bytes: &[u8], at: usize) -> Result<u16, String> {
    let raw = bytes.get(at..at + 2).ok_or(NOT_VALID)?;
    Ok(u16::from_le_bytes([
        raw.first().copied().unwrap_or(0),
        raw.get(1).copied().unwrap_or(0),
    ]))
}

fn u32_at(bytes: &[u8], at: usize) -> Result<u32, String> {
    let raw: [u8; 4] = bytes
        .get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .ok_or(NOT_VALID)?;
    Ok(u32::from_le_bytes(raw))
}

fn io_text(err: io::Error) -> String {
    format!("zip: {err}")
}

/// Reads the end-of-central-directory record and every central-directory entry.
pub fn open<R: Read + Seek>(mut reader: R, size: u64) -> Result<ZipArchive<R>, String> {
    let tail_len = size.min(65_535 + 22);
    reader
        .seek(SeekFrom::Start(size - tail_len))
        .map_err(io_text)?;
    let mut tail = vec![0u8; tail_len as usize];
    reader.read_exact(&mut tail).map_err(io_text)?;
    let eocd = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&at| u32_at(&tail, at) == Ok(0x0605_4b50))
        .ok_or(NOT_VALID)?;
    let zip64_locator = eocd >= 20 && u32_at(&tail, eocd - 20) == Ok(0x0706_4b50);
    let disk = u16_at(&tail, eocd + 4)?;
    let count = u16_at(&tail, eocd + 10)?;
    let cd_size = u32_at(&tail, eocd + 12)?;
    let cd_offset = u32_at(&tail, eocd + 16)?;
    if zip64_locator || count == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF {
        return Err(NO_ZIP64.into());
    }
    if disk != 0 {
        return Err("zip: multi-disk archives are not supported".into());
    }
    if u64::from(cd_offset) + u64::from(cd_size) > size {
        return Err(NOT_VALID.into());
    }
    reader
        .seek(SeekFrom::Start(u64::from(cd_offset)))
        .map_err(io_text)?;
    let mut central = vec![0u8; cd_size as usize];
    reader.read_exact(&mut central).map_err(io_text)?;
    let entries = parse_central(&central, usize::from(count))?;
    Ok(ZipArchive { reader, entries })
}

fn parse_central(central: &[u8], count: usize) -> Result<Vec<ZipEntry>, String> {
    let mut entries = Vec::with_capacity(count);
    let mut at = 0usize;
    for _ in 0..count {
        if u32_at(central, at)? != 0x0201_4b50 {
            return Err(NOT_VALID.into());
        }
        let name_len = usize::from(u16_at(central, at + 28)?);
        let extra_len = usize::from(u16_at(central, at + 30)?);
        let comment_len = usize::from(u16_at(central, at + 32)?);
        let name_at = at + 46;
        let name = central.get(name_at..name_at + name_len).ok_or(NOT_VALID)?;
        let extra = central
            .get(name_at + name_len..name_at + name_len + extra_len)
            .ok_or(NOT_VALID)?;
        entries.push(ZipEntry {
            name: String::from_utf8_lossy(name).into_owned(),
            method: u16_at(central, at + 10)?,
            flags: u16_at(central, at + 8)?,
            crc: u32_at(central, at + 16)?,
            compressed: u64::from(u32_at(central, at + 20)?),
            size: u64::from(u32_at(central, at + 24)?),
            local_offset: u64::from(u32_at(central, at + 42)?),
            external: u32_at(central, at + 38)?,
            creator: u16_at(central, at + 4)? >> 8,
            extra: extra.to_vec(),
        });
        at = name_at + name_len + extra_len + comment_len;
    }
    Ok(entries)
}

impl<R: Read + Seek> ZipArchive<R> {
    /// Writes the entry's uncompressed bytes to `out`, checking size and CRC-32.
    pub fn copy_entry<W: Write>(&mut self, entry: &ZipEntry, out: W) -> Result<(), String> {
        if entry.flags & 1 != 0 {
            return Err("zip: encrypted entries are not supported".into());
        }
        if entry.size == 0xFFFF_FFFF || entry.compressed == 0xFFFF_FFFF {
            return Err(NO_ZIP64.into());
        }
        self.reader
            .seek(SeekFrom::Start(entry.local_offset))
            .map_err(io_text)?;
        let mut local = [0u8; 30];
        self.reader.read_exact(&mut local).map_err(io_text)?;
        if u32_at(&local, 0)? != 0x0403_4b50 {
            return Err(NOT_VALID.into());
        }
        let skip = u64::from(u16_at(&local, 26)?) + u64::from(u16_at(&local, 28)?);
        self.reader
            .seek(SeekFrom::Current(skip as i64))
            .map_err(io_text)?;
        let data = (&mut self.reader).take(entry.compressed);
        let mut sink = CrcWriter::new(out);
        match entry.method {
            0 => {
                io::copy(&mut io::BufReader::new(data), &mut sink).map_err(io_text)?;
            }
            8 => {
                crate::inflate::inflate(data, &mut sink)?;
            }
            _ => return Err("zip: unsupported compression algorithm".into()),
        }
        if sink.written != entry.size || sink.crc.value() != entry.crc {
            return Err("zip: checksum error".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_not_a_valid_zip_file() {
        let data = b"definitely not a zip archive".to_vec();
        let size = data.len() as u64;
        let err = open(io::Cursor::new(data), size).err().expect("refused");
        assert_eq!(err, NOT_VALID);
    }

    #[test]
    fn msdos_attributes_give_go_modes() {
        assert_eq!(msdos_mode(0x10), (Kind::Dir, 0o777));
        assert_eq!(msdos_mode(0x01), (Kind::Regular, 0o444));
        assert_eq!(unix_mode(0o120_777), (Kind::Symlink, 0o777));
    }
}
