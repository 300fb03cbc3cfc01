"""The official `openai` Python client against `moestream serve`: models, chat with and without
streaming, text completions, concurrent requests from threads (each answered as alone), a
refused request, the SDK's tool-calling loop with a forced call, and `chat.completions.parse`
with a pydantic model (structured outputs). Run by `.ci/run` after `cargo test`:

    python tests/openai_client.py target/release/moestream
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import typing

import openai
import pydantic

MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "moestream-tiny-moe")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/moestream"
    server, url = start(binary, "--context", "256")
    try:
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


def start(binary, *args):
    """`moestream serve` on the bundled model with `args` (API key `sk-local`): the process and
    its URL."""
    server = subprocess.Popen(
        [binary, "serve", "--port", "0", "--api-key", "sk-local", "--model", MODEL, *args],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in server.stderr:
        if line.startswith("listening on "):
            return server, line.split()[-1]
    server.kill()
    raise AssertionError("moestream serve did not start")


class Verdict(pydantic.BaseModel):
    """What `parse` asks for: its JSON schema (strict) goes to the server as response_format."""

    verdict: typing.Literal["guilty", "not guilty"]
    votes: pydantic.conint(ge=0, le=12)


def get_weather(city):
    """The tool the loop below runs."""
    return {"city": city, "sky": "clear"}


def tools_and_structured_outputs(binary):
    """The SDK's tool-calling loop (a forced call, executed here, its result sent back) and
    `chat.completions.parse` with a pydantic model, on the bundled model through Qwen3's real
    chat template (which writes Hermes `<tool_call>` calls); with random-ish small-model weights
    the shapes come from constrained decoding."""
    template = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "chat_templates", "Qwen-Qwen3-0.6B.jinja")
    server, url = start(binary, "--context", "2048", "--chat-template", template)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-local", max_retries=0)
        tools = [{
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 24}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        }]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = client.chat.completions.create(
            model="moestream-tiny-moe", messages=messages, tools=tools, tool_choice="required", max_tokens=300, seed=1
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls", first
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather", call
        result = get_weather(**json.loads(call.function.arguments))
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        second = client.chat.completions.create(
            model="moestream-tiny-moe", messages=messages, tools=tools, tool_choice="none", max_tokens=16, temperature=0
        )
        assert second.choices[0].message.tool_calls is None and second.choices[0].message.content, second
        assert second.usage.prompt_tokens > first.usage.prompt_tokens, "the tool result went into the prompt"

        parsed = client.chat.completions.parse(
            model="moestream-tiny-moe",
            messages=[{"role": "user", "content": "What did the jury decide?"}],
            response_format=Verdict,
            max_tokens=300,
            seed=2,
        )
        verdict = parsed.choices[0].message.parsed
        assert isinstance(verdict, Verdict), parsed
        return call.function.arguments, verdict
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
    arguments, verdict = tools_and_structured_outputs(sys.argv[1] if len(sys.argv) > 1 else "target/release/moestream")
    print(f"openai client tool loop and parse: ok (get_weather({arguments}), {verdict!r})")
