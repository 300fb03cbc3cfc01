//! The header region: fixed header, layer table, index and their checksums (encode / parse).

use std::path::Path;

use crate::quant::GgmlType;
use crate::quant::{Int4Scheme, QuantParams, WeightEncoding};

use super::{ggml_extent, ExpertLayout, ProjectionLayout, StoreEncoding, StoreError, EXTENT_ALIGN};

/// File magic, the first 8 bytes.
pub const MAGIC: [u8; 8] = *b"MOEXPRT1";
/// Newest format version this build reads and writes: 2 adds GGUF-typed stores
/// ([`StoreEncoding::Ggml`]); uniform stores are still written as version 1.
pub const FORMAT_VERSION: u32 = 2;
/// Length of the fixed header.
pub const FIXED_HEADER_LEN: usize = 160;
/// Length of one index entry (offset u64, length u64, crc32 u32).
pub const INDEX_ENTRY_LEN: usize = 20;

/// Largest hidden or intermediate size accepted (guards size arithmetic on crafted headers).
pub const MAX_DIM: usize = 1 << 20;

/// Encoding code of GGUF-typed stores (version 2) in the fixed header.
const GGML_CODE: u32 = 3;

/// What a store holds, as given to the writer and read back by the reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreInfo {
    /// Caller-defined hash of the model architecture; the reader refuses other hashes.
    pub arch_hash: u64,
    /// Model layer index of each stored MoE layer ("layer slot" order), all distinct.
    pub layers: Vec<u32>,
    /// Routed experts per layer.
    pub experts_per_layer: usize,
    /// Model hidden size.
    pub hidden: usize,
    /// Expert intermediate size.
    pub intermediate: usize,
    /// Encoding of the projections.
    pub encoding: StoreEncoding,
}

/// Where one expert's extent lies and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexEntry {
    /// File offset (multiple of 4096).
    pub offset: u64,
    /// Extent length (the store's `extent_len`, a multiple of 4096).
    pub length: u64,
    /// crc32 (IEEE, as `crc32fast`) of the whole extent including zero padding.
    pub crc32: u32,
}

/// The data every extent holds: the [`ExpertLayout`] of a uniform store, or for a GGUF store
/// the largest layer's data length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Sub-layout of a uniform store (`None` for GGUF stores, whose layers differ).
    pub layout: Option<ExpertLayout>,
    /// Bytes holding data (the largest layer's, for GGUF stores).
    pub data_len: usize,
    /// `data_len` rounded up to 4096.
    pub extent_len: usize,
}

impl Extent {
    /// The extent of the experts `info` describes, or why it has none.
    pub(crate) fn of(info: &StoreInfo) -> Result<Extent, String> {
        let (layout, data_len) = match &info.encoding {
            StoreEncoding::Uniform(e) => {
                let l = ExpertLayout::new(*e, info.hidden, info.intermediate).map_err(|e| e.to_string())?;
                (Some(l), l.data_len)
            }
            StoreEncoding::Ggml(types) => {
                if types.len() != info.layers.len() {
                    return Err(format!("{} layer type pairs for {} layers", types.len(), info.layers.len()));
                }
                let mut len = 0;
                for (&t, &layer) in types.iter().zip(&info.layers) {
                    let (_, l) = ggml_extent(t, info.hidden, info.intermediate).ok_or_else(|| {
                        format!(
                            "layer {layer}: {}/{} experts of {}x{} are not whole blocks",
                            t[0].name(),
                            t[1].name(),
                            info.hidden,
                            info.intermediate
                        )
                    })?;
                    len = len.max(l);
                }
                (None, len)
            }
        };
        Ok(Extent { layout, data_len, extent_len: data_len.div_ceil(EXTENT_ALIGN) * EXTENT_ALIGN })
    }
}

/// Length of the header region (fixed header, layer table, index, GGUF type table, crc) before
/// padding.
pub(crate) fn region_len(layers: u64, experts: u64, ggml: bool) -> u128 {
    let types = if ggml { 8 * layers as u128 } else { 0 };
    FIXED_HEADER_LEN as u128
        + 4 * layers as u128
        + INDEX_ENTRY_LEN as u128 * layers as u128 * experts as u128
        + types
        + 4
}

fn encoding_code(e: &StoreEncoding) -> (u32, u32) {
    match e {
        StoreEncoding::Uniform(WeightEncoding::F16) => (0, 0),
        StoreEncoding::Uniform(WeightEncoding::Int4(p)) => (
            match p.scheme {
                Int4Scheme::Symmetric => 1,
                Int4Scheme::Affine => 2,
            },
            p.group_size as u32,
        ),
        StoreEncoding::Ggml(_) => (GGML_CODE, 0),
    }
}

fn decode_encoding(code: u32, group: u32) -> Option<WeightEncoding> {
    let scheme = match code {
        0 => return (group == 0).then_some(WeightEncoding::F16),
        1 => Int4Scheme::Symmetric,
        2 => Int4Scheme::Affine,
        _ => return None,
    };
    QuantParams::new(scheme, group as usize).ok().map(WeightEncoding::Int4)
}

