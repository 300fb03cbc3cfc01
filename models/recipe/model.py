"""A compact PyTorch Qwen3-MoE for training on CPU.

Same math and the same parameter names/shapes as transformers' `Qwen3MoeForCausalLM` (v5
fused-expert layout: `mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I],
`mlp.gate.weight` [E, H]), but with a sort-based expert dispatch (one gather, one matmul pair per
expert, one index_add) and SDPA attention. `train.py` checks the exported model against
transformers after training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Cfg:
    vocab_size: int = 4096
    hidden_size: int = 160
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 40
    num_experts: int = 32
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 128
    norm_topk_prob: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    router_aux_loss_coef: float = 0.01


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        hd = self.c.head_dim
        q = self.q_norm(self.q_proj(x).view(B, T, -1, hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, -1, hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.c.num_attention_heads // self.c.num_key_value_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=hd**-0.5)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class Router(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(c.num_experts, c.hidden_size))


class Experts(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        E, H, I = c.num_experts, c.hidden_size, c.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


class SparseMoe(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.c = c
        self.gate = Router(c)
        self.experts = Experts(c)

    def forward(self, x, forced=None, trace=None):
        """`forced` ([B, T, k] expert ids, -1 rows = the router's choice) replaces the top-k
        (moestream's prediction-as-routing: the router's probabilities of the given experts);
        `trace`, a list, receives (x, chosen ids [B, T, k])."""
        B, T, H = x.shape
        c = self.c
        if trace is not None:
            trace.append(x)
        x = x.reshape(-1, H)
        logits = F.linear(x, self.gate.weight)  # [N, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top_v, top_i = torch.topk(probs, c.num_experts_per_tok, dim=-1)
        if forced is not None:
            f = forced.reshape(-1, c.num_experts_per_tok)
            top_i = torch.where(f[:, :1] >= 0, f, top_i)
            top_v = probs.gather(1, top_i)
        if trace is not None:
            trace[-1] = (trace[-1], top_i.view(B, T, -1))
        if c.norm_topk_prob:
            top_v = top_v / top_v.sum(dim=-1, keepdim=True)
        top_v = top_v.to(logits.dtype)
        flat_e = top_i.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        tok = order // c.num_experts_per_tok
        counts = torch.bincount(flat_e, minlength=c.num_experts).tolist()
        xs = x.index_select(0, tok)
        outs = []
        gu_w, dn_w = self.experts.gate_up_proj, self.experts.down_proj
        for e, chunk in enumerate(xs.split(counts)):
            if counts[e] == 0:
                continue
            g, u = F.linear(chunk, gu_w[e]).chunk(2, dim=-1)
            outs.append(F.linear(F.silu(g) * u, dn_w[e]))
        ys = torch.cat(outs) * top_v.reshape(-1).index_select(0, order).unsqueeze(-1)
        out = torch.zeros_like(x).index_add_(0, tok, ys)
        return out.view(B, T, H), logits


class Layer(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = SparseMoe(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, forced=None, trace=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h, logits = self.mlp(self.post_attention_layernorm(x), forced, trace)
        return x + h, logits


class Body(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class TinyQwen3Moe(nn.Module):
    def __init__(self, c: Cfg):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        std = self.c.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)

    def rope(self, T, device):
        pos = torch.arange(T, device=device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]

    def forward(self, ids, forced=None, trace=None):
        """`forced`: per layer, None or [B, T, k] expert ids (see `SparseMoe.forward`);
        `trace`: a list that receives each layer's (FFN input, chosen ids)."""
        B, T = ids.shape
        cos, sin = self.rope(T, ids.device)
        x = self.model.embed_tokens(ids)
        router_logits = []
        for i, layer in enumerate(self.model.layers):
            x, rl = layer(x, cos, sin, None if forced is None else forced[i], trace)
            router_logits.append(rl)
        return self.lm_head(self.model.norm(x)), router_logits


def load_balancing_loss(router_logits: list[torch.Tensor], num_experts: int, top_k: int):
    """transformers' `load_balancing_loss_func` without an attention mask (rows of all layers pooled)."""
    logits = torch.cat(router_logits, dim=0)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    _, sel = torch.topk(probs, top_k, dim=-1)
    tokens_per_expert = F.one_hot(sel, num_experts).float().sum(1).mean(0)  # sums to top_k
    router_prob = probs.mean(0)
    return (tokens_per_expert * router_prob).sum() * num_experts


def to_hub_state_dict(sd: dict[str, torch.Tensor], c: Cfg) -> dict[str, torch.Tensor]:
    """Fused expert tensors -> the per-expert `experts.{e}.{gate,up,down}_proj.weight` hub layout."""
    out = {}
    I = c.moe_intermediate_size
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{p}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v.contiguous()
    return out


def from_hub_state_dict(sd: dict[str, torch.Tensor], c: Cfg) -> dict[str, torch.Tensor]:
    """Inverse of `to_hub_state_dict`."""
    out = {}
    E = c.num_experts
    for k, v in sd.items():
        if ".mlp.experts." not in k:
            out[k] = v
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        out[p + "gate_up_proj"] = torch.stack(
            [torch.cat([sd[f"{p}{e}.gate_proj.weight"], sd[f"{p}{e}.up_proj.weight"]]) for e in range(E)]
        )
        out[p + "down_proj"] = torch.stack([sd[f"{p}{e}.down_proj.weight"] for e in range(E)])
    return out


def param_counts(c: Cfg) -> dict[str, int]:
    H, E, I, L, V = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.num_hidden_layers, c.vocab_size
    qd, kd = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    attn = H * qd + 2 * H * kd + qd * H + 2 * c.head_dim
    expert = 3 * H * I
    per_layer_dense = attn + E * H + 2 * H
    total = V * H * 2 + H + L * (per_layer_dense + E * expert)
    active = V * H * 2 + H + L * (per_layer_dense + c.num_experts_per_tok * expert)
    return {
        "total": total,
        "active_per_token": active,
        "active_per_token_excluding_embedding": active - V * H,
        "experts_total": L * E * expert,
        "per_expert": expert,
    }
