//! Several conversations at once: one call runs their replies together, every step carrying a
//! token of each (the runtime's scheduler), each reply the one its conversation gets alone.

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::rc::Rc;

use moestream::chat::{FinishReason, Reply};
use moestream::runtime::logprobs::TokenLogprob;
use moestream::runtime::{Scheduler, Session};
use moestream::{Error, Result};

use crate::boundary::{c_text, guard, owned_string};
use crate::engine::engine_ref;
use crate::engine::MoestreamEngine;
use crate::generate::{chat_prompt, chat_request, write_stats, MoestreamGenerateOptions, MoestreamStats};
use crate::session::MoestreamSession;

/// Called with each new piece of conversation `index`'s reply (as `MoestreamTokenCallback`,
/// `token` is `UINT32_MAX`); return false to stop that reply (the others go on).
pub type MoestreamBatchCallback = Option<
    unsafe extern "C" fn(user_data: *mut c_void, index: u32, token: u32, text: *const c_char, len: usize) -> bool,
>;

/// Generates the assistant's replies to `count` conversations at once, as `moestream_chat`
/// does for each: `messages_json[i]` is conversation `i`, continued in `sessions[i]` (`sessions`
/// NULL, or an entry NULL: a fresh sequence; a session may appear once). The replies share
/// every step, so together they take less time than one after another. On success returns 0,
/// writes each reply to `replies[i]` (free each with `moestream_string_free`) and, when `stats`
/// is not NULL, each one's figures to `stats[i]` (`struct_size` set by the caller); on failure
/// returns -1 with nothing written (see `moestream_last_error`).
///
/// # Safety
/// `engine` is a live handle; `sessions` NULL or `count` entries each NULL or a live handle of
/// that engine; `messages_json` `count` NUL-terminated strings; `options` NULL or valid;
/// `replies` room for `count` pointers; `stats` NULL or `count` structs; `callback` safe to call
/// with `user_data`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn moestream_chat_batch(
    engine: *mut MoestreamEngine,
    count: u32,
    sessions: *const *mut MoestreamSession,
    messages_json: *const *const c_char,
    options: *const MoestreamGenerateOptions,
    callback: MoestreamBatchCallback,
    user_data: *mut c_void,
    replies: *mut *mut c_char,
    stats: *mut MoestreamStats,
) -> i32 {
    guard(-1, || {
        let e = engine_ref(engine)?;
        let n = count as usize;
        if n == 0 || messages_json.is_null() || replies.is_null() {
            return Err(Error::InvalidArgument("count, messages_json and replies are needed".into()));
        }
        let prompts = (0..n).map(|i| chat_prompt(e, *messages_json.add(i))).collect::<Result<Vec<_>>>()?;
        let request = chat_request(e, options)?;
        // The callers' sessions (each once), and fresh ones where they gave none.
        let lent: Vec<*mut MoestreamSession> =
            (0..n).map(|i| if sessions.is_null() { std::ptr::null_mut() } else { *sessions.add(i) }).collect();
        if (0..n).any(|i| !lent[i].is_null() && lent[..i].contains(&lent[i])) {
            return Err(Error::InvalidArgument("a session appears twice in one batch".into()));
        }
        let mut fresh: Vec<Session> =
            lent.iter().filter(|p| p.is_null()).map(|_| e.engine.new_session()).collect::<Result<_>>()?;
        let mut fresh_iter = fresh.iter_mut();
        let refs: Vec<&mut Session> = lent
            .iter()
            .map(|&p| match p.as_mut() {
                Some(s) => &mut s.session,
                None => fresh_iter.next().expect("one fresh session per NULL entry"),
            })
            .collect();
        let completions = {
            let mut scheduler = Scheduler::with_sessions(&e.engine, refs)?;
            let replies_so_far: Vec<_> = (0..n).map(|_| Rc::new(RefCell::new(Some(Reply::new(&request))))).collect();
            let mut ids = Vec::with_capacity(n);
            for (i, prompt) in prompts.iter().enumerate() {
                let reply = replies_so_far[i].clone();
                let on_token = Box::new(move |id: u32, piece: &str, _: Option<&TokenLogprob>| {
                    let mut reply = reply.borrow_mut();
                    let reply = reply.as_mut().expect("the reply lives until its request ends");
                    reply.token(id, piece, |text| call_indexed(callback, user_data, i as u32, text))
                });
                ids.push(scheduler.submit_to(i, prompt.clone(), request.generate_options(), on_token)?);
            }
            let mut done: Vec<Option<_>> = (0..n).map(|_| None).collect();
            for f in scheduler.run()? {
                let i = ids.iter().position(|&id| id == f.id).expect("a request of this batch");
                let reply = replies_so_far[i].borrow_mut().take().expect("a reply ends once");
                let g = f.result?;
                done[i] =
                    Some(reply.finish(g, &request, e.engine.context(), |text| {
                        call_indexed(callback, user_data, i as u32, text)
                    }));
            }
            done.into_iter().map(|c| c.expect("every request ended")).collect::<Vec<_>>()
        };
        drop(fresh);
        for (i, c) in completions.into_iter().enumerate() {
            if !stats.is_null() {
                write_stats(stats.add(i), &c.generation, c.finish_reason == FinishReason::Cancelled)?;
            }
            replies.add(i).write(owned_string(c.text));
        }
        Ok(0)
    })
}

/// Calls the batch callback for conversation `index` (absent: always go on).
unsafe fn call_indexed(callback: MoestreamBatchCallback, user_data: *mut c_void, index: u32, piece: &str) -> bool {
    let Some(f) = callback else { return true };
    let text = c_text(piece);
    f(user_data, index, u32::MAX, text.as_ptr(), text.as_bytes().len())
}
