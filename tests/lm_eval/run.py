"""EleutherAI's lm-evaluation-harness (`local-completions`, a client nobody in this project wrote)
against `moestream serve` on the bundled model, with two tiny local tasks (tests/lm_eval/*.yaml,
nothing downloaded): multiple choice, scored by loglikelihood requests (`echo` + `logprobs` +
`max_tokens: 1`), and temperature-0 `generate_until` requests (`stop`, `max_tokens`). Then checks what
lm-eval recorded against the engine's own references, so the step fails on wrong numbers, not
only on a crash:

- lm-eval exits 0, and every item of both tasks has its responses and metrics;
- every loglikelihood lm-eval got equals `moestream score`'s teacher-forced log-probability of
  the same continuation after the same context (lm-eval's own tokenization) within 1e-3, and its
  acc / acc_norm are what those reference log-probabilities give;
- every generation equals `moestream generate --temperature 0` on the same prompt, cut at the
  task's first stop string (a request's temperature 0 is the plain argmax on both, whatever
  penalty the model's generation_config.json recommends).

Run by `.ci/run` after the `openai` client check, from a venv holding `lm-eval[api]` and
`transformers` (no torch):

    python tests/lm_eval/run.py target/release/moestream [OUTPUT_DIR]
"""

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODEL = "models/moestream-tiny-moe"  # relative to ROOT, where everything runs
CHOICE, GENERATE = "moestream_brown_choice", "moestream_brown_generate"
TOLERANCE = 1e-3


def lm_eval_args(url, output):
    model_args = ",".join(
        [
            f"base_url={url}/v1/completions",
            "model=moestream-tiny-moe",
            f"tokenizer={MODEL}",
            "tokenizer_backend=huggingface",
            "max_retries=1",
            "timeout=120",
        ]
    )
    return [
        sys.executable, "-m", "lm_eval",
        "--model", "local-completions",
        "--model_args", model_args,
        "--tasks", f"{CHOICE},{GENERATE}",
        "--include_path", "tests/lm_eval",
        "--batch_size", "1",  # one prompt a request: moestream takes no batch of several
        "--log_samples",
        "--output_path", output,
    ]  # fmt: skip


