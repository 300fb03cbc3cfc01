#!/usr/bin/env python3
"""Write moestream's benchmark models: random-weight Mixtral-layout checkpoints.

    python3 benches/make_bench_model.py OUT_DIR [--seed S] [--shape reference|bigmem]

`reference` (default): hidden 512, 8 layers, 8 attention heads (head_dim 64), 4 KV heads, 16
experts per layer with top-2 routing, expert intermediate 1024, vocab 32000, bf16 weights. That
is about 240M parameters in all and 64M active per token, roughly 480 MB on disk.

`bigmem` (the "bigger than memory" benchmark, benches/bigmem/): Qwen3-30B-A3B's real expert
layout -- hidden 2048, 128 experts per layer with top-8 routing, expert intermediate 768, 32
attention heads of 128 (4 KV heads) -- on 4 layers and a vocab of 8192, so that its int4 expert
store is about 1.5 GB while the non-expert weights stay small. About 2.4G parameters (4.8 GB of
bf16), 0.2G active per token.

`deepseek_v2_lite` (the MLA KV-cache benchmark): DeepSeek-V2-Lite's real layer sizes -- hidden
2048, 16 heads with multi-head latent attention (no query compression, kv_lora_rank 512,
qk_nope 128, qk_rope 64, v_head 128, YaRN factor 40 over 4096 positions), a dense first layer
(intermediate 10944, first_k_dense_replace 1), then MoE layers of 64 routed experts (top-6,
greedy softmax routing) + 2 shared, expert intermediate 1408 -- on 3 layers and a vocab of
8192. About 1.3G parameters (2.6 GB of bf16), 0.2G active per token.

Weights are seeded N(0, 0.02) and norms are 1; there is no tokenizer (the benches feed token
ids). Only numpy is needed: the safetensors file is written by hand (8-byte header length,
JSON header, then the tensors back to back), tensor by tensor, so memory stays small. bf16
is float32 rounded to nearest even on its upper 16 bits. The output is a plain Hugging Face
directory (config.json, generation_config.json, model.safetensors) that transformers can
load too. Do not commit it; regenerate it instead (it is deterministic for a given seed).
"""

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

SHAPES = {
    "reference": dict(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, experts=16, top_k=2,
                      intermediate=1024, vocab=32000),
    "bigmem": dict(hidden=2048, layers=4, heads=32, kv_heads=4, head_dim=128, experts=128, top_k=8,
                   intermediate=768, vocab=8192),
}
STD = 0.02
# DeepSeek-V2-Lite's layer sizes (config.json of deepseek-ai/DeepSeek-V2-Lite), on fewer layers.
DEEPSEEK_V2_LITE = dict(hidden=2048, layers=3, heads=16, kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128,
                        dense_intermediate=10944, experts=64, top_k=6, shared=2, intermediate=1408, vocab=8192)


def deepseek_config(d):
    """config.json of the DeepSeek-V2-Lite-shaped model (DeepseekV2ForCausalLM, hub layout)."""
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "first_k_dense_replace": 1,
        "head_dim": d["qk_rope"],
        "hidden_act": "silu",
        "hidden_size": d["hidden"],
        "initializer_range": STD,
        "intermediate_size": d["dense_intermediate"],
        "kv_lora_rank": d["kv_lora_rank"],
        "max_position_embeddings": 163840,
        "moe_intermediate_size": d["intermediate"],
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": d["experts"],
        "n_shared_experts": d["shared"],
        "norm_topk_prob": False,
        "num_attention_heads": d["heads"],
        "num_experts_per_tok": d["top_k"],
        "num_hidden_layers": d["layers"],
        "num_key_value_heads": d["heads"],
        "q_lora_rank": None,
        "qk_head_dim": d["qk_nope"] + d["qk_rope"],
        "qk_nope_head_dim": d["qk_nope"],
        "qk_rope_head_dim": d["qk_rope"],
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "type": "yarn",
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": d["v_head"],
        "vocab_size": d["vocab"],
    }


