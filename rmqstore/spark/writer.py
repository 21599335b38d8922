"""``df.write.format("rocketmq").save(dir)``: a DataFrame into RocketMQ stores.

Each task writes its rows into a store of its own with ``MessageStore.put_arrow`` (the
columns go to the append kernel with no Python object per row; consume queues and index
files built by the store's dispatcher, so every store is byte-compatible with a broker's),
first under ``dir/_temporary/<job>/``; the driver's commit moves the stores to
``dir/part-<task>-<job>`` (``mode("overwrite")`` first removes the stores an earlier
write left in ``dir``, and refuses a ``dir`` holding any other store) and writes
``dir/_SUCCESS``: JSON ``{"stores": {name: [messages, commitlog bytes]}}`` of the
stores this job wrote, as Hadoop's S3A committers put a summary there
(``jobs.write`` reports it without reading the stores back); an abort removes them.
``mode("error")`` / ``mode("ignore")`` are ``jobs.write``'s (Spark's Python data sources
take only append and overwrite).

Columns are the source's (``batch.arrow_schema()``): ``topic`` and ``body`` are required;
``queue_id`` (null: the store's round robin per topic), ``tags``, ``keys``, ``uniq_key``,
``properties``, ``flag``, ``sys_flag``, ``born_timestamp``, ``born_host`` and
``reconsume_times`` are used when present (each row stored as ``put`` stores the Message
of these fields, see ``put_arrow``); the columns a store assigns (``store``,
``queue_offset``, ``phy_offset``, ``store_size``, ``msg_id``, ``body_crc``,
``store_timestamp``, ``store_host``) are ignored. Options: StoreConfig fields in camelCase
(``commitlogFileSize``, ``indexSlots``, ``messageVersion``, ``storeHost``,
``strictTopicNames``...), RocketMQ's defaults otherwise, but for ``warmMappedFile`` (false
here), ``flushIntervalMs`` (100 here) and ``backgroundDispatch`` (false here; see
``store_config``).
"""
import contextlib
import dataclasses
import json
import logging
import os
import re
import uuid

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from rmqstore import MessageStore, StoreConfig
from rmqstore.arguments import decimal_int, path_arg
from rmqstore.errors import InvalidArgumentError, StoreLockedError
from rmqstore.files import lock_writer, remove_entries, remove_if_empty, remove_stale, write_atomic
from rmqstore.spark.options import check_options
from rmqstore.spark.stores import enclosing_store, write_store_id

log = logging.getLogger(__name__)
REQUIRED = ("topic", "body")
ASSIGNED = ("store", "queue_offset", "phy_offset", "store_size", "msg_id", "body_crc", "store_timestamp",
            "store_host")


BULK = dict(warm_mapped_file=False, flush_interval_ms=100, background_dispatch=False)


def store_config(options):
    """A StoreConfig from the options naming its fields in camelCase, case-insensitively
    (``path`` aside, another option is an InvalidArgumentError), with BULK's defaults: a
    task writes its store in one go, so faulting pages in as it writes costs less than a
    background thread faulting them ahead and a next segment made ahead, most often removed
    unused at close; flushing every 100 ms sends the pages to disk while the task writes,
    leaving little for close to sync; and the task's own thread builds the consume queues
    and index after each batch (write_store), with the batch still in the CPU's caches and
    no reput thread to wake per append and hand the GIL to (in a Spark worker, 0.89 ms of
    CPU per MB of commitlog instead of 1.10, Arrow's reading of the batches aside)."""
    defaults = StoreConfig(**BULK)
    fields = {name.replace("_", ""): name for name in StoreConfig.names()}
    check_options(options, ("path", *(_camel(n) for n in StoreConfig.names())), "writer")
    changes = {}
    for key, value in options.items():
        name = fields.get(key.lower())
        if name is not None:
            kind, value = type(getattr(defaults, name)), str(value)   # Spark passes every value as a string
            if kind is bool:
                if value.lower() not in ("true", "false"):
                    raise InvalidArgumentError(f"rocketmq writer: option {key} must be true or false, not {value!r}")
                changes[name] = value.lower() == "true"
            elif kind is int:
                changes[name] = decimal_int(value)
                if changes[name] is None:
                    raise InvalidArgumentError(f"rocketmq writer: option {key}={value!r} is not an integer")
            else:
                changes[name] = value
    try:
        return defaults.with_(**changes)
    except InvalidArgumentError as e:   # it names the field (or not): name the option
        bad = [n for n in changes if str(e).startswith(n + " ")] or list(changes)
        raise InvalidArgumentError(f"rocketmq writer: option {', '.join(map(_camel, bad))}: {e}") from None


