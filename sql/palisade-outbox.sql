-- palisade: the fenced outbox, PostgreSQL, version 1.
--
-- For an external API that cannot check a fencing token (a payment provider's, a
-- card network's) but deduplicates requests by an idempotency key. The holder of a
-- Lease inserts its intent in the same transaction as its fenced write; a relay that
-- holds a Lease of its own delivers each intent with `Idempotency-Key: <intent id>`
-- and records the provider's answer. docs/fences.md says when to use it.
--
-- Needs sql/palisade-fence.sql (schema version 2) installed first, by the same role:
-- this file refuses to run without it (SQLSTATE 55000). Install with `psql -v
-- ON_ERROR_STOP=1 -f sql/palisade-outbox.sql`, `palisade outbox install --store
-- postgres://...` or palisade::outbox::install. Running it again is harmless; it
-- records its version in palisade.outbox_version and refuses to replace a newer one.
--
-- Writers (the holders of the protected resource's Lease), in the transaction of
-- their fenced write:
--
--     SELECT palisade.enqueue($1, $2, $3::jsonb);  -- key, token, payload; returns the id
--
-- It calls palisade.fence(key, token) first, so a stale holder's intent is never
-- inserted: PF001 aborts its transaction, with its other writes. The id (a uuid) is
-- the idempotency key the relay sends.
--
-- The relay (`palisade outbox relay`), fenced by its OWN Lease's key and token:
--
--     palisade.outbox_claim(relay_key text, relay_token bigint, batch integer,
--                           claim_for interval)
--       RETURNS TABLE (intent_id uuid, payload jsonb, attempts integer)
--     palisade.outbox_record(relay_key text, relay_token bigint, intent uuid,
--                            status integer, answer text, retry_in interval)
--       RETURNS text   -- the intent's state afterwards
--
-- outbox_claim returns up to `batch` pending intents that are due, oldest first, and
-- hides them from the same relay for `claim_for` (longer than one delivery's
-- timeout) while it delivers them; a relay with a higher token (the next holder of
-- the relay's Lease) claims them at once. outbox_record stores the provider's answer:
--
--   status 200-299              'delivered': the provider executed it. Final.
--   status 408, 409, 425, 429,  'pending': retried after `retry_in` (the relay's
--   500-599, or NULL (no answer: capped exponential backoff). Never given up: an intent
--   a timeout, a refused         the provider has not answered for stays pending and
--   connection)                  is retried until it does. 409 is the answer of
--                                providers to a request whose key is still in flight.
--   any other status            'rejected': the provider's own answer (a 4xx: the
--                                request is invalid). Final; never retried, because
--                                the same key and payload would get the same answer.
--
-- An intent already delivered or rejected keeps its first final answer. Both relay
-- functions call palisade.fence(relay_key, relay_token) first: a relay paused past
-- its Lease, whose successor has claimed since, cannot record anything (PF001), and
-- its late request reaches the provider with the same key as its successor's, which
-- the provider deduplicates. So the provider executes each intent once; delivery is
-- at least once.
--
-- Privileges: PUBLIC has none on the table or the functions. A writer needs
--
--     GRANT USAGE ON SCHEMA palisade TO app;
--     GRANT EXECUTE ON FUNCTION palisade.enqueue(text, bigint, jsonb) TO app;
--
-- and the relay's role EXECUTE on palisade.outbox_claim(text, bigint, integer,
-- interval) and palisade.outbox_record(text, bigint, uuid, integer, text, interval).
-- The functions are SECURITY DEFINER (search_path pinned), so neither role needs any
-- privilege on palisade.outbox, and neither can forge, delete or re-deliver an
-- intent. GRANT SELECT ON palisade.outbox to whoever watches it. Delivered and
-- rejected intents stay in the table until an administrator deletes them.
--
-- Errors: PF001 (stale token, from palisade.fence) and its other errors (22004,
-- 22023); 22004 for a NULL payload, id or batch; 22023 for a batch below 1 or a
-- negative claim_for or retry_in.

BEGIN;

-- Installers queue here (the fence's installers take the same lock).
DO $$ BEGIN PERFORM pg_advisory_xact_lock(7273612897165101); END $$;

DO $$
DECLARE
  fence_version integer;
BEGIN
  IF to_regclass('palisade.version') IS NULL
     OR to_regprocedure('palisade.fence(text, bigint)') IS NULL THEN
    RAISE EXCEPTION 'palisade outbox: palisade.fence(text, bigint) is not installed; install sql/palisade-fence.sql (version 2) first'
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
  SELECT version INTO fence_version FROM palisade.version;
  IF fence_version IS NULL OR fence_version < 2 THEN
    RAISE EXCEPTION 'palisade outbox: the fence schema is version %, the outbox needs version 2; install sql/palisade-fence.sql first',
        coalesce(fence_version::text, 'unknown')
      USING ERRCODE = 'object_not_in_prerequisite_state';
  END IF;
END
$$;

CREATE TABLE IF NOT EXISTS palisade.outbox_version (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  version integer NOT NULL
);

DO $$
DECLARE
  installed integer;
BEGIN
  SELECT version INTO installed FROM palisade.outbox_version;
  IF installed > 1 THEN
    RAISE EXCEPTION 'palisade outbox schema version % is installed; this file is version 1 and will not downgrade it', installed
      USING ERRCODE = 'PF002';
  END IF;
END
$$;

CREATE TABLE IF NOT EXISTS palisade.outbox (
  id uuid PRIMARY KEY DEFAULT pg_catalog.gen_random_uuid(),
  -- The writer's fence key and the token its intent was admitted with.
  key text NOT NULL,
  token bigint NOT NULL CHECK (token >= 0),
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'rejected')),
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
  -- The relay token of the last claim, and until when it hides the intent.
  claimed_token bigint,
  claimed_until timestamptz,
  -- The provider's last answer (status NULL: none, answer holds why) and the relay
  -- token that recorded it.
  last_status integer,
  last_answer text,
  recorded_token bigint,
  answered_at timestamptz,
  delivered_at timestamptz
);