/// Serializes the header region (`region_len` bytes) for `info`, `extent` and `index`.
pub(crate) fn encode_region(info: &StoreInfo, extent: &Extent, data_offset: u64, index: &[IndexEntry]) -> Vec<u8> {
    let ggml = match &info.encoding {
        StoreEncoding::Ggml(types) => Some(types),
        StoreEncoding::Uniform(_) => None,
    };
    let len = region_len(info.layers.len() as u64, info.experts_per_layer as u64, ggml.is_some());
    let mut b = Vec::with_capacity(len as usize);
    let (code, group) = encoding_code(&info.encoding);
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&info.encoding.version().to_le_bytes());
    b.extend_from_slice(&(FIXED_HEADER_LEN as u32).to_le_bytes());
    b.extend_from_slice(&info.arch_hash.to_le_bytes());
    for v in [info.layers.len(), info.experts_per_layer, info.hidden, info.intermediate] {
        b.extend_from_slice(&(v as u32).to_le_bytes());
    }
    b.extend_from_slice(&code.to_le_bytes());
    b.extend_from_slice(&group.to_le_bytes());
    b.extend_from_slice(&(extent.extent_len as u64).to_le_bytes());
    b.extend_from_slice(&data_offset.to_le_bytes());
    // GGUF stores leave the per-projection fields zero: their layers differ (the type table).
    let projections = extent.layout.map_or([ProjectionLayout::default(); 3], |l| [l.gate, l.up, l.down]);
    for p in projections {
        b.extend_from_slice(&(p.offset as u64).to_le_bytes());
        b.extend_from_slice(&(p.len as u64).to_le_bytes());
        b.extend_from_slice(&(p.rows as u32).to_le_bytes());
        b.extend_from_slice(&(p.cols as u32).to_le_bytes());
    }
    b.extend_from_slice(&(extent.data_len as u64).to_le_bytes());
    b.resize(FIXED_HEADER_LEN - 4, 0);
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    for &l in &info.layers {
        b.extend_from_slice(&l.to_le_bytes());
    }
    for e in index {
        b.extend_from_slice(&e.offset.to_le_bytes());
        b.extend_from_slice(&e.length.to_le_bytes());
        b.extend_from_slice(&e.crc32.to_le_bytes());
    }
    for pair in ggml.into_iter().flatten() {
        for t in pair {
            b.extend_from_slice(&t.to_u32().to_le_bytes());
        }
    }
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// The fixed header, parsed and validated.
pub(crate) struct Fixed {
    pub info: StoreInfo,
    pub extent: Extent,
    pub data_offset: u64,
    pub region_len: u128,
    /// Layers announced; `info.layers` stays empty until [`parse_region`] (and a GGUF store's
    /// type pairs too).
    pub n_layers: usize,
}

