//! `moestream bench kernels | model | streaming | ssd | profile | context`.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::model_args::{base_options, default_model, DirectIoArg, Dtype, KvDtypeArg, ModelArgs, Routing};
use moestream::bench::context::{self, ContextBenchOptions};
use moestream::bench::kernels::{self, KernelBenchOptions};
use moestream::bench::profile::{self, ProfileOptions};
use moestream::bench::ssd::{self, SsdBenchOptions};
use moestream::bench::streaming::{self, StreamingBenchOptions};
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::gpu::profiler::ProfileTiming;
use moestream::gpu::{Gpu, GpuOptions};
use moestream::ops::attention::Heads;
use moestream::runtime::ExpertBudget;
use moestream::{Error, Result};

/// Flags of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Bandwidth of the int4 / f16 / f32 matvec against a buffer copy and read on this adapter.
    Kernels(KernelsArgs),
    /// Prefill and decode speed of one model (median of several runs after a warm-up).
    Model(super::bench_model::ModelBenchArgs),
    /// Every switchable fast path against the plain path it replaces, run by run in turn in one
    /// process; fails when a fast path is over 2x slower in every run.
    Paths(super::bench_paths::PathsArgs),
    /// Expert streaming: every budget × policy × prefetcher against the fully resident run.
    Streaming(StreamingArgs),
    /// A model bigger than memory: decode with experts read from disk, every I/O thread count ×
    /// policy × prefetcher, against the device's sequential and 4 KiB random read bandwidth.
    Ssd(SsdArgs),
    /// Per-kernel GPU time, bytes and GB/s of decode steps and prefill chunks (timestamp queries).
    Profile(ProfileArgs),
    /// Prefill and decode speed at several context depths, against the read-bandwidth roofline.
    Context(ContextArgs),
    /// One sequence's cache bytes at given contexts in f16 and q8_0, with sliding-window rings
    /// and without, from the model's architecture alone (config.json or GGUF metadata).
    KvSize(super::bench_kv_size::KvSizeArgs),
    /// Many requests at once through the scheduler: aggregate tok/s, latency and bytes read
    /// per generated token at each count of concurrent requests.
    Batch(super::bench_batch::BatchArgs),
}

/// Flags of `bench context`.
#[derive(Args, Debug)]
struct ContextArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Context depths (prompt lengths), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "512,4096,16384,32768")]
    depths: Vec<usize>,
    /// Tokens generated after each prompt.
    #[arg(long, default_value_t = 16)]
    decode_tokens: usize,
    /// Seed of the prompts' ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seconds of the read-bandwidth measurement.
    #[arg(long, default_value_t = 1.0)]
    kernel_seconds: f64,
    /// Prefill only the last N tokens of each depth's prompt, over a cache that takes the rest
    /// as computed (zeros): prefill tok/s at depth, as `llama-bench -p N -d …` reports it, and
    /// decode at depth without prefilling it all (a step costs the same whatever the cache
    /// holds). For adapters where prefilling the depth takes hours.
    #[arg(long, value_name = "N")]
    prefill_last: Option<usize>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Flags of `bench profile`.
#[derive(Args, Debug)]
struct ProfileArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length (seeded random token ids).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens generated (greedy, end-of-sequence ignored).
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Seed of the prompt's ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How each dispatch is timed: inside-passes (timestamps around it in the pass),
    /// pass-boundaries (a pass of its own, timestamps at its ends), submits (a submission of its
    /// own, host clock); default: the best the adapter offers.
    #[arg(long, value_parser = ProfileTiming::parse)]
    timing: Option<ProfileTiming>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// Flags of `bench kernels`.
