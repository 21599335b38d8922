"""The dicts of numpy columns that read_queue_columns and query_keys_columns return, typed
key by key (at run time they are plain dicts)."""
from __future__ import annotations

from typing import TypedDict

import numpy as np


class MessageColumns(TypedDict):
    """Messages as numpy columns, a row a message.

    int64 arrays, one value a row: ``phy_offset``, ``store_size``, ``magic``, ``body_crc``,
    ``queue_id``, ``flag``, ``queue_offset``, ``sys_flag``, ``born_timestamp``,
    ``store_timestamp`` (ms since the epoch), ``reconsume_times``,
    ``prepared_transaction_offset``, ``tags_code``, ``born_port``, ``store_port``.
    Bodies, topics and properties, Arrow-style: uint8 ``body_data``, ``topic_data`` and
    ``props_data`` hold every row's bytes end to end, and row i's are
    ``data[offsets[i]:offsets[i+1]]`` with the int64 ``body_offsets``, ``topic_offsets`` and
    ``props_offsets`` (one more than the rows). ``born_addr`` and ``store_addr``: uint8,
    16 bytes a row (an IPv4 address in the first 4). ``count``: the number of rows."""

    phy_offset: np.ndarray
    store_size: np.ndarray
    magic: np.ndarray
    body_crc: np.ndarray
    queue_id: np.ndarray
    flag: np.ndarray
    queue_offset: np.ndarray
    sys_flag: np.ndarray
    born_timestamp: np.ndarray
    store_timestamp: np.ndarray
    reconsume_times: np.ndarray
    prepared_transaction_offset: np.ndarray
    tags_code: np.ndarray
    born_port: np.ndarray
    store_port: np.ndarray
    body_data: np.ndarray
    topic_data: np.ndarray
    props_data: np.ndarray
    body_offsets: np.ndarray
    topic_offsets: np.ndarray
    props_offsets: np.ndarray
    born_addr: np.ndarray
    store_addr: np.ndarray
    count: int


class QueueColumns(MessageColumns):
    """read_queue_columns' rows, in queue order, and ``missing`` (int64): the queue offsets
    whose record could not be read."""

    missing: np.ndarray


class KeyColumns(MessageColumns):
    """query_keys_columns' rows, key by key in the order of the keys given and each key's
    newest first, and ``key`` (int64): the index of the row's key in those keys."""

    key: np.ndarray
