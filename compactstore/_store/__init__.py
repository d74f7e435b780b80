"""The stores and their sessions: the drivers of every read and write."""
