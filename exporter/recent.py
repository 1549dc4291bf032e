"""``Recent``: a function's results for its last few inputs.

A memo, not state a caller can see: a result is the function's for those inputs whether
it was made now or found here. The page parser, the sources and the plan cache hand back
the same objects while nothing changed, so a poll's check is a few ``is`` tests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class Recent(Generic[_T]):
    """The results of a function for its last few inputs. An input matches when it is the
    same object, else when it is equal: an input rebuilt equal still matches. Some figures
    are worked out from the deployment alone, which changes only when vLLM or the sidecar
    restarts; redoing them cost ~45 µs a poll. A few entries, not one: pollers in one
    process each find theirs."""

    def __init__(self, size: int = 8) -> None:
        self._entries: deque[tuple[tuple[object, ...], _T]] = deque(maxlen=size)

    def get(self, key: tuple[object, ...], make: Callable[[], _T]) -> _T:
        for held, value in self._entries:
            if all(a is b or a == b for a, b in zip(held, key, strict=True)):
                return value
        value = make()
        self._entries.append((key, value))
        return value
