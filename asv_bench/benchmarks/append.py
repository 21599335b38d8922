"""Append: put in a loop, put_batch, put_columns, 16 KiB bodies; the peers write the same workload."""
from rmqstore.bench import TAGS

from .peers import TOPIC, Lmdb, PeerCase, Sqlite, StoreCase, StructMmap

BODY_SIZES = [128, 16384]


class Put(StoreCase):
    params = [BODY_SIZES]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size)

    def time_put(self, body_size):
        put = self.store.put
        for m in self.msgs:
            put(m)


class PutBatch(StoreCase):
    params = [[128], [64, 1024]]
    param_names = ["body_size", "batch"]

    def setup(self, body_size, batch):
        self.make(body_size)

    def time_put_batch(self, body_size, batch):
        put_batch, msgs = self.store.put_batch, self.msgs
        for i in range(0, len(msgs), batch):
            put_batch(msgs[i:i + batch])


class PutColumns(StoreCase):
    """The same workload as columns (bodies, one tag, a key each) in chunks of ``chunk``
    rows: no Python object per message."""
    params = [BODY_SIZES, [10_000, 100_000]]
    param_names = ["body_size", "chunk"]

    def setup(self, body_size, chunk):
        self.make(body_size)
        self.bodies = [m.body for m in self.msgs]
        self.keys = [m.keys[0] for m in self.msgs]

    def time_put_columns(self, body_size, chunk):
        put_columns, bodies, keys = self.store.put_columns, self.bodies, self.keys
        for i in range(0, len(bodies), chunk):
            put_columns(TOPIC, bodies[i:i + chunk], tags=TAGS, keys=keys[i:i + chunk])


class _PeerWrite(PeerCase):
    params = [BODY_SIZES]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size)

    def time_write(self, body_size):
        self.system.write(self.data)


class SqliteWrite(_PeerWrite):
    peer = Sqlite


class LmdbWrite(_PeerWrite):
    peer = Lmdb


class StructMmapWrite(_PeerWrite):
    peer = StructMmap


class BodyCrc:
    """BODYCRC of 64 MiB of bodies: the carry-less-multiply CRC-32 every put and check
    uses, against zlib's (the obvious Python choice), in the same run."""
    params = [BODY_SIZES]
    param_names = ["body_size"]

    def setup(self, body_size):
        import os
        self.bodies = [os.urandom(body_size)] * ((64 << 20) // body_size)

    def time_rmqstore_crc(self, body_size):
        from rmqstore._record import crc32_body
        for b in self.bodies:
            crc32_body(b)

    def time_zlib_crc(self, body_size):
        import zlib
        for b in self.bodies:
            zlib.crc32(b)
