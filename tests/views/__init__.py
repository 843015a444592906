"""kv.copy between cache views."""
