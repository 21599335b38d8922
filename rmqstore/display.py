"""Values as text for people, as the front ends (the rmqstore command, the console) show
them: message data with the characters a terminal acts on escaped, times in local time."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any


def local_time(ms: Any) -> Any:
    """Epoch milliseconds as local ISO-8601 time with its UTC offset (tables and pages; JSON
    keeps the milliseconds); 0 or less (never set) as ``-``."""
    if not isinstance(ms, int) or isinstance(ms, bool) or ms <= 0:
        return "-" if ms == 0 else ms
    try:
        return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return ms


# Characters a terminal acts on instead of showing: C0/C1 controls and DEL (ESC starts the
# sequences that move the cursor, clear the screen, set the title), line and paragraph
# separators, bidirectional overrides, isolates and marks (they reorder what follows), and
# zero-width characters and the byte-order mark (invisible: they make two names look alike).
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def shown(value: Any) -> str:
    """``value`` as text for a table or a line: message data (topics, tags, keys, paths) is
    the sender's, so the characters a terminal would act on are shown as escapes
    (``\\x1b``, ``\\u2028``)."""
    return _UNSHOWN.sub(lambda m: repr(m.group())[1:-1], str(value))
