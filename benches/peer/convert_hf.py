#!/usr/bin/env python3
"""Run llama.cpp's own convert_hf_to_gguf.py on a Hugging Face directory whose BPE tokenizer
llama.cpp does not know by hash (the bundled model's tokenizer was trained here), telling it the
pre-tokenizer instead: `gpt-2`, the byte-level GPT-2 split that the tokenizer.json's `ByteLevel`
pre-tokenizer with `use_regex: true` is.

    python benches/peer/convert_hf.py LLAMA_CPP_DIR HF_DIR OUT.gguf [--plain-vocab] [--outtype f16]

`--plain-vocab` also writes the vocabulary as a plain GPT-2 BPE one for families whose converter
expects their real tokenizer's special tokens (GLM's `[gMASK]`), which the tiny test fixtures
(tests/fixtures/*) lack. Everything else (tensor names, metadata, types) is the converter's.
"""

import sys
from pathlib import Path

llama_cpp = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]

import conversion.base  # noqa: E402  (llama.cpp's converter package, from LLAMA_CPP_DIR)
import convert_hf_to_gguf  # noqa: E402

conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
hf_dir, out, rest = sys.argv[2], sys.argv[3], sys.argv[4:]
if "--plain-vocab" in rest:
    rest.remove("--plain-vocab")
    conversion.base.TextModel._set_vocab_glm = conversion.base.TextModel._set_vocab_gpt2
sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, *rest]
convert_hf_to_gguf.main()
