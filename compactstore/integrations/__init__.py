"""Integrations with agent frameworks, each behind its own extra and imported only when used.

- :mod:`compactstore.integrations.langchain`: ``CompactStoreMiddleware``, a LangChain v1
  agent middleware (extra ``langchain``).
- :mod:`compactstore.integrations.pydantic_ai`: ``CompactHistory``, a pydantic-ai capability
  (extra ``pydantic-ai``).
- :mod:`compactstore.integrations.google_adk`: ``CompactPlugin``, a Google ADK runner plug-in
  (extra ``google-adk``).
"""
