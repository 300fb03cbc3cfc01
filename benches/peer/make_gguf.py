#!/usr/bin/env python3
"""Write a Mixtral-layout Hugging Face checkpoint (such as the bench models from
benches/make_bench_model.py) as a GGUF that llama.cpp and moestream both run.

    python benches/peer/make_gguf.py HF_DIR OUT.gguf [--type f16|q4_0]

It writes what llama.cpp's convert_hf_to_gguf.py writes for Mixtral (architecture `llama` with
stacked `ffn_{gate,up,down}_exps` experts, q/k rows permuted into llama.cpp's rotary order),
through llama.cpp's own `gguf` package, tensor by tensor: the tensor table is written first,
then each tensor's data as it is read, so memory holds one stacked expert tensor at a time.
The bench models have no tokenizer, so the file gets a placeholder SentencePiece vocabulary
(`<unk>`, `<s>`, `</s>`, then `t3`, `t4`, ...): the benchmarks feed token ids.

`--type f16` (default): matrices in F16; quantize the result with `llama-quantize OUT.gguf
Q4.gguf Q4_0`. `--type q4_0`: matrices quantized to Q4_0 here by the `gguf` package (the same
reference quantizer as ggml's `quantize_row_q4_0_ref`), for models whose F16 file would not
fit the disk (benches/bigmem/); norms and the router stay F32 as in llama-quantize's output.
Needs numpy, safetensors, torch (bf16 reading) and gguf.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import quant_shape_to_byte_shape, quantize
from safetensors import safe_open


def permute(w, n_head):
    """convert_hf_to_gguf.py's reordering of q/k rows (rotate-half pairs → llama.cpp's)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main(src: Path, out: Path, matrix_type):
    cfg = json.loads((src / "config.json").read_text())
    if cfg["architectures"][0] != "MixtralForCausalLM":
        sys.exit(f"{src}: only MixtralForCausalLM checkpoints are written by this script")
    files = sorted(src.glob("*.safetensors"))
    handles = [safe_open(f, framework="pt") for f in files]
    where = {name: h for h in handles for name in h.keys()}

    def get(name):
        return where[name].get_tensor(name).float().numpy()

    layers, heads, kv_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    vocab = cfg["vocab_size"]
    w = GGUFWriter(str(out), "llama")
    w.add_name(src.name)
    w.add_block_count(layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(2 if matrix_type == T.Q4_0 else 1)  # mostly Q4_0 / mostly F16
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, vocab)])
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(3, vocab)])
    w.add_token_types([2, 3, 3] + [1] * (vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    # (gguf name, shape, type, how to read the values) of every tensor, in file order.
    plan = []

    def add(name, shape, read, qtype=matrix_type):
        plan.append((name, tuple(shape), qtype, read))

    def hf(name, rows_of=None):
        return lambda: permute(get(name), rows_of) if rows_of else get(name)

    hidden, inter, n_exp = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    add("token_embd.weight", (vocab, hidden), hf("model.embed_tokens.weight"))
    add("output_norm.weight", (hidden,), hf("model.norm.weight"), T.F32)
    add("output.weight", (vocab, hidden), hf("lm_head.weight"))
    for i in range(layers):
        p, b = f"model.layers.{i}", f"blk.{i}"
        add(f"{b}.attn_norm.weight", (hidden,), hf(f"{p}.input_layernorm.weight"), T.F32)
        add(f"{b}.ffn_norm.weight", (hidden,), hf(f"{p}.post_attention_layernorm.weight"), T.F32)
        add(f"{b}.attn_q.weight", (heads * head_dim, hidden), hf(f"{p}.self_attn.q_proj.weight", heads))
        add(f"{b}.attn_k.weight", (kv_heads * head_dim, hidden), hf(f"{p}.self_attn.k_proj.weight", kv_heads))
        add(f"{b}.attn_v.weight", (kv_heads * head_dim, hidden), hf(f"{p}.self_attn.v_proj.weight"))
        add(f"{b}.attn_output.weight", (hidden, heads * head_dim), hf(f"{p}.self_attn.o_proj.weight"))
        add(f"{b}.ffn_gate_inp.weight", (n_exp, hidden), hf(f"{p}.block_sparse_moe.gate.weight"), T.F32)
        for leaf, proj, shape in (("gate", "w1", (inter, hidden)), ("down", "w2", (hidden, inter)),
                                  ("up", "w3", (inter, hidden))):
            names = [f"{p}.block_sparse_moe.experts.{e}.{proj}.weight" for e in range(n_exp)]
            add(f"{b}.ffn_{leaf}_exps.weight", (n_exp, *shape), lambda names=names: np.stack([get(n) for n in names]))

    def encode(values, qtype):
        if qtype == T.F32:
            return values.astype(np.float32)
        if qtype == T.F16:
            return values.astype(np.float16)
        return quantize(values, qtype)

    for name, shape, qtype, _ in plan:
        byte_shape = shape if qtype in (T.F32, T.F16) else quant_shape_to_byte_shape(shape, qtype)
        item = {T.F32: 4, T.F16: 2}.get(qtype, 1)
        dtype = {T.F32: np.float32, T.F16: np.float16}.get(qtype, np.uint8)
        w.add_tensor_info(name, byte_shape, np.dtype(dtype), int(np.prod(byte_shape)) * item, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, _, qtype, read in plan:
        w.write_tensor_data(encode(read(), qtype))
    w.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", choices=["f16", "q4_0"], default="f16")
    args = ap.parse_args()
    main(args.hf_dir, args.out, {"f16": T.F16, "q4_0": T.Q4_0}[args.type])
