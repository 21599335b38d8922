"""What the message browser and the live tail match messages with, and nothing else: a
RocketMQ tag expression (``TagA || TagB``, ``*``) and a content filter, a substring or a
regular expression over the body text, the keys and the properties. No code is evaluated.

Regular expressions run on the ``regex`` package with a timeout: Python's ``re`` cannot be
interrupted once it backtracks (``(a+)+$`` over 30 ``a``s and a ``b`` takes minutes), while
``regex`` gives up after ``timeout`` seconds (TimeoutError). Each field is cut to
FIELD_LIMIT characters and the pattern to PATTERN_LIMIT, so one match costs bounded time
and a page's matching is bounded by its deadline."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import regex

from rmqstore.errors import InvalidArgumentError

FIELD_LIMIT = 64 * 1024   # characters of a body (and of each key or property) matched
PATTERN_LIMIT = 256
FILTER_MODES = ("substring", "regex")


def tag_set(expression: str | None) -> frozenset[str] | None:
    """The tags a RocketMQ subscription expression names (``TagA || TagB``); None for all
    (empty or ``*``)."""
    if expression is None or expression.strip() in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return tags or None


@dataclass
class ContentFilter:
    """A substring or regex matched against a message's body text, KEYS and properties."""
    text: str
    mode: str = "substring"
    ignore_case: bool = False

    def __post_init__(self) -> None:
        if self.mode not in FILTER_MODES:
            raise InvalidArgumentError(f"filter mode must be one of {FILTER_MODES}, not {self.mode!r}")
        if len(self.text) > PATTERN_LIMIT:
            raise InvalidArgumentError(f"filter is {len(self.text)} characters; at most {PATTERN_LIMIT}")
        self._pattern: Any = None
        if self.mode == "regex":
            try:
                self._pattern = regex.compile(self.text, regex.IGNORECASE if self.ignore_case else 0)
            except regex.error as e:
                raise InvalidArgumentError(f"bad regular expression {self.text!r}: {e}") from None
        elif self.ignore_case:
            self.text = self.text.casefold()

    def matches(self, fields: list[str], deadline: float) -> bool:
        """Whether any of ``fields`` holds the filter. TimeoutError once ``deadline``
        (time.monotonic()) has passed in a regex match."""
        for f in fields:
            f = f[:FIELD_LIMIT]
            if self._pattern is None:
                if self.text in (f.casefold() if self.ignore_case else f):
                    return True
            elif self._pattern.search(f, timeout=max(0.001, deadline - time.monotonic())) is not None:
                return True
        return False


def searchable(message: Any) -> list[str]:
    """The text a content filter looks at: the body (as UTF-8, undecodable bytes replaced),
    then every property as ``name=value`` (KEYS, TAGS and UNIQ_KEY among them)."""
    body = bytes(message.body[:FIELD_LIMIT * 4]).decode("utf-8", "replace")
    return [body] + [f"{k}={v}" for k, v in message.properties.items()]


def make_filter(text: str | None, mode: str = "substring", ignore_case: bool = False) -> ContentFilter | None:
    """The content filter a page's ``q``, ``mode`` and ``icase`` give; None without ``q``."""
    return ContentFilter(text, mode, ignore_case) if text else None
