"""The LLM agent runtime: chat model adapters, tools, the tool-calling loop, artifacts.

from workers.llm import run_agent_loop, tool, ToolError

@tool
def search_docs(query: str, limit: int = 5) -> list[dict]:
    \"\"\"Search the handbook; returns the best matching documents.\"\"\"
    ...

@agent("helpdesk")
def helpdesk(ctx: RunContext, data: dict) -> dict:
    result = run_agent_loop(ctx, system="Answer from the handbook.", user=data["question"],
                            tools=[search_docs])
    return result.to_dict()
"""

from workers.llm.loop import AgentResult, run_agent_loop
from workers.llm.providers import ChatModel, Completion, OpenAIChat, ScriptedModel, choose_model
from workers.llm.tools import Tool, ToolError, tool

__all__ = [
    "AgentResult",
    "ChatModel",
    "Completion",
    "OpenAIChat",
    "ScriptedModel",
    "Tool",
    "ToolError",
    "choose_model",
    "run_agent_loop",
    "tool",
]
