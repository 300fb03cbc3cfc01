//! WGSL sources, a small preprocessor for feature variants, and the pipeline cache.
//!
//! Each kernel is one `.wgsl` file in `shaders/`. Variants are selected with line directives:
//! `//#if NAME`, `//#else`, `//#endif` (nestable) keep or drop lines depending on whether `NAME`
//! is defined, and `//#include FILE` pastes another shader file (shared helpers such as the
//! weight loaders). The defines a kernel sees are its own plus `SUBGROUPS` when the device has
//! subgroup operations enabled.

use std::sync::Arc;

use super::objects::Object;
use super::Gpu;

/// `(name, source)` of a shader file in `shaders/`.
macro_rules! shader {
    ($name:literal) => {
        ($name, include_str!(concat!("../../shaders/", $name, ".wgsl")))
    };
}

/// Every shader file, by name (without `.wgsl`).
pub const SOURCES: &[(&str, &str)] = &[
    shader!("common"),
    shader!("reduce"),
    shader!("reduce4"),
    shader!("split_merge"),
    shader!("words16"),
    shader!("weights_common"),
    shader!("weights_f32"),
    shader!("weights_f16"),
    shader!("weights_int4"),
    shader!("weights_select"),
    shader!("weights_ggml"),
    shader!("weights_ggml_wide"),
    shader!("weights_q4_0"),
    shader!("weights_q8_0"),
    shader!("weights_q5_0"),
    shader!("weights_q4_k"),
    shader!("weights_q6_k"),
    shader!("weights_mxfp4"),
    shader!("weights_bf16"),
    shader!("expert_params"),
    shader!("team"),
    shader!("rows_dot"),
    shader!("matmul_io"),
    shader!("embed"),
    shader!("rms_norm"),
    shader!("rope_pairs"),
    shader!("rope"),
    shader!("kv_store"),
    shader!("attention_io"),
    shader!("attention"),
    shader!("attention_keys"),
    shader!("mla_attention"),
    shader!("attention_merge"),
    shader!("matmul"),
    shader!("matvec"),
    shader!("router_choice"),
    shader!("router_topk"),
    shader!("expert_gate_up"),
    shader!("expert_matmul"),
    shader!("expert_down"),
    shader!("moe_combine"),
    shader!("swiglu"),
    shader!("causal_conv1d"),
    shader!("delta_gates"),
    shader!("gated_delta_rule"),
    shader!("delta_chunk_prep"),
    shader!("delta_chunk_state"),
    shader!("gate_mul"),
    shader!("argmax"),
    shader!("token_logprob"),
    shader!("prerouter_heads"),
    shader!("mla_merge"),
    shader!("mla_decompress"),
];

/// The kernel files (everything in [`SOURCES`] that has an entry point).
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(n, _)| *n).filter(|n| {
        !matches!(
            *n,
            "common"
                | "reduce"
                | "reduce4"
                | "split_merge"
                | "expert_params"
                | "team"
                | "rows_dot"
                | "matmul_io"
                | "attention_io"
                | "rope_pairs"
                | "router_choice"
                | "delta_gates"
        ) && !n.starts_with("weights_")
    })
}

fn source(name: &str) -> &'static str {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).unwrap_or_else(|| panic!("unknown shader {name}"))
}

/// Expands `//#include`, `//#if`, `//#else` and `//#endif` in shader `name` for `defines`.
pub fn preprocess(name: &str, defines: &[&str]) -> String {
    let mut out = String::new();
    expand(source(name), defines, &mut out);
    out
}

fn expand(src: &str, defines: &[&str], out: &mut String) {
    // Stack of (this branch active, any enclosing branch inactive).
    let mut stack: Vec<bool> = Vec::new();
    let active = |stack: &Vec<bool>| stack.iter().all(|&b| b);
    for line in src.lines() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("//#if ") {
            stack.push(defines.contains(&name.trim()));
        } else if t.starts_with("//#else") {
            let top = stack.last_mut().expect("//#else without //#if");
            *top = !*top;
        } else if t.starts_with("//#endif") {
            stack.pop().expect("//#endif without //#if");
        } else if let Some(file) = t.strip_prefix("//#include ") {
            if active(&stack) {
                expand(source(file.trim()), defines, out);
            }
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(stack.is_empty(), "unterminated //#if");
}

impl Gpu {
    /// The compiled pipeline for kernel `name` with `defines` (plus `SUBGROUPS` when enabled),
    /// built once and cached.
    pub fn pipeline(&self, name: &str, defines: &[&str]) -> Arc<wgpu::ComputePipeline> {
        let mut all: Vec<&str> = defines.to_vec();
        if self.caps.subgroups {
            all.push("SUBGROUPS");
        }
        all.sort_unstable();
        let key = format!("{name}|{}", all.join(","));
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return p.clone();
        }
        let module = self.shader_module(name, &preprocess(name, &all));
        self.objects.created(Object::Pipeline);
        let pipeline = Arc::new(self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        }));
        self.pipelines.lock().unwrap().insert(key, pipeline.clone());
        pipeline
    }

    /// The shader module of WGSL `code`, built with the runtime checks [`Caps::shader_checks`]
    /// says.
    ///
    /// [`Caps::shader_checks`]: super::Caps::shader_checks
    pub fn shader_module(&self, label: &str, code: &str) -> wgpu::ShaderModule {
        let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(code.into()) };
        self.objects.created(Object::ShaderModule);
        if self.caps.shader_checks {
            return self.device.create_shader_module(desc);
        }
        // SAFETY: without naga's bounds and loop checks a kernel must stay in range by itself:
        // the adapter bounds every buffer access (`robustBufferAccess`, the condition for
        // `shader_checks` off), the kernels' loops end at bounds their parameters fix, and their
        // private and workgroup array indices are below the arrays' lengths by construction
        // (super::shader_checks).
        unsafe { self.device.create_shader_module_trusted(desc, super::shader_checks::division_checks_only()) }
    }
}

