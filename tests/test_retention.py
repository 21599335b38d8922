"""Retention: expired commitlog segments go at the delete hour (by file mtime), never the
active one; CQ files wholly below the new minimum go; min offsets and OFFSET_TOO_SMALL
reflect it."""
import os
import time

import pytest

from rmqstore import GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.maintenance import retention

from conftest import SMALL_INDEX, looping_in_threads

HOUR = 3600


def _store(path, **kw):
    cfg = StoreConfig(commitlog_file_size=4096, consume_queue_entries=4, warm_mapped_file=False,
                      **SMALL_INDEX,
                      file_reserved_time=72, delete_when="04", disk_max_used_space_ratio=100, **kw)
    return MessageStore(path, cfg)


def _fill(s, n=60):
    res = [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(n)]
    s.wait_dispatched(5)
    return res


def _at_hour(hour, days_later=0):
    t = time.localtime()
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday + days_later, hour, 30, 0, 0, 0, -1))


def _age(s, n, seconds_old, now):
    for seg in s.commitlog.segments.segments[:n]:
        os.utime(seg.path, (now - seconds_old, now - seconds_old))


def test_expired_segments_go_at_delete_hour(tmp_path):
    with _store(tmp_path) as s:
        res = _fill(s)
        segs = s.commitlog.segments.segments
        assert len(segs) >= 5
        now = _at_hour(4, days_later=10)
        _age(s, len(segs), HOUR, now)
        _age(s, 3, 73 * HOUR, now)
        # not the delete hour: nothing happens
        rep = s.clean_expired(now=_at_hour(5, days_later=10))
        assert (rep.reason, rep.segments_deleted) == ("", 0)
        rep = s.clean_expired(now=now)
        assert rep.reason == "time" and rep.segments_deleted == 3
        new_min = 3 * 4096
        assert s.min_phy_offset == rep.min_phy_offset == new_min
        assert not os.path.exists(segs[0].path) and os.path.exists(segs[3].path)
        first_left = next(i for i, r in enumerate(res) if r.phy_offset >= new_min)
        assert s.min_offset("Ret", 0) == first_left
        assert rep.consume_queue_files_deleted == first_left // 4
        r = s.get_messages("Ret", 0, 0)
        assert (r.status, r.next_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, first_left)
        r = s.get_messages("Ret", 0, first_left, 1)
        assert r.status == GetMessageStatus.FOUND and r.messages[0].phy_offset == res[first_left].phy_offset
    with _store(tmp_path) as s:       # survives a reopen
        assert s.min_phy_offset == new_min and s.min_offset("Ret", 0) == first_left


def test_never_the_active_segment_and_disk_pressure(tmp_path, monkeypatch):
    with _store(tmp_path) as s:
        _fill(s, 30)
        n = len(s.commitlog.segments.segments)
        now = time.time()
        _age(s, n, 1000 * HOUR, now)
        monkeypatch.setattr(retention, "disk_used_ratio", lambda path: 100.0)
        rep = s.clean_expired(now=_at_hour(12))     # not the delete hour, but the disk is full
        assert rep.reason == "disk" and rep.segments_deleted == min(n - 1, retention.BATCH)
        assert len(s.commitlog.segments.segments) == n - rep.segments_deleted
        rep = s.clean_expired(now=_at_hour(12))
        assert len(s.commitlog.segments.segments) == 1        # the active one stays
        last = s.put(Message("Ret", b"after"), queue_id=0)
        assert s.get_by_offset(last.phy_offset).body == b"after"


def test_young_segments_stay(tmp_path):
    with _store(tmp_path) as s:
        _fill(s, 30)
        now = _at_hour(4, days_later=1)
        _age(s, len(s.commitlog.segments.segments), 10 * HOUR, now)
        assert s.clean_expired(now=now).segments_deleted == 0


@pytest.mark.parametrize("when,hour,hit", [("04", 4, True), ("04;05", 5, True), ("04", 3, False)])
def test_delete_hour(when, hour, hit):
    assert retention.is_delete_hour(when, _at_hour(hour)) == hit


def test_a_scan_goes_on_past_segments_deleted_under_it(tmp_path):
    """A scan whose segments retention deletes goes on at the new minimum offset: it
    used to end there silently, as though the newer segments held nothing."""
    with _store(tmp_path) as s:
        res = _fill(s)
        it = s.scan()
        first = next(it)
        now = _at_hour(4, days_later=10)
        _age(s, len(s.commitlog.segments.segments), HOUR, now)
        _age(s, 3, 73 * HOUR, now)
        assert s.clean_expired(now=now).segments_deleted == 3
        rest = [m.phy_offset for m in it]
    # what the scan held already (its first run), then every message from the new minimum
    assert first.phy_offset == res[0].phy_offset
    kept = [r.phy_offset for r in res if r.phy_offset >= 3 * 4096]
    assert rest[len(rest) - len(kept):] == kept
    assert all(p < 3 * 4096 for p in rest[:len(rest) - len(kept)])


