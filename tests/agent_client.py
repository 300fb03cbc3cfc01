"""An agent framework nobody here wrote, pydantic-ai, against `moestream serve`: an agent with a
tool and a structured output type (a pydantic model) runs its loop on the bundled model through
Qwen3's real chat template. pydantic-ai asks for the output as a call of its `final_result` tool
with `tool_choice: "required"`, so the call comes from constrained decoding (the model is far too
small to write one freely); if the model calls the agent's own tool first, pydantic-ai runs it
and sends the result back. Run by `.ci/run` after the `openai` client check:

    python tests/agent_client.py target/release/moestream
"""

import os
import sys
import typing

import pydantic
from pydantic_ai import Agent
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from openai_client import start  # noqa: E402 (a sibling script: the server's start)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "fixtures", "chat_templates", "Qwen-Qwen3-0.6B.jinja")


class Verdict(pydantic.BaseModel):
    verdict: typing.Literal["guilty", "not guilty"]
    votes: pydantic.conint(ge=0, le=12)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/moestream"
    server, url = start(binary, "--context", "2048", "--chat-template", TEMPLATE)
    try:
        model = OpenAIChatModel("moestream-tiny-moe", provider=OpenAIProvider(base_url=url + "/v1", api_key="sk-local"))
        agent = Agent(model, output_type=Verdict, model_settings={"max_tokens": 300, "seed": 3})
        counted = []

        @agent.tool_plain
        def count_votes(room: typing.Literal["jury room", "court"]) -> int:
            """Counts the votes cast in a room."""
            counted.append(room)
            return 9

        result = agent.run_sync("What did the jury decide?")
        assert isinstance(result.output, Verdict), result.output
        calls = [p.tool_name for m in result.all_messages() for p in getattr(m, "parts", []) if isinstance(p, ToolCallPart)]
        assert calls and calls[-1] == "final_result", calls
        print(f"pydantic-ai agent against moestream serve: ok ({result.output!r}, tool calls {calls})")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
