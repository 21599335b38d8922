"""rmqstore: Apache RocketMQ's broker message store as a Python library."""
from rmqstore._message import Message, MessageExt, PutResult
from rmqstore.config import StoreConfig
from rmqstore.consumer import GetMessageResult, GetMessageStatus
from rmqstore.errors import (
                             CorruptRecordError,
                             CorruptStoreError,
                             DerivedFileError,
                             DiskFullError,
                             ForeignProcessError,
                             FrozenObjectError,
                             InvalidArgumentError,
                             InvalidArgumentTypeError,
                             InvalidTopicError,
                             MessageNotFoundError,
                             MessageTooLargeError,
                             NotRecordStartError,
                             ReentrantCallError,
                             ResourceLimitError,
                             StoreClosedError,
                             StoreError,
                             StoreIOError,
                             StoreLockedError,
                             StoreNotFoundError,
                             StoreReadOnlyError,
)
from rmqstore.store import MessageStore

__version__ = "0.1.0"

__all__ = [
    "MessageStore", "StoreConfig", "Message", "MessageExt", "PutResult", "GetMessageResult",
    "GetMessageStatus", "StoreError", "StoreClosedError", "StoreLockedError", "StoreReadOnlyError",
    "InvalidTopicError", "InvalidArgumentError", "InvalidArgumentTypeError", "MessageTooLargeError",
    "CorruptStoreError", "DerivedFileError", "CorruptRecordError", "MessageNotFoundError", "NotRecordStartError",
    "ReentrantCallError", "StoreIOError", "DiskFullError", "ResourceLimitError",
    "StoreNotFoundError", "ForeignProcessError", "FrozenObjectError",
]
