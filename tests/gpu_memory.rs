//! GPU memory discovery and the automatic expert budget on a simulated small adapter.

mod common;

use std::sync::Arc;

use moestream::experts::arena::SlotLayout;
use moestream::gpu::memory::{GpuMemory, MemorySource};
use moestream::gpu::{Gpu, GpuOptions};
use moestream::model::{ArchSpec, CacheShape, Checkpoint};
use moestream::ops::WeightFormat;
use moestream::runtime::memory_plan;
use moestream::runtime::ExpertBudget;
use moestream::{Engine, EngineOptions, Error};

fn mixtral() -> std::path::PathBuf {
    common::fixtures_dir().join("mixtral")
}

/// What the model needs besides its experts, and one slot's bytes, as the engine computes them
/// (on a software adapter, as the tests' lavapipe is, its I/O and upload staging too).
fn needs(options: &EngineOptions) -> (u64, u64, usize) {
    let spec = ArchSpec::from_dir(&options.model_dir).unwrap();
    let ckpt = Checkpoint::open(&options.model_dir).unwrap();
    let context = options.context.unwrap();
    let resident = memory_plan::resident_weight_bytes(&ckpt, options.dense, false)
        + spec.kv_cache_bytes(shape(options, context), options.kv_dtype)
        + memory_plan::activation_bytes(&spec, options.max_batch);
    let m = spec.moe.as_ref().unwrap();
    let slot = SlotLayout::new(options.experts, spec.hidden, m.expert_intermediate).unwrap().slot_bytes as u64;
    let host_side = memory_plan::host_side_bytes(&gpu_of(1 << 30), options.io_threads, slot as usize);
    (resident + host_side, slot, spec.layers * m.num_experts)
}

fn shape(options: &EngineOptions, context: usize) -> CacheShape {
    CacheShape { context, max_step: options.max_batch, rings: options.window_rings, state_copy: false }
}

fn gpu_of(bytes: u64) -> Arc<Gpu> {
    Gpu::new(&GpuOptions { memory_override: Some(bytes), ..Default::default() }).unwrap()
}

#[test]
fn vulkan_adapters_report_device_local_heaps() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
    assert!(!adapters.is_empty(), "the tests need a Vulkan adapter (lavapipe)");
    for adapter in &adapters {
        let m = GpuMemory::query(adapter).expect("a Vulkan adapter has device-local heaps");
        assert!(m.total > 0 && m.available <= m.total, "{m:?}");
        assert!(matches!(m.source, MemorySource::VulkanBudget | MemorySource::VulkanHeaps));
        let discovered = GpuMemory::discover(adapter);
        assert!(discovered.available <= discovered.total && discovered.total > 0, "{discovered:?}");
    }
}

#[test]
fn auto_budget_fits_a_small_adapter() {
    let mut options = EngineOptions::new(mixtral()).with_format(WeightFormat::F16);
    options.context = Some(256);
    let (resident, slot, total) = needs(&options);
    // An adapter with room for the resident part and 5 expert slots (after its 10% reserve).
    let want_slots = 5;
    let memory = ((resident + want_slots * slot) as f64 / 0.9).ceil() as u64 + slot / 2;
    let engine = Engine::load_on(gpu_of(memory), &options).unwrap();
    assert_eq!(engine.expert_slots(), Some(want_slots as usize), "budget of {total} experts on {memory} bytes");
    // It still computes the same tokens as a resident run (the budget only moves experts).
    let resident_engine = Engine::load_on(gpu_of(1 << 40), &options).unwrap();
    assert_eq!(resident_engine.expert_slots(), None, "a large adapter keeps every expert resident");
    let tokens = [1u32, 5, 9, 2, 7, 3];
    assert_eq!(engine.score(&tokens).unwrap().logprobs, resident_engine.score(&tokens).unwrap().logprobs);
}

