"""Pure compaction engines: (active context, config, now) -> outcome. No I/O here."""
