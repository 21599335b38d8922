"""The bounds every console answer keeps, so no request can hang the server: page sizes,
records a filtered page looks at, the time a page or a lookup spends."""
from __future__ import annotations

from rmqstore.errors import InvalidArgumentError

MAX_PAGE = 200
DEFAULT_PAGE = 50
SCAN_LIMIT = 20_000     # records a filtered page looks at before it hands back a "continue" cursor
DEADLINE = 0.05         # seconds after a request arrived that its filtered page or key lookup stops
CHUNK = 32              # messages read from a queue at a time (getMessage's transfer limit)


def check_size(size: int) -> None:
    if not 1 <= size <= MAX_PAGE:
        raise InvalidArgumentError(f"page size must be 1..{MAX_PAGE}, not {size}")
