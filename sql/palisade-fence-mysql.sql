-- palisade: fencing tokens checked inside MySQL and MariaDB (InnoDB), version 1.
--
-- Written for and tested on MariaDB 10.11 (it uses CREATE OR REPLACE FUNCTION and
-- BEGIN NOT ATOMIC, which MySQL lacks). Install with
-- `mariadb --user=admin < sql/palisade-fence-mysql.sql`, `palisade fence --store
-- mysql://... --create` or palisade::fence::mysql::install, as an account that may
-- create the database `palisade` and routines in it; it becomes the function's
-- DEFINER, so keep that account (a dropped definer makes every call fail). A fence
-- call never installs anything. Running it again is harmless (grants on the function
-- survive CREATE OR REPLACE); it records its version in palisade.version and refuses
-- to replace a newer one. DDL commits as it goes: run it outside a transaction, and
-- again if it was interrupted. Replacing the function waits for every open
-- transaction that called it, and new calls queue behind the replacement: the file
-- waits at most 10 s (lock_wait_timeout, error 1205), so install when setting up or
-- upgrading, not while writers hold transactions open.
--
-- Binary log. With log_bin on, creating a function that is NOT DETERMINISTIC and
-- MODIFIES SQL DATA fails with error 1418 for every account, SUPER included, unless
-- log_bin_trust_function_creators = 1 (a global setting; it is checked only when the
-- function is created, so it may be set back afterwards). palisade.fence is declared
-- exactly that, because it is: its answer depends on palisade.marks, and declaring it
-- DETERMINISTIC to dodge the check would let MIXED binary logging replicate calls as
-- statements and invite the optimizer to fold calls. Use binlog_format ROW or MIXED.
--
-- Privileges. palisade.fence runs with SQL SECURITY DEFINER, so a writer needs only
--
--     GRANT EXECUTE ON FUNCTION palisade.fence TO 'app'@'%';
--
-- and, with no privilege on palisade.marks, cannot lower, delete or forge a mark
-- (GRANT SELECT ON palisade.marks to whoever runs `palisade fence --show`).
--
-- Errors end the STATEMENT, not the transaction. Unlike PostgreSQL, MySQL and
-- MariaDB roll back only the failing statement when a function signals; the
-- transaction stays open and can still commit its other statements. So call the
-- fence inside the write's own statement, where a stale token fails the write itself:
--
--     INSERT INTO ledger (account, amount) SELECT ?, ? FROM DUAL
--       WHERE COALESCE(palisade.fence(?, ?), 0) >= 0;
--     UPDATE ledger SET amount = amount + ? WHERE account = ?
--       AND COALESCE(palisade.fence(?, ?), 0) >= 0;
--
-- (the condition is always true when the call returns; it only makes the write
-- depend on the call). A separate `SELECT palisade.fence(?, ?)` checks too, but a
-- program that ignores its error and commits commits its writes: roll back on any
-- error from it (palisade::fence::mysql::admit does). An UPDATE that matches no row
-- never calls the fence, and writes nothing either.
--
-- palisade.fence(key, token) returns the key's previous mark (NULL for the first
-- token of a key). It admits the token when it is at least the highest admitted for
-- the key, and records it. It reads the mark with a locking read (SELECT ... FOR
-- UPDATE), which in InnoDB reads the latest committed mark, not the transaction's
-- snapshot, and holds the row lock until the transaction ends, so at every isolation
-- level concurrent fencers of one key queue on that lock and each compares against
-- the mark its predecessor committed:
--
-- * READ COMMITTED, REPEATABLE READ (the default) and SERIALIZABLE all admit and
--   refuse the same way. innodb_lock_wait_timeout bounds the wait (error 1205,
--   which ends only the statement unless innodb_rollback_on_timeout is on).
-- * The first token of a new key: two transactions inserting the same new key at
--   REPEATABLE READ or SERIALIZABLE may deadlock on the gap lock (error 1213,
--   SQLSTATE 40001: InnoDB rolls the whole transaction back; retry it).
--
-- A mark is as durable as the commit: innodb_flush_log_at_trx_commit = 1 (and
-- sync_binlog = 1 with a binary log) keep it across a crash; a failover to an
-- asynchronous replica can lose it, and a stale token is then admitted.
--
-- Errors:
--   PF001  stale fencing token: the token is lower than the key's highest admitted.
--          Message (at most 128 characters, the key is cut to fit): stale fencing
--          token 33 is below the highest admitted 34, key "billing"
--   22004  the key or the token is NULL.
--   22023  the token is negative, or the key is empty or longer than 1024 bytes.
--   PF002  (installing) a newer version of this file is installed.
--
-- Autocommit: the call is a transaction of its own and protects nothing after it.

DELIMITER //

