-- gridpilot_claim, PostgreSQL: the common claim as one database function, so that a pilot's
-- match is one round trip (draw, take the job, advance the queue's clock, the status change and
-- its history, the payload columns) run in autocommit. taskqueue/pilots/pilotmatch.py calls it
-- and says which cases it hands back to the Python path (taskqueue/matching/claim.py), whose
-- rules it follows one for one (see there for why each is so).
--
-- Every check of a value table is a correlated EXISTS fenced by OFFSET 0, so that it stays one
-- key probe per queue the walk reaches. The per-queue probes of CE and banned-site restrictions
-- are reached only when their table has a row at all: one uncorrelated EXISTS in the walk's own
-- statement (so in its snapshot) instead of a probe of an empty table for every queue.
--
-- This file is the function's one current text. A change is installed by a new migration that
-- carries its own copy of the new text; tests/db/test_claim_sources.py holds the function that
-- `upgrade head` installs equal to this file.

CREATE OR REPLACE FUNCTION gridpilot_claim(
    p_vo text, p_owner text, p_groups text[], p_cpu bigint, p_procs bigint, p_mem bigint,
    p_gpus bigint, p_types text[], p_pools text[], p_sites text[], p_platforms text[],
    p_tags text[], p_ce text, p_required text[], p_with_expressions boolean, p_pilot text,
    p_now timestamp, p_minor text, p_source text, p_e double precision[])
RETURNS TABLE (kind text, job_id bigint, tq_id bigint, vo text, owner text, owner_group text,
               job_type text, description text, description_format text, bulk_index integer)
LANGUAGE plpgsql
-- Plans made once per connection and kept: a plan made for each call's values costs more
-- than the claim itself, and the walk's plan (the draw index, in key order) is the same for
-- all values. No JIT: the walk's plan is costed as if it read every queue of the VO, which
-- at 100,000 queues would compile it (0.4 s) for a walk that stops after a few queues.
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $fn$
#variable_conflict use_column
-- kind: 'job' (one row per job claimed, Matched to p_pilot), then possibly one of
-- 'expression' (the walk reached a queue with a ClassAd expression: the caller evaluates it
-- and goes on in Python), 'limits' (the pilot's site has limits: the caller's gated path),
-- 'banned' (every site of the pilot is banned for the VO; description lists them).
-- No row: no waiting job matches.
DECLARE
    v_sites text[] := p_sites;
    v_banned text[];
    v_site text;
    v_ce text;
    v_count integer := coalesce(array_length(p_e, 1), 0);
    v_claimed integer := 0;
    v_job bigint;
    v_found boolean;
    v_tag text;
    q record;
    -- The walk: matching active queues in draw order, fetched one at a time (a FOR loop
    -- would read ten ahead, ten times the walk that a claim needs).
    walk NO SCROLL CURSOR FOR
        SELECT t.id, t.priority, t.expression FROM task_queues t
         WHERE t.active = 1 AND t.vo = p_vo
           AND (p_with_expressions OR t.expression IS NULL)
           AND (p_groups IS NULL OR t.owner_group = ANY (p_groups))
           AND (p_owner IS NULL OR t.owner = p_owner)
           AND (p_cpu IS NULL OR t.cpu_time <= p_cpu)
           AND (p_procs IS NULL OR t.processors <= p_procs)
           AND (p_mem IS NULL OR t.memory <= p_mem)
           AND (p_gpus IS NULL OR t.gpus <= p_gpus)
           AND (p_types IS NULL OR t.job_type = ANY (p_types))
           AND (t.submit_pool IS NULL
                OR (p_pools IS NOT NULL AND t.submit_pool = ANY (p_pools)))
           AND (v_sites IS NULL OR EXISTS (
                SELECT 1 FROM unnest(v_sites) AS s(v)
                 WHERE (NOT EXISTS (SELECT 1 FROM tq_sites x WHERE x.tq_id = t.id OFFSET 0)
                        OR EXISTS (SELECT 1 FROM tq_sites x
                                    WHERE x.tq_id = t.id AND x.value = s.v OFFSET 0))
                   AND (NOT EXISTS (SELECT 1 FROM tq_banned_sites)
                        OR NOT EXISTS (SELECT 1 FROM tq_banned_sites x
                                        WHERE x.tq_id = t.id AND x.value = s.v OFFSET 0))))
           AND (p_platforms IS NULL
                OR NOT EXISTS (SELECT 1 FROM tq_platforms x WHERE x.tq_id = t.id OFFSET 0)
                OR EXISTS (SELECT 1 FROM tq_platforms x
                            WHERE x.tq_id = t.id AND x.value = ANY (p_platforms) OFFSET 0))
           AND (p_ce IS NULL OR NOT EXISTS (SELECT 1 FROM tq_ces)
                OR NOT EXISTS (SELECT 1 FROM tq_ces x WHERE x.tq_id = t.id OFFSET 0)
                OR EXISTS (SELECT 1 FROM tq_ces x
                            WHERE x.tq_id = t.id AND x.value = p_ce OFFSET 0))
           AND (p_tags IS NULL OR NOT EXISTS (
                SELECT 1 FROM tq_tags x
                 WHERE x.tq_id = t.id AND x.value <> ALL (p_tags) OFFSET 0))
           AND (p_required IS NULL OR NOT EXISTS (
                SELECT 1 FROM unnest(p_required) AS r(v) WHERE NOT EXISTS (
                    SELECT 1 FROM tq_tags x
                     WHERE x.tq_id = t.id AND x.value = r.v OFFSET 0)))
         ORDER BY t.draw_key, t.id;
