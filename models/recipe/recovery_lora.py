#!/usr/bin/env python3
"""Recovery LoRA for prediction-as-routing on the bundled model (Edge0's "unmerged recovery LoRA").

With `moestream ... --routing predicted`, every layer with a prerouter head routes decode tokens to
the experts the head predicted one token ahead, which costs perplexity. This trains a small LoRA
on the attention projections (q, k, v, o of every layer) so that the model running on that
"student path" matches the unmodified model (the teacher) again, and writes it as a PEFT adapter
that `moestream --lora DIR` applies unmerged.

The student path, per batch of training-split windows (as `moestream score --routing predicted`
runs it: token 0 and layer 0 route natively, every later token of a layer with a head uses the
head's top-k from the token before, weighted by the router's own probabilities):
  1. the teacher runs natively and records each layer's FFN input and routing;
  2. the heads predict every token's routing from the token before; to get closer to what the
     student itself would see, the student (no gradient) is run once on those predictions and the
     heads predict again from its states (one fixed-point step; the exact student path would be
     sequential over tokens);
  3. the LoRA student runs on the predicted routing and is trained on KL(teacher || student).

Usage (from the repository root, after train.py and prerouter.sh; ~5 min on 2 cores):
    /work/venv/bin/python models/recipe/recovery_lora.py [--steps 600] --out DIR
then measure with
    moestream score --file models/moestream-tiny-moe/validation.txt --routing predicted --lora DIR
Measured (rank 16, alpha 32, lr 5e-3, 600 steps of 8 × 128 tokens; native perplexity 120.31): with
heads that do not read the next token (`next,prev,deep`, 256 wide), predicted routing 130.13 ->
128.06 with the adapter; with the shipped heads (`token` added, 64 wide) 120.92 -> 120.95, nothing
left to recover, so no adapter ships with the bundled model.
"""

import argparse
import json
import math
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import Cfg, TinyQwen3Moe, from_hub_state_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models/moestream-tiny-moe"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def load_model() -> TinyQwen3Moe:
    cfg = json.loads((MODEL / "config.json").read_text())
    # The hub config uses the recipe's field names; take every one Cfg has.
    c = Cfg(**{f.name: cfg[f.name] for f in fields(Cfg) if f.name in cfg})
    m = TinyQwen3Moe(c)
    sd = {k: v.float() for k, v in load_file(str(MODEL / "model.safetensors")).items()}
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict(from_hub_state_dict(sd, c))
    return m.eval()


class Heads:
    """The prerouter heads of `prerouter.safetensors`, as moestream's `Head::forward` computes them."""

    def __init__(self, path: Path):
        with safe_open(str(path), "pt") as f:
            self.config = json.loads(f.metadata()["prerouter"])
            self.t = {k: f.get_tensor(k).float() for k in f.keys()}
        self.f = self.config["features"]
        self.moe = self.config["moe_layers"]

    def predict(self, trace, k: int, next_embedding: torch.Tensor):
        """Per model layer: None, or [B, T, k] ids predicted for each token from the token before
        and, with the `token` feature, the token's own input embedding (`next_embedding[:, t]`
        is token t+1's; -1 at token 0, which routes natively)."""
        out = [None] * len(trace)
        E = self.config["experts"]
        last_h = trace[self.moe[-1]][0]
        for layer in self.config["heads"]:
            target = self.moe[self.moe.index(layer) + 1]
            h, nxt = trace[layer][0], trace[target][1]
            B, T, _ = h.shape
            dense = [h, last_h] if self.f.get("deep") else [h]
            if self.f.get("token"):
                dense.append(next_embedding)
            blocks = []
            hot = lambda ids: F.one_hot(ids, E).sum(-2).float()  # noqa: E731
            if self.f["next"]:
                blocks.append(hot(nxt))
            if self.f["prev"]:
                prev = torch.zeros(B, T, E)
                prev[:, 1:] = hot(nxt[:, :-1])
                blocks.append(prev)
            if self.f["own"]:
                blocks.append(hot(trace[layer][1]))
            p = f"prerouter.layer{layer}."
            x = torch.cat(dense + blocks, -1)
            a = F.gelu(F.linear(x, self.t[p + "fc1.weight"], self.t[p + "fc1.bias"]))
            scores = F.linear(a, self.t[p + "fc2.weight"], self.t[p + "fc2.bias"]) + F.linear(h, self.t[p + "skip.weight"])
            ids = torch.full((B, T, k), -1, dtype=torch.long)
            ids[:, 1:] = scores[:, :-1].topk(k, -1).indices
            out[target] = ids
        return out


class LoraLinear(nn.Module):
    """y = W x + (alpha / r) B A x, W frozen (PEFT's initialisation: A Kaiming-uniform, B zero)."""

    def __init__(self, base: nn.Linear, r: int, alpha: float):
        super().__init__()
        self.base, self.scale = base, alpha / r
        self.A = nn.Parameter(torch.empty(r, base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, r))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def forward(self, x):
        return self.base(x) + self.scale * F.linear(F.linear(x, self.A), self.B)


def add_lora(m: TinyQwen3Moe, r: int, alpha: float) -> dict[str, LoraLinear]:
    for p in m.parameters():
        p.requires_grad_(False)
    out = {}
    for i, layer in enumerate(m.model.layers):
        for name in TARGETS:
            lora = LoraLinear(getattr(layer.self_attn, name), r, alpha)
            setattr(layer.self_attn, name, lora)
            out[f"base_model.model.model.layers.{i}.self_attn.{name}"] = lora
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    m = load_model()
    heads = Heads(MODEL / "prerouter.safetensors")
    k = m.c.num_experts_per_tok
    ids = torch.from_numpy(np.load(ROOT / "models/recipe/work/train_ids.npy").astype(np.int64))
    loras = add_lora(m, a.rank, a.alpha)
    scale = a.alpha / a.rank
    params = [p for lo in loras.values() for p in (lo.A, lo.B)]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(a.seed)
    t0 = time.time()
    for step in range(a.steps):
        starts = torch.randint(0, len(ids) - a.seq, (a.batch,), generator=g).tolist()
        x = torch.stack([ids[s : s + a.seq] for s in starts])
        with torch.no_grad():
            for lo in loras.values():
                lo.scale = 0.0
            trace = []
            teacher = F.log_softmax(m(x, trace=trace)[0], -1)
            # Token t+1's input embedding beside token t (the last position's is never used).
            following = torch.cat([x[:, 1:], x[:, -1:]], 1)
            next_embedding = m.model.embed_tokens(following)
            forced = heads.predict(trace, k, next_embedding)
            trace = []
            for lo in loras.values():
                lo.scale = scale
            m(x, forced=forced, trace=trace)
            forced = heads.predict(trace, k, next_embedding)
        student = F.log_softmax(m(x, forced=forced)[0], -1)
        loss = F.kl_div(student[:, 1:], teacher[:, 1:], log_target=True, reduction="batchmean") / (a.seq - 1)
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / a.steps))
        opt.step()
        if step % 25 == 0 or step == a.steps - 1:
            print(f"step {step:4d}  KL/token {loss.item():.4f}  {time.time() - t0:.0f} s", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, lo in loras.items():
        tensors[f"{name}.lora_A.weight"] = lo.A.detach().contiguous()
        tensors[f"{name}.lora_B.weight"] = lo.B.detach().contiguous()
    save_file(tensors, str(a.out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": a.rank,
        "lora_alpha": a.alpha,
        "target_modules": TARGETS,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "base_model_name_or_path": "models/moestream-tiny-moe",
    }
    (a.out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"adapter written to {a.out}")


if __name__ == "__main__":
    main()
