//! Every shader variant must parse, validate, and translate to SPIR-V, MSL and HLSL, so that
//! the Metal and DX12 backends (absent from CI) get shaders that at least compile in naga.

use moestream::gpu::shader::{kernel_names, preprocess, variants};

#[test]
fn every_kernel_variant_translates_to_all_backends() {
    let mut checked = 0;
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
            naga::back::spv::write_vec(&module, &info, &Default::default(), None)
                .unwrap_or_else(|e| panic!("{name} {defines:?}: SPIR-V: {e}"));
            let msl_options = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
            let pipeline = naga::back::msl::PipelineOptions::default();
            naga::back::msl::write_string(&module, &info, &msl_options, &pipeline)
                .unwrap_or_else(|e| panic!("{name} {defines:?}: MSL: {e}"));
            let hlsl_options =
                naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_0, ..Default::default() };
            let mut hlsl = String::new();
            naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_options, &Default::default())
                .write(&module, &info, None)
                .unwrap_or_else(|e| panic!("{name} {defines:?}: HLSL: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} variants checked");
    println!("{checked} shader variants translated to SPIR-V, MSL and HLSL");
}
