//! MTP drafts through the C API: `MoestreamLoadOptions.mtp` loads the model's MTP module and
//! `MoestreamGenerateOptions.draft_source` `MOESTREAM_DRAFTS_MTP` drafts from it, giving the
//! text generated without drafts; values outside the enums, and MTP drafts on an engine loaded
//! without the module, are refused by name.

use std::ffi::{c_char, CStr, CString};
use std::ptr::null_mut;

use moestream_c::*;

mod common;
use common::last_error;

/// The GLM-4.5 fixture (which ships an MTP layer) loaded with `mtp`.
unsafe fn load(mtp: u32) -> *mut MoestreamEngine {
    let dir = CString::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/glm4_moe")).unwrap();
    let mut o = std::mem::MaybeUninit::<MoestreamLoadOptions>::uninit();
    moestream_load_options_default(o.as_mut_ptr());
    let mut o = o.assume_init();
    o.model_dir = dir.as_ptr();
    o.mtp = mtp;
    moestream_engine_load(&o)
}

/// Generates 16 greedy tokens with `draft_max` drafts from `source`; the text and how many
/// drafts were proposed.
unsafe fn generate(engine: *mut MoestreamEngine, source: u32, draft_max: u32) -> Result<(String, u32), String> {
    let mut o = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
    moestream_generate_options_default(o.as_mut_ptr());
    let mut o = o.assume_init();
    (o.max_tokens, o.draft_source, o.draft_max) = (16, source, draft_max);
    let mut stats: MoestreamStats = std::mem::zeroed();
    stats.struct_size = std::mem::size_of::<MoestreamStats>() as u32;
    let prompt = CString::new("The jury said").unwrap();
    let text: *mut c_char = moestream_generate(engine, null_mut(), prompt.as_ptr(), &o, None, null_mut(), &mut stats);
    if text.is_null() {
        return Err(last_error());
    }
    let out = CStr::from_ptr(text).to_string_lossy().into_owned();
    moestream_string_free(text);
    Ok((out, stats.draft_tokens))
}

#[test]
fn mtp_drafts_give_the_plain_text_and_bad_values_are_refused() {
    unsafe {
        let engine = load(MOESTREAM_MTP_REQUIRED);
        assert!(!engine.is_null(), "{}", last_error());
        let (plain, _) = generate(engine, MOESTREAM_DRAFTS_PROMPT_LOOKUP, 0).unwrap();
        let (drafted, proposed) = generate(engine, MOESTREAM_DRAFTS_MTP, 3).unwrap();
        assert_eq!(drafted, plain);
        assert!(proposed > 0, "MTP drafts were proposed");
        assert!(generate(engine, 9, 3).unwrap_err().contains("draft_source 9"));
        moestream_engine_free(engine);

        let without = load(MOESTREAM_MTP_OFF);
        assert!(!without.is_null(), "{}", last_error());
        assert!(generate(without, MOESTREAM_DRAFTS_MTP, 3).unwrap_err().contains("MTP module"));
        moestream_engine_free(without);
        assert!(load(7).is_null());
        assert!(last_error().contains("mtp 7"), "{}", last_error());
    }
}
