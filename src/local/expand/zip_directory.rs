//! What a zip archive says about its central directory, read from its end
//! records before any zip parser sees it: how many entries it declares and
//! how many bytes their directory takes, so that an archive declaring more
//! than the caps is refused before a directory of that size is parsed.

use std::io::{Read, Seek, SeekFrom};

/// Size of the end-of-central-directory record without its comment.
const END_RECORD: u64 = 22;
/// Longest comment an end-of-central-directory record may carry.
const MAX_COMMENT: u64 = u16::MAX as u64;
/// Signature of the end-of-central-directory record.
const END_SIGNATURE: [u8; 4] = [0x50, 0x4b, 0x05, 0x06];
/// Size of the zip64 end-of-central-directory locator.
const ZIP64_LOCATOR: u64 = 20;
/// Signature of the zip64 end-of-central-directory locator.
const ZIP64_LOCATOR_SIGNATURE: [u8; 4] = [0x50, 0x4b, 0x06, 0x07];
/// Size of the zip64 end-of-central-directory record's fixed part.
const ZIP64_END_RECORD: u64 = 56;
/// Signature of the zip64 end-of-central-directory record.
const ZIP64_END_SIGNATURE: [u8; 4] = [0x50, 0x4b, 0x06, 0x06];
/// Smallest central directory header (no name, extra field or comment).
pub(crate) const MIN_DIRECTORY_HEADER: u64 = 46;

/// The central directory an archive declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Declared {
    /// Entries in the directory.
    pub(crate) entries: u64,
    /// Bytes of the directory.
    pub(crate) bytes: u64,
}

/// Why an archive's end records could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EndRecordError {
    /// No end-of-central-directory record ends the file.
    #[error("no end-of-central-directory record at the end of the file")]
    Missing,
    /// The records contradict each other or the file.
    #[error("{0}")]
    Inconsistent(String),
    /// The file could not be read.
    #[error("reading the archive: {0}")]
    Io(String),
}

fn u16_at(data: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([data[at], data[at + 1]]))
}

fn u32_at(data: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([
        data[at],
        data[at + 1],
        data[at + 2],
        data[at + 3],
    ]))
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn read_at<F: Read + Seek>(file: &mut F, at: u64, len: u64) -> Result<Vec<u8>, EndRecordError> {
    let io = |e: std::io::Error| EndRecordError::Io(e.to_string());
    file.seek(SeekFrom::Start(at)).map_err(io)?;
    let mut data = Vec::new();
    file.take(len).read_to_end(&mut data).map_err(io)?;
    if (data.len() as u64) < len {
        return Err(EndRecordError::Io("the file ended early".into()));
    }
    Ok(data)
}

/// Reads the directory a zip archive of `size` bytes declares: the
/// end-of-central-directory record whose comment runs exactly to the end
/// of the file (and holds no other such signature, which a parser could
/// take instead), and the zip64 record it points to, if any. The larger of
/// two declared counts (or sizes) is the one returned.
pub(crate) fn declared_directory<F: Read + Seek>(
    file: &mut F,
    size: u64,
) -> Result<Declared, EndRecordError> {
    if size < END_RECORD {
        return Err(EndRecordError::Missing);
    }
    let window = size.min(END_RECORD + MAX_COMMENT);
    let tail_start = size - window;
    let tail = read_at(file, tail_start, window)?;
    let end_at = (0..=tail.len() - END_RECORD as usize)
        .rev()
        .find(|&at| {
            tail[at..at + 4] == END_SIGNATURE
                && at as u64 + END_RECORD + u16_at(&tail, at + 20) == window
        })
        .ok_or(EndRecordError::Missing)?;
    let comment = &tail[end_at + END_RECORD as usize..];
    if comment.windows(4).any(|w| w == END_SIGNATURE) {
        return Err(EndRecordError::Inconsistent(
            "the archive comment holds another end-of-central-directory record".into(),
        ));
    }
    let record = &tail[end_at..end_at + END_RECORD as usize];
    let mut declared = Declared {
        entries: u16_at(record, 10).max(u16_at(record, 8)),
        bytes: u32_at(record, 12),
    };
    let end_offset = tail_start + end_at as u64;
    if end_offset >= ZIP64_LOCATOR {
        let locator = read_at(file, end_offset - ZIP64_LOCATOR, ZIP64_LOCATOR)?;
        if locator[..4] == ZIP64_LOCATOR_SIGNATURE {
            let zip64 = zip64_directory(file, u64_at(&locator, 8), end_offset)?;
            declared.entries = declared.entries.max(zip64.entries);
            declared.bytes = declared.bytes.max(zip64.bytes);
        }
    }
    Ok(declared)
}

/// The directory a zip64 end record at `at` declares (it must lie before
/// the end record at `end_offset`).
fn zip64_directory<F: Read + Seek>(
    file: &mut F,
    at: u64,
    end_offset: u64,
) -> Result<Declared, EndRecordError> {
    if at
        .checked_add(ZIP64_END_RECORD)
        .is_none_or(|end| end > end_offset)
    {
        return Err(EndRecordError::Inconsistent(
            "the zip64 locator points outside the archive".into(),
        ));
    }
    let record = read_at(file, at, ZIP64_END_RECORD)?;
    if record[..4] != ZIP64_END_SIGNATURE {
        return Err(EndRecordError::Inconsistent(
            "the zip64 locator points at no zip64 end record".into(),
        ));
    }
    Ok(Declared {
        entries: u64_at(&record, 32).max(u64_at(&record, 24)),
        bytes: u64_at(&record, 40),
    })
}
