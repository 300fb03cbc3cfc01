"""Train the bundled model's MTP module: one multi-token-prediction layer in Qwen3-Next's
`mtp.*` layout, trained post hoc with every weight of the model frozen (its goldens and figures
stay), so `moestream generate --speculative mtp` drafts with real acceptance rates.

The module (as Qwen3-Next's, and DeepSeek-V3's under other names) reads the model's final-norm
output `h[i]` and the next token `t[i+1]` and predicts `t[i+2]`:

    x = fc([pre_fc_norm_embedding(embed(t[i+1])) | pre_fc_norm_hidden(h[i])])
    x = a Qwen3-MoE decoder layer at position i     (its own attention and 32 experts)
    logits = lm_head(norm(x))                        (the model's frozen lm_head)

It is distilled on the training split: its log-softmax at i against the model's own
distribution at i + 1 (KL), so its greedy draft is the model's greedy token as often as it can
be (what verification accepts), plus transformers' load-balancing loss on its router. The layer
starts as a copy of the model's last layer, `fc` as the identity on the hidden half.

Writes `mtp.safetensors` (bf16, like the model) and `model.safetensors.index.json` into the model
directory (`model.safetensors` is not rewritten), adds `mtp_num_hidden_layers: 1` to its
`config.json`, and `mtp_golden.json` (the module's log-probs over a validation window, for the
engine's tests). Run from the repository root (~10 min on one core):

    /work/venv/bin/python models/recipe/mtp.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import torch.nn as nn
import torch.nn.functional as F
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data as D  # noqa: E402
from model import Cfg, Layer, RMSNorm, TinyQwen3Moe, from_hub_state_dict, load_balancing_loss, to_hub_state_dict  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


class Mtp(nn.Module):
    """The MTP module, parameters named as in Qwen3-Next's `mtp.*` checkpoints."""

    def __init__(self, c: Cfg):
        super().__init__()
        self.pre_fc_norm_embedding = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.fc = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.layers = nn.ModuleList([Layer(c)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, h, e, cos, sin):
        """`h` [B, T, H]: the model's final-norm output at positions 0..T-1; `e` [B, T, H]: the
        embeddings of the tokens after them. Returns the module's normalised output and its
        router logits."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(h)], dim=-1))
        x, router_logits = self.layers[0](x, cos, sin)
        return self.norm(x), router_logits


def load_model(out: Path, c: Cfg) -> TinyQwen3Moe:
    sd = safetensors.torch.load_file(str(out / "model.safetensors"))
    sd = {k: v.float() for k, v in sd.items() if not k.startswith("mtp.")}
    model = TinyQwen3Moe(c)
    model.load_state_dict(from_hub_state_dict(sd, c))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def teacher(model: TinyQwen3Moe, ids: torch.Tensor):
    """The model's final-norm output and logits at every position of `ids` [B, T]."""
    B, T = ids.shape
    cos, sin = model.rope(T, ids.device)
    x = model.model.embed_tokens(ids)
    for layer in model.model.layers:
        x, _ = layer(x, cos, sin)
    h = model.model.norm(x)
    return h, model.lm_head(h)


def mtp_logits(model: TinyQwen3Moe, mtp: Mtp, ids: torch.Tensor, h: torch.Tensor):
    """The module's logits at positions 0..T-2 of `ids` (predicting t[i+2]) and router logits."""
    T = ids.shape[1] - 1
    cos, sin = model.rope(T, ids.device)
    y, rl = mtp(h[:, :T], model.model.embed_tokens(ids[:, 1:]), cos, sin)
    return model.lm_head(y), rl


def init_from(model: TinyQwen3Moe, mtp: Mtp, c: Cfg, g: torch.Generator):
    with torch.no_grad():
        mtp.layers[0].load_state_dict(model.model.layers[-1].state_dict())
        mtp.norm.weight.copy_(model.model.norm.weight)
        H = c.hidden_size
        mtp.fc.weight.zero_()
        mtp.fc.weight[:, :H].normal_(0.0, 0.02, generator=g)
        mtp.fc.weight[:, H:].copy_(torch.eye(H))


def batches(ids: np.ndarray, T: int, B: int, g: torch.Generator):
    n = len(ids) - T - 1
    while True:
        starts = torch.randint(0, n, (B,), generator=g).tolist()
        yield torch.tensor(np.stack([ids[s : s + T + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate(model, mtp, vids: np.ndarray, T: int, windows: int = 8):
    """Over `windows` validation windows: how often the module's greedy draft at i is the model's
    greedy token at i + 1 (what greedy verification accepts), and the KL."""
    hits = total = 0
    kl = 0.0
    for w in range(windows):
        s = w * T
        if s + T + 1 > len(vids):
            break
        ids = torch.tensor(vids[s : s + T + 1].astype(np.int64))[None]
        h, logits = teacher(model, ids)
        ml, _ = mtp_logits(model, mtp, ids, h)
        want = logits[:, 1:]
        hits += (ml.argmax(-1) == want.argmax(-1)).sum().item()
        total += want.shape[1]
        kl += F.kl_div(F.log_softmax(ml, -1), F.log_softmax(want, -1), log_target=True, reduction="sum").item()
    return hits / total, kl / total


def export(out: Path, mtp: Mtp, c: Cfg, model: TinyQwen3Moe, vids: np.ndarray):
    sd = {f"mtp.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in mtp.state_dict().items()}
    hub = {}
    for k, v in sd.items():
        # The layer's fused experts in the hub's per-expert layout.
        hub.update(to_hub_state_dict({k: v}, c))
    safetensors.torch.save_file(hub, str(out / "mtp.safetensors"), metadata={"format": "pt"})
    main = safetensors.torch.load_file(str(out / "model.safetensors"))
    weight_map = {k: "model.safetensors" for k in main}
    weight_map.update({k: "mtp.safetensors" for k in hub})
    total = sum(t.numel() * t.element_size() for t in list(main.values()) + list(hub.values()))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["mtp_num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    # A golden for the engine: the exported (bf16-rounded) module over the first 48 validation
    # tokens, in f32.
    mtp_bf16 = Mtp(c)
    mtp_bf16.load_state_dict({k[4:]: v.float() for k, v in sd.items()})
    ids = torch.tensor(vids[:48].astype(np.int64))[None]
    with torch.no_grad():
        h, _ = teacher(model, ids)
        lsm = F.log_softmax(mtp_logits(model, mtp_bf16, ids, h)[0][0], -1)
    tokens = ids[0].tolist()
    golden = {
        "torch_version": torch.__version__,
        "tokens": tokens,
        "logprobs": [round(lsm[i, tokens[i + 2]].item(), 6) for i in range(len(tokens) - 2)],
        "drafts": lsm.argmax(-1).tolist(),
        "last_logprobs": [round(x, 6) for x in lsm[-1].tolist()],
    }
    (REPO / "tests" / "fixtures" / "bundled_mtp_golden.json").write_text(json.dumps(golden) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=REPO / "models" / "moestream-tiny-moe")
    p.add_argument("--work", type=Path, default=REPO / "models" / "recipe" / "work")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--aux", type=float, default=0.01)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    a.work.mkdir(parents=True, exist_ok=True)

    # The training split, as the model's recipe makes it, in the committed tokenizer's ids.
    docs = D.load_documents(D.fetch_brown(a.work))
    train, _ = D.split(docs, a.seed)
    tok = Tokenizer.from_file(str(a.out / "tokenizer.json"))
    ids = []
    for _, text in train:
        ids.extend(tok.encode(text).ids)
        ids.append(0)
    ids = np.array(ids, dtype=np.uint16)
    vids = np.array(tok.encode((a.out / "validation.txt").read_text()).ids, dtype=np.uint16)

    c = Cfg()
    model = load_model(a.out, c)
    mtp = Mtp(c)
    init_from(model, mtp, c, g)
    opt = torch.optim.AdamW(mtp.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    acc0, kl0 = evaluate(model, mtp, vids, a.seq_len)
    print(f"before: draft = model's greedy {acc0:.3f}, KL {kl0:.3f}", flush=True)
    started = time.time()
    stream = batches(ids, a.seq_len, a.batch, g)
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        batch = next(stream)
        h, logits = teacher(model, batch)
        ml, rl = mtp_logits(model, mtp, batch, h)
        kl = F.kl_div(F.log_softmax(ml, -1), F.log_softmax(logits[:, 1:], -1), log_target=True, reduction="batchmean")
        kl = kl / ml.shape[1]
        loss = kl + a.aux * load_balancing_loss([rl], c.num_experts, c.num_experts_per_tok)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            acc, vkl = evaluate(model, mtp, vids, a.seq_len)
            print(
                f"step {step + 1}: train KL {kl.item():.3f}, validation draft = greedy {acc:.3f}, KL {vkl:.3f} "
                f"({time.time() - started:.0f} s)",
                flush=True,
            )
    acc, vkl = evaluate(model, mtp, vids, a.seq_len, windows=32)
    print(f"after: validation draft = model's greedy {acc:.3f}, KL {vkl:.3f}", flush=True)
    export(a.out, mtp, c, model, vids)
    print(json.dumps({"validation_draft_accuracy": round(acc, 4), "validation_kl": round(vkl, 4)}))


if __name__ == "__main__":
    main()
