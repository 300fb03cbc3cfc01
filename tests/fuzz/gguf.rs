//! GGUF mutants: every numeric field of the header located by a small walker of the layout
//! (counts, metadata value types, values, string and array lengths, array element types, tensor
//! dimension counts, dimensions, types and offsets) and set to a hostile value; raw byte flips,
//! overwrites and cuts of the header; flips and cuts of the data section; and a split set with
//! one mutated part. Run through the engine (load of the `.gguf` + a short score).

use std::path::Path;

use proptest::prelude::*;

use crate::common::{self, TempDir};
use crate::harness::{fuzz, guarded};
use crate::mutate::{apply_bytes, byte_mutations, ByteMutation};
use crate::{load_and_score, load_and_score_any};

/// What a located header field holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FieldKind {
    /// The tensor or metadata count.
    Count,
    /// A metadata value's type.
    ValueType,
    /// A metadata value (any width).
    Value,
    /// A string's or array's length.
    Length,
    /// An array's element type.
    ElementType,
    /// A tensor's number of dimensions.
    Dims,
    /// One dimension.
    Dim,
    /// A tensor's ggml type.
    TensorType,
    /// A tensor's data offset.
    Offset,
}

/// A numeric field of a GGUF header: where, how wide, what.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub at: usize,
    pub width: usize,
    pub kind: FieldKind,
}

/// Width of a scalar metadata value of type `ty` (strings and arrays are handled apart).
fn scalar_width(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        _ => 8,
    }
}

/// Every numeric field of the (valid) GGUF header in `b`, and the header's length.
pub fn fields(b: &[u8]) -> (Vec<Field>, usize) {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
    let mut out =
        vec![Field { at: 8, width: 8, kind: FieldKind::Count }, Field { at: 16, width: 8, kind: FieldKind::Count }];
    let (tensors, kvs) = (u64_at(8), u64_at(16));
    let mut pos = 24;
    let string = |pos: &mut usize, out: &mut Vec<Field>| {
        out.push(Field { at: *pos, width: 8, kind: FieldKind::Length });
        *pos += 8 + u64_at(*pos);
    };
    for _ in 0..kvs {
        pos += 8 + u64_at(pos); // the key (its length is mutated with the values' lengths)
        let ty = u32_at(pos);
        out.push(Field { at: pos, width: 4, kind: FieldKind::ValueType });
        pos += 4;
        let (elem, n) = match ty {
            9 => {
                out.push(Field { at: pos, width: 4, kind: FieldKind::ElementType });
                out.push(Field { at: pos + 4, width: 8, kind: FieldKind::Length });
                let e = (u32_at(pos), u64_at(pos + 4));
                pos += 12;
                e
            }
            t => (t, 1),
        };
        for i in 0..n {
            if elem == 8 {
                // Long arrays of strings (the vocabulary): only the first few lengths.
                if i < 4 {
                    string(&mut pos, &mut out);
                } else {
                    pos += 8 + u64_at(pos);
                }
            } else {
                if i < 4 {
                    out.push(Field { at: pos, width: scalar_width(elem), kind: FieldKind::Value });
                }
                pos += scalar_width(elem);
            }
        }
    }
    for _ in 0..tensors {
        pos += 8 + u64_at(pos);
        let dims = u32_at(pos) as usize;
        out.push(Field { at: pos, width: 4, kind: FieldKind::Dims });
        pos += 4;
        for d in 0..dims {
            out.push(Field { at: pos + 8 * d, width: 8, kind: FieldKind::Dim });
        }
        pos += 8 * dims;
        out.push(Field { at: pos, width: 4, kind: FieldKind::TensorType });
        out.push(Field { at: pos + 4, width: 8, kind: FieldKind::Offset });
        pos += 12;
    }
    (out, pos)
}

/// A hostile value for a header field.
#[derive(Clone, Debug)]
pub enum FieldValue {
    /// A fixed value (truncated to the field's width).
    Set(u64),
    /// The original plus this (wrapping).
    Add(i64),
    /// The original doubled.
    Double,
}

/// A GGUF mutant.
#[derive(Clone, Debug)]
pub enum GgufMutant {
    /// Header field `field` (modulo the field count) set to a hostile value.
    Field { field: usize, value: FieldValue },
    /// Raw changes of the header's bytes.
    Header(Vec<ByteMutation>),
    /// Raw changes (flips, cuts) anywhere in the file, the data section included.
    Anywhere(Vec<ByteMutation>),
}

