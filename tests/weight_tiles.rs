//! The CPU layout holds int4 matrices in groups of 32 and f16 matrices in tiles of 64 rows × 64
//! columns (`Caps::weight_tiles`, `TILES`, src/ops/weight_tiles.rs) and reads expert slots tiled
//! (src/experts/tiled_source.rs): the same values reordered, so every kernel that reads them
//! (decode matvec with and without `LANE_WIDE` loads, the tiled prefill GEMM, the embedding
//! lookup, chunked matrices, the expert kernels decoding and prefilling pair by pair or gathered)
//! gives bit-identical results to row-major weights, and every fixture family's and GGUF's
//! prefill and decode logits are bit-identical either way; so are the log-probs and tokens of a
//! model whose experts tile (the fixtures' do not), in int4 and f16, from its checkpoint and from
//! its int4 conversion, resident and streamed.

mod common;

use std::sync::Arc;

use common::logits::{assert_same_logits, for_every_model};
use common::mixtral::MixtralShape;
use common::{
    as_stored, assert_bits_eq, assert_close, gpu, read_f32, submit, upload_f32, upload_matrix, upload_u32, Rng,
};
use moestream::experts::{SlotArena, SlotLayout, SlotTable};
use moestream::gpu::{Gpu, GpuOptions, StepUniform};
use moestream::ops::embed::Embed;
use moestream::ops::experts::{ExpertFfn, ExpertIo, ExpertPrefill};
use moestream::ops::matmul::{MatMul, MatMulOut};
use moestream::ops::WeightFormat;
use moestream::quant::{Int4Scheme, QuantParams};
use moestream::reference::ops as refops;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};

/// The formats that tile: int4 in groups of 32, affine and symmetric, and f16.
const TILED: [WeightFormat; 3] = [
    WeightFormat::Int4(QuantParams { scheme: Int4Scheme::Affine, group_size: 32 }),
    WeightFormat::Int4(QuantParams { scheme: Int4Scheme::Symmetric, group_size: 32 }),
    WeightFormat::F16,
];

/// A context opened with `options`, and the same with row-major weights.
fn pair(options: GpuOptions) -> (Arc<Gpu>, Arc<Gpu>) {
    let row_major = GpuOptions { row_major_weights: true, ..options.clone() };
    (Gpu::new(&options).unwrap(), Gpu::new(&row_major).unwrap())
}

/// `y = W x` for `t` tokens of a `[rows, cols]` matrix in `format` on `gpu`, and whether the
/// matrix was tiled.
fn matmul(
    gpu: &Arc<Gpu>,
    w: &[f32],
    x: &[f32],
    rows: usize,
    cols: usize,
    t: usize,
    format: WeightFormat,
) -> (Vec<f32>, bool) {
    let step = StepUniform::new(gpu);
    step.set(gpu, t, 0);
    let m = upload_matrix(gpu, w, rows, cols, format);
    let (xb, yb) = (upload_f32(gpu, x), upload_f32(gpu, &vec![0.0; t * rows]));
    let op = MatMul::new(gpu, &step.buffer, &xb, &m, None, &yb, MatMulOut::plain(rows));
    submit(gpu, |pass| op.record(gpu, pass, t));
    (read_f32(gpu, &yb, t * rows), m.tiles)
}

