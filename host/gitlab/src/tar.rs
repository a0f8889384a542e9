//! A tar archive of one regular file, for `PUT /containers/{id}/archive` (ustar format).

/// The archive holding `name` (a plain file name, no directories) with `mode` and `data`.
pub fn one_file(name: &str, mode: u32, data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; 512];
    let put = |header: &mut [u8; 512], at: usize, field: &[u8]| {
        for (slot, byte) in header.iter_mut().skip(at).zip(field) {
            *slot = *byte;
        }
    };
    // put() stops at the field's end; names are ours and short.
    put(
        &mut header,
        0,
        name.as_bytes()
            .get(..name.len().min(99))
            .unwrap_or_default(),
    );
    put(&mut header, 100, format!("{mode:07o}\0").as_bytes());
    put(&mut header, 108, b"0000000\0"); // uid
    put(&mut header, 116, b"0000000\0"); // gid
    put(
        &mut header,
        124,
        format!("{:011o}\0", data.len()).as_bytes(),
    );
    put(&mut header, 136, b"00000000000\0"); // mtime
    put(&mut header, 148, b"        "); // checksum placeholder
    put(&mut header, 156, b"0"); // regular file
    put(&mut header, 257, b"ustar\0");
    put(&mut header, 263, b"00");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    put(&mut header, 148, format!("{sum:06o}\0 ").as_bytes());
    let mut out = Vec::with_capacity(512 + data.len().div_ceil(512) * 512 + 1024);
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out.resize(512 + data.len().div_ceil(512) * 512, 0);
    out.resize(out.len() + 1024, 0); // two empty blocks end the archive
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn tar_lists_the_file_with_its_size_and_mode() {
        let dir = tempfile::tempdir().expect("dir");
        let archive = dir.path().join("a.tar");
        std::fs::write(&archive, super::one_file("script.sh", 0o700, b"echo hi\n")).expect("w");
        let out = std::process::Command::new("tar")
            .arg("-tvf")
            .arg(&archive)
            .output()
            .expect("tar");
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            listing.contains("-rwx------")
                && listing.contains(" 8 ")
                && listing.contains("script.sh"),
            "{listing}"
        );
    }
}
