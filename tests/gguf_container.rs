//! GGUF files: every type's CPU dequantization equals the `gguf` package's numpy reference bit
//! for bit (`tests/fixtures/gguf/quants.gguf`, made by `make_quants.py`: each tensor `T` is
//! followed by `T.ref`, `gguf.quants.dequantize(T)`); corrupt and truncated files give typed errors.

mod common;

use std::path::PathBuf;

use common::TempDir;
use moestream::model::gguf::{GgmlType, GgufError, GgufModel};

fn quants_path() -> PathBuf {
    common::fixtures_dir().join("gguf/quants.gguf")
}

#[test]
fn dequantization_equals_the_gguf_package_bit_for_bit() {
    let m = GgufModel::open(&quants_path()).unwrap();
    let types = ["F32", "F16", "BF16", "Q4_0", "Q8_0", "MXFP4", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"];
    for name in types {
        let info = m.info(name).unwrap();
        assert_eq!(info.ggml_type.name(), name);
        assert_eq!(info.shape, vec![5, 512]);
        let got = m.dequantize(name).unwrap();
        let want = m.dequantize(&format!("{name}.ref")).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let bad = got.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(
            bad.is_none(),
            "{name}: value {} is {} (numpy: {})",
            bad.unwrap(),
            got[bad.unwrap()],
            want[bad.unwrap()]
        );
    }
    assert_eq!(m.tensor_names().len(), 2 * types.len());
    assert_eq!(m.str("general.architecture").unwrap(), "quants");
}

fn open_bytes(tag: &str, bytes: &[u8]) -> Result<GgufModel, GgufError> {
    let dir = TempDir::new(tag);
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, bytes).unwrap();
    GgufModel::open(&path)
}

#[test]
fn truncated_files_give_typed_errors() {
    let bytes = std::fs::read(quants_path()).unwrap();
    // Inside the header/metadata/tensor table, then inside the data section.
    for len in [0, 3, 7, 20, 100, 500, 880, 20_000, bytes.len() - 1] {
        match open_bytes("gguf_trunc", &bytes[..len]) {
            Err(GgufError::Truncated { .. }) | Err(GgufError::TensorOutOfBounds { .. }) => {}
            Err(GgufError::BadMagic { .. }) if len < 4 => {}
            other => panic!("length {len}: {:?}", other.err()),
        }
    }
}

#[test]
fn corrupt_headers_give_typed_errors() {
    let good = std::fs::read(quants_path()).unwrap();
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert!(matches!(open_bytes("gguf_magic", &bad_magic), Err(GgufError::BadMagic { .. })));
    let mut bad_version = good.clone();
    bad_version[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(open_bytes("gguf_version", &bad_version), Err(GgufError::Version { version: 9, .. })));
    let mut huge_count = good.clone();
    huge_count[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(open_bytes("gguf_count", &huge_count), Err(GgufError::Malformed { .. })));
    // The first metadata value's type (after its key) set to an unknown type.
    let key_len = u64::from_le_bytes(good[24..32].try_into().unwrap()) as usize;
    let mut bad_type = good.clone();
    bad_type[32 + key_len..36 + key_len].copy_from_slice(&77u32.to_le_bytes());
    assert!(matches!(open_bytes("gguf_vtype", &bad_type), Err(GgufError::Malformed { .. })));
}

#[test]
fn unsupported_tensor_types_are_refused_by_name() {
    let good = std::fs::read(quants_path()).unwrap();
    let m = GgufModel::open(&quants_path()).unwrap();
    assert_eq!(m.info("Q4_0").unwrap().ggml_type, GgmlType::Q4_0);
    // Rewrite the type field of tensor `Q4_0` (u32 right after its dims) to Q3_K (11).
    let name = b"\x04\x00\x00\x00\x00\x00\x00\x00Q4_0\x02\x00\x00\x00";
    let at = good.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 16;
    let mut bad = good.clone();
    assert_eq!(u32::from_le_bytes(bad[at..at + 4].try_into().unwrap()), 2);
    bad[at..at + 4].copy_from_slice(&11u32.to_le_bytes());
    match open_bytes("gguf_ttype", &bad) {
        Err(GgufError::UnsupportedType { name, ggml_type }) => {
            assert_eq!((name.as_str(), ggml_type.as_str()), ("Q4_0", "Q3_K"))
        }
        other => panic!("{:?}", other.err()),
    }
}