#[test]
fn tiled_matmuls_are_bit_identical_to_row_major_ones() {
    if !gpu().caps.weight_tiles {
        eprintln!("{}: no tiles here (a GPU layout); nothing to compare", gpu().adapter.name);
        return;
    }
    // The decode kernels with LANE_WIDE loads, without subgroups (one group at a time), the
    // tiled GEMM, and row chunks of one tile (a 64 KiB binding: the upload sizes chunks from a
    // one-row blob, 768 bytes with its three segments' padding, so 85 rows, rounded to 64).
    let contexts = [
        ("lane-wide", GpuOptions::default()),
        ("no subgroups", GpuOptions { disable_subgroups: true, ..Default::default() }),
        ("tiled GEMM", GpuOptions { tiled_prefill: true, ..Default::default() }),
        ("chunked", GpuOptions { max_binding_override: Some(65536), ..Default::default() }),
    ];
    let mut rng = Rng::new(7);
    for (name, options) in contexts {
        let (tiled_gpu, row_major_gpu) = pair(options);
        for &(rows, cols) in &[(64usize, 64usize), (192, 128), (320, 64), (128, 512)] {
            for format in TILED {
                for t in [1, 3, 40] {
                    let what = format!("{name} {format:?} [{rows}, {cols}] T={t}");
                    let w = rng.vec(rows * cols, -1.0, 1.0);
                    let x = rng.vec(t * cols, -1.0, 1.0);
                    let (got, tiled) = matmul(&tiled_gpu, &w, &x, rows, cols, t, format);
                    let (want, row_major_tiled) = matmul(&row_major_gpu, &w, &x, rows, cols, t, format);
                    assert!(
                        tiled && !row_major_tiled,
                        "{what}: tiled {tiled}, row-major context tiled {row_major_tiled}"
                    );
                    assert_bits_eq(&what, &got, &want);
                    // And right: the reference on the stored weights.
                    let stored = as_stored(format, &w, rows, cols);
                    let mut r = vec![0.0; rows];
                    refops::matvec(&stored, rows, cols, &x[(t - 1) * cols..], &mut r);
                    assert_close(&what, &got[(t - 1) * rows..], &r, 1e-4);
                }
            }
        }
    }
}

#[test]
fn only_whole_tiles_of_the_tiled_formats_are_tiled() {
    let g = gpu();
    if !g.caps.weight_tiles {
        return;
    }
    let tiles = |rows: usize, cols: usize, format: WeightFormat| {
        upload_matrix(&g, &vec![0.5; rows * cols], rows, cols, format).tiles
    };
    assert!(tiles(128, 64, TILED[0]));
    assert!(!tiles(96, 64, TILED[0]), "rows not a multiple of 64");
    assert!(!tiles(64, 96, TILED[0]), "columns not a multiple of 64");
    let g64 = WeightFormat::Int4(QuantParams { scheme: Int4Scheme::Symmetric, group_size: 64 });
    assert!(!tiles(64, 128, g64), "groups of 64");
    assert!(tiles(64, 64, WeightFormat::F16));
    assert!(!tiles(64, 64, WeightFormat::F32));
    // Chunks of whole tiles: 64 rows where a one-row blob's 768 bytes leave 85 in 64 KiB.
    let chunked = Gpu::new(&GpuOptions { max_binding_override: Some(65536), ..Default::default() }).unwrap();
    let m = upload_matrix(&chunked, &vec![0.5; 192 * 64], 192, 64, TILED[0]);
    assert!(
        m.tiles && m.chunks.iter().map(|c| c.rows).eq([64, 64, 64]),
        "{:?}",
        m.chunks.iter().map(|c| c.rows).collect::<Vec<_>>()
    );
    // Row chunks smaller than a tile leave the matrix row-major.
    let small = Gpu::new(&GpuOptions { max_binding_override: Some(4096), ..Default::default() }).unwrap();
    assert!(!upload_matrix(&small, &vec![0.5; 128 * 128], 128, 128, TILED[0]).tiles);
}

#[test]
fn tiled_embedding_rows_are_the_row_major_ones() {
    let (tiled_gpu, row_major_gpu) = pair(GpuOptions::default());
    if !tiled_gpu.caps.weight_tiles {
        return;
    }
    let (vocab, hidden) = (192, 128);
    let table = Rng::new(3).vec(vocab * hidden, -1.0, 1.0);
    let tokens = [0u32, 63, 64, 191, 7, 130];
    for format in TILED {
        let lookup = |gpu: &Arc<Gpu>| {
            let step = StepUniform::new(gpu);
            step.set(gpu, tokens.len(), 0);
            let m = upload_matrix(gpu, &table, vocab, hidden, format);
            let (tb, xb) = (upload_u32(gpu, &tokens), upload_f32(gpu, &vec![0.0; tokens.len() * hidden]));
            let op = Embed::new(gpu, &step.buffer, &tb, &m, &xb);
            submit(gpu, |pass| op.record(gpu, pass, tokens.len()));
            (read_f32(gpu, &xb, tokens.len() * hidden), m.tiles)
        };
        let ((got, tiled), (want, _)) = (lookup(&tiled_gpu), lookup(&row_major_gpu));
        assert!(tiled, "{format:?}");
        assert_bits_eq(&format!("{format:?} embedding rows"), &got, &want);
        let stored = as_stored(format, &table, vocab, hidden);
        for (i, &id) in tokens.iter().enumerate() {
            let row = &stored[id as usize * hidden..(id as usize + 1) * hidden];
            assert_bits_eq(&format!("{format:?} token {id}"), &got[i * hidden..(i + 1) * hidden], row);
        }
    }
}

