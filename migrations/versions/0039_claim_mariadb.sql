-- gridpilot_claim, MariaDB: the common claim as one stored procedure, so that a pilot's match
-- is one round trip, as claim_postgresql.sql makes it on PostgreSQL: same inputs, same rules
-- (those of taskqueue/matching/claim.py, one for one), same result columns and row kinds.
-- taskqueue/pilots/pilotmatch.py calls it.
--
-- kind: 'job' (one row per job claimed, Matched to p_pilot), then possibly one of 'expression'
-- (the walk reached a queue with a ClassAd expression, tq_id: the caller evaluates it and goes
-- on in Python), 'limits' (the pilot's site has limits: the caller's gated path), 'banned'
-- (every site of the pilot is banned for the VO; description lists them). No row: no waiting
-- job matches.
--
-- What differs from PostgreSQL, and why:
-- - MariaDB has no arrays: each list comes as one JSON array of strings (NULL: no such
--   constraint) and is read with JSON_TABLE (its column longer than any stored label, so that
--   no label is cut to one that is stored), so a label may hold any character and is compared
--   with the column's collation, as the Python path's IN compares it. The exponential variates
--   come as a JSON array of numbers.
-- - A procedure cannot return rows as it goes: the claimed (job, queue) pairs, and the last
--   row's kind if it is not a job, are collected in one JSON array, and one SELECT at the end
--   returns every row (no temporary table, no UNION: each costs the server more than the rest
--   of the call's reads), before the COMMIT, so that the payload columns are read under the
--   row locks the claim holds.
-- - A cursor is materialised whole when it is opened: the walk is a keyset loop instead, one
--   ORDER BY draw_key, id LIMIT 1 read of the draw index (active, vo, draw_key, id) per queue
--   it reaches, so that it stops at the first queue that yields a job.
-- - A list of one site or one platform (the common pilot) is checked as that value, without
--   JSON_TABLE: each JSON_TABLE a walk reaches is parsed and filled again for every queue.
-- - Every check of a value table is a scalar subquery ((SELECT 1 ... LIMIT 1) IS [NOT] NULL):
--   MariaDB turns EXISTS into IN and materialises it for all queues, a scalar subquery stays a
--   dependent probe per queue (see taskqueue/matching/claim.py, _exists).
-- - The job is taken with SELECT ... FOR UPDATE SKIP LOCKED, then deleted by its key (MariaDB
--   refuses a locking subquery on the table a DELETE changes); the queue's row likewise.
-- - The procedure runs its own transaction (READ COMMITTED, like the Python path's sessions),
--   rolled back on any error, which is then raised again. A job that left Waiting under the
--   claim is SIGNAL SQLSTATE '45000' (error 1644) with a message that names it.
--
-- This file is the procedure's one current text. A change is installed by a new migration that
-- carries its own copy of the new text; tests/db/test_claim_sources.py holds the procedure that
-- `upgrade head` installs equal to this file.

CREATE OR REPLACE PROCEDURE gridpilot_claim(
    p_vo VARCHAR(64), p_owner VARCHAR(255), p_groups LONGTEXT, p_cpu BIGINT, p_procs BIGINT,
    p_mem BIGINT, p_gpus BIGINT, p_types LONGTEXT, p_pools LONGTEXT, p_sites LONGTEXT,
    p_platforms LONGTEXT,
    p_tags LONGTEXT, p_ce VARCHAR(255), p_required LONGTEXT, p_with_expressions BOOLEAN,
    p_pilot VARCHAR(255), p_now DATETIME(6), p_minor VARCHAR(255), p_source VARCHAR(64),
    p_e LONGTEXT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_sites LONGTEXT DEFAULT p_sites;
    DECLARE v_banned LONGTEXT DEFAULT NULL;
    DECLARE v_site VARCHAR(1024) DEFAULT NULL;
    DECLARE v_ce VARCHAR(255) DEFAULT NULL;
    DECLARE v_platform VARCHAR(1024) DEFAULT NULL;
    DECLARE v_count INT DEFAULT COALESCE(JSON_LENGTH(p_e), 0);
    DECLARE v_claimed INT DEFAULT 0;
    DECLARE v_claims LONGTEXT DEFAULT '';
    DECLARE v_kind VARCHAR(16) DEFAULT NULL;
    DECLARE v_detail LONGTEXT DEFAULT NULL;
    DECLARE v_tail_tq BIGINT DEFAULT NULL;
    DECLARE v_found BOOLEAN;
    DECLARE v_none BOOLEAN DEFAULT FALSE;
    DECLARE v_tq BIGINT;
    DECLARE v_priority DOUBLE;
    DECLARE v_key DOUBLE;
    DECLARE v_expression BOOLEAN;
    DECLARE v_job BIGINT;
    DECLARE v_lock BIGINT;
    DECLARE v_message VARCHAR(255);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = TRUE;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;

    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    claim: BEGIN
        IF p_sites IS NOT NULL THEN
            SELECT GROUP_CONCAT(b.site ORDER BY b.site SEPARATOR ', ') INTO v_banned
              FROM site_bans b
             WHERE b.vo = p_vo AND b.site IN (SELECT s.v FROM JSON_TABLE(p_sites, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS s);
            IF v_banned IS NOT NULL THEN
                SELECT JSON_ARRAYAGG(s.v ORDER BY s.v) INTO v_sites
                  FROM JSON_TABLE(p_sites, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS s
                 WHERE (SELECT 1 FROM site_bans b
                         WHERE b.vo = p_vo AND b.site = s.v LIMIT 1) IS NULL;
                IF v_sites IS NULL THEN
                    SET v_kind = 'banned', v_detail = v_banned;
                    LEAVE claim;
                END IF;
            END IF;
            IF JSON_LENGTH(v_sites) = 1 THEN
                SELECT s.v INTO v_site FROM JSON_TABLE(v_sites, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS s;
                SET v_ce = p_ce;
                IF (SELECT 1 FROM site_limits l
                     WHERE l.vo = p_vo AND l.site = v_site AND l.ce IN ('', COALESCE(p_ce, ''))
                     LIMIT 1) IS NOT NULL THEN
                    SET v_kind = 'limits';
                    LEAVE claim;
                END IF;
            END IF;
        END IF;
        IF JSON_LENGTH(p_platforms) = 1 THEN
            SELECT g.v INTO v_platform FROM JSON_TABLE(p_platforms, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS g;
        END IF;
        -- A queue that fits carries every required tag: if some tag is carried by no active
        -- queue of the VO, the answer is empty without a walk.
        IF p_required IS NOT NULL AND (
                SELECT 1 FROM JSON_TABLE(p_required, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS r
                 WHERE (SELECT 1 FROM tq_tags x JOIN task_queues t ON t.id = x.tq_id
                         WHERE x.value = r.v AND t.vo = p_vo AND t.active = 1 LIMIT 1) IS NULL
                 LIMIT 1) IS NOT NULL THEN
            LEAVE claim;
        END IF;
        claims: WHILE v_claimed < v_count DO
            SET v_found = FALSE, v_key = -1e300, v_tq = -1;
            walk: LOOP
                SET v_none = FALSE;
                SELECT t.id, t.priority, t.draw_key, t.expression IS NOT NULL
                  INTO v_tq, v_priority, v_key, v_expression
                  FROM task_queues t
                 WHERE t.active = 1 AND t.vo = p_vo
                   AND (t.draw_key > v_key OR (t.draw_key = v_key AND t.id > v_tq))
                   AND (p_with_expressions OR t.expression IS NULL)
                   AND (p_groups IS NULL OR (SELECT 1 FROM JSON_TABLE(p_groups, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS g
                                              WHERE g.v = t.owner_group LIMIT 1) IS NOT NULL)
                   AND (p_owner IS NULL OR t.owner = p_owner)
                   AND (p_cpu IS NULL OR t.cpu_time <= p_cpu)
                   AND (p_procs IS NULL OR t.processors <= p_procs)
                   AND (p_mem IS NULL OR t.memory <= p_mem)
                   AND (p_gpus IS NULL OR t.gpus <= p_gpus)
                   AND (p_types IS NULL OR (SELECT 1 FROM JSON_TABLE(p_types, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS g
                                             WHERE g.v = t.job_type LIMIT 1) IS NOT NULL)
                   AND (t.submit_pool IS NULL
                        OR (p_pools IS NOT NULL AND (SELECT 1 FROM JSON_TABLE(p_pools, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS g
                                                      WHERE g.v = t.submit_pool LIMIT 1)
                                                    IS NOT NULL))
                   AND (v_sites IS NULL
                        OR (v_site IS NOT NULL
                            AND ((SELECT 1 FROM tq_sites x WHERE x.tq_id = t.id LIMIT 1) IS NULL
                                 OR (SELECT 1 FROM tq_sites x
                                      WHERE x.tq_id = t.id AND x.value = v_site LIMIT 1)
                                    IS NOT NULL)
                            AND (SELECT 1 FROM tq_banned_sites x
                                  WHERE x.tq_id = t.id AND x.value = v_site LIMIT 1) IS NULL)
                        OR (v_site IS NULL AND (
                            SELECT 1 FROM JSON_TABLE(v_sites, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS s
                             WHERE ((SELECT 1 FROM tq_sites x WHERE x.tq_id = t.id LIMIT 1)
                                    IS NULL
                                    OR (SELECT 1 FROM tq_sites x
                                         WHERE x.tq_id = t.id AND x.value = s.v LIMIT 1)
                                       IS NOT NULL)
                               AND (SELECT 1 FROM tq_banned_sites x
                                     WHERE x.tq_id = t.id AND x.value = s.v LIMIT 1) IS NULL
                             LIMIT 1) IS NOT NULL))
                   AND (p_platforms IS NULL
                        OR (SELECT 1 FROM tq_platforms x WHERE x.tq_id = t.id LIMIT 1) IS NULL
                        OR (v_platform IS NOT NULL
                            AND (SELECT 1 FROM tq_platforms x
                                  WHERE x.tq_id = t.id AND x.value = v_platform LIMIT 1)
                                IS NOT NULL)
                        OR (v_platform IS NULL
                            AND (SELECT 1 FROM JSON_TABLE(p_platforms, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS g
                                   JOIN tq_platforms x ON x.tq_id = t.id AND x.value = g.v
                                  LIMIT 1) IS NOT NULL))
                   AND (p_ce IS NULL
                        OR (SELECT 1 FROM tq_ces x WHERE x.tq_id = t.id LIMIT 1) IS NULL
                        OR (SELECT 1 FROM tq_ces x WHERE x.tq_id = t.id AND x.value = p_ce
                             LIMIT 1) IS NOT NULL)
                   AND (p_tags IS NULL OR (
                        SELECT 1 FROM tq_tags x
                         WHERE x.tq_id = t.id
                           AND (SELECT 1 FROM JSON_TABLE(p_tags, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS g
                                 WHERE g.v = x.value LIMIT 1) IS NULL
                         LIMIT 1) IS NULL)
                   AND (p_required IS NULL OR (
                        SELECT 1 FROM JSON_TABLE(p_required, '$[*]' COLUMNS (v VARCHAR(1024) PATH '$' ERROR ON ERROR)) AS r
                         WHERE (SELECT 1 FROM tq_tags x
                                 WHERE x.tq_id = t.id AND x.value = r.v LIMIT 1) IS NULL
                         LIMIT 1) IS NULL)
                 ORDER BY t.draw_key, t.id
                 LIMIT 1;
                IF v_none THEN
                    LEAVE walk;
                END IF;
                IF v_expression THEN
                    SET v_kind = 'expression', v_tail_tq = v_tq;
                    LEAVE claims;
                END IF;
                SET v_none = FALSE;
                SELECT k.job_id INTO v_job FROM task_queue_jobs k WHERE k.tq_id = v_tq
                 ORDER BY k.rank, k.job_id LIMIT 1 FOR UPDATE SKIP LOCKED;
                IF v_none THEN
                    -- Empty, or every job in it is being claimed right now: retire it if
                    -- empty, checked under its row lock (a queue another transaction holds
                    -- stays).
                    SET v_none = FALSE;
                    SELECT t.id INTO v_lock FROM task_queues t WHERE t.id = v_tq
                       FOR UPDATE SKIP LOCKED;
                    IF NOT v_none AND (SELECT 1 FROM task_queue_jobs k WHERE k.tq_id = v_tq
                                        LIMIT 1) IS NULL THEN
                        UPDATE task_queues t SET t.active = 0, t.emptied_at = p_now
                         WHERE t.id = v_tq;
                    END IF;
                    ITERATE walk;
                END IF;
                DELETE FROM task_queue_jobs WHERE job_id = v_job;
                -- Advance the queue's clock, unless another transaction holds its row (the
                -- clock first: MariaDB assigns left to right, so it reads the old key).
                SET v_none = FALSE;
                SELECT t.id INTO v_lock FROM task_queues t WHERE t.id = v_tq
                   FOR UPDATE SKIP LOCKED;
                IF NOT v_none THEN
                    UPDATE task_queues t
                       SET t.draw_clock = t.draw_key,
                           t.draw_key = t.draw_key
                               + CAST(JSON_VALUE(p_e, CONCAT('$[', v_claimed, ']')) AS DOUBLE)
                                 / GREATEST(v_priority, 1e-12)
                     WHERE t.id = v_tq;
                END IF;
                SET v_claimed = v_claimed + 1;
                UPDATE jobs j SET j.status = 'Matched', j.minor_status = p_minor,
                       j.pilot_reference = p_pilot, j.site = v_site, j.ce = v_ce,
                       j.heartbeat_at = p_now
                 WHERE j.id = v_job AND j.status = 'Waiting';
                IF ROW_COUNT() = 0 THEN
                    SET v_message = CONCAT('job ', v_job, ' was waiting in task queue ', v_tq,
                                           ' but is no longer Waiting; the claim is abandoned');
                    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message, MYSQL_ERRNO = 1644;
                END IF;
                INSERT INTO job_status_history (job_id, at, status, minor_status, source)
                     VALUES (v_job, p_now, 'Matched', p_minor, p_source);
                SET v_claims = CONCAT(v_claims, IF(v_claims = '', '', ','),
                                      '[', v_job, ',', v_tq, ']');
                SET v_found = TRUE;
                LEAVE walk;  -- the claimed queue's key moved: draw again for the next job
            END LOOP walk;
            IF NOT v_found THEN
                LEAVE claims;
            END IF;
        END WHILE claims;
    END claim;
    IF v_kind IS NOT NULL THEN
        SET v_claims = CONCAT(v_claims, IF(v_claims = '', '', ','),
                              JSON_ARRAY(NULL, v_tail_tq, v_kind, v_detail));
    END IF;
    SELECT COALESCE(c.kind, 'job'), j.id, c.tq_id, j.vo, j.owner, j.owner_group, j.job_type,
           COALESCE(j.description, c.detail), j.description_format, j.bulk_index
      FROM JSON_TABLE(CONCAT('[', v_claims, ']'), '$[*]'
                      COLUMNS (n FOR ORDINALITY, job_id BIGINT PATH '$[0]',
                               tq_id BIGINT PATH '$[1]', kind VARCHAR(16) PATH '$[2]',
                               detail LONGTEXT PATH '$[3]')) AS c
      LEFT JOIN jobs j ON j.id = c.job_id
     ORDER BY c.n;
    COMMIT;
END
