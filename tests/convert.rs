//! `moestream convert`: output files, exact encodings, manifest, cache reuse, typed errors and
//! the streaming memory bound.

mod common;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::mixtral::MixtralShape;

use moestream::convert::{
    cached_conversion, convert, is_converted, source_fingerprint, ConvertOptions, ModelManifest, Progress,
    EXPERTS_FILE, RESIDENT_FILE,
};
use moestream::model::{layer_weights, names, ArchSpec, Checkpoint};
use moestream::ops::WeightFormat;
use moestream::quant::{quantize, Int4Scheme, QuantParams};
use moestream::store::ExpertStore;
use moestream::Error;
use safetensors::{Dtype, SafeTensors, View};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A fresh, unique directory under the system temp dir (removed when dropped).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("moestream-convert-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the files of fixture `name` into `dst` (created).
fn copy_fixture(name: &str, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

fn quiet() -> impl FnMut(Progress) {
    |_| {}
}

/// Checks every output of converting fixture `name` with `options` against the source.
fn check_conversion(name: &str, options: ConvertOptions) {
    let src = fixture(name);
    let scratch = Scratch::new(name);
    let out = scratch.path("out");
    let mut last = None;
    let summary = convert(&src, &out, &options, &mut |p: Progress| last = Some(p)).unwrap();
    let last = last.expect("progress was reported");
    assert_eq!(last.done_bytes, last.total_bytes, "{name}: progress ends at the total");

    let spec = ArchSpec::from_dir(&src).unwrap();
    let moe = spec.moe_layers.iter().any(|&m| m);
    assert!(is_converted(&out));
    for f in ["model.json", RESIDENT_FILE, "config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert!(out.join(f).is_file(), "{name}: {f} missing");
    }
    assert_eq!(out.join(EXPERTS_FILE).is_file(), moe, "{name}: experts.bin iff MoE");
    assert!(!out.join("model.json.tmp").exists());

    let manifest = ModelManifest::load(&out).unwrap();
    assert_eq!(manifest.format, "moestream-model");
    assert_eq!(manifest.version, 1);
    assert_eq!(manifest.arch, spec);
    assert_eq!(manifest.expert_format(), options.experts);
    assert_eq!(manifest.dense_format(), options.dense);
    assert_eq!(manifest.experts.file.as_deref(), moe.then_some(EXPERTS_FILE));
    assert_eq!(manifest.source.path, src.canonicalize().unwrap());
    assert_eq!(manifest.source.fingerprint, source_fingerprint(&src).unwrap());
    assert!(manifest.files.contains_key(RESIDENT_FILE) && manifest.files.contains_key("tokenizer.json"));
    manifest.verify_files(&out, true).unwrap();
    assert_eq!(ArchSpec::from_dir(&out).unwrap(), spec, "{name}: config.json copied");
    assert_eq!(summary.resident_bytes, manifest.files[RESIDENT_FILE].bytes);

    // Resident tensors: same names, exact encodings.
    let source = Checkpoint::open(&src).unwrap();
    let converted = Checkpoint::open(&out).unwrap();
    let routers: Vec<String> =
        (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).map(|i| names::router(spec.family, i)).collect();
    let mut expected_names: Vec<&str> = source.names().filter(|n| !n.contains(".experts.")).collect();
    let mut got_names: Vec<&str> = converted.names().collect();
    if spec.tie_embeddings && !source.contains(names::LM_HEAD) {
        // A tied lm_head is stored in int4 on its own, quantized from the original embedding.
        assert!(got_names.contains(&names::LM_HEAD), "{name}: tied lm_head stored");
        let head = converted.tensor(names::LM_HEAD, &[spec.vocab, spec.hidden]).unwrap();
        let embed = source.tensor(names::EMBED, &[spec.vocab, spec.hidden]).unwrap();
        let q = quantize(&embed.data, spec.vocab, spec.hidden, QuantParams::default()).unwrap();
        assert_eq!(head.int4.as_ref().unwrap().packed, q.packed, "{name}: lm_head codes");
        got_names.retain(|n| *n != names::LM_HEAD);
    }
    expected_names.sort_unstable();
    got_names.sort_unstable();
    assert_eq!(got_names, expected_names, "{name}: resident tensor names");
    for t in expected_names {
        let shape = source.shape(t).unwrap().to_vec();
        let original = source.tensor(t, &shape).unwrap();
        let stored = converted.tensor(t, &shape).unwrap();
        let f16 = |v: &[f32]| v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect::<Vec<_>>();
        if shape.len() == 1 {
            assert!(converted.is_f32(t), "{name}: {t} stays f32");
            assert_eq!(stored.data, original.data, "{name}: {t}");
        } else if t == names::EMBED || routers.iter().any(|r| r == t) {
            assert!(stored.int4.is_none(), "{name}: {t} is never int4");
            assert_eq!(stored.data, f16(&original.data), "{name}: {t} is the f16 rounding");
        } else {
            match options.dense {
                WeightFormat::Int4(p) => {
                    let want = quantize(&original.data, shape[0], shape[1], p).unwrap();
                    assert_eq!(stored.int4.as_ref(), Some(&want), "{name}: {t} is exactly quantize(original)");
                    assert_eq!(stored.data, want.dequantize());
                }
                _ => {
                    assert!(stored.int4.is_none());
                    assert_eq!(stored.data, f16(&original.data), "{name}: {t} is the f16 rounding");
                }
            }
        }
    }

    // Experts: the store decodes to exactly encode→decode of the originals.
    if let Some(m) = spec.moe.as_ref().filter(|_| moe) {
        let store = ExpertStore::open(out.join(EXPERTS_FILE), spec.hash()).unwrap();
        let mut buf = store.alloc_buffer();
        let inter = m.expert_intermediate;
        for layer in (0..spec.layers).filter(|&i| spec.is_moe_layer(i)) {
            for e in 0..m.num_experts {
                let w = layer_weights::expert(&source, &spec, layer, e).unwrap();
                store.read_expert(layer, e, &mut buf).unwrap();
                let (gate, up, down) = store.decode_expert(&buf).unwrap();
                let rt = |v: &[f32], r, c| options.experts.round_trip(v, r, c).unwrap();
                assert_eq!(gate, rt(&w.gate.data, inter, spec.hidden), "{name}: layer {layer} expert {e} gate");
                assert_eq!(up, rt(&w.up.data, inter, spec.hidden), "{name}: layer {layer} expert {e} up");
                assert_eq!(down, rt(&w.down.data, spec.hidden, inter), "{name}: layer {layer} expert {e} down");
            }
        }
        let count = spec.moe_layers.iter().filter(|&&m| m).count() * m.num_experts;
        assert_eq!(summary.experts, count);
    }
}

#[test]
fn converts_every_fixture_with_default_options() {
    // The windowed fixtures' manifests keep their layers' windows.
    for name in ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama", "qwen2", "qwen3", "mixtral_swa", "qwen2_swa"] {
        check_conversion(name, ConvertOptions::default());
    }
}

#[test]
fn converts_with_f16_and_other_int4_parameters() {
    check_conversion("qwen2_moe", ConvertOptions::from_bits(16, 16, QuantParams::default()).unwrap());
    let sym64 = QuantParams::new(Int4Scheme::Symmetric, 64).unwrap();
    check_conversion("olmoe", ConvertOptions::from_bits(4, 16, sym64).unwrap());
    check_conversion("mixtral", ConvertOptions::from_bits(16, 4, sym64).unwrap());
    assert!(matches!(ConvertOptions::from_bits(8, 4, QuantParams::default()), Err(Error::InvalidArgument(_))));
}

#[test]
fn cached_conversion_reuses_until_the_source_changes() {
    let scratch = Scratch::new("cache");
    let src = scratch.path("mixtral-src");
    copy_fixture("mixtral", &src);
    let root = scratch.path("cache");
    let options = ConvertOptions::default();

    let dir = cached_conversion(&src, &root, &options, &mut quiet()).unwrap();
    assert!(dir.starts_with(&root) && is_converted(&dir));
    assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("mixtral-src-"));
    let mtime = |d: &Path| std::fs::metadata(d.join("model.json")).unwrap().modified().unwrap();
    let first = mtime(&dir);

    // Unchanged source: reused without any work.
    let started = Instant::now();
    let mut calls = 0;
    let again = cached_conversion(&src, &root, &options, &mut |_| calls += 1).unwrap();
    assert_eq!(again, dir);
    assert_eq!(calls, 0, "a reused conversion reports no progress");
    assert_eq!(mtime(&dir), first, "model.json untouched");
    assert!(started.elapsed() < Duration::from_secs(2));

    // Other options: another directory.
    let f16 = ConvertOptions::from_bits(16, 16, QuantParams::default()).unwrap();
    let other = cached_conversion(&src, &root, &f16, &mut quiet()).unwrap();
    assert_ne!(other, dir);
    assert_eq!(ModelManifest::load(&other).unwrap().expert_format(), WeightFormat::F16);

    // Touching a weight file invalidates the cache: converted again in place.
    let weights = src.join("model.safetensors");
    let file = std::fs::File::options().append(true).open(&weights).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(5)).unwrap();
    drop(file);
    let fingerprint = source_fingerprint(&src).unwrap();
    assert_ne!(ModelManifest::load(&dir).unwrap().source.fingerprint, fingerprint);
    let mut calls = 0;
    assert_eq!(cached_conversion(&src, &root, &options, &mut |_| calls += 1).unwrap(), dir);
    assert!(calls > 0, "reconverted");
    assert_eq!(ModelManifest::load(&dir).unwrap().source.fingerprint, fingerprint);

    // Changing a file's size (config.json gains whitespace) invalidates it too.
    let mut config = std::fs::read_to_string(src.join("config.json")).unwrap();
    config.push_str("\n\n");
    std::fs::write(src.join("config.json"), config).unwrap();
    let fingerprint = source_fingerprint(&src).unwrap();
    cached_conversion(&src, &root, &options, &mut quiet()).unwrap();
    assert_eq!(ModelManifest::load(&dir).unwrap().source.fingerprint, fingerprint);

    // A damaged cached file (wrong size) is not reused.
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    let mut calls = 0;
    cached_conversion(&src, &root, &options, &mut |_| calls += 1).unwrap();
    assert!(calls > 0);
    ModelManifest::load(&dir).unwrap().verify_files(&dir, true).unwrap();
}