def run_lm_eval(binary, output):
    """Starts the server on a free port, runs lm-eval against it, stops the server."""
    server = subprocess.Popen(
        [binary, "serve", "--port", "0", "--context", "512", "--model", MODEL],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    log = []
    try:
        url = None
        for line in server.stderr:
            log.append(line)
            if line.startswith("listening on "):
                url = line.split()[-1]
                break
        assert url, "moestream serve did not start:\n" + "".join(log)
        # Keep reading the server's log so it never blocks on a full pipe.
        threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()
        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("HF_DATASETS_CACHE", os.path.join(output, "hf-datasets-cache"))
        env.setdefault("LMEVAL_LOG_LEVEL", "WARNING")  # the results table still prints
        env.setdefault("TQDM_DISABLE", "1")
        rc = subprocess.run(lm_eval_args(url, output), cwd=ROOT, env=env).returncode
        assert rc == 0, f"lm_eval exited with {rc}; server log:\n" + "".join(log[-40:])
    finally:
        server.terminate()
        server.wait(timeout=30)


def read_samples(output, task):
    files = glob.glob(os.path.join(output, "**", f"samples_{task}_*.jsonl"), recursive=True)
    assert len(files) == 1, f"expected one samples file for {task}, found {files}"
    with open(files[0], encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def read_docs(name):
    with open(os.path.join(ROOT, "tests", "lm_eval", name), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def engine_json(binary, args):
    out = subprocess.run([binary, *args, "--model", MODEL, "--json"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"moestream {args[0]} failed: {out.stderr}"
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def encode_pair(tokenizer, context, continuation):
    """lm-eval's TemplateLM._encode_pair: trailing spaces of the context go to the continuation;
    the continuation's tokens are those of context + continuation after the context's."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    n_context = len(tokenizer(context, add_special_tokens=False).input_ids)
    return whole, n_context


def check_choice(binary, tokenizer, samples, results):
    docs = read_docs("brown_choice.jsonl")
    assert sorted(s["doc_id"] for s in samples) == list(range(len(docs))), "items missing from the choice task"
    worst, right, right_norm = 0.0, 0, 0
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        doc = docs[s["doc_id"]]
        args = [s["arguments"][f"gen_args_{i}"] for i in range(len(doc["choices"]))]
        assert [(a["arg_0"], a["arg_1"]) for a in args] == [(doc["context"], c) for c in doc["choices"]], s["arguments"]
        assert len(s["resps"]) == len(doc["choices"]), s["resps"]
        reference = []
        for a, resp in zip(args, s["resps"]):
            got = float(resp[0][0])
            assert math.isfinite(got), resp
            whole, n_context = encode_pair(tokenizer, a["arg_0"], a["arg_1"])
            [scored] = engine_json(binary, ["score", "--tokens", ",".join(map(str, whole))])
            assert scored["tokens"] == whole, (scored["tokens"], whole)
            # logprobs[i] is that of tokens[i + 1]: the continuation's start at n_context - 1.
            expected = sum(scored["logprobs"][n_context - 1 :])
            worst = max(worst, abs(got - expected))
            assert abs(got - expected) <= TOLERANCE, f"{a}: lm-eval {got}, moestream score {expected}"
            reference.append(expected)
        right += max(range(len(reference)), key=reference.__getitem__) == doc["gold"]
        norm = [lp / len(c.encode()) for lp, c in zip(reference, doc["choices"])]
        right_norm += max(range(len(norm)), key=norm.__getitem__) == doc["gold"]
    metrics = results[CHOICE]
    assert abs(metrics["acc,none"] - right / len(docs)) < 1e-9, (metrics, right)
    assert abs(metrics["acc_norm,none"] - right_norm / len(docs)) < 1e-9, (metrics, right_norm)
    return worst


def check_generate(binary, samples, stops):
    docs = read_docs("brown_generate.jsonl")
    assert sorted(s["doc_id"] for s in samples) == list(range(len(docs))), "items missing from the generate task"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(d["prompt"] + "\n" for d in docs))
    try:
        generated = engine_json(binary, ["generate", "--prompt-file", f.name, "--temperature", "0", "-n", "12"])
    finally:
        os.unlink(f.name)
    texts = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        text = generated[s["doc_id"]]["text"]
        cut = min([text.find(x) for x in stops if x in text], default=len(text))
        got = s["resps"][0][0]
        assert got == text[:cut], f"{docs[s['doc_id']]['prompt']!r}: lm-eval got {got!r}, moestream generate {text[:cut]!r}"
        texts.append(got)
    return texts


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/moestream"))
    output = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target/ci/lm_eval"))
    shutil.rmtree(output, ignore_errors=True)
    os.makedirs(output)
    run_lm_eval(binary, output)

    [results_file] = glob.glob(os.path.join(output, "**", "results_*.json"), recursive=True)
    with open(results_file, encoding="utf-8") as f:
        results = json.load(f)["results"]
    import lm_eval
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(ROOT, MODEL))
    worst = check_choice(binary, tokenizer, read_samples(output, CHOICE), results)
    # The task's `until` and the end-of-text string lm-eval adds to it.
    texts = check_generate(binary, read_samples(output, GENERATE), ["\n", ".", tokenizer.eos_token])
    c, g = results[CHOICE], results[GENERATE]
    print(
        f"lm-eval {lm_eval.__version__} local-completions against moestream serve: ok "
        f"(choice acc {c['acc,none']:.2f}, acc_norm {c['acc_norm,none']:.2f}, log-likelihoods within "
        f"{worst:.1e} of `moestream score`; generate exact_match {g['exact_match,first_word']:.2f}, {texts!r})"
    )


if __name__ == "__main__":
    main()
