"""Integrations with agent frameworks, each behind its own extra and imported only when used.

- :mod:`compactstore.integrations.langchain`: ``CompactStoreMiddleware``, a LangChain v1
  agent middleware (extra ``langchain``).
"""
