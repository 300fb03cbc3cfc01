//! `moestream serve`: an OpenAI-compatible HTTP server (tokio + axum) over one engine.
//!
//! Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (with
//! `stream: true` as server-sent events ending in `data: [DONE]`), `GET /health`,
//! `GET /metrics`. Requests queue first-come first-served on the engine's thread (`worker`),
//! which answers up to `parallel` of them together, every step carrying a token of each; a
//! client that disconnects stops its reply.

mod api;
mod error;
mod metrics;
mod routes;
mod structured;
mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::runtime::EngineOptions;

/// Where and how to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind (`127.0.0.1` by default: only this machine can connect).
    pub host: String,
    /// Port (0 picks a free one; the address is printed).
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on `/v1/*`.
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// A Jinja chat template to use instead of the model's.
    pub chat_template: Option<std::path::PathBuf>,
    /// Requests answered at once, each with its own KV cache (`None`: 4 where memory allows).
    pub parallel: Option<usize>,
    /// Keep a thinking model's `<think>` reasoning apart from the answer (`reasoning_content`).
    pub split_reasoning: bool,
    /// Prompt-lookup drafts for every request that has no constraint (`None`: one token a
    /// step), as llama-server's `--draft-max`, where MTP drafts do not take their place.
    pub drafts: Option<crate::runtime::drafts::PromptLookup>,
    /// MTP drafts a step for every request that has no constraint, where the engine loaded the
    /// model's MTP module ([`EngineOptions::mtp`]); 0: none.
    pub mtp_drafts: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            max_body_bytes: 1 << 20,
            chat_template: None,
            parallel: None,
            split_reasoning: true,
            drafts: None,
            mtp_drafts: 0,
        }
    }
}

/// Loads the model and serves until Ctrl-C (or SIGTERM); prints `listening on http://ADDR` to
/// stderr once requests are accepted.
pub fn run(engine: EngineOptions, options: ServeOptions) -> Result<()> {
    run_until(engine, options, |local| eprintln!("listening on http://{local}"), shutdown_signal())
}

/// Loads the model and serves until `shutdown` resolves (then finishes the requests in
/// progress); calls `listening` with the bound address once requests are accepted. Returns
/// after the engine has been dropped, so a server started next loads into the memory this
/// one gave back.
pub fn run_until(
    engine: EngineOptions,
    options: ServeOptions,
    listening: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (worker, model) = worker::Worker::start(engine, &options)?;
    log::info!("{} requests at once, {} positions each", model.parallel, model.context);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::InvalidArgument(format!("cannot start the async runtime: {e}")))?;
    let served = runtime.block_on(async move {
        let addr = format!("{}:{}", options.host, options.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::InvalidArgument(format!("cannot bind {addr}: {e}")))?;
        let local: SocketAddr = listener.local_addr().map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let state = routes::AppState {
            worker,
            model,
            api_key: options.api_key.clone(),
            max_body_bytes: options.max_body_bytes,
        };
        let app = routes::router(Arc::new(state));
        listening(local);
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| Error::InvalidArgument(format!("server error: {e}")))
    });
    // The runtime's tasks hold the last references to the worker: dropping them joins the
    // engine's thread, which drops the engine.
    drop(runtime);
    served
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
