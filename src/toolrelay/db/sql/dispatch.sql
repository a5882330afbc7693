-- Named queries of the dispatcher. The worker never writes SQL of its own.

-- name: claim
-- Claim up to %(limit)s runnable invocations (new, approved, due retries, or a dead
-- worker's expired leases) and return each with the tool configuration to send it.
-- Owners take turns (migration 0051): each owner's runnable calls in order, the nth of an
-- owner's on turn n plus %(owners)s (owner id -> calls of it this worker holds), lowest
-- turns first, the oldest first within a turn. Alone, an owner's calls come in the order
-- they were made, as before; beside another's, a flood of them no longer takes every slot.
-- Each owner's calls are locked as they are read (SKIP LOCKED: workers claiming at once
-- take different calls): first each owner's share of the batch, then, if that came up
-- short, more of those that had more; those not claimed are unlocked with the statement.
-- The tool's part (its settings, fingerprint, gating now, its credential row) is computed
-- once per tool and returned on the first row of each tool only (tool_nth = 1; NULL on
-- the others, which store.py fills from the first: the same statement read it, so the
-- same version). Nothing about a call is decided on less than a per-row read would give.
-- A tool with a max_concurrency gets no more calls than its room in this worker: its limit
-- less %(busy)s (tool id -> calls of it this worker holds unsent), none when it is in
-- %(full)s (a JSON array of tool ids with no room: their calls are not even looked at).
-- Calls locked beyond a tool's room are not claimed (their locks end with the statement):
-- claimed, they would wait for the tool inside the worker's slots, and nothing else, any
-- owner's, would be sent meanwhile. Nor are a full tool's calls read (migration 0052): an
-- owner with calls of one waiting (due, not in flight) is "clogged", and its calls are read
-- tool by tool (agents.ready_tools), a full tool passed over with one probe however many
-- it has queued.
WITH RECURSIVE owners AS (
    -- The owners this claim visits: from the one after %(after)s (where this worker's last
    -- claim stopped) in owner order, round to the first past the last, until %(limit)s of
    -- them have a call runnable now or every owner has been seen once. One probe of the
    -- runnable index an owner, and one to see if it has a call to take now (an owner whose
    -- calls are all in flight or waiting to retry is passed, not counted). 1,000 owners
    -- with calls cost a claim 7 ms when it visited all of them.
    SELECT %(after)s::uuid AS owner, false AS lap, false AS ok, false AS clogged, 0 AS n,
           0 AS step
    UNION ALL
    SELECT s.owner, s.lap, r.ok, r.clogged, o.n + r.ok::int, o.step + 1
      FROM owners o
     CROSS JOIN LATERAL (
        -- the next owner, else (once a lap) the first: the second is read only when the
        -- first finds none
        (SELECT i.owner, o.lap FROM agents.tool_invocations i
          WHERE i.status = 'running' AND i.owner > o.owner ORDER BY i.owner LIMIT 1)
        UNION ALL
        (SELECT i.owner, true FROM agents.tool_invocations i
          WHERE i.status = 'running' AND NOT o.lap ORDER BY i.owner LIMIT 1)
        LIMIT 1) s
     CROSS JOIN LATERAL (
        SELECT c.clogged, CASE WHEN c.clogged
            THEN EXISTS (SELECT FROM agents.ready_tools(s.owner, %(full)s::jsonb, 1))
            -- (in run_after order: the owner's calls waiting for a retry are not read)
            ELSE coalesce((
                SELECT true FROM agents.tool_invocations i
                 WHERE i.owner = s.owner AND i.status = 'running' AND i.run_after <= now()
                   AND (i.lease_expires_at IS NULL OR i.lease_expires_at < now())
                   AND NOT (%(full)s::jsonb ? coalesce(i.tool_id::text, ''))
                 ORDER BY i.run_after LIMIT 1), false) END AS ok
          -- (looked for only in the owners of full tools: a tool's calls are its owner's)
          FROM (SELECT s.owner = ANY (ARRAY(
                        SELECT t.owner FROM agents.tools_registry t
                         WHERE t.id = ANY (ARRAY(
                            SELECT jsonb_array_elements_text(%(full)s::jsonb)::uuid))))
                   AND EXISTS (
                    SELECT FROM agents.tool_invocations i
                     WHERE i.owner = s.owner AND i.status = 'running'
                       AND i.tool_id = ANY (ARRAY(
                            SELECT jsonb_array_elements_text(%(full)s::jsonb)::uuid))
                       AND i.run_after <= now()
                       AND (i.lease_expires_at IS NULL OR i.lease_expires_at < now()))
                   AS clogged
                OFFSET 0) c
        OFFSET 0) r  -- (not pulled up: ok is used twice, and would be computed twice)
     WHERE o.n < %(limit)s
       AND NOT (s.lap AND s.owner > %(after)s::uuid)
), visited AS (
    SELECT owner, clogged FROM owners WHERE ok
), share AS (
    -- a first look takes the batch's share of each owner: the claim of 64 with 200 owners
    -- queued reads 1 call of each, not 64 (8.8 ms a claim)
    SELECT greatest(1, ceil(%(limit)s::numeric / greatest(count(*), 1)))::int AS n
      FROM visited
), first_look AS (
    SELECT o.owner, c.id, c.tool_id, c.run_after
      FROM visited o
     CROSS JOIN LATERAL (
        SELECT i.id, i.tool_id, i.run_after FROM agents.tool_invocations i
         WHERE i.owner = o.owner AND i.status = 'running' AND i.run_after <= now()
           AND (i.lease_expires_at IS NULL OR i.lease_expires_at < now())
           -- not "tool_id <> ALL (uuid[])": with one tool in the statistics PostgreSQL
           -- estimated that to leave no row, and the generic plan then read all of the
           -- owner's calls and sorted them instead of walking this index in order
           AND NOT (%(full)s::jsonb ? coalesce(i.tool_id::text, ''))
         ORDER BY i.run_after
         LIMIT (SELECT n FROM share)
           FOR UPDATE SKIP LOCKED) c
     WHERE NOT o.clogged
    UNION ALL
    -- a clogged owner's share, from up to that many of its tools with a call to take now,
    -- an equal part of each (at most one call a tool more than the share is locked)
    SELECT o.owner, c.id, c.tool_id, c.run_after
      FROM visited o
     CROSS JOIN share h
     CROSS JOIN LATERAL (
        SELECT array_agg(r.tool_id) AS ids
          FROM agents.ready_tools(o.owner, %(full)s::jsonb, h.n) r) t
     CROSS JOIN LATERAL unnest(t.ids) AS u(tool_id)
     CROSS JOIN LATERAL (
        SELECT i.id, i.tool_id, i.run_after FROM agents.tool_invocations i
         WHERE i.owner = o.owner AND i.tool_id = u.tool_id AND i.status = 'running'
           AND i.run_after <= now()
           AND (i.lease_expires_at IS NULL OR i.lease_expires_at < now())
         ORDER BY i.run_after
         LIMIT ceil(h.n::numeric / cardinality(t.ids))::int
           FOR UPDATE SKIP LOCKED) c
     WHERE o.clogged
), second_look AS (
    -- short of the batch: more of the owners that had more than their share (a clogged
    -- owner's next calls wait for the next claim)
    SELECT f.owner, c.id, c.tool_id, c.run_after
      FROM (SELECT owner FROM first_look
             WHERE owner IN (SELECT owner FROM visited WHERE NOT clogged)
             GROUP BY owner HAVING count(*) >= (SELECT n FROM share)) f
     CROSS JOIN LATERAL (
        SELECT i.id, i.tool_id, i.run_after FROM agents.tool_invocations i
         WHERE i.owner = f.owner AND i.status = 'running' AND i.run_after <= now()
           AND (i.lease_expires_at IS NULL OR i.lease_expires_at < now())
           AND NOT (%(full)s::jsonb ? coalesce(i.tool_id::text, ''))
           AND i.id <> ALL (ARRAY(SELECT l.id FROM first_look l WHERE l.owner = f.owner))
         ORDER BY i.run_after
         LIMIT %(limit)s - (SELECT count(*) FROM first_look)
           FOR UPDATE SKIP LOCKED) c
     WHERE (SELECT count(*) FROM first_look) < %(limit)s
), turns AS (
    SELECT c.id, c.tool_id, c.run_after,
           row_number() OVER (PARTITION BY c.owner ORDER BY c.run_after)
             + coalesce((%(owners)s::jsonb ->> c.owner::text)::int, 0) AS turn
      FROM (SELECT * FROM first_look UNION ALL SELECT * FROM second_look) c
), picked AS (
    SELECT l.id
      FROM (SELECT c.id, c.tool_id,
                   row_number() OVER (PARTITION BY c.tool_id ORDER BY c.turn, c.run_after) AS nth
              FROM (SELECT * FROM turns ORDER BY turn, run_after LIMIT %(limit)s) c) l
      LEFT JOIN agents.tools_registry t ON t.id = l.tool_id
     WHERE t.max_concurrency IS NULL
        OR l.nth <= t.max_concurrency - coalesce((%(busy)s::jsonb ->> l.tool_id::text)::int, 0)
), claimed AS (
    -- By primary key, whatever the statistics say (= ANY of an array: a handful of rows
    -- to the planner; joined with picked, a small queue's stale statistics can make it a
    -- scan of the whole table).
    UPDATE agents.tool_invocations i
       SET attempt = i.attempt + 1, lease_owner = %(worker)s,
           lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
     WHERE i.id = ANY (ARRAY(SELECT id FROM picked))
 RETURNING i.id, i.owner, i.agent_id, i.tool_id, i.input, i.attempt, i.approval_returns,
           i.approval_status, i.approval_expires_at, i.config_fingerprint, i.request_digest,
           i.sent_at,
           -- where the next claim of this worker goes on from
           (SELECT owner FROM owners ORDER BY step DESC LIMIT 1) AS walked_to
), numbered AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.tool_id) AS tool_nth FROM claimed c
), tools AS MATERIALIZED (
    SELECT t.id AS tid,
           -- kept with the tool (migration 0038), the formula for a tool without its row
           coalesce(f.fingerprint, agents.tool_fingerprint(t)) AS current_fingerprint,
           -- gating is decided again at every claim (SPEC §3), retries included
           agents.tool_is_gated(t) AS gated_now, t.approval_ttl_seconds,
           t.key AS tool_key, t.status AS tool_status, t.endpoint_url, t.http_method,
           t.request_template, t.auth_method, t.auth_placement, t.auth_param_name,
           t.auth_param_prefix, t.credential_ref, t.schema_input, t.schema_output,
           t.response_pointer, t.connect_timeout_seconds, t.timeout_seconds,
           t.max_response_bytes, t.max_attempts, t.max_concurrency, t.idempotency_header,
           -- the credential row, so that resolving it costs no extra round trip
           k.id AS cred_id, k.owner AS cred_owner, k.name AS cred_name, k.kind AS cred_kind,
           k.status AS cred_status, k.allowed_hosts AS cred_allowed_hosts,
           k.key_id AS cred_key_id, k.wrapped_key AS cred_wrapped_key, k.nonce AS cred_nonce,
           k.ciphertext AS cred_ciphertext, k.expires_at AS cred_expires_at
      FROM agents.tools_registry t
      LEFT JOIN agents.tool_fingerprints f ON f.tool_id = t.id
      LEFT JOIN agents.credentials k ON k.id = t.credential_ref
     WHERE t.id IN (SELECT tool_id FROM claimed)
)
SELECT n.id, n.owner, n.agent_id, n.tool_id, n.input, n.attempt, n.approval_returns,
       n.approval_status, n.approval_expires_at, n.config_fingerprint, n.request_digest,
       n.sent_at, n.tool_nth, n.walked_to,
       tools.current_fingerprint, tools.gated_now, tools.approval_ttl_seconds,
       tools.tool_key, tools.tool_status, tools.endpoint_url, tools.http_method,
       tools.request_template, tools.auth_method, tools.auth_placement,
       tools.auth_param_name, tools.auth_param_prefix, tools.credential_ref,
       tools.schema_input, tools.schema_output, tools.response_pointer,
       tools.connect_timeout_seconds, tools.timeout_seconds, tools.max_response_bytes,
       tools.max_attempts, tools.max_concurrency, tools.idempotency_header,
       tools.cred_id, tools.cred_owner, tools.cred_name, tools.cred_kind, tools.cred_status,
       tools.cred_allowed_hosts, tools.cred_key_id, tools.cred_wrapped_key, tools.cred_nonce,
       tools.cred_ciphertext, tools.cred_expires_at,
       a.status AS agent_status, a.name AS agent_name, s.allowed AS assignment_allowed
  FROM numbered n
  -- LEFT: a deleted tool or agent fails the call in the worker instead of stranding it
  LEFT JOIN tools ON tools.tid = n.tool_id AND n.tool_nth = 1
  LEFT JOIN agents.agents a ON a.id = n.agent_id
  LEFT JOIN agents.tool_assignments s ON s.agent_id = n.agent_id AND s.tool_id = n.tool_id;

