-- Version 1 of sql/palisade-fence.sql as it shipped, for the upgrade test in
-- tests/postgres/install.rs. Not installed by anything else.
--
-- palisade: fencing tokens checked inside PostgreSQL, version 1.
--
-- Install with `psql -v ON_ERROR_STOP=1 -f sql/palisade-fence.sql` or
-- palisade::fence::postgres::install. Running it again is harmless; a later
-- version of this file upgrades an installed one in place (it records its version
-- in palisade.version and refuses to replace a newer one).
--
-- A program that holds a palisade Lease adds one statement to the transaction that
-- does the protected write:
--
--     SELECT palisade.fence($1, $2);   -- $1 the key (e.g. the Lease name), $2 the token
--
-- palisade.fence(key text, token bigint) returns the key's previous mark (NULL for
-- the first token of a key). It admits the token when it is at least the highest
-- admitted for the key, and records it; the row lock it takes on the key's mark is
-- held until the transaction ends, so:
--
-- * READ COMMITTED: concurrent fencers of one key queue on the row lock and each sees
--   the mark its predecessor committed; a rolled-back transaction raises nothing.
-- * REPEATABLE READ and SERIALIZABLE: a transaction whose snapshot predates a mark
--   committed by another gets SQLSTATE 40001 (serialization_failure): retry it. It
--   never accepts a token its snapshot could not compare with the current mark.
--
-- Errors (each rolls back the caller's transaction):
--   PF001  stale fencing token: the token is lower than the key's highest admitted.
--          Message: write rejected: stale fencing token 33 for key "billing" is lower
--          than the highest admitted token 34. DETAIL: {"key": "billing", "token": 33,
--          "highest": 34} (JSON, for programs).
--   22004  (null_value_not_allowed) the key or the token is NULL.
--   22023  (invalid_parameter_value) the token is negative, or the key is empty or
--          longer than 1024 bytes.
--   22003  (numeric_value_out_of_range) from PostgreSQL itself, for a token beyond bigint.
--
-- Autocommit (no BEGIN): the call is a transaction of its own. The check and the
-- raised mark commit together at once, and nothing else is protected: a write made
-- by a later statement is not fenced. That is what `palisade fence --store
-- postgres://...` does, and useful only as a check before work that is fenced
-- elsewhere.

BEGIN;

-- Installers queue here, so two at once cannot collide on CREATE.
DO $$ BEGIN PERFORM pg_advisory_xact_lock(7273612897165101); END $$;

CREATE SCHEMA IF NOT EXISTS palisade;

CREATE TABLE IF NOT EXISTS palisade.version (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  version integer NOT NULL
);

DO $$
DECLARE
  installed integer;
BEGIN
  SELECT version INTO installed FROM palisade.version;
  IF installed > 1 THEN
    RAISE EXCEPTION 'palisade fence schema version % is installed; this file is version 1 and will not downgrade it', installed
      USING ERRCODE = 'PF002';
  END IF;
END
$$;

-- The high-water mark per key. Marks are never deleted by palisade.
CREATE TABLE IF NOT EXISTS palisade.marks (
  key text PRIMARY KEY,
  token bigint NOT NULL CHECK (token >= 0)
);

CREATE OR REPLACE FUNCTION palisade.fence(key text, token bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
-- Not STRICT: a NULL argument must be an error, not a silent NULL.
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  current bigint;
BEGIN
  IF fence.key IS NULL OR fence.token IS NULL THEN
    RAISE EXCEPTION 'palisade.fence: the % is NULL', CASE WHEN fence.key IS NULL THEN 'key' ELSE 'token' END
      USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF fence.token < 0 THEN
    RAISE EXCEPTION 'palisade.fence: fencing token % is negative; tokens are unsigned integers', fence.token
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF fence.key = '' THEN
    RAISE EXCEPTION 'palisade.fence: the key is empty' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(fence.key) > 1024 THEN
    RAISE EXCEPTION 'palisade.fence: the key is % bytes long; the limit is 1024', octet_length(fence.key)
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The first token of a key inserts its mark. Under REPEATABLE READ and
  -- SERIALIZABLE, a conflicting row this snapshot cannot see is a serialization
  -- failure (PostgreSQL checks that for ON CONFLICT DO NOTHING), never a pass.
  INSERT INTO palisade.marks AS m (key, token) VALUES (fence.key, fence.token)
    ON CONFLICT ON CONSTRAINT marks_pkey DO NOTHING;
  IF FOUND THEN
    RETURN NULL;
  END IF;

  -- Otherwise lock the mark. READ COMMITTED waits for a concurrent holder and then
  -- reads the mark it committed; the snapshot isolation levels raise 40001 if the
  -- row changed after their snapshot.
  SELECT m.token INTO current FROM palisade.marks AS m WHERE m.key = fence.key FOR UPDATE;
  IF NOT FOUND THEN
    -- Someone deleted the mark by hand between the two statements.
    RAISE EXCEPTION 'palisade.fence: the mark of key % vanished while fencing; retry', to_json(fence.key)::text
      USING ERRCODE = 'serialization_failure';
  END IF;
  IF fence.token < current THEN
    RAISE EXCEPTION 'write rejected: stale fencing token % for key % is lower than the highest admitted token %',
        fence.token, to_json(fence.key)::text, current
      USING ERRCODE = 'PF001',
            DETAIL = json_build_object('key', fence.key, 'token', fence.token, 'highest', current)::text,
            HINT = 'A holder with a higher token has written since this token was granted: stop writing.';
  END IF;
  IF fence.token > current THEN
    UPDATE palisade.marks AS m SET token = fence.token WHERE m.key = fence.key;
  END IF;
  RETURN current;
END
$fn$;

COMMENT ON FUNCTION palisade.fence(text, bigint) IS
  'palisade fencing check: admits token >= the key''s highest admitted token and records it, in the caller''s transaction; raises SQLSTATE PF001 on a stale token.';

INSERT INTO palisade.version (version) VALUES (1)
  ON CONFLICT (only_row) DO UPDATE SET version = EXCLUDED.version;

COMMIT;
