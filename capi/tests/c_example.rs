//! `examples/c/generate.c` compiled with the system C compiler against `include/moestream.h` and
//! the shared library, then run on the bundled model as an app would.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory cargo put `libmoestream_c` in for this build: `deps/` beside the test binary
/// first (what this `cargo test` built; the copy one level up is the last `cargo build`'s).
fn library_dir() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let name = format!("{}moestream_c{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    [deps.clone(), deps.parent().unwrap().to_path_buf()]
        .into_iter()
        .find(|d| d.join(&name).exists())
        .unwrap_or_else(|| panic!("{name} not found next to the test binary"))
}

#[test]
fn c_example_loads_the_bundled_model_and_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let lib = library_dir();
    let exe = std::env::temp_dir().join(format!("moestream-c-example-{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(root.join("examples/c/generate.c"))
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg("-lmoestream_c")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .status()
        .expect("a C compiler (cc) is installed");
    assert!(status.success(), "compiling examples/c/generate.c failed");
    let out = Command::new(&exe).arg(root.join("models/moestream-tiny-moe")).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the example failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("bad model dir: "), "{stdout}");
    assert!(
        stdout.contains("generated at") && stdout.contains("cancelled=1"),
        "the callback stops after 8 tokens:\n{stdout}"
    );
    assert!(stdout.contains(" prompt tokens, 8 generated"), "{stdout}");
    let turn2 = stdout.lines().find(|l| l.starts_with("[turn 2: ")).expect("a second chat turn");
    let reused: u32 = turn2.split(", ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(reused > 10, "the session reuses the first turn's KV cache: {turn2}");
    assert!(stdout.contains("perplexity"), "{stdout}");
    assert!(stdout.contains("bad messages: invalid argument: messages_json"), "{stdout}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}
