//! Every shader variant must parse, validate, and translate to SPIR-V, MSL and HLSL, so that
//! the Metal and DX12 backends (absent from CI) get shaders that at least compile in naga; and
//! every variant wgpu's DX12 backend can build with FXC must compile with Microsoft's FXC itself
//! (under Wine: `tests/wine/setup.sh`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use moestream::gpu::shader::{kernel_names, preprocess, variants};

/// One kernel variant, parsed and validated.
struct Variant {
    name: &'static str,
    defines: Vec<&'static str>,
    module: naga::Module,
    info: naga::valid::ModuleInfo,
}

fn every_variant() -> Vec<Variant> {
    let mut all = Vec::new();
    for name in kernel_names() {
        for defines in variants(name) {
            let src = preprocess(name, &defines);
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{name} {defines:?}: parse error:\n{}", e.emit_to_string(&src)));
            // f16 weights are unpacked with unpack2x16float: every Vulkan, Metal and DX12
            // device wgpu supports has SHADER_F16_IN_F32; subgroups only where offered.
            let mut caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
            if defines.contains(&"SUBGROUPS") {
                caps |= naga::valid::Capabilities::SUBGROUP;
            }
            // 8-byte integers only where the adapter has SHADER_INT64 (Caps::words64).
            if defines.contains(&"WORDS64") {
                caps |= naga::valid::Capabilities::SHADER_INT64;
            }
            let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                .validate(&module)
                .unwrap_or_else(|e| panic!("{name} {defines:?}: invalid:\n{}", e.emit_to_string(&src)));
            all.push(Variant { name, defines, module, info });
        }
    }
    all
}

/// naga's HLSL for `variant` with the options wgpu's DX12 backend passes it, and the names of
/// its entry points there (none for a file of functions other kernels include).
fn hlsl(variant: &Variant, shader_model: naga::back::hlsl::ShaderModel) -> (String, Vec<String>) {
    let options = naga::back::hlsl::Options {
        shader_model,
        zero_initialize_workgroup_memory: true,
        restrict_indexing: true,
        force_loop_bounding: true,
        ..Default::default()
    };
    let mut text = String::new();
    let reflection = naga::back::hlsl::Writer::new(&mut text, &options, &Default::default())
        .write(&variant.module, &variant.info, None)
        .unwrap_or_else(|e| panic!("{} {:?}: HLSL: {e}", variant.name, variant.defines));
    let entries = reflection
        .entry_point_names
        .into_iter()
        .map(|name| name.unwrap_or_else(|e| panic!("{} {:?}: HLSL entry point: {e}", variant.name, variant.defines)));
    (text, entries.collect())
}

#[test]
fn every_kernel_variant_translates_to_all_backends() {
    let all = every_variant();
    for variant in &all {
        let (name, defines) = (variant.name, &variant.defines);
        naga::back::spv::write_vec(&variant.module, &variant.info, &Default::default(), None)
            .unwrap_or_else(|e| panic!("{name} {defines:?}: SPIR-V: {e}"));
        let msl_options = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
        let pipeline = naga::back::msl::PipelineOptions::default();
        naga::back::msl::write_string(&variant.module, &variant.info, &msl_options, &pipeline)
            .unwrap_or_else(|e| panic!("{name} {defines:?}: MSL: {e}"));
        hlsl(variant, naga::back::hlsl::ShaderModel::V6_0);
    }
    assert!(all.len() >= 30, "only {} variants checked", all.len());
    println!("{} shader variants translated to SPIR-V, MSL and HLSL", all.len());
}

/// Where `tests/wine/setup.sh` put FXC and its driver, when Wine can run them.
fn fxc_tools() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/wine");
    let ready = ["fxc_compile.exe", "d3dcompiler_47.dll"].iter().all(|f| dir.join(f).is_file())
        && Command::new("wine").arg("--version").output().is_ok_and(|o| o.status.success());
    if ready {
        return Some(dir);
    }
    let why = "FXC check skipped: Wine or target/wine/ missing (run tests/wine/setup.sh)";
    assert!(std::env::var_os("MOESTREAM_REQUIRE_WINE").is_none(), "{why}, and MOESTREAM_REQUIRE_WINE is set");
    eprintln!("{why}");
    None
}

/// A Linux path as a Windows program under Wine sees it (drive Z: is `/`).
fn wine_path(path: &Path) -> String {
    format!("Z:{}", path.display()).replace('/', "\\")
}

/// What a variant must show FXC: each of its defines, and each pair of them.
fn define_pairs(variant: &Variant) -> BTreeSet<(&'static str, &'static str)> {
    let d = &variant.defines;
    let mut pairs: BTreeSet<_> = d.iter().map(|&a| (a, "")).collect();
    pairs.insert(("", ""));
    for (i, &a) in d.iter().enumerate() {
        pairs.extend(d[i + 1..].iter().map(|&b| (a.min(b), a.max(b))));
    }
    pairs
}

