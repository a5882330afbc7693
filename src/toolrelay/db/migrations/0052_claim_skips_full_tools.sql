-- A claim reads none of the calls queued for a tool with no room (docs/architecture.md, "A
-- tool at its max_concurrency waits in the queue"). The claim skipped them one row at a
-- time: an owner's 100,000 calls queued for a tool limited to 1 made every claim of every
-- worker, whoever's calls it took, read all of them (91–106 ms a claim of 64 against
-- 6–7 ms), twice when the owner had another call behind them. An owner with calls waiting
-- for a full tool is "clogged"; its calls are then read tool by tool through this index, a
-- full tool's passed over with one probe whatever it has queued.
CREATE INDEX tool_invocations_runnable_tool_idx ON agents.tool_invocations (owner, tool_id, run_after)
    WHERE status = 'running';

-- The tools of p_owner with a call to take now, not in p_full (a JSON array of tool ids),
-- at most p_max of them, in tool id order. One probe of the index a tool, and a second for
-- a tool not full; at most 256 tools are looked at: an owner with more tools than that
-- with calls queued has those past the 256th taken once it is no longer clogged.
-- PL/pgSQL, not SQL: an SQL function would be inlined into the claim, and its plan's nodes
-- set up at every claim whether any owner is clogged or not (0.3 ms a claim of 64).
CREATE FUNCTION agents.ready_tools(p_owner uuid, p_full jsonb, p_max integer)
RETURNS TABLE (tool_id uuid)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE walk AS (
        (SELECT i.tool_id, 1 AS step FROM agents.tool_invocations i
          WHERE i.owner = p_owner AND i.status = 'running' AND i.tool_id IS NOT NULL
          ORDER BY i.tool_id LIMIT 1)
        UNION ALL
        SELECT n.tool_id, w.step + 1
          FROM walk w
         CROSS JOIN LATERAL (
            SELECT i.tool_id FROM agents.tool_invocations i
             WHERE i.owner = p_owner AND i.status = 'running' AND i.tool_id > w.tool_id
             ORDER BY i.tool_id LIMIT 1) n
         WHERE w.step < 256
    )
    -- (a lateral with a limit, not EXISTS: that can be made a join that reads all of the
    -- owner's due calls, a full tool's too, once, where the statistics have it few)
    SELECT w.tool_id FROM walk w
     CROSS JOIN LATERAL (
        SELECT FROM agents.tool_invocations i
         WHERE i.owner = p_owner AND i.tool_id = w.tool_id AND i.status = 'running'
           AND i.run_after <= now()
           AND (i.lease_expires_at IS NULL OR i.lease_expires_at < now())
         ORDER BY i.run_after LIMIT 1) due
     WHERE NOT (p_full ? w.tool_id::text)
     LIMIT p_max;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.ready_tools(uuid, jsonb, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.ready_tools(uuid, jsonb, integer) TO service_role;
