"""The official `openai` Python client against `moestream serve`: models, chat with and without
streaming, text completions, concurrent requests from threads (each answered as alone), and a
refused request. Run by `.ci/run` after `cargo test`:

    python tests/openai_client.py target/release/moestream
"""

import concurrent.futures
import os
import subprocess
import sys

import openai

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "moestream-tiny-moe")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/moestream"
    server = subprocess.Popen(
        [binary, "serve", "--port", "0", "--context", "256", "--api-key", "sk-local", "--model", MODEL],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = None
        for line in server.stderr:
            if line.startswith("listening on "):
                url = line.split()[-1]
                break
        assert url, "moestream serve did not start"
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-local", max_retries=0)

        models = client.models.list()
        assert [m.id for m in models.data] == ["moestream-tiny-moe"], models

        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who won the election?"}]
        reply = client.chat.completions.create(model="moestream-tiny-moe", messages=messages, max_tokens=16, temperature=0)
        text = reply.choices[0].message.content
        assert reply.choices[0].message.role == "assistant"
        assert reply.choices[0].finish_reason in ("stop", "length"), reply
        assert reply.usage.completion_tokens >= 1 and reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

        stream = client.chat.completions.create(
            model="moestream-tiny-moe", messages=messages, max_tokens=16, temperature=0, stream=True
        )
        pieces, finish = [], None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert "".join(pieces) == text, (pieces, text)
        assert finish == reply.choices[0].finish_reason

        completion = client.completions.create(model="moestream-tiny-moe", prompt="The jury said", max_tokens=8, temperature=0)
        assert completion.choices[0].text and completion.usage.completion_tokens <= 8

        # Six threads at once, answered together (`--parallel` 4 by default), each reply the
        # one it gets alone at temperature 0.
        questions = [f"Tell me about the {w} river." for w in ("long", "old", "cold", "wide", "slow", "last")]

        def ask(question, stream=False):
            chat = [{"role": "user", "content": question}]
            if not stream:
                r = client.chat.completions.create(model="moestream-tiny-moe", messages=chat, max_tokens=12, temperature=0)
                return r.choices[0].message.content
            chunks = client.chat.completions.create(
                model="moestream-tiny-moe", messages=chat, max_tokens=12, temperature=0, stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        alone = [ask(q) for q in questions]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(questions)) as pool:
            together = list(pool.map(lambda iq: ask(iq[1], stream=iq[0] % 2 == 1), enumerate(questions)))
        assert together == alone, (together, alone)

        try:
            client.chat.completions.create(model="moestream-tiny-moe", messages=[{"role": "user", "content": "word " * 400}])
            raise AssertionError("a prompt over the context must be refused")
        except openai.BadRequestError as e:
            assert e.code == "context_length_exceeded", e

        try:
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
            raise AssertionError("a wrong API key must be refused")
        except openai.AuthenticationError:
            pass
        print(f"openai client {openai.__version__} against moestream serve: ok ({text!r})")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
