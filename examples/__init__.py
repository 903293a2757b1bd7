"""Demo and example content, installed only with ``RUNS_EXAMPLES=1`` (``make run`` sets it).

- ``examples.agents``: ``research``, ``research_many`` and ``research_brief``, which work offline;
- ``examples.crm`` (app label ``crm``): the demo CRM, its ``crm_update`` kind and its Django task;
- ``examples.deploys`` (app label ``deploys``): the pretend infrastructure of the ``deploy_app`` saga;
- ``examples.frameworks``: ``pydantic_ai_demo`` and ``openai_agents_demo``, where their extra is installed.

Production settings leave them out: their kinds would be open to every
tenant, and ``manage.py check --deploy`` warns when they are on with DEBUG off.
"""
