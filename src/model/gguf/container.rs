//! The GGUF container of one file: header, metadata key/values, tensor table, data offset.
//! Layout (little-endian): `GGUF`, u32 version, u64 tensor count, u64 metadata count, the
//! metadata (string key, u32 value type, value), the tensor infos (string name, u32 dims,
//! u64 × dims sizes innermost first, u32 ggml type, u64 offset into the data section), then the
//! data section at the next multiple of `general.alignment` (default 32).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::GgufError;
use crate::quant::GgmlType;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type (u8, u16, u32, u64).
    Uint(u64),
    /// Any signed integer type (i8, i16, i32, i64).
    Int(i64),
    /// f32 or f64.
    Float(f64),
    /// Boolean.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer (a non-negative signed one too).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::Uint(v) => Some(v),
            GgufValue::Int(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }

    /// The value as a float (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::Float(v) => Some(v),
            GgufValue::Uint(v) => Some(v as f64),
            GgufValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of a file's tensor table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Shape, outermost first (GGUF stores it innermost first).
    pub shape: Vec<usize>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Byte length of the data.
    pub bytes: usize,
}

/// The parsed header of one GGUF file.
#[derive(Clone, Debug)]
pub struct Container {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata in key order.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
}

/// Counts above this are treated as corruption rather than allocated.
const MAX_COUNT: u64 = 1 << 24;

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        match self.pos.checked_add(n).filter(|&end| end <= self.bytes.len()) {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated { path: self.path.into(), what: what.into(), offset: self.pos }),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N, what)?.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn malformed(&self, message: String) -> GgufError {
        GgufError::Malformed { path: self.path.into(), message }
    }

    fn count(&mut self, what: &str) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        if n > MAX_COUNT {
            return Err(self.malformed(format!("{what} {n} is implausibly large")));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).map_err(|_| self.malformed(format!("{what}: length {n}")))?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.malformed(format!("{what} is not UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<GgufValue, GgufError> {
        Ok(match ty {
            0 => GgufValue::Uint(self.array::<1>(key)?[0] as u64),
            1 => GgufValue::Int(self.array::<1>(key)?[0] as i8 as i64),
            2 => GgufValue::Uint(u16::from_le_bytes(self.array(key)?) as u64),
            3 => GgufValue::Int(i16::from_le_bytes(self.array(key)?) as i64),
            4 => GgufValue::Uint(self.u32(key)? as u64),
            5 => GgufValue::Int(i32::from_le_bytes(self.array(key)?) as i64),
            6 => GgufValue::Float(f32::from_le_bytes(self.array(key)?) as f64),
            7 => match self.array::<1>(key)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.malformed(format!("`{key}`: boolean byte {b}"))),
            },
            8 => GgufValue::String(self.string(key)?),
            9 if depth == 0 => {
                let elem = self.u32(key)?;
                let n = self.count(key)?;
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::Uint(self.u64(key)?),
            11 => GgufValue::Int(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.array(key)?)),
            _ => return Err(self.malformed(format!("`{key}`: unknown or nested value type {ty}"))),
        })
    }
}

impl Container {
    /// Parses the header of the GGUF file `bytes` (named `path` in errors) and checks that every
    /// tensor's data lies inside the file.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Container, GgufError> {
        let mut c = Cursor { bytes, pos: 0, path };
        let magic: [u8; 4] = c.array("magic")?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic { path: path.into(), magic });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version { path: path.into(), version });
        }
        let n_tensors = c.count("tensor count")?;
        let n_kv = c.count("metadata count")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32(&key)?;
            let value = c.value(ty, &key, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
                _ => return Err(c.malformed(format!("general.alignment {v:?} is not a power of two"))),
            },
        };
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            let dims = c.u32(&name)?;
            if !(1..=4).contains(&dims) {
                return Err(c.malformed(format!("tensor `{name}` has {dims} dimensions")));
            }
            let mut shape = Vec::with_capacity(dims as usize);
            for _ in 0..dims {
                let d = c.u64(&name)?;
                shape.push(
                    usize::try_from(d)
                        .ok()
                        .filter(|&d| d > 0 && d < 1 << 40)
                        .ok_or_else(|| c.malformed(format!("tensor `{name}` has dimension {d}")))?,
                );
            }
            shape.reverse();
            let ty = c.u32(&name)?;
            let ggml_type = GgmlType::from_u32(ty)
                .ok_or_else(|| GgufError::UnsupportedType { name: name.clone(), ggml_type: GgmlType::describe(ty) })?;
            let offset = c.u64(&name)?;
            raw.push((name, shape, ggml_type, offset));
        }
        let data_start = c.pos.next_multiple_of(alignment);
        let mut tensors = Vec::with_capacity(raw.len());
        // Offset in the data section where the next tensor must start: tensors are packed in
        // file order, each padded to the alignment.
        let mut expected = 0usize;
        for (name, shape, ggml_type, offset) in raw {
            let cols = *shape.last().expect("at least one dimension");
            if cols % ggml_type.block_size() != 0 {
                return Err(GgufError::PartialBlock {
                    name,
                    cols,
                    block: ggml_type.block_size(),
                    ggml_type: ggml_type.name(),
                });
            }
            let rows: usize = shape[..shape.len() - 1].iter().product();
            let bytes_len = rows.checked_mul(ggml_type.row_bytes(cols));
            let start = usize::try_from(offset).ok().and_then(|o| o.checked_add(data_start));
            let (Some(nbytes), Some(start)) = (bytes_len, start) else {
                return Err(c.malformed(format!("tensor `{name}`: size or offset overflows")));
            };
            if offset != expected as u64 {
                return Err(GgufError::Misplaced { path: path.into(), name, offset, expected: expected as u64 });
            }
            if start.checked_add(nbytes).is_none_or(|end| end > bytes.len()) {
                return Err(GgufError::TensorOutOfBounds {
                    path: PathBuf::from(path),
                    name,
                    offset: start,
                    bytes: nbytes,
                    file_len: bytes.len(),
                });
            }
            expected = (expected + nbytes).next_multiple_of(alignment);
            tensors.push(TensorInfo { name, shape, ggml_type, offset: start, bytes: nbytes });
        }
        // Writers pad the last tensor or not; anything beyond is not a GGUF file of this table.
        let data_end = data_start.saturating_add(expected);
        if bytes.len() > data_end {
            return Err(c.malformed(format!(
                "{} bytes after the end of the last tensor's data at {data_end}",
                bytes.len() - data_end
            )));
        }
        Ok(Container { version, metadata, tensors })
    }
}
