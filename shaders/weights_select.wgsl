// The weight reader of the kernel's format: GGML_* (a ggml block type, weights_ggml), INT4, F16,
// else f32. Every reader implements the interface of weights_common.
//#if GGML
//#include weights_ggml
//#else
//#if INT4
//#include weights_int4
//#else
//#if F16
//#include weights_f16
//#else
//#include weights_f32
//#endif
//#endif
//#endif
