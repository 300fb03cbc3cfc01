//! `moestream_chat_batch`: several conversations answered in one call give each the reply
//! `moestream_chat` gives it alone, continue their sessions (the next turn reuses the cache),
//! report every piece of text to the callback under its conversation's index, and refuse bad
//! arguments before anything runs.

use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};

use moestream_c::*;

mod common;
use common::{last_error, load_bundled, stats_structs};

unsafe fn take(text: *mut c_char) -> String {
    assert!(!text.is_null(), "{}", last_error());
    let out = CStr::from_ptr(text).to_string_lossy().into_owned();
    moestream_string_free(text);
    out
}

/// Appends each piece to the string of its conversation.
unsafe extern "C" fn collect(user_data: *mut c_void, index: u32, _token: u32, text: *const c_char, len: usize) -> bool {
    let pieces = &mut *(user_data as *mut Vec<String>);
    pieces[index as usize] += std::str::from_utf8(std::slice::from_raw_parts(text as *const u8, len)).unwrap();
    true
}

unsafe fn options(max_tokens: u32) -> MoestreamGenerateOptions {
    let mut o = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
    moestream_generate_options_default(o.as_mut_ptr());
    let mut o = o.assume_init();
    o.max_tokens = max_tokens;
    o
}

#[test]
fn conversations_answered_together_equal_their_solo_replies() {
    unsafe {
        let engine = load_bundled();
        let o = options(12);
        let conversations: Vec<CString> = ["Who won the race?", "Tell me about the city.", "What did the jury say?"]
            .iter()
            .map(|q| CString::new(format!("[{{\"role\": \"user\", \"content\": \"{q}\"}}]")).unwrap())
            .collect();
        // Alone, each in a fresh session.
        let alone: Vec<String> = conversations
            .iter()
            .map(|c| take(moestream_chat(engine, null_mut(), c.as_ptr(), &o, None, null_mut(), null_mut())))
            .collect();
        // Together: the first two in sessions, the third fresh.
        let sessions = [moestream_session_new(engine), moestream_session_new(engine), null_mut()];
        let messages: Vec<*const c_char> = conversations.iter().map(|c| c.as_ptr()).collect();
        let mut replies = [null_mut::<c_char>(); 3];
        let mut pieces = vec![String::new(); 3];
        let mut stats = stats_structs(3);
        let status = moestream_chat_batch(
            engine,
            3,
            sessions.as_ptr(),
            messages.as_ptr(),
            &o,
            Some(collect),
            &mut pieces as *mut Vec<String> as *mut c_void,
            replies.as_mut_ptr(),
            stats.as_mut_ptr(),
        );
        assert_eq!(status, 0, "{}", last_error());
        let together: Vec<String> = replies.iter().map(|&r| take(r)).collect();
        assert_eq!(together, alone);
        assert_eq!(pieces, alone, "the callback saw each reply under its index");
        assert!(stats.iter().all(|s| s.generated_tokens >= 1 && s.prompt_tokens > 0));
        // The sessions hold their conversations: a session's next turn reuses its cache.
        let held = moestream_session_len(sessions[0]);
        assert!(held > stats[0].prompt_tokens as usize);
        let mut next_stats: MoestreamStats = std::mem::zeroed();
        next_stats.struct_size = std::mem::size_of::<MoestreamStats>() as u32;
        let second = CString::new(format!(
            "[{{\"role\": \"user\", \"content\": \"Who won the race?\"}}, {{\"role\": \"assistant\", \"content\": {}}}, {{\"role\": \"user\", \"content\": \"Why?\"}}]",
            serde_json::to_string(&together[0]).unwrap()
        ))
        .unwrap();
        take(moestream_chat(engine, sessions[0], second.as_ptr(), &o, None, null_mut(), &mut next_stats));
        assert!(next_stats.reused_tokens > 0, "the next turn reused the batch's cache");

        // Bad arguments: nothing runs.
        let twice = [sessions[0], sessions[0]];
        let two: Vec<*const c_char> = messages[..2].to_vec();
        let mut out = [null_mut::<c_char>(); 2];
        let bad = moestream_chat_batch(
            engine,
            2,
            twice.as_ptr(),
            two.as_ptr(),
            &o,
            None,
            null_mut(),
            out.as_mut_ptr(),
            null_mut(),
        );
        assert_eq!(bad, -1);
        assert!(last_error().contains("twice"), "{}", last_error());
        assert_eq!(
            moestream_chat_batch(engine, 0, null(), two.as_ptr(), &o, None, null_mut(), out.as_mut_ptr(), null_mut()),
            -1
        );
        let not_json = [CString::new("not json").unwrap()];
        let bad_messages: Vec<*const c_char> = not_json.iter().map(|c| c.as_ptr()).collect();
        let r = moestream_chat_batch(
            engine,
            1,
            null(),
            bad_messages.as_ptr(),
            &o,
            None,
            null_mut(),
            out.as_mut_ptr(),
            null_mut(),
        );
        assert_eq!(r, -1);
        assert!(last_error().contains("messages_json"));
        assert!(out.iter().all(|p| p.is_null()), "nothing written on failure");

        for s in sessions.into_iter().filter(|s| !s.is_null()) {
            moestream_session_free(s);
        }
        moestream_engine_free(engine);
    }
}
