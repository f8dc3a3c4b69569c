-- The worker's table (java_worker_rows: apart from the Python example's worker_rows, so
-- both can share a database). The fence itself (schema palisade) is installed separately:
-- psql -v ON_ERROR_STOP=1 -f sql/palisade-fence.sql (or palisade fence --store URL --create).
CREATE TABLE IF NOT EXISTS java_worker_rows (
    id         bigserial PRIMARY KEY,
    txn        uuid        NOT NULL,  -- one per transaction
    seq        int         NOT NULL,  -- the row's place in it
    token      bigint      NOT NULL,  -- the fencing token the transaction was admitted with
    writer     text        NOT NULL,  -- the pod
    batch      bigint      NOT NULL,  -- the writer's count of batches under this token
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