#[test]
fn a_cached_conversion_from_before_mtp_layers_were_stored_is_made_again() {
    // A GGUF file with an MTP block (llama.cpp's GLM-4.5 conversion): its cached conversion
    // records that it stored the layer; one whose manifest says nothing of it (made by a build
    // that dropped MTP layers) is converted again, once, and then holds the layer.
    let scratch = Scratch::new("cache_mtp");
    let src = fixture("gguf").join("glm4_moe-bf16.gguf");
    let root = scratch.path("cache");
    let options = ConvertOptions::default();
    let dir = cached_conversion(&src, &root, &options, &mut quiet()).unwrap();
    let manifest = ModelManifest::load(&dir).unwrap();
    assert_eq!((manifest.arch.mtp_layers, manifest.mtp_layer), (1, Some(true)));
    let mut older: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap();
    older.as_object_mut().unwrap().remove("mtp_layer").expect("recorded");
    std::fs::write(dir.join("model.json"), older.to_string()).unwrap();
    assert_eq!(ModelManifest::load(&dir).unwrap().mtp_layer, None, "the older manifest reads");
    let mut calls = 0;
    cached_conversion(&src, &root, &options, &mut |_| calls += 1).unwrap();
    assert!(calls > 0, "converted again");
    assert_eq!(ModelManifest::load(&dir).unwrap().mtp_layer, Some(true));
    let mut calls = 0;
    cached_conversion(&src, &root, &options, &mut |_| calls += 1).unwrap();
    assert_eq!(calls, 0, "then reused");
    // A model without MTP layers is reused whatever its manifest says of them.
    let plain = cached_conversion(&fixture("gguf").join("qwen3_moe.gguf"), &root, &options, &mut quiet()).unwrap();
    assert_eq!(ModelManifest::load(&plain).unwrap().mtp_layer, Some(false));
}