/// The `//#if` flags each kernel understands (besides `SUBGROUPS`), for the portability test
/// that compiles every combination.
pub const KERNEL_FLAGS: &[(&str, &[&str])] = &[
    ("embed", &["F16", "INT4", "INT4_SYM", "G64", "TILES"]),
    ("rms_norm", &["OUT", "ADD_PAIRS", "PAIR", "ONE_SUBGROUP", "WIDE_ROW"]),
    ("kv_store", &["F16", "Q8", "Q4", "ROPE", "RING"]),
    (
        "attention",
        &[
            "F16",
            "Q8",
            "Q4",
            "Q8_B32",
            "RING",
            "SPLIT",
            "SINKS",
            "ONE_TEAM",
            "SHARED_REDUCE",
            "HD128",
            "HD256",
            "QT2",
            "WORDS64",
        ],
    ),
    (
        "attention_keys",
        &["F16", "Q8", "Q4", "Q8_B32", "RING", "SPLIT", "SINKS", "SHARED_REDUCE", "HD128", "HD256", "QT2", "WORDS64"],
    ),
    ("matmul", &["F16", "INT4", "INT4_SYM", "G64", "TILES", "BIAS", "ACCUMULATE", "SPLIT_OUT"]),
    (
        "matvec",
        &[
            "F16",
            "INT4",
            "INT4_SYM",
            "G64",
            "TILES",
            "BIAS",
            "ACCUMULATE",
            "LAST_TOKEN",
            "LANE_ROWS",
            "SHARED_REDUCE",
            "TEAM32",
            "WIDE",
            "LANE_WIDE",
            "SPLIT_OUT",
            "VEC4_WEIGHTS",
            "WORDS64",
        ],
    ),
    ("expert_gate_up", EXPERT_DECODE_FLAGS),
    ("expert_down", EXPERT_DECODE_FLAGS),
    ("expert_matmul", &["F16", "INT4", "INT4_SYM", "G64", "TILES", "GATE_UP"]),
    ("moe_combine", &["SHARED"]),
    ("argmax", &["VEC4", "NOISE", "ONE_SUBGROUP"]),
    ("token_logprob", &["ONE_SUBGROUP"]),
    ("router_topk", &["FORCED", "CAPTURE", "SIGMOID", "GROUPS", "ONE_SUBGROUP"]),
    ("prerouter_heads", &["SCORES", "TOKEN"]),
    ("mla_attention", &["F16", "Q8", "Q4", "SPLIT", "DECOMPRESSED"]),
    ("mla_decompress", &["F16"]),
    ("gated_delta_rule", &["KDA", "SAFE_GATE"]),
    ("delta_chunk_prep", &["KDA", "SAFE_GATE"]),
];

/// The flags of the decode expert kernels (`expert_gate_up`, `expert_down`).
const EXPERT_DECODE_FLAGS: &[&str] = &[
    "F16",
    "INT4",
    "INT4_SYM",
    "G64",
    "TILES",
    "LANE_ROWS",
    "SHARED_REDUCE",
    "TEAM32",
    "CLAMPED",
    "WIDE",
    "LANE_WIDE",
    "VEC4_WEIGHTS",
    "WORDS64",
];