def test_reads_racing_retention_never_find_the_store_closed(tmp_path):
    """Reads of consume queues and the index in other threads while clean_expired deletes
    the oldest segments under them: a read that met a file just deleted (a commitlog or
    consume-queue segment) raised StoreClosedError ("segment is closed") on a store still
    open. Now it runs again once the deletes are done, on what is left."""
    cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, index_slots=100, index_entries=400,
                      warm_mapped_file=False, file_reserved_time=0)
    with MessageStore(tmp_path / "s", cfg) as s:
        reads = [lambda: s.read_queue_columns("Ret", 0, 0, 50), lambda: s.consume_queue_entries("Ret", 0, 0, 50),
                 lambda: s.query_keys("Ret", ["k5", "k900"]),
                 lambda: s.offset_by_time("Ret", 0, int(time.time() * 1000)),
                 lambda: s.get_messages("Ret", 0, 0, 32)]
        with looping_in_threads(reads) as errors:
            for i in range(30):
                for j in range(200):
                    s.put(Message("Ret", b"y" * 200, keys=[f"k{i * 200 + j}"]), queue_id=0)
                s.wait_dispatched()
                s.clean_expired(now=_at_hour(4, days_later=30))   # a deleteWhen hour
        assert errors == []
        assert s.max_offset("Ret", 0) == 6_000 and s.min_offset("Ret", 0) > 0


def test_the_logics_flusher_outlives_retention(tmp_path):
    """clean_expired closed consume-queue and index files without the logics lock the
    background flusher holds while it flushes them, so the flusher met a closed file,
    died of StoreClosedError, and from then on nothing flushed the consume queues, index,
    checkpoint or committed consumer offsets. Now retention takes that lock: the flusher
    lives on and an offset committed after the race reaches the disk."""
    import json
    import threading

    cfg = StoreConfig(commitlog_file_size=1 << 16, consume_queue_entries=100, index_slots=100, index_entries=400,
                      warm_mapped_file=False, file_reserved_time=0, flush_cq_interval_ms=1, flush_cq_least_pages=0)
    with MessageStore(tmp_path / "s", cfg) as s:
        for i in range(40):
            for j in range(200):
                s.put(Message("Ret", b"y" * 200, keys=[f"k{i * 200 + j}"]), queue_id=0)
            s.wait_dispatched()
            s.clean_expired(now=_at_hour(4, days_later=30))   # a deleteWhen hour
        assert [t for t in threading.enumerate() if t.name == "rmq-flush-logics" and t.is_alive()]
        s.commit_offset("G", "Ret", 0, 7777)
        deadline = time.monotonic() + 10
        path = tmp_path / "s" / "config" / "consumerOffset.json"
        while time.monotonic() < deadline and not (path.exists() and "7777" in path.read_text()):
            time.sleep(0.01)
        assert json.loads(path.read_text())["offsetTable"]["Ret@G"] == {"0": 7777}


def test_a_segment_deleted_while_the_flusher_walks_the_list_is_passed_over(tmp_path):
    """ASYNC: retention may delete an old segment whose pages the flusher has not synced
    (disk pressure deletes whatever the age). A flusher that read the segment list before
    the delete met the closed segment: StoreClosedError, which ended the flusher thread
    (and, with flusher errors failing the store, turned it read-only). A deleted segment
    needs no flush: it is passed over and the ones after it are flushed."""
    cfg = StoreConfig(commitlog_file_size=4096, consume_queue_entries=4, warm_mapped_file=False, **SMALL_INDEX,
                      flush_mode="async", flush_interval_ms=1 << 30, flush_thorough_interval_ms=1 << 30)
    with MessageStore(tmp_path / "s", cfg) as s:
        res = [s.put(Message("Ret", b"x" * 300), queue_id=0) for _ in range(30)]
        s.wait_dispatched()
        segs = list(s.commitlog.segments.segments)
        assert len(segs) > 2 and s.commitlog.flushed_offset < segs[0].size
        segs[0].close()            # retention deletes it after the flusher read the list ...
        s.flush()
        assert s.commitlog.flushed_offset == s.max_phy_offset
        s.commitlog.segments.delete_segments([segs[0]])    # ... and then takes it out of the list
        assert s.get_by_offset(res[-1].phy_offset).body == b"x" * 300