-- name: adopt
-- The calls this process made and claimed for this worker as it inserted them (migration
-- 0036; `serve` hands them over), returned as the claim returns its rows: not run alone,
-- store.py puts it in place of the claim's picked and claimed CTEs. attempt = 1: a call
-- whose lease ran out and was claimed again by anyone is not this hand-off's any more.
SELECT i.id, i.owner, i.agent_id, i.tool_id, i.input, i.attempt, i.approval_returns,
       i.approval_status, i.approval_expires_at, i.config_fingerprint, i.request_digest,
       i.sent_at, NULL::uuid AS walked_to
  FROM agents.tool_invocations i
 WHERE i.id = ANY (%(ids)s::uuid[]) AND i.lease_owner = %(worker)s AND i.attempt = 1
   AND coalesce(i.status, '') = 'running';

-- name: wake
-- A worker that was registered asleep (migration 0018) is awake: calls stop notifying it.
-- Not run alone: store.py prefixes it to the claim as a CTE (WITH woke AS (...), ...), so
-- that waking costs no statement of its own.
DELETE FROM agents.dispatch_sleepers WHERE worker = %(worker)s;

-- name: try_sleep
-- About to wait for a notification (migration 0018): registered asleep, or not (a lock
-- timeout: stay awake). Sent in the same round trip as the claim that follows it.
SELECT agents.fn_dispatch_try_sleep(%(worker)s) AS asleep;