fn field_values() -> impl Strategy<Value = FieldValue> {
    prop_oneof![
        4 => prop::sample::select(vec![
            0u64, 1, 2, 3, 4, 7, 8, 9, 10, 12, 13, 30, 39, 255, 1 << 16, 1 << 24, 1 << 31, u32::MAX as u64,
            1 << 32, 1 << 40, 1 << 63, u64::MAX,
        ])
        .prop_map(FieldValue::Set),
        2 => prop::sample::select(vec![-1i64, 1, -32, 32, 4096]).prop_map(FieldValue::Add),
        1 => Just(FieldValue::Double),
    ]
}

/// Header fields four times in six, header bytes once, anywhere once.
pub fn gguf_mutants() -> impl Strategy<Value = GgufMutant> {
    prop_oneof![
        4 => (any::<usize>(), field_values()).prop_map(|(field, value)| GgufMutant::Field { field, value }),
        1 => byte_mutations().prop_map(GgufMutant::Header),
        1 => byte_mutations().prop_map(GgufMutant::Anywhere),
    ]
}

/// `file` after `m`.
pub fn mutate_gguf(file: &[u8], m: &GgufMutant) -> Vec<u8> {
    let (fields, header) = fields(file);
    let mut b = file.to_vec();
    match m {
        GgufMutant::Field { field, value } => {
            let f = fields[field % fields.len()];
            let mut old = [0u8; 8];
            old[..f.width].copy_from_slice(&b[f.at..f.at + f.width]);
            let old = u64::from_le_bytes(old);
            let new = match *value {
                FieldValue::Set(v) => v,
                FieldValue::Add(d) => old.wrapping_add(d as u64),
                FieldValue::Double => old.wrapping_mul(2),
            };
            b[f.at..f.at + f.width].copy_from_slice(&new.to_le_bytes()[..f.width]);
        }
        GgufMutant::Header(raw) => apply_bytes(&mut b, header, raw),
        GgufMutant::Anywhere(raw) => apply_bytes(&mut b, file.len(), raw),
    }
    b
}

fn gguf_fixture(name: &str) -> std::path::PathBuf {
    common::fixtures_dir().join("gguf").join(name)
}

/// Loads and scores `path`: header mutants must run correctly or be refused; mutants of the
/// data section may also give other numbers (a weight is any bit pattern), but never a panic.
fn run(path: &Path, m: &GgufMutant) -> crate::harness::Outcome {
    match m {
        GgufMutant::Anywhere(_) => load_and_score_any(path, |_| {}),
        _ => load_and_score(path, |_| {}),
    }
}

#[test]
fn the_field_walker_reads_the_whole_header() {
    // The walker ends where the data section's padding starts, and finds every tensor's fields.
    let file = std::fs::read(gguf_fixture("qwen3_moe.gguf")).unwrap();
    let (fields, header) = fields(&file);
    let tensors = u64::from_le_bytes(file[8..16].try_into().unwrap()) as usize;
    assert_eq!(fields.iter().filter(|f| f.kind == FieldKind::Offset).count(), tensors);
    assert!(header <= file.len() && file[header..header.next_multiple_of(32)].iter().all(|&b| b == 0));
}

/// `cases` mutants (in CI) of the GGUF fixture `name` through the engine.
fn fuzz_gguf_of(name: &str, cases: u32) {
    let original = std::fs::read(gguf_fixture(name)).unwrap();
    fuzz(&format!("{name}/engine"), cases, gguf_mutants(), |m| {
        let dir = TempDir::new("fuzz-gguf");
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, mutate_gguf(&original, &m)).unwrap();
        guarded(move || {
            let _dir = &dir;
            run(&path, &m)
        })
    });
}

#[test]
fn gguf_file_through_engine() {
    fuzz_gguf_of("qwen3_moe.gguf", 96);
}

#[test]
fn gguf_files_of_the_newer_architectures_through_engine() {
    // Metadata read through the Hugging Face config parser: MLA and YaRN keys, GLM's partial
    // rotary, gpt-oss's windows and MXFP4 experts, the hybrids' `ssm.*` keys and reordered tensors.
    for name in [
        "deepseek_v2-bf16.gguf",
        "glm4_moe-bf16.gguf",
        "gpt_oss-mxfp4.gguf",
        "qwen3_5_moe-bf16.gguf",
        "qwen3_next_moe-bf16.gguf",
    ] {
        fuzz_gguf_of(name, 24);
    }
}

