//! The options structs' `struct_size` in use: an app compiled against the first version of
//! `MoestreamGenerateOptions` (which ended at `seed`) still generates, with the appended fields
//! at their defaults, and the same tokens as the current struct; a struct larger than this
//! library's, and figures too small to be any version, are refused by name before anything runs;
//! `moestream_generate_options_for_model` fills the model's recommended sampling.

use std::ffi::{c_char, CStr, CString};
use std::ptr::null_mut;

use moestream_c::*;

mod common;
use common::{last_error, load_bundled};

/// `MoestreamGenerateOptions` as the first header declared it.
#[repr(C)]
struct GenerateOptionsV1 {
    struct_size: u32,
    max_tokens: u32,
    temperature: f32,
    top_p: f32,
    top_k: u32,
    seed: u64,
}

/// Generates with `options` (a pointer to some version of the struct); the text, or the error.
unsafe fn generate(
    engine: *mut MoestreamEngine,
    options: *const MoestreamGenerateOptions,
    stats: *mut MoestreamStats,
) -> Result<String, String> {
    let prompt = CString::new("The jury said").unwrap();
    let text: *mut c_char = moestream_generate(engine, null_mut(), prompt.as_ptr(), options, None, null_mut(), stats);
    if text.is_null() {
        return Err(last_error());
    }
    let out = CStr::from_ptr(text).to_string_lossy().into_owned();
    moestream_string_free(text);
    Ok(out)
}