/// The variants FXC compiles in the suite, kernel by kernel: a greedy set in which every define
/// and every pair of defines that any variant of the kernel has appears at least once (FXC needs
/// up to 20 s for one tiled GEMM, and all variants take hours). `MOESTREAM_FXC_ALL=1` keeps
/// every variant; `MOESTREAM_FXC_KERNELS=a,b` only those kernels'.
fn fxc_selection(all: Vec<Variant>) -> Vec<Variant> {
    let only = std::env::var("MOESTREAM_FXC_KERNELS").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|k| k == name));
    let mut all: Vec<Variant> = all
        .into_iter()
        .filter(|v| wanted(v.name) && !v.defines.iter().any(|d| matches!(*d, "SUBGROUPS" | "WORDS64")))
        .collect();
    if std::env::var_os("MOESTREAM_FXC_ALL").is_some() {
        return all;
    }
    let mut chosen = Vec::new();
    let mut names: Vec<&str> = all.iter().map(|v| v.name).collect();
    names.dedup();
    for name in names {
        let (mut pool, rest): (Vec<Variant>, Vec<Variant>) = all.into_iter().partition(|v| v.name == name);
        all = rest;
        let mut missing: BTreeSet<_> = pool.iter().flat_map(define_pairs).collect();
        while !missing.is_empty() {
            let gain = |v: &Variant| define_pairs(v).intersection(&missing).count();
            let best = (0..pool.len()).max_by_key(|&i| (gain(&pool[i]), std::cmp::Reverse(i))).expect("a variant");
            let variant = pool.swap_remove(best);
            missing.retain(|p| !define_pairs(&variant).contains(p));
            chosen.push(variant);
        }
    }
    chosen
}

/// wgpu's DX12 backend compiles with FXC at shader model 5.1 wherever no `dxcompiler.dll` is
/// installed (its default), and offers neither subgroups nor 8-byte integers there, so every
/// variant without them must pass Microsoft's compiler: FXC rejects what naga accepts, such as
/// a barrier inside control flow that depends on the invocation (error X4026).
#[test]
fn every_dx12_variant_compiles_with_microsofts_fxc() {
    let Some(tools) = fxc_tools() else { return };
    // A sweep of every variant writes beside the suite's selection, not over it.
    let folder = if std::env::var_os("MOESTREAM_FXC_ALL").is_some() { "hlsl-all" } else { "hlsl" };
    let out = tools.join(folder);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("create the HLSL folder");
    let mut manifests = vec![String::new(); std::thread::available_parallelism().map_or(1, |n| n.get())];
    let mut count = 0;
    for variant in fxc_selection(every_variant()) {
        let (text, entries) = hlsl(&variant, naga::back::hlsl::ShaderModel::V5_1);
        let file = out.join(format!(
            "{}{}.hlsl",
            variant.name,
            variant.defines.iter().map(|d| format!("-{d}")).collect::<String>()
        ));
        std::fs::write(&file, text).expect("write HLSL");
        for entry in entries {
            let shard = count % manifests.len();
            manifests[shard] += &format!("{entry} {}\n", wine_path(&file));
            count += 1;
        }
    }
    // FXC's flow-control checks (X4026) and everything before them run without its optimizer,
    // which takes most of the time; MOESTREAM_FXC_OPTIMIZE=1 compiles exactly as wgpu does.
    let optimize = std::env::var_os("MOESTREAM_FXC_OPTIMIZE").is_some();
    // One Wine process per core, each compiling its share.
    let runs: Vec<_> = manifests
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(i, manifest)| {
            let list = out.join(format!("manifest-{i}.txt"));
            std::fs::write(&list, manifest).expect("write manifest");
            let mut wine = Command::new("wine");
            wine.arg(tools.join("fxc_compile.exe"))
                .arg(wine_path(&tools.join("d3dcompiler_47.dll")))
                .arg(wine_path(&list));
            if !optimize {
                wine.arg("skip-optimization");
            }
            wine.env("WINEPREFIX", tools.join("prefix"))
                .env("WINEDEBUG", "-all")
                .env("WINEDLLOVERRIDES", "mscoree,mshtml=")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run wine")
        })
        .collect();
    let mut compiled = 0;
    let mut failures = String::new();
    for run in runs {
        let run = run.wait_with_output().expect("wait for wine");
        let report = String::from_utf8_lossy(&run.stdout);
        compiled += report.lines().filter(|l| l.starts_with("ok ")).count();
        if !run.status.success() {
            failures += &report.lines().filter(|l| !l.starts_with("ok ")).collect::<Vec<_>>().join("\n");
            failures += &String::from_utf8_lossy(&run.stderr);
        }
    }
    assert!(failures.is_empty(), "FXC rejected shaders (HLSL in {}):\n{failures}", out.display());
    assert_eq!(compiled, count, "FXC reported fewer shaders than it was given");
    println!("{count} shader variants compiled by Microsoft's FXC (cs_5_1)");
}
