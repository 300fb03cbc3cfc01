//! The command line as a llama.cpp user tries it, through the binary: short flags, the model's
//! sampling defaults and seeds, sampling values checked before anything runs, a missing path
//! named as missing, `info` on GGUF and MLX models, a prompt over the context refused before
//! anything is printed, and output cut short by a closed pipe ending the command quietly.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn moestream(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moestream")).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn short_flags_generate_on_the_bundled_model() {
    let model = root().join("models/moestream-tiny-moe");
    let out = moestream(&["generate", "-m", model.to_str().unwrap(), "-p", "The history of", "-n", "4", "-c", "64"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("The history of") && stdout.len() > "The history of".len(), "{stdout:?}");
    assert!(text(&out.stderr).contains("4 generated"), "{}", text(&out.stderr));
}

/// `--batch-size` (llama.cpp's `-ub`) sets the prompt's chunk size: the same log-probs in any
/// chunking (every kernel computes a token's rows on their own), and streamed, far fewer expert
/// bytes read in big chunks than in small ones; 0 and too large a value are refused by name.
#[test]
fn batch_size_chunks_the_prompt_without_changing_the_result() {
    let model = root().join("models/moestream-tiny-moe");
    let text_file = model.join("validation.txt");
    let score = |extra: &[&str]| {
        let mut args = vec!["score", "-m", model.to_str().unwrap(), "--file", text_file.to_str().unwrap(), "-c", "300"];
        args.extend(extra);
        let out = moestream(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let default = score(&[]);
    assert!(default.contains("perplexity"), "{default}");
    assert_eq!(default, score(&["-b", "7"]));
    assert_eq!(default, score(&["--ubatch-size", "300"]));
    // Streamed at a quarter of the experts, bigger chunks read each expert for more tokens.
    let streamed = |b: &str| {
        let json = score(&["--expert-slots", "72", "--json", "-b", b]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        (v["logprobs"].clone(), v["experts"]["bytes_read"].as_u64().unwrap())
    };
    let ((small_lp, small), (big_lp, big)) = (streamed("8"), streamed("300"));
    assert_eq!(small_lp, big_lp);
    assert!(big * 4 < small, "{big} bytes read in 300-token chunks, {small} in 8-token ones");
    for bad in ["0", "8193", "x"] {
        let out =
            moestream(&["score", "-m", model.to_str().unwrap(), "--file", text_file.to_str().unwrap(), "-b", bad]);
        assert!(!out.status.success() && text(&out.stderr).contains("--batch-size"), "{bad}: {}", text(&out.stderr));
    }
}

/// With `--routing predicted`, `--speculative auto` goes without drafts (a verify step would
/// route its tokens natively and change the text), and asking for them by name is refused.
#[test]
fn predicted_routing_goes_without_drafts() {
    let model = root().join("models/moestream-tiny-moe");
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "-m", model.to_str().unwrap(), "-p", "The history of", "-n", "24"];
        args.extend(["--temperature", "0", "--routing", "predicted"]);
        args.extend(extra);
        moestream(&args)
    };
    let (auto, off) = (run(&[]), run(&["--speculative", "off"]));
    assert!(auto.status.success(), "{}", text(&auto.stderr));
    assert_eq!(text(&auto.stdout), text(&off.stdout));
    assert!(!text(&auto.stderr).contains("MTP drafts"), "{}", text(&auto.stderr));
    for asked in [&["--speculative", "mtp"][..], &["--speculative", "ngram"], &["--draft", "3"]] {
        let out = run(asked);
        assert!(!out.status.success() && text(&out.stderr).contains("--routing predicted"), "{asked:?}");
    }
}

#[test]
fn sampling_takes_the_models_defaults_and_repeats_with_a_seed() {
    let bundled = root().join("models/moestream-tiny-moe");
    let run = |model: &Path, extra: &[&str]| {
        let mut args = vec!["generate", "-m", model.to_str().unwrap(), "-p", "The history of", "-n", "12", "-c", "64"];
        args.extend(extra);
        let out = moestream(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    // The bundled model's generation_config.json states llama.cpp's settings: no flags but a seed
    // sample as those flags spelled out do.
    let defaults = run(&bundled, &["-s", "5"]);
    assert_eq!(defaults, run(&bundled, &["--seed", "5"]), "a seed repeats");
    let spelled = ["--seed", "5", "--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"];
    assert_eq!(defaults, run(&bundled, &[&spelled[..], &["--repeat-penalty", "1.1"]].concat()));
    // A model whose generation_config.json says `do_sample: false` is greedy without flags.
    let greedy_model = root().join("tests/fixtures/qwen3_moe");
    assert_eq!(run(&greedy_model, &[]), run(&greedy_model, &["--temperature", "0"]));
}

#[test]
fn bad_sampling_values_are_refused_by_name() {
    for (flag, value, word) in [
        ("--temperature", "-1", "temperature"),
        ("--temperature=-1", "", "temperature"),
        ("--temperature", "nan", "temperature"),
        ("--top-p", "2", "top-p"),
        ("--top-p", "0", "top-p"),
    ] {
        let mut args = vec!["generate", "-p", "Hi", "-n", "2", flag];
        if !value.is_empty() {
            args.push(value);
        }
        let out = moestream(&args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} ran");
        assert!(stderr.contains("error:") && stderr.contains(word), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed {:?}", text(&out.stdout));
    }
}

#[test]
fn a_missing_path_is_named_as_missing() {
    for command in ["generate", "info"] {
        let mut args = vec![command, "--model", "/no/such/model"];
        if command == "generate" {
            args.extend(["-p", "Hi"]);
        }
        let out = moestream(&args);
        let stderr = text(&out.stderr);
        assert!(!out.status.success() && stderr.contains("/no/such/model does not exist"), "{command}: {stderr}");
    }
}

#[test]
fn info_reads_gguf_files_and_mlx_directories() {
    for model in ["tests/fixtures/gguf/qwen3_moe.gguf", "tests/fixtures/mlx/olmoe_4bit"] {
        let path = root().join(model);
        let out = moestream(&["info", "-m", path.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{model}: {}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["moe_layers"].as_u64().is_some_and(|n| n > 0) && v["architecture"].is_string(), "{model}: {v}");
    }
}

#[test]
fn a_converted_gguf_directory_runs() {
    // `convert FILE.gguf OUT` leaves model.json and experts.bin (no config.json): generate and
    // info take OUT as the model (the bench commands pass the same check).
    let dir = std::env::temp_dir().join(format!("moestream-cli-gguf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let gguf = root().join("tests/fixtures/gguf/qwen3_moe.gguf");
    let out = moestream(&["convert", gguf.to_str().unwrap(), dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!dir.join("config.json").exists() && dir.join("model.json").exists());
    let d = dir.to_str().unwrap();
    let runs: [&[&str]; 2] = [
        &["generate", "-m", d, "--tokens", "1,2,3", "-n", "2", "--expert-slots", "4", "--temperature", "0"],
        &["info", "-m", d, "--json"],
    ];
    for args in runs {
        let out = moestream(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_prompt_over_the_context_prints_nothing_but_the_error() {
    let prompt = "The history of the world ".repeat(20);
    let out = moestream(&["generate", "-p", &prompt, "-c", "16", "-n", "4"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "printed {:?}", text(&out.stdout));
    assert!(text(&out.stderr).contains("error:"), "{}", text(&out.stderr));
}

/// Runs `args`, reads `n` bytes of its output and closes the pipe: the command must end (by
/// SIGPIPE or quietly) without a panic, long before it would have finished its work.
fn cut_short(args: &[&str], n: usize) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = vec![0u8; n];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    // The read end is dropped here: the next write fails.
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert!(out.status.success() || out.status.signal() == Some(libc::SIGPIPE), "{args:?}: {:?}", out.status);
    }
}

#[test]
fn output_cut_short_ends_the_command_quietly() {
    cut_short(&["info", "--json"], 1);
    // 100,000 tokens would take minutes: generation stops at the closed pipe instead.
    cut_short(&["generate", "-p", "The history of", "-n", "100000", "--ignore-eos"], 20);
}

#[test]
fn speculative_flags_keep_the_output_and_refuse_what_does_not_run() {
    let model = root().join("models/moestream-tiny-moe");
    let run = |extra: &[&str]| {
        let mut args =
            vec!["generate", "-m", model.to_str().unwrap(), "-p", "The history of", "-n", "24", "--temp", "0"];
        args.extend(extra);
        let out = moestream(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    // The bundled model ships an MTP module: `auto` (the default) drafts from it, `mtp` too,
    // the same text as one token a step.
    let (plain, stats) = run(&["--speculative", "off", "--draft", "4"]);
    assert!(!stats.contains("drafts"), "{stats}");
    for extra in [&[][..], &["--speculative", "mtp", "--draft", "2"]] {
        let (text, stats) = run(extra);
        assert_eq!(text, plain, "{extra:?}");
        assert!(stats.contains("[MTP drafts:"), "{extra:?}: {stats}");
    }
    // Prompt lookup, named or (without an MTP module) through `--draft N`, also spelled
    // `--draft-max`: the same text, with drafts verified.
    for extra in [&["--speculative", "ngram"][..], &["--speculative", "ngram", "--draft-max", "3"]] {
        let (text, stats) = run(extra);
        assert_eq!(text, plain, "{extra:?}");
        assert!(stats.contains("[prompt-lookup drafts:"), "{extra:?} reports its drafts: {stats}");
    }
    // A constrained request drafts nothing under `auto`; drafts asked for by name are refused.
    let schema = r#"{"type":"array","items":{"type":"string"}}"#;
    let (_, stats) = run(&["--json-schema", schema]);
    assert!(!stats.contains("drafts"), "{stats}");
    let mut args = vec!["generate", "-m", model.to_str().unwrap(), "-p", "x", "--json-schema", schema];
    args.extend(["--speculative", "mtp"]);
    let out = moestream(&args);
    assert!(!out.status.success() && text(&out.stderr).contains("drafts with a constraint"), "{}", text(&out.stderr));
    // A model without MTP layers: `mtp` is refused by name, `auto` with `--draft N` looks up.
    let qwen = root().join("tests/fixtures/qwen3_moe");
    let q = |extra: &[&str]| {
        let mut args = vec!["generate", "-m", qwen.to_str().unwrap(), "--tokens", "5,6,7", "-n", "8", "--temp", "0"];
        args.extend(extra);
        moestream(&args)
    };
    let out = q(&["--speculative", "mtp"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--speculative mtp: this model ships no MTP layers"), "{}", text(&out.stderr));
    let out = q(&["--draft", "3"]);
    assert!(out.status.success() && text(&out.stderr).contains("[prompt-lookup drafts:"), "{}", text(&out.stderr));
    // `serve` likewise: `mtp` on a model without MTP layers is refused by name, and so is a
    // draft length out of range, before anything listens.
    let out = moestream(&["serve", "-m", qwen.to_str().unwrap(), "--port", "0", "--speculative", "mtp"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--speculative mtp: this model ships no MTP layers"), "{}", text(&out.stderr));
    let out =
        moestream(&["serve", "-m", model.to_str().unwrap(), "--port", "0", "--speculative", "mtp", "--draft", "33"]);
    assert!(!out.status.success() && text(&out.stderr).contains("draft length 33"), "{}", text(&out.stderr));
}