#[test]
fn an_adapter_too_small_for_top_k_is_a_clear_error() {
    let mut options = EngineOptions::new(mixtral()).with_format(WeightFormat::F16);
    options.context = Some(256);
    let (resident, _, _) = needs(&options);
    let err = Engine::load_on(gpu_of(resident), &options).err().expect("too small");
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidArgument(_)) && text.contains("MiB free"), "{text}");
    // An explicit budget still overrides the discovery; the KV budget is what memory the experts
    // leave (none here: a typed error), unless it is given too.
    options.budget = ExpertBudget::Slots(2);
    let err = Engine::load_on(gpu_of(resident), &options).err().expect("no memory left for KV");
    assert!(matches!(err, Error::KvCacheTooLarge { .. }), "{err}");
    let spec = ArchSpec::from_dir(&options.model_dir).unwrap();
    options.kv_memory = Some(spec.kv_cache_bytes(shape(&options, 256), options.kv_dtype));
    let engine = Engine::load_on(gpu_of(resident), &options).unwrap();
    assert_eq!(engine.expert_slots(), Some(2));
}

#[test]
fn an_allocation_the_driver_refuses_is_a_typed_error() {
    let gpu = gpu_of(1 << 30);
    // Far over any buffer limit: wgpu reports it through the error scope, never a panic.
    let err = gpu
        .catch_out_of_memory(|| {
            let _ = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("huge"),
                size: gpu.caps.max_buffer + 4096,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            Ok(())
        })
        .err();
    // lavapipe rejects the size as a validation error rather than out-of-memory: either way it
    // is a typed error, not a panic, and the context stays usable (a validation error left to
    // the uncaptured handler failed every later wait: long fuzz runs refused everything after).
    match err {
        Some(Error::OutOfGpuMemory { .. } | Error::Gpu(_)) => {}
        other => panic!("unexpected outcome {other:?}"),
    }
    gpu.wait().expect("the context is not poisoned");
}

#[test]
fn dropped_models_and_sessions_give_their_memory_back() {
    // Regression: the context counted every allocation ever made, so after some thousand
    // engines loaded and dropped on one context (the fuzz suite's long runs) every automatic
    // budget came out at 0 slots and every mutant was refused before reaching the code under test.
    let mut options = EngineOptions::new(mixtral()).with_format(WeightFormat::F16);
    options.context = Some(256);
    let (resident, slot, total) = needs(&options);
    let memory = ((resident + total as u64 * slot) as f64 / 0.9).ceil() as u64 + slot;
    let gpu = gpu_of(memory);
    for round in 0..4 {
        let engine = Engine::load_on(gpu.clone(), &options).unwrap();
        assert_eq!(engine.expert_slots(), None, "round {round}: every expert resident");
        let mut session = engine.new_session().unwrap();
        engine.generate_in(&mut session, &[1, 2, 3], &Default::default(), |_, _| true).unwrap();
        assert!(gpu.bytes_allocated() > 0);
    }
    assert_eq!(gpu.bytes_allocated(), 0, "every model and session dropped");
}

#[test]
fn gguf_matrices_count_at_their_gpu_size() {
    // qwen3_moe-q4km.gguf's dense matrices are Q8_0, held on the GPU in 36-byte padded blocks:
    // the resident estimate the automatic budget subtracts counts those, not the file's 34.
    let path = common::fixtures_dir().join("gguf/qwen3_moe-q4km.gguf");
    let gguf = moestream::model::gguf::GgufModel::open(&path).unwrap();
    let spec = moestream::model::gguf::arch::spec_from_gguf(&gguf).unwrap();
    let ckpt = Checkpoint::from_gguf(gguf, &spec).unwrap();
    let q8 = moestream::model::gguf::GgmlType::Q8_0;
    let dense_q8: Vec<&str> = ckpt.names().filter(|n| ckpt.ggml_type(n) == Some(q8)).collect();
    assert!(dense_q8.len() > 4, "the fixture's attention, embedding and lm_head are Q8_0");
    let file: u64 = dense_q8.iter().map(|n| ckpt.tensor_bytes(n)).sum();
    let estimate = memory_plan::resident_weight_bytes(&ckpt, WeightFormat::F16, true);
    let others: u64 = ckpt
        .names()
        .filter(|n| ckpt.ggml_type(n) != Some(q8) && !n.contains(".experts."))
        .map(|n| ckpt.tensor_bytes(n))
        .sum();
    assert!(estimate >= others + file / 34 * 36, "estimate {estimate}, Q8_0 file bytes {file}, others {others}");
}
