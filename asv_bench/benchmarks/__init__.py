"""asv suites for rmqstore; peers (sqlite3, LMDB, struct+mmap) run as sibling classes."""
