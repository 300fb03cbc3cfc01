#!/usr/bin/env python3
"""A small Qwen3-MoE trained here to edit code by copying it: the model prompt-lookup drafts are
measured on (`bench model --speculative ngram`, benches/README.md "Prompt-lookup drafts").

The bundled model (trained on the Brown corpus) writes prose and never copies a passage it was
shown, so drafts copied from its prompt are rejected whatever the engine does. A code model
asked to edit a file mostly writes the file again; this script trains the smallest MoE that
does so, from scratch on synthetic tasks, on a CPU in minutes:

    Rename <old> to <new>.

    <a random Python-like function>

    Answer:

    <the same function with <old> renamed><|endoftext|>

and as many copies of random runs of names and symbols (`repeat`). The loss is on the answers
only (the functions themselves are random). The model is the
recipe's `TinyQwen3Moe` (transformers' `Qwen3MoeForCausalLM` math and names) with the bundled
model's tokenizer, exported in the Hugging Face layout; `--check` compares its greedy answers
with the right edits on fresh tasks. Run from the repository root:

    python benches/make_copy_model.py target/ci/copy-moe           # ~20 min on 2 threads
    python benches/make_copy_model.py target/ci/copy-moe --prompt  # also writes prompt.txt
    moestream convert target/ci/copy-moe tests/fixtures/copy_moe   # the test fixture (with prompt.txt, training.json)

Not run by CI (tests run the committed conversion); the benchmark's figures name the commit and this script's seed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "models" / "recipe"))
from model import Cfg, TinyQwen3Moe, load_balancing_loss  # noqa: E402
from train import export_hf, write_json  # noqa: E402

BUNDLED = REPO / "models" / "moestream-tiny-moe"
EOS_ID = 0

NOUNS = (
    "total count items price value result index data name size line text width height score "
    "rate amount order user page file path key node item row column cell word letter number "
    "point color level state money time day year city name table list record entry stock share "
    "market cost sale tax field block group part piece unit step round turn game team player"
).split()
VERBS = "get set add make find load save read write count check build update sum move show".split()


def ident(rng: random.Random) -> str:
    """A snake_case name of one or two words."""
    if rng.random() < 0.5:
        return rng.choice(NOUNS)
    return f"{rng.choice(NOUNS)}_{rng.choice(NOUNS)}"


def function(rng: random.Random) -> str:
    """A random Python-like function of 3 to 9 statements."""
    name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
    args = rng.sample(NOUNS, rng.randint(1, 3))
    names = list(args)
    lines = [f"def {name}({', '.join(args)}):"]
    depth = 1
    for _ in range(rng.randint(3, 9)):
        pad = "    " * depth
        kind = rng.random()
        a, b = rng.choice(names), rng.choice(names)
        if kind < 0.3:
            new = ident(rng)
            op = rng.choice(["+", "-", "*"])
            rhs = rng.choice([f"{a} {op} {b}", f"{a} {op} {rng.randint(0, 99)}", f"{a}.{rng.choice(NOUNS)}"])
            lines.append(f"{pad}{new} = {rhs}")
            names.append(new)
        elif kind < 0.45 and depth < 3:
            lines.append(f"{pad}for {ident(rng)} in {a}:")
            names.append(lines[-1].split()[1])
            depth += 1
        elif kind < 0.6 and depth < 3:
            lines.append(f"{pad}if {a} {rng.choice(['>', '<', '==', '!='])} {rng.choice([b, str(rng.randint(0, 9))])}:")
            depth += 1
        elif kind < 0.75:
            lines.append(f"{pad}{a}.{rng.choice(['append', 'update', 'add', 'remove'])}({b})")
        elif kind < 0.85:
            lines.append(f"{pad}print({a}, {b})")
        else:
            lines.append(f"{pad}{a} += {rng.choice([b, str(rng.randint(1, 9))])}")
        if depth > 1 and not lines[-1].endswith(":") and rng.random() < 0.3:
            depth -= 1
    if lines[-1].endswith(":"):
        lines.append(f"{'    ' * depth}print({rng.choice(names)})")
    lines.append(f"    return {rng.choice(names)}")
    return "\n".join(lines)


def task(rng: random.Random, functions: int = 0) -> tuple[str, str]:
    """(prompt, answer): 1 to 2 functions (or `functions`), and the same with one name renamed."""
    code = "\n\n".join(function(rng) for _ in range(functions or rng.randint(1, 2)))
    words = sorted(set(re.findall(r"[a-z_]+", code)) - {"def", "for", "in", "if", "return", "print"})
    old = rng.choice(words)
    new = ident(rng)
    while new in words:
        new = ident(rng)
    edited = re.sub(rf"\b{old}\b", new, code)
    return f"Rename {old} to {new}.\n\n{code}\n\nAnswer:\n\n", edited


def repeat(rng: random.Random) -> tuple[str, str]:
    """(prompt, answer): a random run of names and symbols, and the same again: nothing but
    copying predicts it, which is what teaches a model this small to copy (induction) quickly."""
    pieces = NOUNS + VERBS + list("()=+:.,") + ["\n", "\n    "]
    text = " ".join(rng.choice(pieces) for _ in range(rng.randint(20, 60)))
    return f"Repeat this.\n\n{text}\n\nAnswer:\n\n", text


def batch(tok, rng: random.Random, B: int, T: int):
    """B rows of T tokens packed with tasks; targets outside answers are -100."""
    xs, ys = [], []
    for _ in range(B):
        ids, tgt = [], []
        while len(ids) < T + 1:
            prompt, answer = task(rng) if rng.random() < 0.5 else repeat(rng)
            p = tok.encode(prompt).ids
            a = tok.encode(answer).ids + [EOS_ID]
            ids += p + a
            tgt += [-100] * len(p) + a
        ids, tgt = ids[: T + 1], tgt[: T + 1]
        xs.append(ids[:-1])
        ys.append(tgt[1:])
    return torch.tensor(xs), torch.tensor(ys)


@torch.no_grad()
def greedy(model, tok, prompt: str, limit: int) -> str:
    ids = tok.encode(prompt).ids
    out = []
    for _ in range(limit):
        logits, _ = model(torch.tensor([ids + out]))
        t = int(logits[0, -1].argmax())
        if t == EOS_ID:
            break
        out.append(t)
    return tok.decode(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--check", type=int, default=20, help="fresh tasks answered greedily after training")
    ap.add_argument("--prompt", action="store_true", help="write the benchmark's code-editing prompt.txt")
    a = ap.parse_args()
    from tokenizers import Tokenizer

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    tok = Tokenizer.from_file(str(BUNDLED / "tokenizer.json"))
    c = Cfg(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        max_position_embeddings=2048,
    )
    model = TinyQwen3Moe(c)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    t0 = time.time()
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / a.steps)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(tok, rng, a.batch, a.seq)
        logits, router = model(x)
        ce = F.cross_entropy(logits.reshape(-1, c.vocab_size), y.reshape(-1), ignore_index=-100)
        loss = ce + c.router_aux_loss_coef * load_balancing_loss(router, c.num_experts, c.num_experts_per_tok)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == a.steps - 1:
            print(json.dumps({"step": step, "answer_ce": round(ce.item(), 4), "s": round(time.time() - t0)}), flush=True)
    model.eval()
    check = random.Random(a.seed + 1)
    right = 0
    for _ in range(a.check):
        prompt, answer = task(check)
        right += greedy(model, tok, prompt, 200) == answer
    print(f"{right} of {a.check} fresh edits answered exactly")
    a.out.mkdir(parents=True, exist_ok=True)
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(BUNDLED / f, a.out / f)
    export_hf(model.state_dict(), c, a.out, eos_id=EOS_ID)
    write_json(a.out / "training.json", {"seed": a.seed, "steps": a.steps, "exact_edits": [right, a.check]})
    if a.prompt:
        prompt, _ = task(random.Random(a.seed + 2), functions=2)
        (a.out / "prompt.txt").write_text(prompt)
    print(f"wrote {a.out} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
