"""An OpenAI Agents SDK agent (`openai-agents`) with a function tool as the SDK makes it by
default — strict — runs a tool loop through `cachet serve`'s chat completions: the first turn
must call (tool_choice `required`), the SDK runs the tool and, as it does by default, resets
tool_choice to `auto` for the next turn, which then sends the strict tool under `auto` (once a
400; now the arguments are held to the schema once a call opens).

Run by gateway/tests/serve/api_fields.rs with BASE_URL and KEY. Prints one line per check;
exits non-zero on the first failure.
"""
import asyncio
import os
import sys

from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                    set_tracing_disabled)
from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI

base = os.environ["BASE_URL"]
key = os.environ["KEY"]
set_tracing_disabled(True)
client = AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
cities = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


@function_tool
def get_weather(city: str) -> str:
    """The current weather of a city.

    Args:
        city: The city's name.
    """
    cities.append(city)
    return f"Sunny and 21 degrees in {city}."


check("the SDK's tool is strict by default", get_weather.strict_json_schema is True)
agent = Agent(
    name="weather",
    instructions="Look the weather up with the tool, then answer in one sentence.",
    model=OpenAIChatCompletionsModel(model="smollm2", openai_client=client),
    tools=[get_weather],
    model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
)
check("the SDK resets tool_choice after a call (so the next turn is auto)", agent.reset_tool_choice is True)


async def main():
    try:
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        turns = len(result.raw_responses)
        check("two turns or more: the tool's call, then an answer", turns >= 2, str(turns))
        check("the final answer is text", isinstance(result.final_output, str) and result.final_output != "",
              repr(result.final_output))
    except MaxTurnsExceeded:
        # Every turn was served (a refusal would have raised BadRequestError): the small model
        # kept calling under auto, each call within the strict schema (the SDK parsed it).
        check("every turn served; the model kept calling under auto", len(cities) >= 2, str(cities))
    check("the tool ran with a city", len(cities) >= 1 and all(isinstance(c, str) and c for c in cities),
          str(cities))


asyncio.run(main())
print("all checks passed")