#[test]
fn tiled_models_give_the_row_major_logits() {
    let (tiled_gpu, row_major_gpu) = pair(GpuOptions::default());
    if !tiled_gpu.caps.weight_tiles {
        eprintln!("{}: no tiles here (a GPU layout); nothing to compare", tiled_gpu.adapter.name);
        return;
    }
    for_every_model(|path, format, prompt| {
        assert_same_logits("tiled weights against row-major", &tiled_gpu, &row_major_gpu, path, format, prompt)
    });
}

#[test]
fn lavapipe_tiles_weights() {
    // lavapipe takes the CPU layout, so it tiles; only the CPU layout ever does.
    let g = gpu();
    if g.adapter.name.contains("llvmpipe") {
        assert!(g.caps.weight_tiles, "{:?}", g.caps);
    }
    assert!(!g.caps.weight_tiles || g.caps.cpu_layouts, "{:?}", g.caps);
}

/// The routed-expert FFN's (h, y) on `gpu` for `t` tokens with every one of `experts` (gate, up,
/// down) resident in slot `e` of layer 0, its slots in `layout` (tiled or not).
#[allow(clippy::too_many_arguments)]
fn expert_ffn(
    gpu: &Arc<Gpu>,
    layout: SlotLayout,
    experts: &[[Vec<f32>; 3]],
    x: &[f32],
    ids: &[u32],
    route_w: &[f32],
    t: usize,
    prefill: ExpertPrefill,
) -> (Vec<f32>, Vec<f32>) {
    let (k, n) = (ids.len() / t, experts.len());
    let step = StepUniform::new(gpu);
    step.set(gpu, t, 0);
    let arena = SlotArena::new(gpu, n, layout).unwrap();
    let mut table = SlotTable::new(gpu, 1, n);
    for (e, [gate, up, down]) in experts.iter().enumerate() {
        let mut bytes = layout.encode(gate, up, down).unwrap();
        layout.tile(&mut bytes, &mut Vec::new()).unwrap();
        arena.write(gpu, e, &bytes);
        table.set(gpu, 0, e, e as u32);
    }
    let (xb, ib, wb) = (upload_f32(gpu, x), upload_u32(gpu, ids), upload_f32(gpu, route_w));
    let hb = upload_f32(gpu, &vec![0.0; t * k * layout.inter]);
    let yb = upload_f32(gpu, &vec![0.0; t * k * layout.hidden]);
    let io = ExpertIo { x: &xb, ids: &ib, route_w: &wb, h: &hb, y: &yb, act: (Default::default(), None) };
    let op = ExpertFfn::new(gpu, &step.buffer, io, arena.binding(&table), &layout, 0, k, prefill);
    submit(gpu, |pass| op.record(gpu, pass, t));
    (read_f32(gpu, &hb, t * k * layout.inter), read_f32(gpu, &yb, t * k * layout.hidden))
}