BEGIN
    IF p_sites IS NOT NULL THEN
        SELECT array_agg(b.site ORDER BY b.site) INTO v_banned
          FROM site_bans b WHERE b.vo = p_vo AND b.site = ANY (p_sites);
        IF v_banned IS NOT NULL THEN
            SELECT array_agg(s ORDER BY s) INTO v_sites
              FROM unnest(p_sites) AS s WHERE s <> ALL (v_banned);
            IF v_sites IS NULL THEN
                RETURN QUERY SELECT 'banned'::text, NULL::bigint, NULL::bigint, NULL::text,
                    NULL::text, NULL::text, NULL::text, array_to_string(v_banned, ', '),
                    NULL::text, NULL::integer;
                RETURN;
            END IF;
        END IF;
        IF array_length(v_sites, 1) = 1 THEN
            v_site := v_sites[1];
            v_ce := p_ce;
            IF EXISTS (SELECT 1 FROM site_limits l WHERE l.vo = p_vo AND l.site = v_site
                         AND l.ce IN ('', coalesce(p_ce, ''))) THEN
                RETURN QUERY SELECT 'limits'::text, NULL::bigint, NULL::bigint, NULL::text,
                    NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- A queue that fits carries every required tag: if some tag is carried by no active
    -- queue of the VO, the answer is empty without a walk.
    IF p_required IS NOT NULL THEN
        FOREACH v_tag IN ARRAY p_required LOOP
            IF NOT EXISTS (SELECT 1 FROM tq_tags x JOIN task_queues t ON t.id = x.tq_id
                            WHERE x.value = v_tag AND t.vo = p_vo AND t.active = 1) THEN
                RETURN;
            END IF;
        END LOOP;
    END IF;
    <<claims>>
    WHILE v_claimed < v_count LOOP
        v_found := false;
        OPEN walk;
        LOOP
            FETCH walk INTO q;
            EXIT WHEN NOT FOUND;
            IF q.expression IS NOT NULL THEN
                CLOSE walk;
                RETURN QUERY SELECT 'expression'::text, NULL::bigint, q.id, NULL::text,
                    NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::integer;
                RETURN;
            END IF;
            DELETE FROM task_queue_jobs j WHERE j.job_id = (
                SELECT k.job_id FROM task_queue_jobs k WHERE k.tq_id = q.id
                 ORDER BY k.rank, k.job_id LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING j.job_id INTO v_job;
            IF v_job IS NULL THEN
                -- Empty, or every job in it is being claimed right now: retire it if empty,
                -- checked under its row lock (a queue another transaction holds stays).
                PERFORM 1 FROM task_queues t WHERE t.id = q.id FOR UPDATE SKIP LOCKED;
                IF FOUND AND NOT EXISTS (SELECT 1 FROM task_queue_jobs k
                                          WHERE k.tq_id = q.id) THEN
                    UPDATE task_queues t SET active = 0, emptied_at = p_now WHERE t.id = q.id;
                END IF;
                CONTINUE;
            END IF;
            -- Advance the queue's clock, unless another transaction holds its row.
            UPDATE task_queues t
               SET draw_clock = t.draw_key,
                   draw_key = t.draw_key + p_e[v_claimed + 1] / greatest(q.priority, 1e-12)
             WHERE t.id = (SELECT u.id FROM task_queues u WHERE u.id = q.id
                            FOR UPDATE SKIP LOCKED);
            v_claimed := v_claimed + 1;
            UPDATE jobs j SET status = 'Matched', minor_status = p_minor,
                   pilot_reference = p_pilot, site = v_site, ce = v_ce, heartbeat_at = p_now
             WHERE j.id = v_job AND j.status = 'Waiting'
            RETURNING j.vo, j.owner, j.owner_group, j.job_type, j.description,
                      j.description_format, j.bulk_index
                 INTO vo, owner, owner_group, job_type, description, description_format,
                      bulk_index;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'job % was waiting in task queue % but is no longer Waiting; '
                    'the claim is abandoned', v_job, q.id USING ERRCODE = 'GP409';
            END IF;
            kind := 'job';
            job_id := v_job;
            tq_id := q.id;
            RETURN NEXT;
            INSERT INTO job_status_history (job_id, at, status, minor_status, source)
                 VALUES (v_job, p_now, 'Matched', p_minor, p_source);
            v_found := true;
            EXIT;  -- the claimed queue's key moved: draw again for the next job
        END LOOP;
        CLOSE walk;
        EXIT claims WHEN NOT v_found;
    END LOOP;
END
$fn$
