"""kv.prepare and the plan cache behind the plain calls."""