#[test]
fn tiled_expert_slots_compute_what_row_major_ones_do() {
    let g = gpu();
    if !g.caps.weight_tiles {
        return;
    }
    let no_subgroups = Gpu::new(&GpuOptions { disable_subgroups: true, ..Default::default() }).unwrap();
    let mut rng = Rng::new(11);
    for &(hidden, inter) in &[(128usize, 64usize), (64, 128), (192, 320)] {
        for format in TILED {
            let row_major = SlotLayout::new(format, hidden, inter).unwrap();
            let tiled = row_major.tiled();
            assert!(tiled.tiles && !row_major.tiles);
            let experts: Vec<[Vec<f32>; 3]> = (0..5)
                .map(|_| {
                    [
                        rng.vec(inter * hidden, -0.5, 0.5),
                        rng.vec(inter * hidden, -0.5, 0.5),
                        rng.vec(hidden * inter, -0.5, 0.5),
                    ]
                })
                .collect();
            for (t, k, prefill) in [
                (1, 2, ExpertPrefill::Pairs),
                (3, 2, ExpertPrefill::Pairs),
                (9, 3, ExpertPrefill::Pairs),
                (9, 3, ExpertPrefill::Gather),
            ] {
                let x = rng.vec(t * hidden, -1.0, 1.0);
                let ids: Vec<u32> = (0..t * k).map(|j| ((j * 7 + j / k) % 5) as u32).collect();
                let route_w = rng.vec(t * k, 0.1, 1.0);
                for (name, gpu) in [("lane-wide", &g), ("no subgroups", &no_subgroups)] {
                    let what = format!("{name} {format:?} H={hidden} I={inter} T={t} k={k} {prefill:?}");
                    let (h, y) = expert_ffn(gpu, tiled, &experts, &x, &ids, &route_w, t, prefill);
                    let (h0, y0) = expert_ffn(gpu, row_major, &experts, &x, &ids, &route_w, t, prefill);
                    assert_bits_eq(&format!("{what}: h"), &h, &h0);
                    assert_bits_eq(&format!("{what}: y"), &y, &y0);
                    // And right: expert 0's first pair against the reference.
                    let j = ids.iter().position(|&e| e == 0).unwrap();
                    let [gate, up, down] = &experts[0];
                    let stored = |w: &[f32], r, c| as_stored(format, w, r, c);
                    let mut want = vec![0.0; hidden];
                    let xt = &x[(j / k) * hidden..(j / k + 1) * hidden];
                    refops::swiglu_mlp(
                        &stored(gate, inter, hidden),
                        &stored(up, inter, hidden),
                        &stored(down, hidden, inter),
                        hidden,
                        inter,
                        xt,
                        &mut want,
                    );
                    want.iter_mut().for_each(|v| *v *= route_w[j]);
                    assert_close(&what, &y[j * hidden..(j + 1) * hidden], &want, 1e-4);
                }
            }
        }
    }
}

/// A random-weight Mixtral-layout checkpoint in `dir` whose every matrix tiles: hidden 128,
/// expert intermediate 128, 8 experts (top 2) in 2 layers, vocabulary 256.
fn tileable_moe_checkpoint(dir: &std::path::Path) {
    let shape = MixtralShape { hidden: 128, inter: 128, layers: 2, experts: 8, vocab: 256, heads: 4, kv_heads: 2 };
    std::fs::write(dir.join("config.json"), shape.config().to_string()).unwrap();
    let mut rng = Rng::new(21);
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = shape
        .tensors()
        .into_iter()
        .map(|(name, dims, norm)| {
            let n = dims.iter().product();
            let values = if norm { vec![1.0; n] } else { rng.vec(n, -0.2, 0.2) };
            (name, dims, values)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, values)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                bytemuck::cast_slice(values),
            );
            (name.clone(), view.unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

#[test]
fn a_model_with_tiled_experts_gives_the_row_major_tokens() {
    let (tiled_gpu, row_major_gpu) = pair(GpuOptions::default());
    if !tiled_gpu.caps.weight_tiles {
        return;
    }
    let dir = common::TempDir::new("tileable_moe");
    let checkpoint = dir.path().join("checkpoint");
    std::fs::create_dir_all(&checkpoint).unwrap();
    tileable_moe_checkpoint(&checkpoint);
    // Its int4 conversion: experts from the store rather than encoded from the checkpoint.
    let converted = dir.path().join("converted");
    let convert = std::process::Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["convert", checkpoint.to_str().unwrap(), converted.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(convert.status.success(), "convert: {}", String::from_utf8_lossy(&convert.stderr));
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
    let gen = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    for (model, format) in [(&checkpoint, TILED[0]), (&checkpoint, WeightFormat::F16), (&converted, TILED[0])] {
        let run = |gpu: &Arc<Gpu>, budget| {
            let cache = common::TempDir::new("tileable_moe_cache");
            let mut o = EngineOptions::new(model).with_format(format);
            o.cache_dir = Some(cache.path().to_path_buf());
            o.budget = budget;
            let e = Engine::load_on(gpu.clone(), &o).unwrap();
            (e.score(&prompt).unwrap().logprobs, e.generate(&prompt, &gen, |_, _| true).unwrap().tokens)
        };
        let want = run(&row_major_gpu, ExpertBudget::Auto);
        // Resident, and streamed through one layer's top-k of slots: tiled as the I/O threads read.
        for budget in [ExpertBudget::Auto, ExpertBudget::Slots(2)] {
            assert_eq!(run(&tiled_gpu, budget), want, "{} {format:?} {budget:?}", model.display());
        }
    }
}
