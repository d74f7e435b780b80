"""The compaction core the store drivers call: checks, rules, plan, decide, commit.

A driver (:mod:`compactstore.store`) opens the transactions; the modules here do the work
inside them. Each compaction path is *plan* (read the snapshot and its versions), *decide*
(pure engines, no database) and *commit* (write the outcome), so the steps can run in one
transaction or in separate ones.
"""