#[derive(Args, Debug)]
struct KernelsArgs {
    /// Matrix rows (output features).
    #[arg(long, default_value_t = 4096)]
    rows: usize,
    /// Matrix columns (input features), a multiple of 64.
    #[arg(long, default_value_t = 4096)]
    cols: usize,
    /// Seconds of timed dispatches per kernel.
    #[arg(long, default_value_t = 1.5)]
    seconds: f64,
    /// Cached positions of the decode-attention measurement (f16 and q8_0 caches).
    #[arg(long, default_value_t = 16384)]
    kv_len: usize,
    /// Head layout of the decode-attention measurement: query heads, KV heads, head dim
    /// (the reference bench model's is 8,4,64).
    #[arg(long, value_delimiter = ',', default_values_t = [32, 4, 128])]
    attention_heads: Vec<usize>,
    /// GPU adapter by name substring or index (see `moestream devices`); env MOESTREAM_ADAPTER.
    #[arg(long)]
    adapter: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Flags of `bench ssd` (I/O threads, policy and prefetcher are swept).
#[derive(Args, Debug)]
struct SsdArgs {
    /// A converted model directory (`moestream convert`), holding `experts.bin`.
    #[arg(long)]
    model: PathBuf,
    /// GPU adapter by name substring or index (see `moestream devices`); env MOESTREAM_ADAPTER.
    #[arg(long)]
    adapter: Option<String>,
    /// GPU slots for routed experts.
    #[arg(long, conflicts_with = "gpu_memory", required_unless_present = "gpu_memory")]
    expert_slots: Option<usize>,
    /// GPU memory for routed experts, e.g. `256MiB` (converted to slots).
    #[arg(long, value_parser = moestream::gpu::memory::parse_bytes)]
    gpu_memory: Option<u64>,
    /// Positions per sequence.
    #[arg(long, default_value_t = 256)]
    context: usize,
    /// Read the expert store uncached (O_DIRECT): `auto` when it exceeds the memory available;
    /// a bare `--direct-io` means `on`.
    #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "on")]
    direct_io: DirectIoArg,
    /// Reader thread counts to compare.
    #[arg(long, value_delimiter = ',', default_value = "4")]
    io_threads: Vec<usize>,
    /// Eviction policies to compare.
    #[arg(long, value_delimiter = ',', value_parser = parse_policy, default_value = "eamc")]
    policies: Vec<PolicyKind>,
    /// Prefetchers to compare (none, eamc, prerouter, prerouter+eamc).
    #[arg(long, value_delimiter = ',', value_parser = parse_prefetch, default_value = "none,eamc")]
    prefetch: Vec<PrefetchKind>,
    /// Prompt tokens (seeded random ids).
    #[arg(long, default_value_t = 8)]
    prompt_tokens: usize,
    /// Tokens decoded per configuration.
    #[arg(long, default_value_t = 16)]
    decode_tokens: usize,
    /// Seed of the prompt.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Seconds of each device-bandwidth pattern (sequential, 4 KiB random).
    #[arg(long, default_value_t = 2.0)]
    device_seconds: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Flags of `bench streaming` (the budget, policy and prefetcher are swept).
#[derive(Args, Debug)]
struct StreamingArgs {
    /// Model directory (Hugging Face layout); defaults to the bundled model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Weight precision on the GPU.
    #[arg(long, value_enum, default_value = "f16")]
    dtype: Dtype,
    /// Positions per sequence (default: the model's maximum or what fits, whichever is smaller).
    #[arg(long)]
    context: Option<usize>,
    /// Element type of the KV cache.
    #[arg(long, value_enum, default_value = "f16")]
    kv_dtype: KvDtypeArg,
    /// GPU adapter by name substring or index (see `moestream devices`); env MOESTREAM_ADAPTER.
    #[arg(long)]
    adapter: Option<String>,
    /// Threads reading the expert store.
    #[arg(long, default_value_t = moestream::runtime::engine::DEFAULT_IO_THREADS)]
    io_threads: usize,
    /// Read the expert store uncached (O_DIRECT): `auto` when it exceeds the memory available;
    /// a bare `--direct-io` means `on`.
    #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "on")]
    direct_io: DirectIoArg,
    /// Expert budgets in percent of all routed experts (at least top-k slots).
    #[arg(long, value_delimiter = ',', value_parser = parse_percent, default_value = "10%,25%,50%,100%")]
    budgets: Vec<f64>,
    /// Eviction policies to compare.
    #[arg(long, value_delimiter = ',', value_parser = parse_policy, default_value = "lru,lfu,eamc")]
    policies: Vec<PolicyKind>,
    /// Prefetchers to compare (none, eamc, prerouter, prerouter+eamc).
    #[arg(long, value_delimiter = ',', value_parser = parse_prefetch, default_value = "none,eamc")]
    prefetch: Vec<PrefetchKind>,
    /// Expert routing of decode steps, in every run (the resident baseline too, so the
    /// exactness check compares like with like).
    #[arg(long, value_enum, default_value = "native")]
    routing: Routing,
    /// Prerouter heads for `prerouter` prefetch or predicted routing (default: the model
    /// directory's `prerouter.safetensors`).
    #[arg(long)]
    prerouter: Option<PathBuf>,
    /// Requests in the workload.
    #[arg(long, default_value_t = 8)]
    requests: usize,
    /// Prompt tokens per request (windows of the model's validation.txt, else random ids).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Seed of random prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of a markdown table.
    #[arg(long)]
    json: bool,
}

/// Parses `25%` or `25` into 25.0.
fn parse_percent(s: &str) -> std::result::Result<f64, String> {
    s.trim().trim_end_matches('%').parse::<f64>().map_err(|_| format!("bad percentage {s:?}"))
}

fn parse_policy(s: &str) -> std::result::Result<PolicyKind, String> {
    s.trim().parse().map_err(|e: Error| e.to_string())
}

fn parse_prefetch(s: &str) -> std::result::Result<PrefetchKind, String> {
    s.trim().parse().map_err(|e: Error| e.to_string())
}

/// Runs `bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    match a.what {
        BenchCommand::Kernels(k) => run_kernels(k),
        BenchCommand::Model(m) => super::bench_model::run(m),
        BenchCommand::Paths(p) => super::bench_paths::run(p),
        BenchCommand::Streaming(s) => run_streaming(s),
        BenchCommand::Ssd(s) => run_ssd(s),
        BenchCommand::Profile(p) => run_profile(p),
        BenchCommand::Context(c) => run_context(c),
        BenchCommand::KvSize(k) => super::bench_kv_size::run(k),
        BenchCommand::Batch(b) => super::bench_batch::run(b),
    }
}