-- Bounded waits for metadata locks (the caller's setting comes back at the end).
SET @palisade_caller_lock_wait_timeout = @@SESSION.lock_wait_timeout //
SET SESSION lock_wait_timeout = 10 //

CREATE DATABASE IF NOT EXISTS palisade CHARACTER SET utf8mb4 COLLATE utf8mb4_bin //

-- Installers queue here; the lock is the session's until it ends or releases it.
BEGIN NOT ATOMIC
  IF GET_LOCK('palisade.install', 60) IS NOT TRUE THEN
    SIGNAL SQLSTATE 'HY000'
      SET MESSAGE_TEXT = 'palisade: another installer held the lock palisade.install for 60s';
  END IF;
END //

CREATE TABLE IF NOT EXISTS palisade.version (
  only_row TINYINT NOT NULL DEFAULT 1 PRIMARY KEY CHECK (only_row = 1),
  version INT NOT NULL
) ENGINE = InnoDB //

BEGIN NOT ATOMIC
  DECLARE installed INT DEFAULT (SELECT MAX(version) FROM palisade.version);
  IF installed > 1 THEN
    DO RELEASE_LOCK('palisade.install');
    SIGNAL SQLSTATE 'PF002'
      SET MESSAGE_TEXT = 'palisade: a newer fence schema version is installed; this file is version 1 and will not downgrade it';
  END IF;
END //

-- The high-water mark per key: the key's UTF-8 bytes, compared byte for byte.
-- Marks are never deleted by palisade.
CREATE TABLE IF NOT EXISTS palisade.marks (
  `key` VARBINARY(1024) NOT NULL PRIMARY KEY,
  token BIGINT NOT NULL CHECK (token >= 0)
) ENGINE = InnoDB //

-- A function keeps the sql_mode it was created with: strict, whatever the caller's.
SET @palisade_caller_sql_mode = @@SESSION.sql_mode //
SET SESSION sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION' //

CREATE OR REPLACE FUNCTION palisade.fence(fence_key TEXT CHARACTER SET utf8mb4, fence_token BIGINT)
RETURNS BIGINT
NOT DETERMINISTIC
MODIFIES SQL DATA
SQL SECURITY DEFINER
COMMENT 'palisade fencing check: admits token >= the key''s highest admitted token and records it, in the caller''s transaction; SIGNALs SQLSTATE PF001 on a stale token.'
BEGIN
  DECLARE mark_key VARBINARY(1024);
  DECLARE current BIGINT DEFAULT NULL;
  DECLARE no_mark BOOLEAN DEFAULT FALSE;
  DECLARE raced BOOLEAN DEFAULT FALSE;
  DECLARE message TEXT CHARACTER SET utf8mb4;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET no_mark = TRUE;
  DECLARE CONTINUE HANDLER FOR 1062 SET raced = TRUE;

  IF fence_key IS NULL OR fence_token IS NULL THEN
    SIGNAL SQLSTATE '22004' SET MESSAGE_TEXT = 'palisade.fence: the key or the token is NULL';
  END IF;
  IF fence_token < 0 THEN
    SET message = CONCAT('palisade.fence: fencing token ', fence_token, ' is negative; tokens are unsigned integers');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = message;
  END IF;
  -- OCTET_LENGTH, not = '': a PAD SPACE collation finds ' ' equal to ''.
  IF OCTET_LENGTH(fence_key) = 0 THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'palisade.fence: the key is empty';
  END IF;
  IF OCTET_LENGTH(fence_key) > 1024 THEN
    SET message = CONCAT('palisade.fence: the key is ', OCTET_LENGTH(fence_key), ' bytes long; the limit is 1024');
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = message;
  END IF;
  SET mark_key = CAST(fence_key AS BINARY);

  -- A locking read: the latest committed mark, whatever the transaction's snapshot,
  -- and its row lock (or, for a missing key, the gap's) until the transaction ends.
  SELECT m.token INTO current FROM palisade.marks AS m WHERE m.`key` = mark_key FOR UPDATE;
  IF no_mark THEN
    INSERT INTO palisade.marks (`key`, token) VALUES (mark_key, fence_token);
    IF NOT raced THEN
      RETURN NULL;
    END IF;
    -- READ COMMITTED takes no gap lock: another transaction inserted the key's first
    -- mark and committed after our read. Lock and read the mark it committed.
    SET no_mark = FALSE;
    SELECT m.token INTO current FROM palisade.marks AS m WHERE m.`key` = mark_key FOR UPDATE;
    IF no_mark THEN
      SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = 'palisade.fence: the mark vanished while fencing; retry';
    END IF;
  END IF;

  IF fence_token < current THEN
    -- The highest comes before the key, so a cut key never hides it.
    SET message = CONCAT('stale fencing token ', fence_token, ' is below the highest admitted ',
                         current, ', key ', JSON_QUOTE(fence_key));
    IF CHAR_LENGTH(message) > 128 THEN
      SET message = CONCAT(LEFT(message, 125), '...');
    END IF;
    SIGNAL SQLSTATE 'PF001' SET MESSAGE_TEXT = message;
  END IF;
  IF fence_token > current THEN
    UPDATE palisade.marks AS m SET m.token = fence_token WHERE m.`key` = mark_key;
  END IF;
  RETURN current;
END //

SET SESSION sql_mode = @palisade_caller_sql_mode //
SET SESSION lock_wait_timeout = @palisade_caller_lock_wait_timeout //

INSERT INTO palisade.version (only_row, version) VALUES (1, 1)
  ON DUPLICATE KEY UPDATE version = VALUES(version) //

DO RELEASE_LOCK('palisade.install') //

DELIMITER ;