#[test]
fn cache_root_follows_the_environment() {
    // Only this test touches these variables; other tests pass their cache root explicitly.
    let home = std::env::var_os("HOME");
    std::env::set_var("MOESTREAM_CACHE", "/somewhere/cache");
    assert_eq!(moestream::convert::default_cache_root(), PathBuf::from("/somewhere/cache"));
    std::env::remove_var("MOESTREAM_CACHE");
    std::env::set_var("XDG_CACHE_HOME", "/xdg");
    assert_eq!(moestream::convert::default_cache_root(), PathBuf::from("/xdg/moestream"));
    std::env::remove_var("XDG_CACHE_HOME");
    std::env::set_var("HOME", "/home/someone");
    assert_eq!(moestream::convert::default_cache_root(), PathBuf::from("/home/someone/.cache/moestream"));
    match home {
        Some(h) => std::env::set_var("HOME", h),
        None => std::env::remove_var("HOME"),
    }
}

/// Rewrites the safetensors file `path` without the tensors `drop`.
fn remove_tensors(path: &Path, drop: &[&str]) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| !drop.contains(&n.as_str())).collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(path, out).unwrap();
}

#[test]
fn errors_are_typed() {
    let scratch = Scratch::new("errors");
    let options = ConvertOptions::default();

    // No config.json.
    let src = scratch.path("no-config");
    copy_fixture("olmoe", &src);
    std::fs::remove_file(src.join("config.json")).unwrap();
    let err = convert(&src, &scratch.path("o1"), &options, &mut quiet()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(!is_converted(&scratch.path("o1")));

    // Unsupported architecture.
    let src = scratch.path("gpt2");
    copy_fixture("olmoe", &src);
    let config =
        std::fs::read_to_string(src.join("config.json")).unwrap().replace("OlmoeForCausalLM", "GPT2LMHeadModel");
    std::fs::write(src.join("config.json"), config).unwrap();
    let err = convert(&src, &scratch.path("o2"), &options, &mut quiet()).unwrap_err();
    assert!(matches!(err, Error::UnsupportedArchitecture(ref a) if a == "GPT2LMHeadModel"), "{err}");

    // Output = source, or a directory with foreign files: refused.
    let err = convert(&fixture("olmoe"), &fixture("olmoe"), &options, &mut quiet()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let foreign = scratch.path("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let err = convert(&fixture("olmoe"), &foreign, &options, &mut quiet()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(foreign.join("notes.txt").exists());

    // A failed re-conversion leaves no valid-looking directory (nor partial files).
    let out = scratch.path("out");
    convert(&fixture("olmoe"), &out, &options, &mut quiet()).unwrap();
    let broken = scratch.path("broken");
    copy_fixture("olmoe", &broken);
    remove_tensors(&broken.join("model.safetensors"), &["model.layers.1.mlp.experts.5.up_proj.weight"]);
    let err = convert(&broken, &out, &options, &mut quiet()).unwrap_err();
    assert!(matches!(err, Error::MissingTensor(ref t) if t.contains("experts.5")), "{err}");
    assert!(!is_converted(&out));
    assert!(!out.join(EXPERTS_FILE).exists() && !out.join("experts.bin.partial").exists());
    convert(&fixture("olmoe"), &out, &options, &mut quiet()).unwrap();

    // Corruption of a converted file is caught by the full check only; resizing by both.
    let manifest = ModelManifest::load(&out).unwrap();
    manifest.verify_files(&out, true).unwrap();
    let resident = out.join(RESIDENT_FILE);
    let mut bytes = std::fs::read(&resident).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    std::fs::write(&resident, &bytes).unwrap();
    manifest.verify_files(&out, false).unwrap();
    let err = manifest.verify_files(&out, true).unwrap_err();
    assert!(matches!(err, Error::Corrupt { ref path, .. } if path == &resident), "{err}");
    bytes.push(0);
    std::fs::write(&resident, &bytes).unwrap();
    assert!(matches!(manifest.verify_files(&out, false), Err(Error::Corrupt { .. })));
    bytes.pop();
    bytes[at] ^= 0x40;
    std::fs::write(&resident, &bytes).unwrap();
    manifest.verify_files(&out, true).unwrap();
    std::fs::remove_file(out.join("tokenizer.json")).unwrap();
    assert!(matches!(manifest.verify_files(&out, false), Err(Error::Io { .. })));

    // Manifest problems.
    let model_json = out.join("model.json");
    let text = std::fs::read_to_string(&model_json).unwrap();
    std::fs::write(&model_json, text.replace("\"version\": 1", "\"version\": 7")).unwrap();
    let err = ModelManifest::load(&out).unwrap_err();
    assert!(matches!(err, Error::UnsupportedConfig(ref m) if m.contains('7') && m.contains('1')), "{err}");
    std::fs::write(&model_json, text.replace("int4-affine-g32", "int3-affine-g32")).unwrap();
    assert!(matches!(ModelManifest::load(&out), Err(Error::Json { .. })));
    std::fs::write(&model_json, &text[..text.len() / 2]).unwrap();
    assert!(matches!(ModelManifest::load(&out), Err(Error::Json { .. })));
    std::fs::remove_file(&model_json).unwrap();
    assert!(matches!(ModelManifest::load(&out), Err(Error::Io { .. })));
    assert!(!is_converted(&out));
}

#[test]
fn fused_expert_layout_converts_to_the_same_store() {
    // Rewrite the OLMoE fixture (f32) in the transformers-5 fused layout: per layer
    // `experts.gate_up_proj` [E, 2I, H] (gate rows then up rows per expert) and
    // `experts.down_proj` [E, H, I].
    let scratch = Scratch::new("fused");
    let fused = scratch.path("fused-src");
    copy_fixture("olmoe", &fused);
    let spec = ArchSpec::from_dir(&fused).unwrap();
    let m = spec.moe.clone().unwrap();
    let bytes = std::fs::read(fixture("olmoe").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| !n.contains(".experts.")).collect();
    let mut fused_data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for layer in 0..spec.layers {
        let [gate_up, down] = names::fused_experts(spec.family, layer);
        let (mut gu, mut dn) = (Vec::new(), Vec::new());
        for e in 0..m.num_experts {
            let [g, u, d] = names::expert(spec.family, layer, e);
            gu.extend_from_slice(st.tensor(&g).unwrap().data());
            gu.extend_from_slice(st.tensor(&u).unwrap().data());
            dn.extend_from_slice(st.tensor(&d).unwrap().data());
        }
        let (h, i) = (spec.hidden, m.expert_intermediate);
        fused_data.push((gate_up, vec![m.num_experts, 2 * i, h], gu));
        fused_data.push((down, vec![m.num_experts, h, i], dn));
    }
    for (name, shape, data) in &fused_data {
        tensors.push((name.clone(), safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), data).unwrap()));
    }
    std::fs::write(fused.join("model.safetensors"), safetensors::serialize(tensors, None).unwrap()).unwrap();

    let options = ConvertOptions::default();
    let (a, b) = (scratch.path("per-expert"), scratch.path("fused"));
    convert(&fixture("olmoe"), &a, &options, &mut quiet()).unwrap();
    let mut last = None;
    convert(&fused, &b, &options, &mut |p: Progress| last = Some(p)).unwrap();
    let last = last.unwrap();
    assert_eq!(last.done_bytes, last.total_bytes);
    for f in [EXPERTS_FILE, RESIDENT_FILE] {
        assert!(std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(), "{f} differs");
    }
}

/// A synthetic f32 tensor whose bytes are generated when written.
struct Synth {
    shape: Vec<usize>,
    seed: u64,
}

impl View for Synth {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut state = self.seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        let n: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(n * 4);
        for _ in 0..n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            out.extend_from_slice(&v.to_le_bytes());
        }
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 4
    }
}

