"""What a process keeps per Bot or per reader, bounded: a dict whose oldest entries go first."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def keep_newest(kept: dict[K, V], key: K, value: V, most: int) -> None:
    """``kept[key] = value`` as the newest entry; the oldest beyond ``most`` entries are dropped."""
    kept.pop(key, None)
    kept[key] = value
    while len(kept) > most:
        del kept[next(iter(kept))]
