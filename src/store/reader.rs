//! [`ExpertStore`]: validates an `experts.bin` at open and preads single experts, thread-safely.

use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::header::{parse_fixed, parse_region, Extent, FIXED_HEADER_LEN};
use super::positioned::{open_uncached, PositionedIo};
use super::{decode_expert, AlignedBuf, DecodedExpert, ExpertLayout, IndexEntry, StoreError, StoreInfo, EXTENT_ALIGN};

/// How [`ExpertStore::open_with`] opens the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Try uncached reads (O_DIRECT on Linux, F_NOCACHE on macOS), bypassing the page cache. Falls back to buffered reads
    /// when the platform or filesystem refuses; see [`ExpertStore::io_mode`].
    pub direct_io: bool,
    /// Behave as a filesystem that refuses O_DIRECT (the fallback's tests: tmpfs accepts
    /// O_DIRECT since Linux 6.6, so no common filesystem reliably refuses it).
    pub refuse_direct: bool,
}

/// Which read path an [`ExpertStore`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// Ordinary page-cached `pread`.
    Buffered,
    /// O_DIRECT `pread` (for 4096-aligned destination buffers; others use the buffered path).
    Direct,
}

/// An open, validated expert store. `Send + Sync`: many threads may [`read_expert`] at once.
///
/// [`read_expert`]: ExpertStore::read_expert
#[derive(Debug)]
pub struct ExpertStore {
    path: PathBuf,
    file: File,
    direct: Option<File>,
    direct_error: Option<String>,
    info: StoreInfo,
    extent: Extent,
    data_offset: u64,
    index: Vec<IndexEntry>,
    /// (model layer, slot), sorted by layer.
    slots: Vec<(u32, usize)>,
}

impl ExpertStore {
    /// Opens `path` with buffered reads, checking it was built for `expected_arch_hash`.
    pub fn open(path: impl AsRef<Path>, expected_arch_hash: u64) -> Result<Self, StoreError> {
        Self::open_with(path, expected_arch_hash, OpenOptions::default())
    }

