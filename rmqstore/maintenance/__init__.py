"""Store maintenance: verify, rebuild and retention, each given a store's components
(commitlog, consume-queue table, index service, checkpoint, config), never the store."""
