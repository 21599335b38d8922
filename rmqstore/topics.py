"""Topic names: what the store creates (RocketMQ's broker rule) and what it reads."""
import re

from rmqstore.errors import InvalidArgumentError, InvalidTopicError

_BROKER_RULE = re.compile(r"[%|a-zA-Z0-9_-]+")
MAX_TOPIC_BYTES_V1 = 127
MAX_TOPIC_BYTES = 255   # a consume-queue directory name; longer ones cannot exist on disk
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
MAX_GROUP_CHARS = 255   # RocketMQ's Validators.CHARACTER_MAX_LENGTH


def validate_topic(topic, version=1, strict=True):
    """Raise InvalidTopicError unless ``topic`` can be written and become a directory name.

    strict: RocketMQ's broker pattern. Never allowed: empty, '.', '..', '/', NUL, or more
    bytes than the record version or a file name can hold (chosen by encoded length, not
    by UTF-16 characters as RocketMQ 5.3 wrongly does)."""
    if not isinstance(topic, str) or not topic:
        raise InvalidTopicError(f"topic must be a non-empty str, got {topic!r}")
    n = len(topic.encode("utf-8", "surrogatepass"))
    limit = MAX_TOPIC_BYTES_V1 if version == 1 else MAX_TOPIC_BYTES
    if n > limit:
        raise InvalidTopicError(f"topic of {n} UTF-8 bytes exceeds {limit} (message version {version})")
    if topic in (".", "..") or "/" in topic or "\x00" in topic or "\\" in topic:
        raise InvalidTopicError(f"topic {topic!r} cannot be a directory name")
    if strict and not _BROKER_RULE.fullmatch(topic):   # (match: "T\n" would pass, $ matches before a final newline)
        raise InvalidTopicError(f"topic {topic!r} does not match {_BROKER_RULE.pattern}")
    try:
        topic.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidTopicError(f"topic {topic!r} is not valid Unicode") from None


def validate_group(group, strict=True):
    """Raise InvalidArgumentError unless ``group`` (a non-empty str) can name a consumer
    group: at most 255 characters, and with ``strict`` RocketMQ's rule
    (Validators.checkGroup: the topic pattern)."""
    if len(group) > MAX_GROUP_CHARS:
        raise InvalidArgumentError(f"group {group[:32]!r}... of {len(group)} characters exceeds {MAX_GROUP_CHARS}")
    if strict and not _BROKER_RULE.fullmatch(group):
        raise InvalidArgumentError(f"group {group!r} does not match {_BROKER_RULE.pattern}")


def is_safe_dirname(name):
    """Whether topic ``name`` (read from disk: any bytes a record holds) may become a path:
    one component that cannot leave its parent (no ``/``, NUL, ``.`` or ``..``), encodable,
    and short enough for a directory entry (255 bytes)."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        return False
    try:
        return len(name.encode()) <= 255
    except UnicodeEncodeError:
        return False