/// Every define combination of kernel `name`, with and without `SUBGROUPS`.
pub fn variants(name: &str) -> Vec<Vec<&'static str>> {
    let flags: &[&str] = KERNEL_FLAGS.iter().find(|(n, _)| *n == name).map_or(&[], |(_, f)| f);
    let mut out = Vec::new();
    for mask in 0..(1u32 << (flags.len() + 1)) {
        let mut set: Vec<&'static str> =
            flags.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, f)| *f).collect();
        if mask & (1 << flags.len()) != 0 {
            set.push("SUBGROUPS");
        }
        // ONE_SUBGROUP is the CPU layout with subgroups (ops::one_subgroup_layout).
        if set.contains(&"ONE_SUBGROUP") && !set.contains(&"SUBGROUPS") {
            continue;
        }
        // One cache element type at a time; q8_0 MLA caches hold the latent only; Q8_B32 is a
        // layout of the quantized caches (Q8), Q4 their 4-bit codes.
        let q8 = set.contains(&"Q8");
        if q8 && (set.contains(&"F16") || set.contains(&"DECOMPRESSED"))
            || (set.contains(&"Q8_B32") || set.contains(&"Q4")) && !q8
        {
            continue;
        }
        // PAIR normalises in place (RmsNorm::pair).
        if name == "rms_norm" && set.contains(&"PAIR") && (set.contains(&"OUT") || set.contains(&"ADD_PAIRS")) {
            continue;
        }
        // TEAM32 sizes the GPU layout's teams (DecodeLayout::defines).
        if set.contains(&"TEAM32") && set.contains(&"LANE_ROWS") {
            continue;
        }
        // WIDE exists only with the int4 reader in groups of 32 and the Q4_K, Q5_K and padded
        // Q6_K, Q8_0 and MXFP4 ones (below; DecodeLayout::wide_defines).
        let wide = set.contains(&"WIDE");
        if wide && set.contains(&"INT4") && (set.contains(&"G64") || set.contains(&"F16")) {
            continue;
        }
        // TILES is int4 in groups of 32 or f16 in the CPU layout (ops::weight_tiles).
        let int4_g32 = set.contains(&"INT4") && !set.contains(&"G64") && !set.contains(&"F16");
        let f16 = set.contains(&"F16") && !set.contains(&"INT4") && !set.contains(&"INT4_SYM") && !set.contains(&"G64");
        let tiles_reader = int4_g32 || f16;
        let decode_kernel = flags.contains(&"LANE_ROWS");
        if set.contains(&"TILES") && !(tiles_reader && (!decode_kernel || set.contains(&"LANE_ROWS"))) {
            continue;
        }
        // VEC4_WEIGHTS exists only with the f16 reader (DecodeLayout::wide_defines).
        if set.contains(&"VEC4_WEIGHTS") && (!set.contains(&"F16") || set.contains(&"INT4")) {
            continue;
        }
        // LANE_WIDE is the CPU layout with subgroups, for int4 WIDE or the f16 reader
        // (DecodeLayout::wide_defines).
        let f16_reader = set.contains(&"F16") && !set.contains(&"INT4");
        let lane_wide =
            ["LANE_ROWS", "SUBGROUPS"].iter().all(|f| set.contains(f)) && (set.contains(&"WIDE") || f16_reader);
        if set.contains(&"LANE_WIDE") && !lane_wide {
            continue;
        }
        // WORDS64 is the CPU layout's: 16-byte loads as 8-byte integers in LANE_WIDE
        // (DecodeLayout::wide_defines) and the CPU layout's attention (ops::attention).
        let cpu_attention = name == "attention_keys" || set.contains(&"ONE_TEAM");
        if set.contains(&"WORDS64") && !(set.contains(&"LANE_WIDE") || cpu_attention) {
            continue;
        }
        // The ggml readers are exclusive alternatives to the int4 / f16 flags: each one with
        // the kernel's other flags.
        if flags.contains(&"INT4") && !set.iter().any(|f| INT_F16_FLAGS.contains(f)) {
            for ggml in GGML_DEFINES.iter().filter(|&&g| !wide || WIDE_GGML_DEFINES.contains(&g)) {
                out.push([&["GGML", ggml][..], &set].concat());
            }
        }
        if wide && !set.contains(&"INT4") {
            continue;
        }
        out.push(set);
    }
    out
}

const INT_F16_FLAGS: [&str; 5] = ["F16", "INT4", "INT4_SYM", "G64", "TILES"];

/// The ggml readers with 16-byte loads (`WIDE`, shaders/weights_ggml_wide.wgsl): those of the
/// formats `DecodeLayout::wide_defines` reads so.
const WIDE_GGML_DEFINES: [&str; 5] =
    ["GGML_Q4_K", "GGML_Q5_K", "GGML_Q6_K_PADDED", "GGML_Q8_0_PADDED", "GGML_MXFP4_PADDED"];

/// The define of each ggml block type's reader (with `GGML`), see `shaders/weights_ggml.wgsl`;
/// the last three, `GGML_Q6_K_PADDED`, `GGML_Q8_0_PADDED` and `GGML_MXFP4_PADDED`, read
/// [`crate::ops::WeightFormat::Padded`] blocks.
pub const GGML_DEFINES: [&str; 12] = [
    "GGML_Q4_0",
    "GGML_Q8_0",
    "GGML_Q4_K",
    "GGML_Q5_K",
    "GGML_Q6_K",
    "GGML_MXFP4",
    "GGML_BF16",
    "GGML_Q5_0",
    "GGML_Q5_1",
    "GGML_Q6_K_PADDED",
    "GGML_Q8_0_PADDED",
    "GGML_MXFP4_PADDED",
];