def _camel(name):
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def check_schema(schema, source_schema):
    """The writable columns of Spark ``schema``: every field one of the source's, with its
    type (an array or map that cannot hold null is one that can); topic and body present.
    InvalidArgumentError names the column at fault."""
    full = {f.name: f.dataType for f in source_schema.fields}
    for f in schema.fields:
        if f.name not in full:
            raise InvalidArgumentError(f"rocketmq writer: unknown column {f.name!r}; the columns are {list(full)}")
        if f.dataType.simpleString() != full[f.name].simpleString():   # whether null may be in it aside
            raise InvalidArgumentError(f"rocketmq writer: column {f.name!r} must be {full[f.name].simpleString()}, "
                                       f"not {f.dataType.simpleString()}")
    missing = [c for c in REQUIRED if c not in schema.fieldNames()]
    if missing:
        raise InvalidArgumentError(f"rocketmq writer: column(s) {missing} are required")
    return tuple(c for c in schema.fieldNames() if c not in ASSIGNED)


SUCCESS = "_SUCCESS"


@dataclasses.dataclass
class Written(WriterCommitMessage):
    store: str
    messages: int
    nbytes: int = 0


def write_store(path, config, batches):
    """Write the rows of Arrow ``batches`` into a new store at ``path``, one ``put_arrow``
    per batch (columns straight to the append kernel, rows in order, queue ids per row),
    which with ``dispatch`` builds the batch's consume-queue and index entries in this
    thread from the columns it wrote, without reading the records back (0.06 ms of CPU
    per MB of commitlog less); ``wait_dispatched`` after each builds any it left (a batch
    put as Messages, a consumer's error). Returns (messages,
    commitlog bytes of their records). A row with no topic or body is an
    InvalidArgumentError naming it."""
    count = nbytes = 0
    with MessageStore(path, config) as store:
        write_store_id(path, config.file_mode)
        for rb in batches:
            for name in REQUIRED:
                col = rb.column(name)
                if col.null_count:
                    row = col.is_null().index(True).as_py()
                    raise InvalidArgumentError(f"rocketmq writer: row {row} has no {name}")
            nbytes += int(store.put_arrow(rb, dispatch=True)["size"].sum())
            count += rb.num_rows
            store.wait_dispatched()
    return count, nbytes


def stores_in(path):
    """The store directories directly under ``path``."""
    return [os.path.join(path, d) for d in sorted(os.listdir(path))
            if os.path.isdir(os.path.join(path, d, "commitlog"))]


PART = re.compile(r"part-\d{5,}-[0-9a-f]{12}-[0-9a-f]{6}")   # the name write() gives a task's store


def replace_parts(path):
    """What overwrite removes: the stores under ``path`` this writer wrote (PART names,
    real directories). Any other store there (a broker's, or a link to one) makes it an
    InvalidArgumentError, checked before a task runs: overwrite never deletes a store the
    writer did not make."""
    stores = stores_in(path)
    others = [os.path.basename(p) for p in stores if not PART.fullmatch(os.path.basename(p)) or os.path.islink(p)]
    if others:
        raise InvalidArgumentError(f"rocketmq writer: {path} holds store(s) this writer did not write: {others}; "
                                   "mode overwrite replaces only its own part-* stores (write elsewhere)")
    return stores


