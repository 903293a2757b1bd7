"""The framework adapters' example kinds (workers.frameworks): ``pydantic_ai_demo``, ``openai_agents_demo``."""
