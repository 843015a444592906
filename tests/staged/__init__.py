"""The staged (bulk-copy) load kernel."""