-- name: register
-- This worker follows the sleep protocol; true when its registration was still live.
SELECT agents.fn_dispatch_register(%(worker)s, %(seconds)s) AS live;

-- name: unregister
SELECT agents.fn_dispatch_unregister(%(worker)s);

-- name: mark_sent
-- Before a write leaves: record that it may have left, fenced by lease and attempt.
-- Rows by primary key whatever the statistics say: "= ANY (ARRAY(...))" is a handful of
-- rows to the planner, and the status is tested as coalesce(status, '') (status is NOT
-- NULL): "status = 'running'" would match the runnable index's predicate, and statistics
-- taken on a smaller queue then make the planner walk every queued row per statement.
UPDATE agents.tool_invocations i
   SET sent_at = now()
  FROM jsonb_to_recordset(%(items)s) AS r(id uuid, attempt integer)
 WHERE i.id = r.id AND i.attempt = r.attempt AND i.lease_owner = %(worker)s
   AND i.id = ANY (ARRAY(SELECT (e ->> 'id')::uuid FROM jsonb_array_elements(%(items)s) e))
   AND coalesce(i.status, '') = 'running'
RETURNING i.id;

-- name: finish
-- Record outcomes (terminal, 'running' again for a retry, or 'pending' again when the tool
-- became gated since the call was made) and every attempt made, with the request it sent
-- (credential masked; NULLs when nothing was sent).
-- A worker whose lease was taken over matches no row: its result is discarded.
-- Waiters learn of terminal outcomes and of calls back at 'pending' (not of retries) from
-- NOTIFY toolrelay_done in this transaction, so a woken waiter sees the row: one per batch,
-- ids comma-separated, 200 ids (7,400 bytes) at most per payload (the limit is 8,000).
-- Returns each row written as get_invocation reads it, but input and output (the worker
-- has both): `serve` hands it to the call's waiter, which then reads nothing. A worker with
-- nobody to hand it to selects done.id alone (store.py).
WITH r AS (
    SELECT * FROM jsonb_to_recordset(%(results)s) AS x(
        id uuid, attempt integer, status text, output jsonb, error text, error_code text,
        http_status integer, output_mismatch text, retry_in_ms double precision,
        clear_sent boolean, approval_ttl_seconds integer, fingerprint text)
), attempts AS (
    INSERT INTO agents.tool_invocation_attempts (
        invocation_id, owner, attempt, worker, started_at, finished_at, status_code,
        duration_ms, error_code, error, request_method, request_url, request_headers,
        request_body_bytes, request_body_sha256)
    SELECT a.invocation_id, a.owner, a.attempt, %(worker)s, a.started_at, a.finished_at,
           a.status_code, a.duration_ms, a.error_code, a.error, a.request_method,
           a.request_url, a.request_headers, a.request_body_bytes, a.request_body_sha256
      FROM jsonb_to_recordset(%(attempts)s) AS a(
          invocation_id uuid, owner uuid, attempt integer, started_at timestamptz,
          finished_at timestamptz, status_code integer, duration_ms double precision,
          error_code text, error text, request_method text, request_url text,
          request_headers jsonb, request_body_bytes bigint, request_body_sha256 text)
), done AS (
UPDATE agents.tool_invocations i
   SET status = r.status,
       output = r.output,
       error = r.error,
       error_code = r.error_code,
       http_status = r.http_status,
       output_mismatch = r.output_mismatch,
       approval_status = CASE WHEN r.status IN ('expired', 'pending') THEN r.status
                              ELSE i.approval_status END,
       approval_expires_at = CASE WHEN r.status = 'pending'
                                  THEN now() + make_interval(secs => r.approval_ttl_seconds)
                                  ELSE i.approval_expires_at END,
       config_fingerprint = CASE WHEN r.status = 'pending' THEN r.fingerprint
                                 ELSE i.config_fingerprint END,
       -- this claim sent nothing: it counts no attempt (migration 0053)
       approval_returns = i.approval_returns + (r.status = 'pending')::int,
       lease_owner = NULL,
       lease_expires_at = NULL,
       run_after = CASE WHEN r.status = 'running'
                        THEN now() + r.retry_in_ms * interval '1 millisecond'
                        ELSE i.run_after END,
       sent_at = CASE WHEN r.clear_sent THEN NULL ELSE i.sent_at END,
       finished_at = CASE WHEN r.status NOT IN ('running', 'pending') THEN now() END,
       updated_at = now()
  FROM r
 WHERE i.id = r.id AND i.attempt = r.attempt AND i.lease_owner = %(worker)s
   -- by primary key whatever the statistics say (see mark_sent)
   AND i.id = ANY (ARRAY(SELECT (e ->> 'id')::uuid FROM jsonb_array_elements(%(results)s) e))
   AND coalesce(i.status, '') = 'running'
RETURNING i.id, i.owner, i.tool_id, i.agent_id, i.run_id, i.status, i.approval_status,
          i.error, i.error_code, i.created_at, i.updated_at, i.approval_expires_at,
          i.config_fingerprint, i.decided_by, i.decided_at, i.reject_reason, i.attempt,
          i.lease_owner, i.lease_expires_at, i.run_after, i.sent_at, i.http_status,
          i.output_mismatch, i.finished_at, i.deleted_tool_key, i.deleted_agent_name,
          i.request_digest, i.retry_of, i.decided_by_policy, i.reason
), told AS (
    SELECT count(pg_notify('toolrelay_done', ids)) AS n
      FROM (SELECT string_agg(id::text, ',') AS ids
              FROM (SELECT id, (row_number() OVER () - 1) / 200 AS chunk
                      FROM done WHERE status <> 'running') numbered
             GROUP BY chunk) chunks
)
SELECT done.* FROM done, told;

