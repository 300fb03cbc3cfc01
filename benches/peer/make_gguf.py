#!/usr/bin/env python3
"""Write a Mixtral-layout Hugging Face checkpoint (such as the reference bench model from
benches/make_bench_model.py) as an F16 GGUF that llama.cpp and moestream both run.

    python benches/peer/make_gguf.py HF_DIR OUT.gguf

It writes what llama.cpp's convert_hf_to_gguf.py writes for Mixtral (architecture `llama` with
stacked `ffn_{gate,up,down}_exps` experts, q/k rows permuted into llama.cpp's rotary order),
through llama.cpp's own `gguf` package, tensor by tensor. The bench model has no tokenizer, so
the file gets a placeholder SentencePiece vocabulary (`<unk>`, `<s>`, `</s>`, then `t3`, `t4`,
...): the benchmarks feed token ids. Quantize the result with `llama-quantize OUT.gguf Q4.gguf
Q4_0`. Needs numpy, safetensors, torch (bf16 reading) and gguf.
"""

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from safetensors import safe_open


def permute(w, n_head):
    """convert_hf_to_gguf.py's reordering of q/k rows (rotate-half pairs → llama.cpp's)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main(src: Path, out: Path):
    cfg = json.loads((src / "config.json").read_text())
    if cfg["architectures"][0] != "MixtralForCausalLM":
        sys.exit(f"{src}: only MixtralForCausalLM checkpoints are written by this script")
    files = sorted(src.glob("*.safetensors"))
    handles = [safe_open(f, framework="pt") for f in files]
    where = {name: h for h in handles for name in h.keys()}

    def get(name):
        return where[name].get_tensor(name).float().numpy()

    layers, heads, kv_heads = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    vocab = cfg["vocab_size"]
    w = GGUFWriter(str(out), "llama")
    w.add_name(src.name)
    w.add_block_count(layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_file_type(1)  # mostly F16
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, vocab)])
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(3, vocab)])
    w.add_token_types([2, 3, 3] + [1] * (vocab - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def add(name, values, qtype=T.F16):
        data = values.astype(np.float32 if qtype == T.F32 else np.float16)
        w.add_tensor(name, data, raw_dtype=qtype)

    add("token_embd.weight", get("model.embed_tokens.weight"))
    add("output_norm.weight", get("model.norm.weight"), T.F32)
    add("output.weight", get("lm_head.weight"))
    for i in range(layers):
        p, b = f"model.layers.{i}", f"blk.{i}"
        add(f"{b}.attn_norm.weight", get(f"{p}.input_layernorm.weight"), T.F32)
        add(f"{b}.ffn_norm.weight", get(f"{p}.post_attention_layernorm.weight"), T.F32)
        add(f"{b}.attn_q.weight", permute(get(f"{p}.self_attn.q_proj.weight"), heads))
        add(f"{b}.attn_k.weight", permute(get(f"{p}.self_attn.k_proj.weight"), kv_heads))
        add(f"{b}.attn_v.weight", get(f"{p}.self_attn.v_proj.weight"))
        add(f"{b}.attn_output.weight", get(f"{p}.self_attn.o_proj.weight"))
        add(f"{b}.ffn_gate_inp.weight", get(f"{p}.block_sparse_moe.gate.weight"), T.F32)
        for leaf, proj in (("gate", "w1"), ("down", "w2"), ("up", "w3")):
            experts = range(cfg["num_local_experts"])
            stack = np.stack([get(f"{p}.block_sparse_moe.experts.{e}.{proj}.weight") for e in experts])
            add(f"{b}.ffn_{leaf}_exps.weight", stack)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
