#!/usr/bin/env python3
"""Write a random-weight Qwen3.6-35B-A3B-shaped model straight to a Q4_0 GGUF (arch `qwen35moe`),
tensor by tensor, without a checkpoint (the bf16 one would be ~70 GB):

    python3 benches/fullsize/make_gguf.py OUT.gguf [--layers 40] [--vocab 248320] [--seed 0]

Every size is benches/make_hybrid_bench_model.py's (Qwen3.5/3.6-35B-A3B's: hidden 2048, Gated
DeltaNet layers with 16 key and 32 value heads of 128, gated full attention every fourth layer
with 16 query and 2 KV heads of 256, 256 experts of width 512, top-8, a 512-wide shared expert),
here on all 40 layers with the real vocabulary of 248,320 rows: 34.7G parameters (3.3G active per
token incl. the embedding row and the lm_head), a 19.6 GB file. The tensor list is that script's
(`tensors()`), named, laid out and typed as llama.cpp's converter and `llama-quantize --pure
Q4_0` store them: every matrix Q4_0 (token_embd and output too), the router (`ffn_gate_inp`),
the shared expert's gate, the conv and the norms F32; the zero-centred norms stored as 1 + w,
`ssm_a` as -exp(A_log). No MTP layer.

Weights are not quantized from floats: each Q4_0 block gets random 4-bit codes and an f16 scale of
random sign and magnitude std / sqrt(21.5) (the mean square of code - 8 over 0..15), so a
matrix's values have the standard deviation of transformers' init (0.02) and mean 0. The value
heads' tiled order of llama.cpp's converter is irrelevant for i.i.d. random weights. Random
routers route almost uniformly with no temporal locality, so expert-cache hit rates on this
model are a worst case.

The tokenizer is the bundled model's byte-level BPE (models/moestream-tiny-moe: 4,096 tokens,
trained on the Brown Corpus; `<|endoftext|>` is id 0), GPT-2 pre-tokenizer, padded to the vocab
size with unused normal tokens `<|pad_N|>` that no merge produces; llama.cpp and moestream both
read it. Needs numpy and gguf (llama.cpp's package). Peak memory ~0.6 GB (one stacked expert
tensor, or the embedding, at a time).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import quant_shape_to_byte_shape

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))
import make_bench_model as mb  # noqa: E402
import make_hybrid_bench_model as hb  # noqa: E402

ARCH = "qwen35moe"
VOCAB = 248320
TOKENIZER = ROOT / "models/moestream-tiny-moe/tokenizer.json"
# E[(code - 8)^2] for codes uniform over 0..15.
Q4_0_CODE_MS = 21.5

# Hugging Face leaf name → (llama.cpp leaf name, how the values are stored). Stored kinds: "q4"
# (a Q4_0 matrix), "f32" (as is), "plus_one" (zero-centred norm, 1 + w), "neg_exp" (ssm_a).
LEAVES = {
    "input_layernorm.weight": ("attn_norm.weight", "plus_one"),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", "plus_one"),
    "linear_attn.A_log": ("ssm_a", "neg_exp"),
    "linear_attn.conv1d.weight": ("ssm_conv1d.weight", "f32"),
    "linear_attn.dt_bias": ("ssm_dt.bias", "f32"),
    "linear_attn.in_proj_a.weight": ("ssm_alpha.weight", "q4"),
    "linear_attn.in_proj_b.weight": ("ssm_beta.weight", "q4"),
    "linear_attn.in_proj_qkv.weight": ("attn_qkv.weight", "q4"),
    "linear_attn.in_proj_z.weight": ("attn_gate.weight", "q4"),
    "linear_attn.norm.weight": ("ssm_norm.weight", "f32"),
    "linear_attn.out_proj.weight": ("ssm_out.weight", "q4"),
    "self_attn.q_proj.weight": ("attn_q.weight", "q4"),
    "self_attn.k_proj.weight": ("attn_k.weight", "q4"),
    "self_attn.v_proj.weight": ("attn_v.weight", "q4"),
    "self_attn.o_proj.weight": ("attn_output.weight", "q4"),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", "plus_one"),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", "plus_one"),
    "mlp.gate.weight": ("ffn_gate_inp.weight", "f32"),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", "q4"),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", "q4"),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", "q4"),
    "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", "f32"),
}
TOP = {
    "model.embed_tokens.weight": ("token_embd.weight", "q4"),
    "model.norm.weight": ("output_norm.weight", "plus_one"),
    "lm_head.weight": ("output.weight", "q4"),
}


def plan(layers, vocab):
    """(gguf name, numpy shape, stored kind, HF init) of every tensor, in file order: the
    hybrid bench script's tensors, the per-expert matrices of a layer stacked into one
    `ffn_{gate,up,down}_exps` tensor where its first expert's stand."""
    out = []
    for name, shape, init in hb.tensors(layers, vocab):
        if name in TOP:
            out.append((*TOP[name], shape, init))
            continue
        parts = name.split(".")  # model.layers.I.<leaf>
        block, leaf = f"blk.{parts[2]}", ".".join(parts[3:])
        if leaf.startswith("mlp.experts."):
            e, proj = int(parts[5]), parts[6]
            if e == 0:
                kind = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}[proj]
                out.append((f"{block}.ffn_{kind}_exps.weight", "q4", (hb.EXPERTS, *shape), init))
            continue
        gguf_leaf, stored = LEAVES[leaf]
        if leaf == "linear_attn.conv1d.weight":
            shape = (shape[0], shape[2])  # [channels, 1, kernel] → [channels, kernel]
        out.append((f"{block}.{gguf_leaf}", stored, shape, init))
    return out


