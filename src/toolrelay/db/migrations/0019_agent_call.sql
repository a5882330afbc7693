-- An agent's tools/call in one lookup (issue 14, goal 1).
--
-- tools/call used to read every tool the agent may call (the whole rows, schemas and
-- templates) to find one and to compute the stamp that tells a session its list changed.
-- Now one function answers both: the callable tool by key and the stamp, computed here.
-- SECURITY INVOKER (row-level security decides what the agent sees, as before); plpgsql
-- so that the plans are cached per connection.

-- A digest of what the agent may call now (assigned, allowed, active): key, last change
-- and whether calls wait for approval. Epoch seconds, not timestamptz text, which would
-- follow each session's TimeZone and DateStyle.
CREATE FUNCTION agents.agent_tools_stamp(p_agent uuid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN encode(sha256(convert_to(coalesce((
        SELECT string_agg(t.key || '|' || extract(epoch FROM t.updated_at)::text || '|'
                          || agents.tool_is_gated(t)::text, E'\n' ORDER BY t.key COLLATE "C")
          FROM agents.tool_assignments s
          JOIN agents.tools_registry t ON t.id = s.tool_id
         WHERE s.agent_id = p_agent AND s.allowed AND t.status = 'active'), ''), 'UTF8')), 'hex');
END
$$;

-- The tool ``p_key`` as the agent may call it now (NULLs when it may not: unassigned,
-- denied, disabled and unknown look the same), with the stamp above. Always one row.
CREATE FUNCTION agents.agent_call_target(
    p_agent uuid, p_key text,
    OUT tool_id uuid, OUT tool_key text, OUT schema_input jsonb, OUT schema_output jsonb,
    OUT gated boolean, OUT stamp text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    SELECT t.id, t.key, t.schema_input, t.schema_output, agents.tool_is_gated(t)
      INTO tool_id, tool_key, schema_input, schema_output, gated
      FROM agents.tool_assignments s
      JOIN agents.tools_registry t ON t.id = s.tool_id
     WHERE s.agent_id = p_agent AND t.key = p_key AND s.allowed AND t.status = 'active';
    stamp := agents.agent_tools_stamp(p_agent);
END
$$;

REVOKE EXECUTE ON FUNCTION agents.agent_tools_stamp(uuid), agents.agent_call_target(uuid, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.agent_tools_stamp(uuid), agents.agent_call_target(uuid, text)
    TO authenticated;
