-- An invoke in one round trip once the tool has been read (issue 14, goal 3).
--
-- Registry.invoke validates the input against the tool's schema_input in Python, so it
-- read the tool first (one round trip) and inserted second (another). A process now keeps
-- what it read, with the version of the tool row it came from; the next call validates
-- against that and inserts in one trip, through agents.invoke_seen, which inserts only
-- while the tool is still that version (NULL otherwise: read it again). Who may call what
-- is decided by fn_invoke_tool as before (assignment, status, the caller's identity);
-- the version only guards the schema the input was checked against.

-- The version of a tool's row: xmin changes with every update (a new row version), and
-- updated_at too. NULL when the caller cannot see the tool.
CREATE FUNCTION agents.tool_version(p_tool uuid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT t.xmin::text || '/' || extract(epoch FROM t.updated_at)::text
      FROM agents.tools_registry t WHERE t.id = p_tool
$$;

-- invoke_target (0016) and the version of the tool found.
CREATE FUNCTION agents.invoke_lookup(
    p_agent_id uuid, p_agent_name text, p_tool_id uuid, p_tool_key text, p_assigned boolean,
    OUT found_agent uuid, OUT found_tool uuid, OUT found_schema jsonb, OUT found_version text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    SELECT f.found_agent, f.found_tool, f.found_schema
      INTO found_agent, found_tool, found_schema
      FROM agents.invoke_target(p_agent_id, p_agent_name, p_tool_id, p_tool_key, p_assigned) f;
    found_version := agents.tool_version(found_tool);
END
$$;

-- agent_call_target (0019) and the version of the tool found.
CREATE FUNCTION agents.agent_call_lookup(
    p_agent uuid, p_key text,
    OUT tool_id uuid, OUT tool_key text, OUT schema_input jsonb, OUT schema_output jsonb,
    OUT gated boolean, OUT stamp text, OUT version text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    SELECT f.tool_id, f.tool_key, f.schema_input, f.schema_output, f.gated, f.stamp
      INTO tool_id, tool_key, schema_input, schema_output, gated, stamp
      FROM agents.agent_call_target(p_agent, p_key) f;
    version := agents.tool_version(tool_id);
END
$$;

-- fn_invoke_tool, when the tool is still version p_version (and, given a name, the agent
-- still has it); else NULL and nothing is recorded.
CREATE FUNCTION agents.invoke_seen(
    p_agent_id uuid, p_agent_name text, p_tool_id uuid, p_input jsonb, p_run_id uuid,
    p_version text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog
AS $$
BEGIN
    IF agents.tool_version(p_tool_id) IS DISTINCT FROM p_version
       OR (p_agent_name IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM agents.agents a WHERE a.id = p_agent_id AND a.name = p_agent_name))
    THEN
        RETURN NULL;
    END IF;
    RETURN public.fn_invoke_tool(p_agent_id, p_tool_id, p_input, p_run_id);
END
$$;

REVOKE EXECUTE ON FUNCTION agents.tool_version(uuid),
    agents.invoke_lookup(uuid, text, uuid, text, boolean), agents.agent_call_lookup(uuid, text),
    agents.invoke_seen(uuid, text, uuid, jsonb, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.tool_version(uuid),
    agents.invoke_lookup(uuid, text, uuid, text, boolean), agents.agent_call_lookup(uuid, text),
    agents.invoke_seen(uuid, text, uuid, jsonb, uuid, text) TO authenticated, service_role;