@contextlib.contextmanager
def locked(paths, mode):
    """Hold the stores ``paths`` locked as a writer locks them: when a writer or a broker has
    one open (StoreLockedError), none is locked and the block does not run."""
    fds = []
    try:
        for p in paths:
            fds.append(lock_writer(p, mode))
        yield
    finally:
        for fd in fds:
            os.close(fd)


def remove_stores(paths, trash):
    """Remove the stores ``paths`` (the caller holds their locks, see ``locked``), each
    first renamed into the directory ``trash`` (on the same file system), so a kill while
    one is deleted leaves none half there."""
    gone = [os.path.join(trash, os.path.basename(p)) for p in paths]
    os.makedirs(trash, exist_ok=True)
    for p, g in zip(paths, gone, strict=True):
        os.rename(p, g)
    for g in gone:
        remove_entries(g, os.listdir(g))
        os.rmdir(g)


class StoreWriter(DataSourceArrowWriter):
    """One store per task under ``path``; see the module doc."""

    def __init__(self, path, options, overwrite):
        self.path = os.path.abspath(path_arg("path", path))
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise InvalidArgumentError(f"rocketmq writer: {self.path} is not a directory")
        if enclosing_store(self.path):
            raise InvalidArgumentError(f"rocketmq writer: {self.path} is inside the store "
                                       f"{enclosing_store(self.path)}; write the new stores elsewhere")
        self.config = store_config(options)
        self.overwrite = overwrite
        if overwrite and os.path.isdir(self.path):
            replace_parts(self.path)
        self.job = uuid.uuid4().hex[:12]
        self.temp = os.path.join(self.path, "_temporary", self.job)

    def write(self, iterator):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        name = f"part-{ctx.partitionId() if ctx else 0:05d}-{self.job}-{uuid.uuid4().hex[:6]}"
        os.makedirs(self.temp, exist_ok=True)
        path = os.path.join(self.temp, name)
        return Written(path, *write_store(path, self.config, iterator))

    def commit(self, messages):
        """Remove ``_SUCCESS``, then (overwrite) the earlier stores, move the new ones in and
        write ``_SUCCESS`` anew (atomically): killed part way, the directory never holds a
        ``_SUCCESS`` naming other stores than it holds. Every store removed or moved is
        locked meanwhile, so no writer has it open (StoreLockedError, nothing changed, when
        one does)."""
        old = replace_parts(self.path) if self.overwrite else []
        new = [m for m in messages if m is not None and m.messages]
        with locked(old + [m.store for m in new], self.config.file_mode):
            remove_stale(os.path.join(self.path, SUCCESS))
            remove_stores(old, os.path.join(self.temp, "replaced"))
            for m in new:
                os.replace(m.store, os.path.join(self.path, os.path.basename(m.store)))
        written = {os.path.basename(m.store): [m.messages, m.nbytes] for m in new}
        write_atomic(os.path.join(self.path, SUCCESS), json.dumps({"stores": written}).encode(), self.config.file_mode)
        self._clean()

    def abort(self, messages):
        self._clean()

    def _clean(self):
        """Remove the job's temporary directory: each store in it under its lock, but one a
        writer has open (a task still running), which is left where it is."""
        trash = os.path.join(self.temp, "replaced")
        for entry in os.listdir(self.temp) if os.path.isdir(self.temp) else ():
            store = os.path.join(self.temp, entry)
            if store == trash:
                continue
            if not os.path.isdir(store) or os.path.islink(store):   # no store: nobody's lock to take
                os.unlink(store)
                continue
            try:
                with locked([store], self.config.file_mode):
                    remove_stores([store], trash)
            except StoreLockedError:
                log.warning("%s: left in place, a writer has it open", store)
        for d in (trash, self.temp, os.path.dirname(self.temp)):
            remove_if_empty(d)
