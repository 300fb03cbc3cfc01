//! MTP drafts through the C API: `MoestreamLoadOptions.mtp` loads the model's MTP module and
//! `MoestreamGenerateOptions.draft_source` `MOESTREAM_DRAFTS_MTP` drafts from it, giving the
//! text generated without drafts, alone and in `moestream_chat_batch`; values outside the
//! enums, and MTP drafts on an engine loaded without the module, are refused by name.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use moestream_c::*;

mod common;
use common::{last_error, stats_structs};

/// The GLM-4.5 fixture (which ships an MTP layer) loaded with `mtp`.
unsafe fn load(mtp: u32) -> *mut MoestreamEngine {
    load_from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/glm4_moe"), mtp)
}

/// The model in `dir` loaded with `mtp`.
unsafe fn load_from(dir: &str, mtp: u32) -> *mut MoestreamEngine {
    let dir = CString::new(dir).unwrap();
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

#[test]
fn conversations_answered_together_draft_from_the_mtp_module_and_keep_their_replies() {
    unsafe {
        // The bundled model ships a trained MTP module.
        let engine =
            load_from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/moestream-tiny-moe"), MOESTREAM_MTP_REQUIRED);
        assert!(!engine.is_null(), "{}", last_error());
        let conversations: Vec<CString> = ["Who won the race?", "Tell me about the city.", "What did the jury say?"]
            .iter()
            .map(|q| CString::new(format!("[{{\"role\": \"user\", \"content\": \"{q}\"}}]")).unwrap())
            .collect();
        let messages: Vec<*const c_char> = conversations.iter().map(|c| c.as_ptr()).collect();
        let batch = |source: u32, draft_max: u32| {
            let mut o = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
            moestream_generate_options_default(o.as_mut_ptr());
            let mut o = o.assume_init();
            (o.max_tokens, o.temperature, o.draft_source, o.draft_max) = (24, 0.0, source, draft_max);
            let mut replies = [null_mut::<c_char>(); 3];
            let mut stats = stats_structs(3);
            let status = moestream_chat_batch(
                engine,
                3,
                null(),
                messages.as_ptr(),
                &o,
                None,
                null_mut(),
                replies.as_mut_ptr(),
                stats.as_mut_ptr(),
            );
            assert_eq!(status, 0, "{}", last_error());
            let texts: Vec<String> = replies
                .iter()
                .map(|&r| {
                    let out = CStr::from_ptr(r).to_string_lossy().into_owned();
                    moestream_string_free(r);
                    out
                })
                .collect();
            (texts, stats.iter().map(|s| (s.draft_tokens, s.accepted_draft_tokens)).collect::<Vec<_>>())
        };
        let (plain, _) = batch(MOESTREAM_DRAFTS_PROMPT_LOOKUP, 0);
        let (drafted, counts) = batch(MOESTREAM_DRAFTS_MTP, 3);
        assert_eq!(drafted, plain);
        assert!(counts.iter().all(|&(d, a)| d > 0 && a > 0), "every conversation drafted and accepted: {counts:?}");
        moestream_engine_free(engine);
    }
}