    /// Opens and validates `path`: magic, version, arch hash, header and index checksums,
    /// internal consistency, and that every extent lies within the file (so truncation is
    /// reported here, as [`StoreError::Truncated`]).
    pub fn open_with(
        path: impl AsRef<Path>,
        expected_arch_hash: u64,
        options: OpenOptions,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let io = |e| StoreError::io(&path, e);
        let file = File::open(&path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut head = vec![0u8; FIXED_HEADER_LEN.min(file_len as usize)];
        file.read_exact_at(&mut head, 0).map_err(io)?;
        let mut fixed = parse_fixed(&path, &head, file_len, expected_arch_hash)?;
        if fixed.region_len > file_len as u128 {
            return Err(StoreError::Truncated {
                path,
                expected_len: fixed.region_len.min(u64::MAX as u128) as u64,
                file_len,
            });
        }
        let mut region = vec![0u8; fixed.region_len as usize];
        file.read_exact_at(&mut region, 0).map_err(io)?;
        let index = parse_region(&path, &mut fixed, &region)?;
        check_extents(&path, &index, fixed.data_offset, fixed.extent.extent_len as u64, file_len)?;
        let mut slots: Vec<(u32, usize)> = fixed.info.layers.iter().enumerate().map(|(s, &l)| (l, s)).collect();
        slots.sort_unstable();
        let mut store = ExpertStore {
            path,
            file,
            direct: None,
            direct_error: None,
            info: fixed.info,
            extent: fixed.extent,
            data_offset: fixed.data_offset,
            index,
            slots,
        };
        if options.refuse_direct && options.direct_io {
            store.direct_error = Some("uncached open failed: refused (simulated)".into());
        } else if options.direct_io {
            match store.open_direct() {
                Ok(f) => store.direct = Some(f),
                Err(e) => store.direct_error = Some(e),
            }
        }
        Ok(store)
    }

    /// Opens a second, uncached descriptor (O_DIRECT, or F_NOCACHE on macOS) and probes one
    /// aligned read.
    fn open_direct(&self) -> Result<File, String> {
        let f = open_uncached(&self.path).map_err(|e| format!("uncached open failed: {e}"))?;
        let mut probe = AlignedBuf::new(EXTENT_ALIGN);
        f.read_exact_at(&mut probe, 0).map_err(|e| format!("uncached read failed: {e}"))?;
        Ok(f)
    }

    /// The read path in use: [`IoMode::Direct`] only if O_DIRECT was requested and works.
    pub fn io_mode(&self) -> IoMode {
        if self.direct.is_some() {
            IoMode::Direct
        } else {
            IoMode::Buffered
        }
    }

    /// Why O_DIRECT was not used although requested (`None` if not requested or active).
    pub fn direct_io_error(&self) -> Option<&str> {
        self.direct_error.as_deref()
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the store holds (arch hash, layers, experts, shapes, encoding).
    pub fn info(&self) -> &StoreInfo {
        &self.info
    }

    /// The sub-layout of every extent of a uniform store (`None` for a GGUF store, whose
    /// layers' types are in [`StoreInfo::encoding`]).
    pub fn layout(&self) -> Option<&ExpertLayout> {
        self.extent.layout.as_ref()
    }

    /// Bytes of data in the largest extent (the slot size the experts need).
    pub fn data_len(&self) -> usize {
        self.extent.data_len
    }

    /// Bytes of one extent (a multiple of 4096): the buffer size [`read_expert`] needs.
    ///
    /// [`read_expert`]: ExpertStore::read_expert
    pub fn extent_len(&self) -> usize {
        self.extent.extent_len
    }

    /// File offset of the first extent.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Model layer indices stored, in slot order.
    pub fn layers(&self) -> &[u32] {
        &self.info.layers
    }

    /// Routed experts per layer.
    pub fn experts_per_layer(&self) -> usize {
        self.info.experts_per_layer
    }

    /// Whether the store holds `layer` (a model layer index).
    pub fn has_layer(&self, layer: usize) -> bool {
        self.slot(layer).is_some()
    }

    fn slot(&self, layer: usize) -> Option<usize> {
        let l = u32::try_from(layer).ok()?;
        self.slots.binary_search_by_key(&l, |&(l, _)| l).ok().map(|i| self.slots[i].1)
    }

    /// The index entry of (model `layer`, `expert`).
    pub fn entry(&self, layer: usize, expert: usize) -> Result<IndexEntry, StoreError> {
        match self.slot(layer) {
            Some(s) if expert < self.info.experts_per_layer => Ok(self.index[s * self.info.experts_per_layer + expert]),
            _ => Err(StoreError::IndexOutOfRange { path: self.path.clone(), layer, expert }),
        }
    }

    /// A zeroed, 4096-aligned buffer of one extent, suitable for either I/O mode.
    pub fn alloc_buffer(&self) -> AlignedBuf {
        AlignedBuf::new(self.extent_len())
    }

    /// Reads the extent of (model `layer`, `expert`) into `buf[..extent_len]` with one pread
    /// and verifies its crc32.
    ///
    /// In [`IoMode::Direct`], a buffer whose start is not 4096-aligned is read through the
    /// buffered descriptor instead (same result, page cache used); a failed direct read is
    /// retried buffered. Errors: [`StoreError::IndexOutOfRange`], [`StoreError::BufferTooSmall`],
    /// [`StoreError::Checksum`], [`StoreError::Truncated`] if the file shrank since open,
    /// [`StoreError::Io`].
    pub fn read_expert(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<(), StoreError> {
        let e = self.entry(layer, expert)?;
        let n = self.extent.extent_len;
        if buf.len() < n {
            return Err(StoreError::BufferTooSmall { needed: n, got: buf.len() });
        }
        let dst = &mut buf[..n];
        let direct_ok = match &self.direct {
            Some(f) if (dst.as_ptr() as usize).is_multiple_of(AlignedBuf::ALIGN) => {
                f.read_exact_at(dst, e.offset).is_ok()
            }
            _ => false,
        };
        if !direct_ok {
            self.file.read_exact_at(dst, e.offset).map_err(|err| {
                if err.kind() == ErrorKind::UnexpectedEof {
                    let file_len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
                    StoreError::Truncated { path: self.path.clone(), expected_len: e.offset + e.length, file_len }
                } else {
                    StoreError::io(&self.path, err)
                }
            })?;
        }
        if crc32fast::hash(dst) != e.crc32 {
            return Err(StoreError::Checksum { path: self.path.clone(), layer, expert });
        }
        Ok(())
    }

    /// Dequantizes an extent of a uniform store read by [`read_expert`](ExpertStore::read_expert)
    /// into `(gate, up, down)` f32 weights (see [`decode_expert`]); a GGUF store's extents are
    /// the GGUF blocks themselves, refused here ([`StoreError::InvalidSpec`]).
    pub fn decode_expert(&self, bytes: &[u8]) -> Result<DecodedExpert, StoreError> {
        let layout = self.extent.layout.as_ref().ok_or_else(|| StoreError::InvalidSpec {
            path: self.path.clone(),
            detail: "a GGUF store's extents are GGUF blocks; dequantize them with model::gguf::dequant".into(),
        })?;
        decode_expert(layout, bytes)
    }
}

/// Every entry: right length, aligned, after the header, not overlapping, within the file.
fn check_extents(
    path: &Path,
    index: &[IndexEntry],
    data_offset: u64,
    extent_len: u64,
    file_len: u64,
) -> Result<(), StoreError> {
    let mut end_max = 0u64;
    for (i, e) in index.iter().enumerate() {
        if e.length != extent_len || !e.offset.is_multiple_of(EXTENT_ALIGN as u64) || e.offset < data_offset {
            return Err(StoreError::corrupt(
                path,
                format!("index entry {i} has bad offset {} / length {}", e.offset, e.length),
            ));
        }
        let end = e
            .offset
            .checked_add(e.length)
            .ok_or_else(|| StoreError::corrupt(path, format!("index entry {i} overflows")))?;
        end_max = end_max.max(end);
    }
    let mut offsets: Vec<u64> = index.iter().map(|e| e.offset).collect();
    offsets.sort_unstable();
    if offsets.windows(2).any(|w| w[1] - w[0] < extent_len) {
        return Err(StoreError::corrupt(path, "overlapping extents"));
    }
    if end_max > file_len {
        return Err(StoreError::Truncated { path: path.to_path_buf(), expected_len: end_max, file_len });
    }
    Ok(())
}