#[test]
fn conversion_memory_is_bounded_by_one_expert() {
    // A Mixtral-layout checkpoint in f32: 4 layers x 16 experts of 3 x 256 x 512 weights
    // (1.5 MiB each, 96 MiB of experts), plus ~5 MiB of attention, embeddings and lm_head.
    let shape = MixtralShape { hidden: 256, inter: 512, layers: 4, experts: 16, vocab: 512, heads: 4, kv_heads: 4 };
    let scratch = Scratch::new("rss");
    let src = scratch.path("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("config.json"), shape.config().to_string()).unwrap();
    let tensors: HashMap<String, Synth> = shape
        .tensors()
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape, _))| (name, Synth { shape, seed: i as u64 + 1 }))
        .collect();
    safetensors::serialize_to_file(tensors, None, &src.join("model.safetensors")).unwrap();
    let checkpoint_bytes = std::fs::metadata(src.join("model.safetensors")).unwrap().len();

    let out = scratch.path("out");
    let started = Instant::now();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["convert", src.to_str().unwrap(), out.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(child.status.success(), "convert failed: {}", String::from_utf8_lossy(&child.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&child.stdout).unwrap();
    let peak = summary["peak_rss_bytes"].as_u64().unwrap();
    eprintln!(
        "checkpoint {:.1} MiB, peak RSS {:.1} MiB, {:.2} s",
        checkpoint_bytes as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    // Bound: the process at rest (binary and libraries: ~7 MiB peak when converting a tiny
    // fixture) + one expert in f32 (1.5 MiB) and its encoding + the largest resident tensor
    // (embedding, 0.5 MiB in f32) and its encoding + two 1 MiB I/O buffers. Measured: ~14 MiB.
    // The bound leaves a >3x margin; without streaming, or without releasing the source's
    // mapped pages, the peak reaches the size of the ~101 MiB checkpoint (measured 105 MiB).
    const BOUND: u64 = 48 << 20;
    assert!(checkpoint_bytes > 2 * BOUND, "the checkpoint ({checkpoint_bytes} B) must dwarf the bound");
    assert!(peak > 0 && peak < BOUND, "peak RSS {peak} B exceeds the {BOUND} B bound");
    assert!(summary["source_bytes"].as_u64().unwrap() < checkpoint_bytes);
    assert!(is_converted(&out));
    ModelManifest::load(&out).unwrap().verify_files(&out, true).unwrap();
}

#[test]
fn threads_give_byte_identical_output() {
    // Expert encoding on 1, 3 (batches 3 + 3 + 2 of 8 experts) and every core writes the same
    // bytes in every file; qwen2_moe's shared expert and int4 dense weights go through the
    // resident path too.
    let scratch = Scratch::new("threads");
    let convert_with = |threads: usize| {
        let out = scratch.path(&format!("out-{threads}"));
        let options = ConvertOptions { threads, ..ConvertOptions::default() };
        convert(&fixture("qwen2_moe"), &out, &options, &mut quiet()).unwrap();
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())
            })
            .collect();
        files.sort();
        files
    };
    let single = convert_with(1);
    assert!(single.iter().any(|(name, _)| name == EXPERTS_FILE));
    for threads in [3, 0] {
        let multi = convert_with(threads);
        assert_eq!(multi.len(), single.len(), "{threads} threads: same files");
        for ((name, a), (other, b)) in single.iter().zip(&multi) {
            assert_eq!(name, other);
            assert!(a == b, "{threads} threads: {name} differs from the single-threaded output");
        }
    }
}

#[test]
fn architecture_hashes_stay_what_earlier_stores_were_built_for() {
    // A store records its model's architecture hash; a hash that moves makes every converted
    // model and cache a user has fail with "re-convert the model". These are the hashes the
    // stores of this and earlier versions carry (a field that does not change the stored
    // experts, such as the MTP layers, stays out of them).
    for (name, want) in [
        ("qwen3_moe", 0x7bd8_4711_6818_793a_u64),
        ("deepseek_v3", 0xbece_e459_5174_9168),
        ("glm4_moe", 0x2a41_4396_24d0_2a77),
    ] {
        let spec = moestream::model::ArchSpec::from_dir(&fixture(name)).unwrap();
        assert_eq!(spec.hash(), want, "{name}: {:#x}", spec.hash());
    }
}
