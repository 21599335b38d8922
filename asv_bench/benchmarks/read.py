"""Reading the commitlog: get_by_offset, scan, decode_batch of whole segments; the peers
scan the same workload."""
from rmqstore import _columns

from .peers import Lmdb, PeerCase, Sqlite, StoreCase, StructMmap


class Read(StoreCase):
    params = [[128, 16384]]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size, fill=True)
        self.offsets = [m.phy_offset for m in self.store.scan()]

    def time_get_by_offset(self, body_size):
        get = self.store.get_by_offset
        for off in self.offsets:
            get(off)

    def time_scan(self, body_size):
        for m in self.store.scan():
            _ = m.body

    def time_decode_batch(self, body_size):
        for seg in self.store.commitlog.segments.segments:
            _columns.decode_batch(seg, 0, seg.wrote_pos)


class _PeerScan(PeerCase):
    params = [[128, 16384]]
    param_names = ["body_size"]

    def setup(self, body_size):
        self.make(body_size, fill=True)

    def time_scan(self, body_size):
        self.system.scan()


class SqliteScan(_PeerScan):
    peer = Sqlite


class LmdbScan(_PeerScan):
    peer = Lmdb


class StructMmapScan(_PeerScan):
    peer = StructMmap
