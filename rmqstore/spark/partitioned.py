"""Parquet files of one export task, in Spark's Hive layout ``topic=/date=``.

``PartitionedWriter`` splits each Arrow batch by (topic, store date UTC) with one ``take``
(none when the batch holds one partition), buffers each partition's rows and writes them
to a ``pyarrow.parquet.ParquetWriter`` of its own in row groups of exactly
``row_group_rows`` rows (the last one of a file fewer). The buffered batches go to the
writer as one chunked table: no concatenation, no other copy. The files leave out the
partition columns, which Spark reads from the directory names, as its own writers do.

Encoding: dictionary pages only for the low-cardinality columns (``DICTIONARY``); min/max
statistics for every column but the ones no filter prunes by (``NO_STATISTICS``); one
codec for all (``compression``, snappy by default). Memory: a task holding more than
``buffer_bytes`` of unwritten rows writes its largest partition's rows early, as a smaller
row group; at most ``MAX_OPEN`` files are open, a partition met again after its file was
closed continues in a new file.
"""
import datetime
import os

import numpy as np

DICTIONARY = ("store", "tags", "born_host", "store_host")
NO_STATISTICS = ("body", "keys", "properties", "uniq_key")
MAX_OPEN = 128
_PATH_ESCAPE = frozenset(map(chr, range(0x20))) | frozenset('"#%\'*/:=?\\\x7f{[]^')
_US_PER_DAY = 86_400_000_000
_EPOCH = datetime.date(1970, 1, 1)


def spark_path_name(value: str) -> str:
    """A partition value as Spark writes it in a path (ExternalCatalogUtils.escapePathName:
    the listed characters as %XX, the rest verbatim), so Spark's reader gets it back."""
    return "".join(f"%{ord(c):02X}" if c in _PATH_ESCAPE else c for c in value)


def topic_dir(topic: str) -> str:
    """The partition directory name of ``topic``."""
    return f"topic={spark_path_name(topic)}"


def name_max(path: str) -> int:
    """The longest file name (bytes) the file system of ``path`` (or of its nearest existing
    parent) takes: NAME_MAX, 255 on Linux's."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return os.pathconf(path, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


class PartitionedWriter:
    """Files ``out_dir/topic=T/date=D/part-<index>-<n>.parquet`` of the batches written (of
    ``batch.arrow_schema()``'s columns, topic and store_timestamp among them); each file is
    made under ``out_dir/_temporary/<index>/`` and moved into place when complete. The rows
    of a topic whose directory name would be over ``name_max`` bytes are not written: the
    topic is added to ``too_long`` for the driver to refuse the export."""

    def __init__(self, out_dir: str, index: int, schema, row_group_rows: int, compression: str = "snappy",
                 buffer_bytes: int = 512 << 20, name_max: int = 255) -> None:
        self.out_dir, self.index, self.name_max = out_dir, index, name_max
        self.too_long: set[str] = set()
        self.tmp = os.path.join(out_dir, "_temporary", str(index))
        self.schema = schema.remove(schema.get_field_index("topic"))
        self.row_group_rows, self.buffer_bytes = row_group_rows, buffer_bytes
        self.options = dict(compression=compression,
                            use_dictionary=[c for c in DICTIONARY if c in self.schema.names],
                            write_statistics=[c for c in self.schema.names if c not in NO_STATISTICS])
        self.buffers: dict[tuple[str, int], list] = {}   # partition -> batches not yet written
        self.rows: dict[tuple[str, int], int] = {}
        self.nbytes: dict[tuple[str, int], int] = {}
        self.open: dict[tuple[str, int], tuple] = {}    # partition -> (writer, temp path, final path)
        self.files: dict[tuple[str, int], int] = {}     # partition -> files made
        self.made = 0
        self.buffered = 0

    def write(self, rb) -> None:
        """Buffer ``rb``'s rows by partition, writing every row group that is complete."""
        import pyarrow as pa
        import pyarrow.compute as pc
        if not rb.num_rows:
            return
        topics = pc.dictionary_encode(rb.column("topic"))
        days = rb.column("store_timestamp").cast(pa.int64()).to_numpy() // _US_PER_DAY
        key = topics.indices.to_numpy().astype(np.int64) * (int(days.max() - days.min()) + 1) + (days - days.min())
        uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        rest = rb.drop_columns(["topic"])
        if len(uniq) > 1:
            order = np.argsort(inverse, kind="stable")
            rest = rest.take(pa.array(order))
        names = topics.dictionary.to_pylist()
        ti = topics.indices.to_numpy()
        row_bytes = rest.get_total_buffer_size() / rb.num_rows   # slices share the buffers: share it out
        start = 0
        for k, n in zip(first.tolist(), np.bincount(inverse).tolist(), strict=True):
            topic = names[ti[k]]
            if len(topic_dir(topic).encode()) > self.name_max:
                self.too_long.add(topic)
            else:
                self._add((topic, int(days[k])), rest.slice(start, n), int(n * row_bytes))
            start += n

    def _add(self, part, rb, nbytes: int) -> None:
        self.buffers.setdefault(part, []).append(rb)
        self.rows[part] = self.rows.get(part, 0) + rb.num_rows
        self.nbytes[part] = self.nbytes.get(part, 0) + nbytes
        self.buffered += nbytes
        if self.rows[part] >= self.row_group_rows:
            self._flush(part, self.rows[part] // self.row_group_rows * self.row_group_rows)
        while self.buffered > self.buffer_bytes:
            big = max(self.nbytes, key=self.nbytes.__getitem__)
            self._flush(big, self.rows[big])

    def _flush(self, part, rows: int) -> None:
        """Write the first ``rows`` buffered rows of ``part`` (row groups of row_group_rows)."""
        import pyarrow as pa
        table = pa.Table.from_batches(self.buffers[part], self.schema)
        self._writer(part).write_table(table.slice(0, rows), row_group_size=self.row_group_rows)
        left = table.slice(rows)
        self.buffers[part] = left.to_batches()
        kept = self.nbytes[part] * left.num_rows // max(1, self.rows[part])
        self.buffered += kept - self.nbytes[part]
        self.rows[part], self.nbytes[part] = left.num_rows, kept

    def _writer(self, part):
        if part in self.open:
            return self.open[part][0]
        import pyarrow.parquet as pq
        if len(self.open) >= MAX_OPEN:
            self._close(next(iter(self.open)))
        n = self.files.get(part, 0)
        self.files[part] = n + 1
        name = f"part-{self.index:05d}-{n}.parquet"
        topic, day = part
        final = os.path.join(self.out_dir, topic_dir(topic),
                             f"date={_EPOCH + datetime.timedelta(days=day)}", name)
        self.made += 1
        tmp = os.path.join(self.tmp, f"{self.made}.parquet")
        os.makedirs(self.tmp, exist_ok=True)
        self.open[part] = (pq.ParquetWriter(tmp, self.schema, **self.options), tmp, final)
        return self.open[part][0]

    def _close(self, part) -> None:
        writer, tmp, final = self.open.pop(part)
        writer.close()
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(tmp, final)

    def close(self) -> None:
        """Write every buffered row and move the files into place."""
        for part, rows in list(self.rows.items()):
            if rows:
                self._flush(part, rows)
        for part in list(self.open):
            self._close(part)
