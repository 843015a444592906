"""``BoundedMemo``: kvnumba's one memo of values that are cheap to make again, kept to a bounded size."""
from typing import Any


class BoundedMemo(dict):
    """A dict that starts over once it holds ``limit`` entries. A workload repeats a few keys (its
    geometries, its layers), so a memo past its limit is one fed keys that do not come back: clearing it
    costs one rebuild of each key that does."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key`` (clearing the memo first if it is full) and return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
