"""The active context as a domain model: messages, pairs, thinking, media, tokens."""
