#!/usr/bin/env python3
"""llama.cpp's KV-cache size for three published model shapes, read from its own load log.

    python3 benches/peer/kv_sizes.py --llama-server target/peer/build-cpu/bin/llama-server \\
        [--moestream target/release/moestream] [--contexts 32768,131072] [--dtypes f16,q8_0]
        [--out results.json] [--markdown] [--keep DIR]

With --moestream, `moestream bench kv-size` sizes moestream's caches for the same GGUF files
(from their metadata, by the formula the engine allocates with: sliding-window rings of
window + 63 positions, q8_0 rows of int8 codes and an f16 scale per 32, each linear-attention
state once, as a resident model holds it),
and the table gains moestream's figure and its ratio to llama.cpp's.

A KV cache's size depends only on the attention geometry (layer count, KV heads, head sizes,
sliding windows and which layers have them, MLA ranks, linear-attention state sizes), not on the
hidden size, the vocabulary or the experts. So for each shape this writes a *shape-only* GGUF
with llama.cpp's own `gguf` package: the real geometry below, but hidden size 64, a 64-token
vocabulary, 2 experts (top-1) of width 32, all weights zero (28 to 128 MB per file; DeepSeek's
per-head attn_k_b/attn_v_b keep their real size). It then starts
`llama-server -m FILE -c N -ctk T -ctv T -np 1 -t 1 -fa on -fit off --no-warmup -lv 4` for every
context N and cache type T (`-lv 4`: the server logs libllama's info lines at verbosity 4; `-fa on`:
a q8_0 V cache needs flash attention), reads its log until the caches are allocated (llama.cpp
prints the memory lines, then its compute buffers), stops the server, and reports every memory
line:

* `llama_kv_cache: size = X MiB (C cells, L layers, ...), K (T): X MiB, V (T): X MiB`: attention
  KV; for gpt-oss two of them, announced by `llama_kv_cache_iswa: creating non-SWA KV cache` and
  `creating SWA KV cache` (full-attention and sliding-window layers);
* `llama_memory_recurrent: size = X MiB (C cells, L layers, ...), R (f32): ..., S (f32): ...`: the
  Gated DeltaNet layers' conv and recurrent state of the hybrid (its L is the model's layer count;
  only the linear layers get tensors).

gpt-oss is also run with `--swa-full` (sliding-window layers get a full-length cache instead of
the ring). llama.cpp prints MiB with two decimals; `bytes` is that figure times 2^20, so it is
exact to within 0.005 MiB. A run that prints no memory line (an architecture this llama.cpp
does not know, a failed load) is recorded as `"supported": false` with the log's error lines.

How llama.cpp sizes what it prints (src/llama-kv-cache-iswa.cpp, llama-model.cpp create_memory):
the SWA ring has GGML_PAD(min(n_ctx, n_swa * (kv_unified ? n_seq_max : 1) + n_ubatch), 256)
cells, i.e. 128 + 512 = 640 -> 768 cells with -np 1 and the default -ub 512, whatever the context;
n_ctx itself is padded to 256. MLA stores only K (the 576-wide latent row; V is a view of it, so
`V: 0.00 MiB`). The recurrent state has max(1, n_seq_max) cells, one per sequence, independent of
the context. The KV caches hold -ctk/-ctv types; the recurrent state is always f32.

The `gguf` package must be importable: llama.cpp's own copy (PYTHONPATH=
target/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py, which needs numpy, pyyaml, tqdm),
or `pip install gguf numpy` in a venv; architecture names and keys must be ones the server's
llama.cpp knows, so prefer the vendored copy.

Shapes (config.json values; only the attention geometry matters):

* gpt-oss-20b, GGUF architecture `gpt-oss`: openai/gpt-oss-20b config.json (num_hidden_layers 24,
  num_attention_heads 64, num_key_value_heads 8, head_dim 64, sliding_window 128, layer_types
  alternating sliding_attention (even layers) / full_attention (odd), max_position_embeddings
  131072), as transcribed in this repository's tests/gpt_oss.rs (`hub_config_parses`) and in
  keras-hub's gpt_oss_20b_en preset. llama.cpp's default pattern for this architecture (period 2,
  the last layer of each period full) is that alternation.
* DeepSeek-V2-Lite, architecture `deepseek2` (MLA): deepseek-ai/DeepSeek-V2-Lite config.json
  (num_hidden_layers 27, num_attention_heads 16, q_lora_rank null, kv_lora_rank 512,
  qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, first_k_dense_replace 1,
  max_position_embeddings 163840), as transcribed in tests/info.rs and in the hub's duplicates of
  that file (e.g. TechxGenus/DeepSeek-V2-Lite-Chat-AWQ). Written as llama.cpp's converter writes
  MLA: one KV head, key_length = kv_lora_rank + rope dim = 576, value_length = kv_lora_rank = 512,
  key_length_mla 192, value_length_mla 128; llama.cpp then caches only the 576-wide latent row.
* Qwen3.6-35B-A3B, architecture `qwen35moe` (hybrid): Qwen/Qwen3.6-35B-A3B config.json text_config
  (num_hidden_layers 40, full_attention_interval 4, i.e. layers 3, 7, ..., 39 full attention;
  num_attention_heads 16, num_key_value_heads 2, head_dim 256, partial_rotary_factor 0.25,
  mrope_section [11, 11, 10]; Gated DeltaNet linear_num_key_heads 16, linear_num_value_heads 32,
  linear_key_head_dim = linear_value_head_dim = 128, linear_conv_kernel_dim 4;
  max_position_embeddings 262144), as on the model card ("10 x (3 x (Gated DeltaNet -> MoE) ->
  1 x (Gated Attention -> MoE))") and in transformers' Qwen3_5MoeTextConfig defaults
  (benches/make_hybrid_bench_model.py); Qwen3.5-35B-A3B has the same geometry. Written as
  llama.cpp's converter writes it: ssm.state_size 128, ssm.group_count 16, ssm.time_step_rank 32,
  ssm.inner_size 4096, ssm.conv_kernel 4, rope.dimension_count 64.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

HIDDEN, VOCAB, EXPERTS, EXPERT_FFN = 64, 64, 2, 32  # shape-only sizes: no bearing on the KV cache


@dataclass
class Shape:
    """One model: its GGUF architecture, the geometry it is measured for, a function writing its
    metadata, and its tensors (name -> ggml shape, ne0 first); `swa`: also run with --swa-full."""

    name: str
    arch: str
    source: str
    geometry: dict
    meta: Callable[[GGUFWriter], None]
    tensors: dict
    swa: bool = False


def moe_tensors(i, shared=None):
    """Routed experts (separate gate/up/down), plus a shared expert of width `shared`."""
    t = {
        f"blk.{i}.ffn_gate_inp.weight": (HIDDEN, EXPERTS),
        f"blk.{i}.ffn_gate_exps.weight": (HIDDEN, EXPERT_FFN, EXPERTS),
        f"blk.{i}.ffn_up_exps.weight": (HIDDEN, EXPERT_FFN, EXPERTS),
        f"blk.{i}.ffn_down_exps.weight": (EXPERT_FFN, HIDDEN, EXPERTS),
    }
    if shared:
        t |= {
            f"blk.{i}.ffn_gate_shexp.weight": (HIDDEN, shared),
            f"blk.{i}.ffn_up_shexp.weight": (HIDDEN, shared),
            f"blk.{i}.ffn_down_shexp.weight": (shared, HIDDEN),
        }
    return t


def common_tensors():
    return {"token_embd.weight": (HIDDEN, VOCAB), "output_norm.weight": (HIDDEN,), "output.weight": (HIDDEN, VOCAB)}


def gpt_oss_20b():
    layers, heads, kv_heads, head_dim = 24, 64, 8, 64

    def meta(w):
        w.add_context_length(131072)
        w.add_block_count(layers)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(150000.0)
        w.add_sliding_window(128)
        w.add_feed_forward_length(EXPERT_FFN)
        w.add_expert_feed_forward_length(EXPERT_FFN)

    t = common_tensors()
    for i in range(layers):
        t |= {
            f"blk.{i}.attn_norm.weight": (HIDDEN,),
            f"blk.{i}.post_attention_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_q.weight": (HIDDEN, heads * head_dim),
            f"blk.{i}.attn_k.weight": (HIDDEN, kv_heads * head_dim),
            f"blk.{i}.attn_v.weight": (HIDDEN, kv_heads * head_dim),
            f"blk.{i}.attn_output.weight": (heads * head_dim, HIDDEN),
            f"blk.{i}.attn_output.bias": (HIDDEN,),
            f"blk.{i}.attn_sinks.weight": (heads,),
            f"blk.{i}.ffn_gate_inp.bias": (EXPERTS,),
            f"blk.{i}.ffn_gate_exps.bias": (EXPERT_FFN, EXPERTS),
            f"blk.{i}.ffn_up_exps.bias": (EXPERT_FFN, EXPERTS),
            f"blk.{i}.ffn_down_exps.bias": (HIDDEN, EXPERTS),
        } | moe_tensors(i)
    geometry = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "sliding_window": 128,
                "swa_layers": "even (12)", "full_layers": "odd (12)"}
    return Shape("gpt-oss-20b", "gpt-oss", "openai/gpt-oss-20b config.json", geometry, meta, t, swa=True)


def deepseek_v2_lite():
    layers, heads, kv_lora, rope, nope, v_dim = 27, 16, 512, 64, 128, 128

    def meta(w):
        w.add_context_length(163840)
        w.add_block_count(layers)
        w.add_head_count(heads)
        w.add_head_count_kv(1)
        w.add_kv_lora_rank(kv_lora)
        w.add_key_length(kv_lora + rope)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v_dim)
        w.add_rope_dimension_count(rope)
        w.add_leading_dense_block_count(1)
        w.add_feed_forward_length(EXPERT_FFN)
        w.add_expert_feed_forward_length(EXPERT_FFN)
        w.add_expert_shared_count(1)
        w.add_vocab_size(VOCAB)

    t = common_tensors()
    for i in range(layers):
        t |= {
            f"blk.{i}.attn_norm.weight": (HIDDEN,),
            f"blk.{i}.attn_kv_a_norm.weight": (kv_lora,),
            f"blk.{i}.attn_q.weight": (HIDDEN, heads * (nope + rope)),
            f"blk.{i}.attn_kv_a_mqa.weight": (HIDDEN, kv_lora + rope),
            f"blk.{i}.attn_k_b.weight": (nope, kv_lora, heads),
            f"blk.{i}.attn_v_b.weight": (kv_lora, v_dim, heads),
            f"blk.{i}.attn_output.weight": (heads * v_dim, HIDDEN),
            f"blk.{i}.ffn_norm.weight": (HIDDEN,),
        }
        if i == 0:
            t |= {
                f"blk.{i}.ffn_gate.weight": (HIDDEN, EXPERT_FFN),
                f"blk.{i}.ffn_up.weight": (HIDDEN, EXPERT_FFN),
                f"blk.{i}.ffn_down.weight": (EXPERT_FFN, HIDDEN),
            }
        else:
            t |= moe_tensors(i, shared=EXPERT_FFN)
    geometry = {"layers": layers, "kv_lora_rank": kv_lora, "qk_rope_head_dim": rope, "cached_row": kv_lora + rope}
    return Shape("DeepSeek-V2-Lite", "deepseek2", "deepseek-ai/DeepSeek-V2-Lite config.json", geometry, meta, t)


def qwen36_35b_a3b():
    layers, heads, kv_heads, head_dim, interval = 40, 16, 2, 256, 4
    k_heads, v_heads, state, conv = 16, 32, 128, 4
    conv_dim = 2 * k_heads * state + v_heads * state

    def meta(w):
        w.add_context_length(262144)
        w.add_block_count(layers)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim // 4)
        w.add_rope_dimension_sections([11, 11, 10, 0])
        w.add_rope_freq_base(1e7)
        w.add_full_attention_interval(interval)
        w.add_ssm_conv_kernel(conv)
        w.add_ssm_state_size(state)
        w.add_ssm_group_count(k_heads)
        w.add_ssm_time_step_rank(v_heads)
        w.add_ssm_inner_size(v_heads * state)
        w.add_expert_feed_forward_length(EXPERT_FFN)
        w.add_expert_shared_feed_forward_length(EXPERT_FFN)

    t = common_tensors()
    for i in range(layers):
        t |= {f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.post_attention_norm.weight": (HIDDEN,)}
        if (i + 1) % interval == 0:
            t |= {
                f"blk.{i}.attn_q.weight": (HIDDEN, 2 * heads * head_dim),  # query and output gate
                f"blk.{i}.attn_k.weight": (HIDDEN, kv_heads * head_dim),
                f"blk.{i}.attn_v.weight": (HIDDEN, kv_heads * head_dim),
                f"blk.{i}.attn_output.weight": (heads * head_dim, HIDDEN),
                f"blk.{i}.attn_q_norm.weight": (head_dim,),
                f"blk.{i}.attn_k_norm.weight": (head_dim,),
            }
        else:
            t |= {
                f"blk.{i}.attn_qkv.weight": (HIDDEN, conv_dim),
                f"blk.{i}.attn_gate.weight": (HIDDEN, v_heads * state),
                f"blk.{i}.ssm_conv1d.weight": (conv, conv_dim),
                f"blk.{i}.ssm_dt.bias": (v_heads,),
                f"blk.{i}.ssm_a": (v_heads,),
                f"blk.{i}.ssm_beta.weight": (HIDDEN, v_heads),
                f"blk.{i}.ssm_alpha.weight": (HIDDEN, v_heads),
                f"blk.{i}.ssm_norm.weight": (state,),
                f"blk.{i}.ssm_out.weight": (v_heads * state, HIDDEN),
            }
        t |= moe_tensors(i, shared=EXPERT_FFN) | {f"blk.{i}.ffn_gate_inp_shexp.weight": (HIDDEN,)}
    geometry = {"layers": layers, "full_attention_layers": layers // interval, "kv_heads": kv_heads,
                "head_dim": head_dim, "linear_layers": layers - layers // interval, "linear_key_heads": k_heads,
                "linear_value_heads": v_heads, "linear_head_dim": state, "conv_kernel": conv}
    return Shape("Qwen3.6-35B-A3B", "qwen35moe", "Qwen/Qwen3.6-35B-A3B config.json (text_config)", geometry, meta, t)


SHAPES = [gpt_oss_20b, deepseek_v2_lite, qwen36_35b_a3b]


def write_gguf(shape, path):
    """Shape-only GGUF: the shape's metadata, a placeholder SentencePiece vocabulary, zero weights
    (F16 matrices; F32 vectors, biases and the conv kernel, which ggml's CPU ops need as F32)."""
    w = GGUFWriter(str(path), shape.arch)
    w.add_name(f"{shape.name} (shape only)")
    w.add_embedding_length(HIDDEN)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(1)
    shape.meta(w)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, VOCAB)])
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, ne in shape.tensors.items():
        f32 = len(ne) == 1 or name.endswith(".bias") or "ssm_conv1d" in name
        w.add_tensor(name, np.zeros(ne[::-1], dtype=np.float32 if f32 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(server):
    return os.environ | {"LD_LIBRARY_PATH": str(Path(server).resolve().parent)}


def server_args(ctx, dtype, swa_full):
    """The flags of one run (`-lv 4`: llama-server logs libllama's info lines at verbosity 4)."""
    return (["-c", str(ctx), "-ctk", dtype, "-ctv", dtype, "-np", "1", "-t", "1", "-fa", "on", "-fit", "off",
             "--no-warmup", "-lv", "4"] + (["--swa-full"] if swa_full else []))


def server_log(server, gguf, args, timeout=600):
    """llama-server's log lines up to its first compute-buffer line (the caches are allocated
    before it), or up to its exit; the server is stopped either way."""
    cmd = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(free_port()), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env(server))
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "compute buffer size" in line:
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    return lines


KV_LINE = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
    r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
RS_LINE = re.compile(
    r"llama_memory_recurrent: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+) seqs +(\d+) rs_seq\), "
    r"R \((\w+)\): +([\d.]+) MiB, S \((\w+)\): +([\d.]+) MiB")
ISWA_LINE = re.compile(r"llama_kv_cache_iswa: creating +(non-SWA|SWA) KV cache")


def mib_entry(mib, cells, layers, **parts):
    return {"mib": float(mib), "bytes": round(float(mib) * 2**20), "cells": int(cells), "layers": int(layers)} | parts


def parse_memory(lines):
    """{"full_attention", "swa", "recurrent"} -> the printed cache, from the log's memory lines."""
    caches, kind = {}, "full_attention"
    for line in lines:
        if m := ISWA_LINE.search(line):
            kind = "swa" if m[1] == "SWA" else "full_attention"
        elif m := KV_LINE.search(line):
            caches[kind] = mib_entry(m[1], m[2], m[3], seqs=int(m[4]), type_k=m[6], k_mib=float(m[7]),
                                     type_v=m[8], v_mib=float(m[9]))
        elif m := RS_LINE.search(line):
            caches["recurrent"] = mib_entry(m[1], m[2], m[3], seqs=int(m[4]), type_r=m[6], r_mib=float(m[7]),
                                            type_s=m[8], s_mib=float(m[9]))
    return caches


def measure(server, shape, gguf, ctx, dtype, swa_full):
    args = server_args(ctx, dtype, swa_full)
    lines = server_log(server, gguf, args)
    run = {"shape": shape.name, "arch": shape.arch, "context": ctx, "dtype": dtype, "swa_full": swa_full,
           "args": " ".join(args)}
    caches = parse_memory(lines)
    if not caches:
        errors = [line for line in lines if re.search(r"error|unknown|failed|exception|abort", line, re.I)]
        return run | {"supported": False, "why": errors[-5:] or lines[-5:]}
    return run | {"supported": True, "total_mib": round(sum(c["mib"] for c in caches.values()), 2),
                  "total_bytes": sum(c["bytes"] for c in caches.values()),
                  **{k: caches.get(k) for k in ("full_attention", "swa", "recurrent")}}


def moestream_sizes(binary, gguf, contexts):
    """`moestream bench kv-size` on the same GGUF: {(context, dtype, rings): total bytes}."""
    cmd = [str(binary), "bench", "kv-size", "-m", str(gguf), "--contexts", ",".join(map(str, contexts)), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {(r["context"], r["dtype"], r["rings"]): r["total_bytes"] for r in json.loads(out)["rows"]}


def version(server):
    """`llama-server --version`'s first line (version, build number, commit)."""
    out = subprocess.run([str(server), "--version"], capture_output=True, text=True, env=server_env(server))
    return (out.stdout + out.stderr).strip().splitlines()[0]


def cell(c):
    return f"{c['mib']:.2f} ({c['cells']} cells x {c['layers']} layers)" if c else "-"


def markdown(runs):
    rows = ["| shape | context | cache type | swa-full | llama.cpp MiB | moestream MiB | moestream / llama.cpp | "
            "full-attention KV | SWA KV | recurrent state |",
            "|---|---:|---|---|---:|---:|---:|---|---|---|"]
    for r in runs:
        head = f"| {r['shape']} | {r['context']} | {r['dtype']} | {'yes' if r['swa_full'] else ''} | "
        ours = r.get("moestream_mib")
        ours_cells = f"{ours:.2f} | {ours / r['total_mib']:.3f}" if ours and r["supported"] else "- | -"
        if r["supported"]:
            rows.append(head + f"{r['total_mib']:.2f} | {ours_cells} | {cell(r['full_attention'])} | "
                               f"{cell(r['swa'])} | {cell(r['recurrent'])} |")
        else:
            rows.append(head + f"unsupported | {ours_cells} | | | |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", required=True, type=Path)
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--dtypes", default="f16,q8_0")
    ap.add_argument("--out", type=Path, help="write the JSON here (it is printed either way)")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table after the JSON")
    ap.add_argument("--keep", type=Path, help="write the GGUFs here and keep them (default: a temp dir)")
    ap.add_argument("--moestream", type=Path,
                    help="also size moestream's caches for the same GGUFs (`moestream bench kv-size`)")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    dtypes = args.dtypes.split(",")

    with tempfile.TemporaryDirectory() as tmp:
        gguf_dir = args.keep or Path(tmp)
        gguf_dir.mkdir(parents=True, exist_ok=True)
        runs, shapes = [], []
        for shape in (make() for make in SHAPES):
            gguf = gguf_dir / f"{shape.name}-shape.gguf"
            write_gguf(shape, gguf)
            ours = moestream_sizes(args.moestream, gguf, contexts) if args.moestream else {}
            shapes.append({"name": shape.name, "arch": shape.arch, "source": shape.source, "geometry": shape.geometry,
                           "gguf_mib": round(gguf.stat().st_size / 2**20, 1)})
            for ctx in contexts:
                for dtype in dtypes:
                    for swa_full in (False, True) if shape.swa else (False,):
                        run = measure(args.llama_server, shape, gguf, ctx, dtype, swa_full)
                        if (ctx, dtype, not swa_full) in ours:
                            run["moestream_bytes"] = ours[(ctx, dtype, not swa_full)]
                            run["moestream_mib"] = round(run["moestream_bytes"] / 2**20, 2)
                        print(f"{shape.name} {ctx} {dtype}{' swa-full' if swa_full else ''}: "
                              f"{run.get('total_mib', 'unsupported')}", file=sys.stderr)
                        runs.append(run)

    result = {"llama_server": str(args.llama_server), "version": version(args.llama_server),
              "note": "mib as llama.cpp prints it (two decimals); bytes = mib * 2^20, so within 0.005 MiB",
              "shapes": shapes, "runs": runs}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    if args.markdown:
        print()
        print(markdown(runs))


if __name__ == "__main__":
    main()