/// Checks magic (given at least 8 bytes), then length, version, arch hash, crc and
/// consistency of the fixed header. `bytes` is the start of the file (up to 160 bytes).
pub(crate) fn parse_fixed(path: &Path, bytes: &[u8], file_len: u64, expected_hash: u64) -> Result<Fixed, StoreError> {
    if bytes.len() >= 8 && bytes[..8] != MAGIC {
        return Err(StoreError::BadMagic { path: path.into(), found: bytes[..8].try_into().expect("8 bytes") });
    }
    if bytes.len() < FIXED_HEADER_LEN {
        return Err(StoreError::Truncated { path: path.into(), expected_len: FIXED_HEADER_LEN as u64, file_len });
    }
    let b = &bytes[..FIXED_HEADER_LEN];
    let version = u32_at(b, 8);
    if version == 0 || version > FORMAT_VERSION {
        return Err(StoreError::UnsupportedVersion { path: path.into(), found: version, expected: FORMAT_VERSION });
    }
    let hash = u64_at(b, 16);
    if hash != expected_hash {
        return Err(StoreError::ArchMismatch { path: path.into(), found: hash, expected: expected_hash });
    }
    if crc32fast::hash(&b[..FIXED_HEADER_LEN - 4]) != u32_at(b, FIXED_HEADER_LEN - 4) {
        return Err(StoreError::corrupt(path, "fixed header checksum mismatch"));
    }
    if u32_at(b, 12) as usize != FIXED_HEADER_LEN {
        return Err(StoreError::corrupt(path, format!("fixed header length {} != {FIXED_HEADER_LEN}", u32_at(b, 12))));
    }
    let (n_layers, experts) = (u32_at(b, 24), u32_at(b, 28));
    let (hidden, inter) = (u32_at(b, 32) as usize, u32_at(b, 36) as usize);
    if n_layers == 0 || experts == 0 {
        return Err(StoreError::corrupt(path, "zero layers or experts"));
    }
    if hidden > MAX_DIM || inter > MAX_DIM {
        return Err(StoreError::corrupt(path, format!("implausible shapes hidden={hidden} intermediate={inter}")));
    }
    let (code, group) = (u32_at(b, 40), u32_at(b, 44));
    let proj = |o: usize| ProjectionLayout {
        offset: u64_at(b, o) as usize,
        len: u64_at(b, o + 8) as usize,
        rows: u32_at(b, o + 16) as usize,
        cols: u32_at(b, o + 20) as usize,
    };
    let stored = ([proj(64), proj(88), proj(112)], u64_at(b, 136) as usize, u64_at(b, 48) as usize);
    let (encoding, extent) = match (version, code, group) {
        (2, GGML_CODE, 0) => {
            // Each layer's length is checked against its types in `parse_region`.
            let (projections, data_len, extent_len) = stored;
            if projections != [ProjectionLayout::default(); 3]
                || data_len == 0
                || data_len > 3 * MAX_DIM * MAX_DIM
                || extent_len != data_len.div_ceil(EXTENT_ALIGN) * EXTENT_ALIGN
            {
                return Err(StoreError::corrupt(path, "GGUF expert extent fields are inconsistent"));
            }
            (StoreEncoding::Ggml(Vec::new()), Extent { layout: None, data_len, extent_len })
        }
        (1, ..) => {
            let encoding = decode_encoding(code, group)
                .ok_or_else(|| StoreError::corrupt(path, format!("unknown encoding {code}/{group}")))?;
            let layout = ExpertLayout::new(encoding, hidden, inter)
                .map_err(|e| StoreError::corrupt(path, format!("invalid expert shape: {e}")))?;
            if stored != ([layout.gate, layout.up, layout.down], layout.data_len, layout.extent_len) {
                return Err(StoreError::corrupt(path, "expert sub-layout disagrees with encoding and shapes"));
            }
            let extent = Extent { layout: Some(layout), data_len: layout.data_len, extent_len: layout.extent_len };
            (StoreEncoding::Uniform(encoding), extent)
        }
        _ => return Err(StoreError::corrupt(path, format!("encoding {code}/{group} in a version {version} store"))),
    };
    let ggml = matches!(encoding, StoreEncoding::Ggml(_));
    let region_len = region_len(n_layers as u64, experts as u64, ggml);
    let data_offset = u64_at(b, 56);
    if data_offset as u128 != region_len.div_ceil(EXTENT_ALIGN as u128) * EXTENT_ALIGN as u128 {
        return Err(StoreError::corrupt(path, format!("data offset {data_offset} inconsistent with index size")));
    }
    let info = StoreInfo {
        arch_hash: hash,
        layers: Vec::new(),
        experts_per_layer: experts as usize,
        hidden,
        intermediate: inter,
        encoding,
    };
    Ok(Fixed { info, extent, data_offset, region_len, n_layers: n_layers as usize })
}

/// Checks the region crc and parses the layer table, the index and (GGUF stores) the type
/// table. `region` is the whole header region (`fixed.region_len` bytes, checked against the
/// file length by the caller); fills `fixed.info.layers` (and the type pairs) and returns the
/// index.
pub(crate) fn parse_region(path: &Path, fixed: &mut Fixed, region: &[u8]) -> Result<Vec<IndexEntry>, StoreError> {
    let n = region.len();
    if crc32fast::hash(&region[..n - 4]) != u32_at(region, n - 4) {
        return Err(StoreError::corrupt(path, "index checksum mismatch"));
    }
    let n_layers = fixed.n_layers;
    fixed.info.layers = (0..n_layers).map(|i| u32_at(region, FIXED_HEADER_LEN + 4 * i)).collect();
    let mut sorted = fixed.info.layers.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(StoreError::corrupt(path, "duplicate layer in layer table"));
    }
    let base = FIXED_HEADER_LEN + 4 * n_layers;
    let count = n_layers * fixed.info.experts_per_layer;
    let index = (0..count)
        .map(|i| {
            let o = base + INDEX_ENTRY_LEN * i;
            IndexEntry { offset: u64_at(region, o), length: u64_at(region, o + 8), crc32: u32_at(region, o + 16) }
        })
        .collect();
    if let StoreEncoding::Ggml(types) = &mut fixed.info.encoding {
        let table = base + INDEX_ENTRY_LEN * count;
        for l in 0..n_layers {
            let code = |k: usize| u32_at(region, table + 8 * l + 4 * k);
            let ty = |k: usize| {
                GgmlType::from_u32(code(k))
                    .ok_or_else(|| StoreError::corrupt(path, format!("layer slot {l}: unknown ggml type {}", code(k))))
            };
            types.push([ty(0)?, ty(1)?]);
        }
        let extent = Extent::of(&fixed.info).map_err(|e| StoreError::corrupt(path, e))?;
        if extent != fixed.extent {
            return Err(StoreError::corrupt(path, "extent length disagrees with the layers' ggml types"));
        }
    }
    Ok(index)
}