CREATE INDEX IF NOT EXISTS outbox_pending_due
  ON palisade.outbox (next_attempt_at, created_at) WHERE state = 'pending';

CREATE OR REPLACE FUNCTION palisade.enqueue(key text, token bigint, payload jsonb)
RETURNS uuid
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  intent uuid;
BEGIN
  -- The fence first: a stale token raises PF001 before anything is inserted.
  PERFORM palisade.fence(enqueue.key, enqueue.token);
  IF enqueue.payload IS NULL THEN
    RAISE EXCEPTION 'palisade.enqueue: the payload is NULL' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  INSERT INTO palisade.outbox AS o (key, token, payload)
    VALUES (enqueue.key, enqueue.token, enqueue.payload)
    RETURNING o.id INTO intent;
  RETURN intent;
END
$fn$;

COMMENT ON FUNCTION palisade.enqueue(text, bigint, jsonb) IS
  'palisade fenced outbox: fences (key, token) like palisade.fence, then inserts the intent in the caller''s transaction; returns its id, the idempotency key the relay sends.';

CREATE OR REPLACE FUNCTION palisade.outbox_claim(relay_key text, relay_token bigint, batch integer,
                                                 claim_for interval)
RETURNS TABLE (intent_id uuid, payload jsonb, attempts integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
  PERFORM palisade.fence(outbox_claim.relay_key, outbox_claim.relay_token);
  IF outbox_claim.batch IS NULL OR outbox_claim.claim_for IS NULL THEN
    RAISE EXCEPTION 'palisade.outbox_claim: the batch or claim_for is NULL' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF outbox_claim.batch < 1 OR outbox_claim.claim_for < interval '0' THEN
    RAISE EXCEPTION 'palisade.outbox_claim: batch % must be at least 1 and claim_for % not negative',
        outbox_claim.batch, outbox_claim.claim_for
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  UPDATE palisade.outbox AS o
     SET attempts = o.attempts + 1,
         claimed_token = outbox_claim.relay_token,
         claimed_until = clock_timestamp() + outbox_claim.claim_for
   WHERE o.id IN (
           SELECT d.id FROM palisade.outbox AS d
            WHERE d.state = 'pending'
              AND d.next_attempt_at <= clock_timestamp()
              -- In flight with this relay: hidden until claimed_until. A successor
              -- (higher token) takes over at once.
              AND (d.claimed_until IS NULL OR d.claimed_until <= clock_timestamp()
                   OR d.claimed_token < outbox_claim.relay_token)
            ORDER BY d.next_attempt_at, d.created_at
            LIMIT outbox_claim.batch
            FOR UPDATE SKIP LOCKED)
  RETURNING o.id, o.payload, o.attempts;
END
$fn$;

COMMENT ON FUNCTION palisade.outbox_claim(text, bigint, integer, interval) IS
  'palisade fenced outbox: the relay (fenced by its own Lease''s key and token) claims up to batch due intents for claim_for.';

CREATE OR REPLACE FUNCTION palisade.outbox_record(relay_key text, relay_token bigint, intent uuid,
                                                  status integer, answer text, retry_in interval)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
  current text;
  outcome text;
BEGIN
  PERFORM palisade.fence(outbox_record.relay_key, outbox_record.relay_token);
  IF outbox_record.intent IS NULL THEN
    RAISE EXCEPTION 'palisade.outbox_record: the intent id is NULL' USING ERRCODE = 'null_value_not_allowed';
  END IF;
  IF outbox_record.retry_in IS NULL OR outbox_record.retry_in < interval '0' THEN
    RAISE EXCEPTION 'palisade.outbox_record: retry_in % must be given and not negative', outbox_record.retry_in
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT o.state INTO current FROM palisade.outbox AS o WHERE o.id = outbox_record.intent FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'palisade.outbox_record: no intent %', outbox_record.intent
      USING ERRCODE = 'no_data_found';
  END IF;
  IF current <> 'pending' THEN
    RETURN current;  -- the first final answer stays
  END IF;
  outcome := CASE
    WHEN outbox_record.status BETWEEN 200 AND 299 THEN 'delivered'
    WHEN outbox_record.status IS NULL OR outbox_record.status IN (408, 409, 425, 429)
         OR outbox_record.status BETWEEN 500 AND 599 THEN 'pending'
    ELSE 'rejected'
  END;
  UPDATE palisade.outbox AS o
     SET state = outcome,
         last_status = outbox_record.status,
         last_answer = outbox_record.answer,
         recorded_token = outbox_record.relay_token,
         answered_at = clock_timestamp(),
         claimed_until = NULL,
         next_attempt_at = CASE WHEN outcome = 'pending'
                                THEN clock_timestamp() + outbox_record.retry_in
                                ELSE o.next_attempt_at END,
         delivered_at = CASE WHEN outcome = 'delivered' THEN clock_timestamp() END
   WHERE o.id = outbox_record.intent;
  RETURN outcome;
END
$fn$;

COMMENT ON FUNCTION palisade.outbox_record(text, bigint, uuid, integer, text, interval) IS
  'palisade fenced outbox: the relay (fenced by its own Lease''s key and token) records the provider''s answer; 2xx delivered, 408/409/425/429/5xx/none retried after retry_in, any other rejected.';

-- Privileges, set on the first install only: installing again leaves the grants an
-- administrator made since.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM palisade.outbox_version) THEN
    RETURN;
  END IF;
  REVOKE ALL ON TABLE palisade.outbox, palisade.outbox_version FROM PUBLIC;
  REVOKE ALL ON FUNCTION palisade.enqueue(text, bigint, jsonb) FROM PUBLIC;
  REVOKE ALL ON FUNCTION palisade.outbox_claim(text, bigint, integer, interval) FROM PUBLIC;
  REVOKE ALL ON FUNCTION palisade.outbox_record(text, bigint, uuid, integer, text, interval) FROM PUBLIC;
END
$$;

INSERT INTO palisade.outbox_version (version) VALUES (1)
  ON CONFLICT (only_row) DO UPDATE SET version = EXCLUDED.version;

COMMIT;
