"""The compaction core the store drivers call: checks, rules, plan, decide, commit.

A driver (:mod:`compactstore._store.store` and :mod:`compactstore._store.session`) opens the
transactions; the modules here do the work inside them. Each compaction path is *plan*
(read the snapshot and its versions), *decide* (pure engines, no database) and *commit*
(write the outcome), so the steps can run in one transaction or in separate ones.

- :mod:`.checks` — the caller's arguments, and a message checked on its own before insert.
- :mod:`.pairing` — the pairing and pin rules, pure; used by append and the importers.
- :mod:`.appending` — append: read what the rules need, apply them, write the rows.
- :mod:`.sessions` — open or create a session, import a transcript, list sessions.
- :mod:`.cache` — the active contexts this process read, by session and version.
- :mod:`.compaction` — compaction requests, plan and commit, and imported boundaries.
- :mod:`.recording` — an outcome written as rows; rows read back as the public models.
- :mod:`.replay` — rollback and replay (plan, decide, commit).
- :mod:`.replay_inputs` — the typed inputs recorded with each compaction for replay.
- :mod:`.usage` — calibration from real counts, and a window the overhead fills.
- :mod:`.plugins` — the caller's token counter and memory provider, guarded.
"""