def q4_0_blocks(shape, rng, std):
    """Random Q4_0 blocks of a matrix of `shape` (outermost first), as the uint8 byte array
    GGUF stores: per 32 values an f16 scale (±std / sqrt(21.5), random sign) and 16 bytes of
    random 4-bit codes."""
    n = int(np.prod(shape)) // 32
    blocks = np.empty((n, 18), dtype=np.uint8)
    blocks[:, 2:] = np.frombuffer(rng.bytes(n * 16), dtype=np.uint8).reshape(n, 16)
    d = np.float16(std / np.sqrt(Q4_0_CODE_MS)).view(np.uint16)
    sign = (rng.integers(0, 2, size=n, dtype=np.uint16) << 15).astype(np.uint16)
    blocks[:, :2] = (sign | d).view(np.uint8).reshape(n, 2)
    return blocks.reshape(quant_shape_to_byte_shape(shape, T.Q4_0))


def float_values(stored, shape, init, rng):
    v = mb.initial_values(init, shape, rng).astype(np.float32)
    if stored == "plus_one":
        v = v + 1
    elif stored == "neg_exp":
        v = -np.exp(v)
    return v.reshape(shape)


def tokenizer(vocab):
    """The bundled model's byte-level BPE, padded to `vocab` tokens: (tokens, types, merges)."""
    t = json.loads(TOKENIZER.read_text())
    by_id = {i: s for s, i in t["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in t.get("added_tokens", [])}
    by_id.update(special)
    n = max(by_id) + 1
    if n > vocab:
        sys.exit(f"--vocab {vocab} is below the tokenizer's {n} tokens")
    tokens = [by_id[i] for i in range(n)] + [f"<|pad_{i}|>" for i in range(n, vocab)]
    types = [3 if i in special else 1 for i in range(n)] + [1] * (vocab - n)
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
    eos = next(iter(special), 0)
    return tokens, types, merges, eos


def write(out, layers, vocab, seed, std):
    rng = np.random.default_rng(seed)
    tensors = plan(layers, vocab)
    w = GGUFWriter(str(out), ARCH)
    w.add_name(f"random {ARCH} {layers}-layer Qwen3.6-35B-A3B shape")
    w.add_block_count(layers)
    w.add_context_length(262144)
    w.add_embedding_length(hb.HIDDEN)
    w.add_head_count(hb.HEADS)
    w.add_head_count_kv(hb.KV_HEADS)
    w.add_key_length(hb.HEAD_DIM)
    w.add_value_length(hb.HEAD_DIM)
    w.add_rope_dimension_count(hb.HEAD_DIM // 4)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_rope_freq_base(1e7)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(hb.EXPERTS)
    w.add_expert_used_count(hb.TOP_K)
    w.add_expert_feed_forward_length(hb.EXPERT_INTERMEDIATE)
    w.add_expert_shared_feed_forward_length(hb.SHARED_INTERMEDIATE)
    w.add_ssm_conv_kernel(hb.CONV)
    w.add_ssm_state_size(hb.LIN_K_DIM)
    w.add_ssm_group_count(hb.LIN_K_HEADS)
    w.add_ssm_time_step_rank(hb.LIN_V_HEADS)
    w.add_ssm_inner_size(hb.LIN_V_HEADS * hb.LIN_V_DIM)
    w.add_full_attention_interval(hb.FULL_ATTENTION_INTERVAL)
    w.add_file_type(2)  # mostly Q4_0
    tokens, types, merges, eos = tokenizer(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    for name, stored, shape, _ in tensors:
        if stored == "q4":
            byte_shape = quant_shape_to_byte_shape(shape, T.Q4_0)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=T.Q4_0)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4, raw_dtype=T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    start, done = time.time(), 0
    for i, (name, stored, shape, init) in enumerate(tensors):
        data = q4_0_blocks(shape, rng, std) if stored == "q4" else float_values(stored, shape, init, rng)
        w.write_tensor_data(data)
        done += data.nbytes
        if name.endswith("ffn_down_exps.weight"):
            print(f"{name}: {done / 1e9:.1f} GB in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    w.close()
    params = sum(int(np.prod(s)) for _, _, s, _ in tensors)
    per_layer_experts = 3 * hb.HIDDEN * hb.EXPERT_INTERMEDIATE * hb.EXPERTS
    active = params - layers * per_layer_experts * (hb.EXPERTS - hb.TOP_K) // hb.EXPERTS - (vocab - 1) * hb.HIDDEN
    print(f"wrote {out}: {params / 1e9:.2f}G parameters ({active / 1e9:.2f}G active per token), "
          f"{Path(out).stat().st_size / 1e9:.2f} GB, {time.time() - start:.0f} s", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=mb.STD)
    args = ap.parse_args()
    write(args.out, args.layers, args.vocab, args.seed, args.std)


if __name__ == "__main__":
    main()