-- name: heartbeat
-- Extend the leases of the calls in flight. A row locked now is skipped, not waited for:
-- its lock is most often this worker's own finish of a batch, which, each statement holding
-- rows the other wanted, deadlocked with this one (PostgreSQL then aborted the finish: its
-- results were lost and its calls ran again after their leases; seen with two serve
-- processes at 16 sessions, 2026-12-03). A row skipped is extended by the next beat, a third
-- of a lease later, if it is still in flight.
UPDATE agents.tool_invocations
   SET lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY (ARRAY(
           SELECT id FROM agents.tool_invocations
            WHERE id = ANY(%(ids)s) AND lease_owner = %(worker)s AND status = 'running'
              FOR UPDATE SKIP LOCKED))
RETURNING id;

-- name: release
-- On shutdown: hand back claims whose request never left, for another worker.
UPDATE agents.tool_invocations
   SET lease_owner = NULL, lease_expires_at = NULL, attempt = attempt - 1
 WHERE id = ANY(%(ids)s) AND lease_owner = %(worker)s AND status = 'running'
   AND sent_at IS NULL;

-- name: pending_work
-- For --drain: is anything still running (runnable now, later, or under a lease)? The
-- unleased calls of the tools in %(skip)s (this worker cannot open their credential) are
-- not this worker's to wait for.
SELECT EXISTS (SELECT 1 FROM agents.tool_invocations
                WHERE status = 'running'
                  AND (lease_owner IS NOT NULL OR tool_id <> ALL (%(skip)s::uuid[]))) AS busy;

-- name: expire_approvals
SELECT fn_expire_tool_invocations() AS expired;

-- name: prune
-- Retention: delete one batch of finished invocations (and, by cascade, their attempts)
-- that finished before %(cutoff)s. Runnable rows are never touched.
WITH doomed AS (
    SELECT id FROM agents.tool_invocations
     WHERE status IN ('completed', 'failed', 'rejected', 'expired')
       AND coalesce(finished_at, updated_at) < %(cutoff)s
     LIMIT %(batch)s
)
DELETE FROM agents.tool_invocations i USING doomed WHERE i.id = doomed.id;

-- name: prune_count
-- What `prune` would delete before %(cutoff)s (--dry-run).
SELECT count(*) AS n FROM agents.tool_invocations
 WHERE status IN ('completed', 'failed', 'rejected', 'expired')
   AND coalesce(finished_at, updated_at) < %(cutoff)s
