"""Prompts of the held-out cache workload: paragraphs of the two held-out texts, interleaved.

Run by hand (not by CI): `python3 benches/workloads/heldout/make_prompts.py`. Deterministic; no
network. Writes `prompts.txt`, one prompt per line: 12 prompts of the first 40 words of a
paragraph of the bundled model's held-out documents (`models/moestream-tiny-moe/validation.txt`,
Brown corpus documents never trained on: in domain) alternating with 12 of `out_of_domain.txt`
(the project's own documentation of 2026-12-06, frozen here: modern technical English, code
names and flags, out of the 1961 corpus's domain).
"""
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORDS = 40
PER_TEXT = 12


def paragraphs(text, wrapped):
    """One paragraph per line, or (`wrapped`, Markdown) blocks of lines that a blank line or a
    list item starts."""
    blocks = re.split(r"\n\s*\n|\n(?=- )", text) if wrapped else text.split("\n")
    return [" ".join(b.split()) for b in blocks]


def prompts(path, rng, wrapped):
    paras = [p for p in paragraphs(path.read_text(), wrapped) if len(p.split()) >= WORDS]
    rng.shuffle(paras)
    return [" ".join(p.split()[:WORDS]) for p in paras[:PER_TEXT]]


def main():
    rng = random.Random(7)
    inside = prompts(ROOT / "models" / "moestream-tiny-moe" / "validation.txt", rng, False)
    outside = prompts(HERE / "out_of_domain.txt", rng, True)
    assert len(inside) == len(outside) == PER_TEXT, (len(inside), len(outside))
    mixed = [p for pair in zip(inside, outside) for p in pair]
    (HERE / "prompts.txt").write_text("\n".join(mixed) + "\n")
    print(len(mixed), "prompts")


if __name__ == "__main__":
    main()