pub(super) fn print_json(value: &impl serde::Serialize) {
    println!("{}", serde_json::to_string(value).expect("serialisable"));
}

fn run_kernels(a: KernelsArgs) -> Result<()> {
    let &[n_heads, n_kv_heads, head_dim] = a.attention_heads.as_slice() else {
        return Err(Error::InvalidArgument(format!(
            "--attention-heads takes three numbers (query heads, KV heads, head dim), got {:?}",
            a.attention_heads
        )));
    };
    let gpu = Gpu::new(&GpuOptions { adapter: a.adapter.clone(), ..Default::default() })?;
    let o = KernelBenchOptions {
        rows: a.rows,
        cols: a.cols,
        seconds: a.seconds,
        kv_len: a.kv_len,
        attention_heads: Heads { n_heads, n_kv_heads, head_dim },
        ..Default::default()
    };
    let r = kernels::run(&gpu, &o)?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!("{} ({}), matvec {} x {}", r.adapter, r.backend, r.rows, r.cols);
    println!("{:<8} {:>10} {:>10} {:>10} {:>10}", "kernel", "GB/s", "us/op", "vs copy", "vs read");
    for (name, gbps, us) in [
        ("int4", r.int4_gbps, r.int4_us),
        ("f16", r.f16_gbps, r.f16_us),
        ("f32", r.f32_gbps, r.f32_us),
        ("copy", r.copy_gbps, r.copy_us),
        ("read", r.read_gbps, r.read_us),
        ("attn", r.attention.gbps, r.attention.us),
        ("attn q8", r.attention_q8_0.gbps, r.attention_q8_0.us),
    ] {
        println!("{name:<8} {gbps:>10.2} {us:>10.1} {:>10.2} {:>10.2}", gbps / r.copy_gbps, gbps / r.read_gbps);
    }
    println!(
        "int4 vs f16 weights/s: {:.2}x (int4 counts {} blob bytes: codes + scales + mins)",
        r.int4_vs_f16, r.int4_bytes
    );
    println!("copy GB/s counts bytes read (the memory traffic is twice that); read is a compute-shader sum");
    match r.read_u64_gbps {
        Some(u64s) => println!(
            "read: the faster of vec4<f32> loads ({:.2} GB/s) and vec2<u64> loads ({u64s:.2} GB/s)",
            r.read_vec4_gbps
        ),
        None => println!("read: vec4<f32> loads (no 8-byte integers on this device)"),
    }
    let [q, kv, hd] = r.attention.heads;
    println!(
        "attn: one decode token over {} positions of an f16 KV cache ({q} query heads sharing {kv} KV heads of {hd}), counting {} cache bytes; attn q8: the same over q8_0 ({} bytes), {:.2}x the f16 time",
        r.attention.kv_len, r.attention.bytes, r.attention_q8_0.bytes, r.attention_q8_0_vs_f16_time
    );
    Ok(())
}

fn run_profile(a: ProfileArgs) -> Result<()> {
    let mut options = a.model.options()?;
    options.gpu.profile = true;
    options.gpu.profile_timing = a.timing;
    let engine = moestream::Engine::load(&options)?;
    let o = ProfileOptions { prompt_tokens: a.prompt_tokens, decode_tokens: a.decode_tokens, seed: a.seed };
    let r = profile::run(&engine, &o)?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!(
        "{} on {}: {} prompt tokens, {} generated ({:.1} tok/s while profiled), dispatches timed by {}, kernels {}",
        r.model,
        r.adapter,
        r.prompt_tokens,
        r.decode_tokens,
        r.decode_tokens_per_s,
        r.timing.name(),
        if r.shader_checks { "with every naga check" } else { "without naga's index clamps and loop counters" }
    );
    print!("{}", r.markdown());
    Ok(())
}