def deepseek_tensors(d):
    """(name, shape, is_norm) of every tensor of the DeepSeek-V2-Lite-shaped model."""
    h, heads, rank = d["hidden"], d["heads"], d["kv_lora_rank"]
    out = [("model.embed_tokens.weight", (d["vocab"], h), False)]
    for i in range(d["layers"]):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        out.append((f"{p}.input_layernorm.weight", (h,), True))
        out.append((f"{a}.q_proj.weight", (heads * (d["qk_nope"] + d["qk_rope"]), h), False))
        out.append((f"{a}.kv_a_proj_with_mqa.weight", (rank + d["qk_rope"], h), False))
        out.append((f"{a}.kv_a_layernorm.weight", (rank,), True))
        out.append((f"{a}.kv_b_proj.weight", (heads * (d["qk_nope"] + d["v_head"]), rank), False))
        out.append((f"{a}.o_proj.weight", (h, heads * d["v_head"]), False))
        out.append((f"{p}.post_attention_layernorm.weight", (h,), True))
        mlps = []
        if i == 0:
            mlps.append((f"{p}.mlp", d["dense_intermediate"]))
        else:
            out.append((f"{p}.mlp.gate.weight", (d["experts"], h), False))
            mlps += [(f"{p}.mlp.experts.{e}", d["intermediate"]) for e in range(d["experts"])]
            mlps.append((f"{p}.mlp.shared_experts", d["shared"] * d["intermediate"]))
        for m, inter in mlps:
            out.append((f"{m}.gate_proj.weight", (inter, h), False))
            out.append((f"{m}.up_proj.weight", (inter, h), False))
            out.append((f"{m}.down_proj.weight", (h, inter), False))
    out.append(("model.norm.weight", (h,), True))
    out.append(("lm_head.weight", (d["vocab"], h), False))
    return out


def config(shape):
    """config.json of the model (MixtralForCausalLM)."""
    HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, EXPERT_INTERMEDIATE, VOCAB = shape.values()
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "head_dim": HEAD_DIM,
        "initializer_range": STD,
        "intermediate_size": EXPERT_INTERMEDIATE,
        "max_position_embeddings": 32768,
        "num_attention_heads": HEADS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "num_local_experts": EXPERTS,
        "output_router_logits": False,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
    }


def tensors(shape):
    """(name, shape, is_norm) of every tensor, in file order."""
    HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, EXPERT_INTERMEDIATE, VOCAB = shape.values()
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN), False)]
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        out.append((f"{p}.input_layernorm.weight", (HIDDEN,), True))
        out.append((f"{p}.self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), False))
        out.append((f"{p}.self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), False))
        out.append((f"{p}.self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), False))
        out.append((f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), False))
        out.append((f"{p}.post_attention_layernorm.weight", (HIDDEN,), True))
        out.append((f"{p}.block_sparse_moe.gate.weight", (EXPERTS, HIDDEN), False))
        for e in range(EXPERTS):
            q = f"{p}.block_sparse_moe.experts.{e}"
            out.append((f"{q}.w1.weight", (EXPERT_INTERMEDIATE, HIDDEN), False))
            out.append((f"{q}.w2.weight", (HIDDEN, EXPERT_INTERMEDIATE), False))
            out.append((f"{q}.w3.weight", (EXPERT_INTERMEDIATE, HIDDEN), False))
    out.append(("model.norm.weight", (HIDDEN,), True))
    out.append(("lm_head.weight", (VOCAB, HIDDEN), False))
    return out


def to_bf16(x):
    """float32 array -> uint16 bf16 bits, rounded to nearest even (no NaNs occur here)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype("<u2")


def initial_values(init, shape, rng):
    """A tensor's values: `init` True (a norm: ones), False (N(0, STD)), or a callable of
    (shape, rng) for other layouts (benches/make_hybrid_bench_model.py)."""
    if callable(init):
        return np.asarray(init(shape, rng), dtype=np.float32)
    if init:
        return np.ones(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)


def write_safetensors(path, specs, rng):
    """Writes `specs` ((name, shape, init) in file order) as one bf16 safetensors file;
    returns the bytes of tensor data."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, _ in specs:
        size = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, init in specs:
            f.write(to_bf16(initial_values(init, shape, rng)).tobytes())
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES) + ["deepseek_v2_lite"], default="reference")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.shape == "deepseek_v2_lite":
        shape, moe_layers = DEEPSEEK_V2_LITE, DEEPSEEK_V2_LITE["layers"] - 1
        specs, cfg = deepseek_tensors(shape), deepseek_config(shape)
    else:
        shape = SHAPES[args.shape]
        moe_layers = shape["layers"]
        specs, cfg = tensors(shape), config(shape)
    params = sum(int(np.prod(s)) for _, s, _ in specs)
    per_expert = 3 * shape["hidden"] * shape["intermediate"]
    expert_params = moe_layers * shape["experts"] * per_expert
    active = params - expert_params + moe_layers * shape["top_k"] * per_expert
    (args.out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {"bos_token_id": 1, "eos_token_id": 2}
    (args.out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    rng = np.random.default_rng(args.seed)
    size = write_safetensors(args.out_dir / "model.safetensors", specs, rng)
    print(
        f"wrote {args.out_dir}: {params / 1e6:.1f}M parameters ({active / 1e6:.1f}M active per token), "
        f"{size / 1e6:.0f} MB of bf16 weights",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