#[test]
fn gguf_split_set_with_a_mutated_part_through_engine() {
    let names: Vec<String> = (1..=3).map(|k| format!("qwen3_moe-split-{k:05}-of-00003.gguf")).collect();
    let originals: Vec<Vec<u8>> = names.iter().map(|n| std::fs::read(gguf_fixture(n)).unwrap()).collect();
    fuzz("qwen3_moe-split/engine", 48, (0usize..3, 0usize..3, gguf_mutants()), |(part, opened, m)| {
        let dir = TempDir::new("fuzz-gguf-split");
        for (k, (name, bytes)) in names.iter().zip(&originals).enumerate() {
            let bytes = if k == part { mutate_gguf(bytes, &m) } else { bytes.clone() };
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        let path = dir.path().join(&names[opened]);
        guarded(move || {
            let _dir = &dir;
            run(&path, &m)
        })
    });
}

// Regression cases: GGUF mutants that hung or gave NaN before the checks at the edge.

/// The engine's error for `bytes` written as `name` in a copy of the split set (or alone when
/// `name` is not a split part); a run that succeeds fails the test.
fn refused(name: &str, bytes: Vec<u8>) -> String {
    let dir = TempDir::new("fuzz-gguf-regression");
    for k in 1..=3 {
        let part = format!("qwen3_moe-split-{k:05}-of-00003.gguf");
        std::fs::copy(gguf_fixture(&part), dir.path().join(&part)).unwrap();
    }
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let outcome = guarded(move || load_and_score(&path, |_| {})).unwrap_or_else(|e| panic!("{name}: {e}"));
    outcome.expect_err("the mutant must be refused")
}

/// `file` with the `width`-byte field at `at` set to `value`.
fn with_field(mut file: Vec<u8>, at: usize, width: usize, value: u64) -> Vec<u8> {
    file[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
    file
}

#[test]
fn regression_gguf_block_count_wrapped_hung() {
    // block_count 3 − 32 as a u32: 4 billion `blk.N` look-ups and a 4 GiB layer list.
    let file = std::fs::read(gguf_fixture("qwen3_moe.gguf")).unwrap();
    let key = b"qwen3moe.block_count";
    let at = file.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    for value in [3u64.wrapping_sub(32), 0, 2, 4] {
        let e = refused("m.gguf", with_field(file.clone(), at, 4, value));
        assert!(e.contains("block_count") && e.contains(&(value as u32).to_string()), "{e}");
    }
}

#[test]
fn regression_gguf_tensor_offset_shifted_gave_nan() {
    // An offset moved by ±32 (still aligned, still inside the file) read a neighbour's bytes.
    let file = std::fs::read(gguf_fixture("qwen3_moe.gguf")).unwrap();
    let offsets: Vec<Field> = fields(&file).0.into_iter().filter(|f| f.kind == FieldKind::Offset).collect();
    let second = offsets[1];
    let old = u64::from_le_bytes(file[second.at..second.at + 8].try_into().unwrap());
    for value in [old + 32, old - 32] {
        let e = refused("m.gguf", with_field(file.clone(), second.at, 8, value));
        assert!(e.contains(&format!("has offset {value}, expected {old}")), "{e}");
    }
}

#[test]
fn regression_gguf_last_tensor_retyped_gave_nan() {
    // The last tensor of a split part set to Q4_0: smaller, so still inside the file, and its
    // bytes read as the wrong type.
    let name = "qwen3_moe-split-00002-of-00003.gguf";
    let file = std::fs::read(gguf_fixture(name)).unwrap();
    let last = *fields(&file).0.iter().rfind(|f| f.kind == FieldKind::TensorType).unwrap();
    let e = refused(name, with_field(file, last.at, 4, 2));
    assert!(e.contains("bytes after the end of the last tensor"), "{e}");
}

#[test]
fn regression_gguf_rope_freq_base_tiny_gave_nan() {
    // rope.freq_base's f32 bits set to 1 (1.4e-45): every log-probability NaN.
    let file = std::fs::read(gguf_fixture("qwen3_moe.gguf")).unwrap();
    let key = b"qwen3moe.rope.freq_base";
    let at = file.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    for bits in [1u32, 0, 1.0f32.to_bits(), f32::NAN.to_bits(), f32::INFINITY.to_bits()] {
        let e = refused("m.gguf", with_field(file.clone(), at, 4, bits as u64));
        assert!(e.contains("rope_theta"), "{e}");
    }
}