#[test]
fn older_structs_work_and_unknown_sizes_are_refused() {
    unsafe {
        let engine = load_bundled();

        let mut current = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
        moestream_generate_options_default(current.as_mut_ptr());
        let mut current = current.assume_init();
        current.max_tokens = 6;
        let v1 = GenerateOptionsV1 {
            struct_size: std::mem::size_of::<GenerateOptionsV1>() as u32,
            max_tokens: 6,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        };
        assert!(v1.struct_size < current.struct_size, "the struct grew since its first version");
        let want = generate(engine, &current, null_mut()).unwrap();
        let old = generate(engine, &v1 as *const GenerateOptionsV1 as *const MoestreamGenerateOptions, null_mut());
        assert_eq!(old.unwrap(), want, "an app built against the first header");

        // A newer app's larger struct, and one with no size at all.
        for size in [current.struct_size + 8, 0] {
            let mut bad = current;
            bad.struct_size = size;
            let e = generate(engine, &bad, null_mut()).unwrap_err();
            assert!(e.contains("MoestreamGenerateOptions.struct_size"), "{size}: {e}");
        }
        // Figures too small to be any version are refused before generating.
        let mut stats = std::mem::zeroed::<MoestreamStats>();
        stats.struct_size = 8;
        let e = generate(engine, &current, &mut stats).unwrap_err();
        assert!(e.contains("MoestreamStats.struct_size"), "{e}");
        stats.struct_size = std::mem::size_of::<MoestreamStats>() as u32;
        generate(engine, &current, &mut stats).unwrap();
        assert_eq!(stats.generated_tokens, 6);

        // The model's recommended sampling (the bundled model's generation_config.json), a
        // struct of the current size that generates; NULLs refused.
        let mut model = std::mem::zeroed::<MoestreamGenerateOptions>();
        assert_eq!(moestream_generate_options_for_model(engine, &mut model), 0, "{}", last_error());
        assert_eq!(model.struct_size, current.struct_size);
        let got = (model.temperature, model.top_k, model.top_p, model.min_p, model.repeat_penalty, model.repeat_last_n);
        assert_eq!(got, (0.8, 40, 0.95, 0.05, 1.1, 64));
        model.max_tokens = 6;
        model.seed = 7;
        let sampled = generate(engine, &model, null_mut()).unwrap();
        assert_eq!(generate(engine, &model, null_mut()).unwrap(), sampled, "seeded sampling repeats");
        // The third version's constraint: JSON valid against a schema; two at once refused.
        let schema = CString::new(r#"{"enum": ["guilty", "not guilty"]}"#).unwrap();
        let mut constrained = model;
        constrained.json_schema = schema.as_ptr();
        constrained.max_tokens = 20;
        let text = generate(engine, &constrained, null_mut()).unwrap();
        assert!(text == "\"guilty\"" || text == "\"not guilty\"", "{text:?}");
        let regex = CString::new("[a-z]+").unwrap();
        constrained.regex = regex.as_ptr();
        let e = generate(engine, &constrained, null_mut()).unwrap_err();
        assert!(e.contains("one of json_schema, regex and lark_grammar"), "{e}");
        // The fourth version's drafts: greedy text as without them, counted in the figures
        // (the bundled model's loops accept drafts); sizes out of range refused.
        let mut plain = current;
        plain.max_tokens = 48;
        let want = generate(engine, &plain, null_mut()).unwrap();
        let mut drafted = plain;
        drafted.draft_max = 4;
        stats.struct_size = std::mem::size_of::<MoestreamStats>() as u32;
        assert_eq!(generate(engine, &drafted, &mut stats).unwrap(), want);
        assert!(stats.accepted_draft_tokens > 0 && stats.accepted_draft_tokens <= stats.draft_tokens);
        drafted.draft_max = 40;
        let e = generate(engine, &drafted, null_mut()).unwrap_err();
        assert!(e.contains("draft length 40"), "{e}");
        // Figures of the first version (which ended at `cancelled`) are still filled.
        let mut stats_v1 = std::mem::zeroed::<MoestreamStats>();
        stats_v1.struct_size = (std::mem::offset_of!(MoestreamStats, cancelled) + 1).next_multiple_of(8) as u32;
        generate(engine, &plain, &mut stats_v1).unwrap();
        assert_eq!(stats_v1.generated_tokens, 48);
        assert_eq!(moestream_generate_options_for_model(engine, std::ptr::null_mut()), -1);
        assert!(last_error().contains("options is NULL"), "{}", last_error());
        assert_eq!(moestream_generate_options_for_model(std::ptr::null(), &mut model), -1);
        moestream_engine_free(engine);
    }
}

/// `MoestreamLoadOptions` as the first header declared it (it ended at `adapter`).
#[repr(C)]
struct LoadOptionsV1 {
    struct_size: u32,
    model_dir: *const c_char,
    context: u32,
    expert_slots: u32,
    expert_memory_bytes: u64,
    policy: u32,
    prefetch: u32,
    weights: u32,
    adapter: *const c_char,
}

#[test]
fn load_options_of_the_first_version_and_the_kv_cache_type() {
    let dir = CString::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/moestream-tiny-moe")).unwrap();
    unsafe {
        let mut current = std::mem::MaybeUninit::<MoestreamLoadOptions>::uninit();
        moestream_load_options_default(current.as_mut_ptr());
        let mut current = current.assume_init();
        current.model_dir = dir.as_ptr();
        let v1 = LoadOptionsV1 {
            struct_size: std::mem::size_of::<LoadOptionsV1>() as u32,
            model_dir: dir.as_ptr(),
            context: 0,
            expert_slots: 0,
            expert_memory_bytes: 0,
            policy: current.policy,
            prefetch: current.prefetch,
            weights: current.weights,
            adapter: std::ptr::null(),
        };
        assert!(v1.struct_size < current.struct_size, "the struct grew since its first version");
        let mut options = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
        moestream_generate_options_default(options.as_mut_ptr());
        let mut options = options.assume_init();
        options.max_tokens = 6;
        let old = moestream_engine_load(&v1 as *const LoadOptionsV1 as *const MoestreamLoadOptions);
        assert!(!old.is_null(), "an app built against the first header: {}", last_error());
        let want = generate(old, &options, null_mut()).unwrap();
        moestream_engine_free(old);
        // A q8_0 cache: the bundled model's greedy tokens.
        current.kv_cache_type = MOESTREAM_KV_Q8_0;
        let q8 = moestream_engine_load(&current);
        assert!(!q8.is_null(), "q8_0: {}", last_error());
        assert_eq!(generate(q8, &options, null_mut()).unwrap(), want, "q8_0 KV cache");
        moestream_engine_free(q8);
        // A q4_0 cache loads and generates (its rounding may move a greedy choice).
        current.kv_cache_type = MOESTREAM_KV_Q4_0;
        let q4 = moestream_engine_load(&current);
        assert!(!q4.is_null(), "q4_0: {}", last_error());
        assert_eq!(generate(q4, &options, null_mut()).unwrap().len(), want.len(), "q4_0 KV cache");
        moestream_engine_free(q4);
        current.kv_cache_type = 7;
        assert!(moestream_engine_load(&current).is_null());
        assert!(last_error().contains("kv_cache_type 7"), "{}", last_error());
    }
}
