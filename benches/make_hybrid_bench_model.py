#!/usr/bin/env python3
"""Write a random-weight Qwen3.6-35B-A3B-shaped checkpoint (Qwen3_5MoeForCausalLM text layout).

    python3 benches/make_hybrid_bench_model.py OUT_DIR [--layers 4] [--vocab 8192] [--seed S]

Every per-layer size is the real model's (transformers' Qwen3_5MoeTextConfig defaults, which are
Qwen3.5/3.6-35B-A3B's): hidden 2048; Gated DeltaNet layers with 16 key heads and 32 value heads of
128, conv kernel 4; gated full attention with 16 query heads and 2 KV heads of 256 (q_proj
doubled by the output gate), partial rotary 0.25, RoPE theta 1e7; every layer MoE with 256
experts, top-8, expert intermediate 512, plus a 512-wide shared expert with its sigmoid gate.
The layer pattern is the real one, `full_attention_interval` 4 (three linear layers, then one
full), but only `--layers` of the real 40. The vocabulary defaults to 8192 instead of 248320 so
that on 4 layers the lm_head (which a 40-layer model amortises) does not dominate the step.

Initialisation (seeded; what transformers' own init draws, at the bench scale): projections and
experts N(0, 0.02); zero-centred RMSNorm weights (input, post-attention, final, q/k norms; they
scale by 1 + w) 0; the DeltaNet's gated norm 1; conv1d N(0, 0.02); A_log log U(1, 16); dt_bias 1.
At 4 layers that is 3.40G parameters (0.28G active per token), 6.8 GB of bf16, written tensor by
tensor (numpy only; the writer is make_bench_model.py's). Do not commit the output; convert it
(`moestream convert`) and delete it (see benches/README.md, "Hybrid").
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import make_bench_model as mb  # noqa: E402

HIDDEN = 2048
HEADS, KV_HEADS, HEAD_DIM = 16, 2, 256
LIN_K_HEADS, LIN_V_HEADS, LIN_K_DIM, LIN_V_DIM, CONV = 16, 32, 128, 128, 4
EXPERTS, TOP_K, EXPERT_INTERMEDIATE, SHARED_INTERMEDIATE = 256, 8, 512, 512
FULL_ATTENTION_INTERVAL = 4


def zeros(shape, rng):
    return np.zeros(shape, dtype=np.float32)


def a_log(shape, rng):
    return np.log(rng.uniform(1.0, 16.0, size=shape))


def layer_types(layers):
    return [
        "linear_attention" if (i + 1) % FULL_ATTENTION_INTERVAL else "full_attention" for i in range(layers)
    ]


def config(layers, vocab):
    """config.json (Qwen3_5MoeForCausalLM, text model)."""
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": mb.STD,
        "layer_types": layer_types(layers),
        "linear_conv_kernel_dim": CONV,
        "linear_key_head_dim": LIN_K_DIM,
        "linear_num_key_heads": LIN_K_HEADS,
        "linear_num_value_heads": LIN_V_HEADS,
        "linear_value_head_dim": LIN_V_DIM,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": layers,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "shared_expert_intermediate_size": SHARED_INTERMEDIATE,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
    }


def tensors(layers, vocab):
    """(name, shape, init) of every tensor, in file order (init as make_bench_model.initial_values)."""
    key_dim, value_dim = LIN_K_HEADS * LIN_K_DIM, LIN_V_HEADS * LIN_V_DIM
    conv_dim = 2 * key_dim + value_dim
    out = [("model.embed_tokens.weight", (vocab, HIDDEN), False)]
    for i, kind in enumerate(layer_types(layers)):
        p = f"model.layers.{i}"
        out.append((f"{p}.input_layernorm.weight", (HIDDEN,), zeros))
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            out += [
                (f"{a}.A_log", (LIN_V_HEADS,), a_log),
                (f"{a}.conv1d.weight", (conv_dim, 1, CONV), False),
                (f"{a}.dt_bias", (LIN_V_HEADS,), True),
                (f"{a}.in_proj_a.weight", (LIN_V_HEADS, HIDDEN), False),
                (f"{a}.in_proj_b.weight", (LIN_V_HEADS, HIDDEN), False),
                (f"{a}.in_proj_qkv.weight", (conv_dim, HIDDEN), False),
                (f"{a}.in_proj_z.weight", (value_dim, HIDDEN), False),
                (f"{a}.norm.weight", (LIN_V_DIM,), True),
                (f"{a}.out_proj.weight", (HIDDEN, value_dim), False),
            ]
        else:
            a = f"{p}.self_attn"
            out += [
                (f"{a}.q_proj.weight", (2 * HEADS * HEAD_DIM, HIDDEN), False),
                (f"{a}.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), False),
                (f"{a}.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), False),
                (f"{a}.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), False),
                (f"{a}.q_norm.weight", (HEAD_DIM,), zeros),
                (f"{a}.k_norm.weight", (HEAD_DIM,), zeros),
            ]
        out.append((f"{p}.post_attention_layernorm.weight", (HIDDEN,), zeros))
        m = f"{p}.mlp"
        out.append((f"{m}.gate.weight", (EXPERTS, HIDDEN), False))
        for e in range(EXPERTS):
            q = f"{m}.experts.{e}"
            out.append((f"{q}.gate_proj.weight", (EXPERT_INTERMEDIATE, HIDDEN), False))
            out.append((f"{q}.up_proj.weight", (EXPERT_INTERMEDIATE, HIDDEN), False))
            out.append((f"{q}.down_proj.weight", (HIDDEN, EXPERT_INTERMEDIATE), False))
        out += [
            (f"{m}.shared_expert.gate_proj.weight", (SHARED_INTERMEDIATE, HIDDEN), False),
            (f"{m}.shared_expert.up_proj.weight", (SHARED_INTERMEDIATE, HIDDEN), False),
            (f"{m}.shared_expert.down_proj.weight", (HIDDEN, SHARED_INTERMEDIATE), False),
            (f"{m}.shared_expert_gate.weight", (1, HIDDEN), False),
        ]
    out.append(("model.norm.weight", (HIDDEN,), zeros))
    out.append(("lm_head.weight", (vocab, HIDDEN), False))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    specs = tensors(args.layers, args.vocab)
    params = sum(int(np.prod(s)) for _, s, _ in specs)
    per_expert = 3 * HIDDEN * EXPERT_INTERMEDIATE
    active = params - args.layers * (EXPERTS - TOP_K) * per_expert
    (args.out_dir / "config.json").write_text(json.dumps(config(args.layers, args.vocab), indent=2) + "\n")
    gen = {"bos_token_id": 1, "eos_token_id": 2}
    (args.out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    size = mb.write_safetensors(args.out_dir / "model.safetensors", specs, np.random.default_rng(args.seed))
    print(
        f"wrote {args.out_dir}: {params / 1e9:.2f}G parameters ({active / 1e9:.2f}G active per token), "
        f"{size / 1e9:.1f} GB of bf16 weights",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