fn run_context(a: ContextArgs) -> Result<()> {
    let engine = a.model.load()?;
    let o = ContextBenchOptions {
        depths: a.depths.clone(),
        decode_tokens: a.decode_tokens,
        seed: a.seed,
        kernel_seconds: a.kernel_seconds,
        prefill_last: a.prefill_last,
    };
    let r = context::run(&engine, &o)?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!(
        "{} on {}: context {}, {} KV bytes per position, {:.1} MB of weights per token, read bandwidth {:.2} GB/s\n",
        r.model,
        r.adapter,
        r.context,
        r.kv_bytes_per_token,
        r.weight_bytes_per_token as f64 / 1e6,
        r.read_gbps
    );
    print!("{}", r.markdown());
    Ok(())
}

fn run_streaming(a: StreamingArgs) -> Result<()> {
    let mut base = base_options(&a.model.clone().unwrap_or_else(default_model), a.dtype)?;
    base.context = a.context;
    base.kv_dtype = a.kv_dtype.dtype();
    base.gpu = GpuOptions { adapter: a.adapter.clone(), ..Default::default() };
    base.io_threads = a.io_threads;
    base.direct_io = a.direct_io.mode();
    base.routing = a.routing.mode();
    base.prerouter = a.prerouter.clone();
    let o = StreamingBenchOptions {
        base,
        budgets_pct: a.budgets.clone(),
        policies: a.policies.clone(),
        prefetch: a.prefetch.clone(),
        requests: a.requests,
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens,
        seed: a.seed,
    };
    let r = streaming::run(&o, |r| {
        eprintln!(
            "[{}% = {} slots, {} / {}: hit rate {:.1}%, {:.2} tok/s ({:.2}x resident)]",
            r.budget_pct,
            r.slots,
            r.policy,
            r.prefetch,
            r.hit_rate * 100.0,
            r.decode_tokens_per_s,
            r.vs_resident
        );
    })?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!(
        "{} on {}: {} requests ({}) of {} prompt + {} generated tokens, {} experts, {} routing; resident prefill {:.1} tok/s\n",
        r.model,
        r.adapter,
        r.requests,
        r.workload,
        r.prompt_tokens,
        r.decode_tokens,
        r.total_experts,
        r.routing,
        r.resident.prefill_tokens_per_s
    );
    print!("{}", r.markdown());
    Ok(())
}

fn run_ssd(a: SsdArgs) -> Result<()> {
    let mut base = base_options(&a.model, Dtype::Int4)?;
    base.context = Some(a.context);
    base.gpu = GpuOptions { adapter: a.adapter.clone(), ..Default::default() };
    base.direct_io = a.direct_io.mode();
    base.budget = match (a.expert_slots, a.gpu_memory) {
        (Some(n), _) => ExpertBudget::Slots(n),
        (None, Some(b)) => ExpertBudget::Bytes(b),
        (None, None) => ExpertBudget::Auto,
    };
    let o = SsdBenchOptions {
        base,
        io_threads: a.io_threads.clone(),
        policies: a.policies.clone(),
        prefetch: a.prefetch.clone(),
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens,
        seed: a.seed,
        device_seconds: a.device_seconds,
    };
    let r = ssd::run(&o, |r| {
        eprintln!(
            "[{} I/O threads, {} / {}: {:.2} tok/s, stall {:.0} ms/tok, {:.0}% hidden, amplification {:.2}]",
            r.io_threads,
            r.policy,
            r.prefetch,
            r.decode_tokens_per_s,
            r.stall_ms_per_token,
            r.hidden_share * 100.0,
            r.read_amplification
        );
    })?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!(
        "{} on {}: store {:.2} GiB, {} of {} experts in slots, {}, {} host copies per read; prompt {} + {} decoded tokens\n\
         device: sequential {:.0} MB/s, 4 KiB random {:.0} MB/s ({:.0} IOPS, {} threads)\n",
        r.model,
        r.adapter,
        r.store_bytes as f64 / (1u64 << 30) as f64,
        r.slots,
        r.total_experts,
        r.io_mode,
        r.host_copies_per_read,
        r.prompt_tokens,
        r.decode_tokens,
        r.device.sequential_mb_s,
        r.device.random_4k_mb_s,
        r.device.random_4k_iops,
        r.device.random_threads
    );
    print!("{}", r.markdown());
    Ok(())
}
