"""The bodies of :class:`~compactstore._store.session.Session`'s longer methods, as plain functions.

``Session`` is one class: it keeps each method's signature and docstring, checks what is
quick to check, and hands the rest to a function here, which takes what it needs as
arguments: the session handle (its public attributes, :class:`~compactstore._core.handle.Handle`),
the handle's own state (:class:`.state.HandleState`) and the call's arguments.

- :mod:`.state` — what one handle keeps between calls: its plug-ins and its views.
- :mod:`.writing` — a provider response, a tool result, a reported usage.
- :mod:`.reading` — the provider call's parameters and the wire view, kept step by step.
- :mod:`.history` — rollback, replay and the recorded compactions and breaker.
- :mod:`.compacting` — the compaction calls, memory entries and recall.
"""
