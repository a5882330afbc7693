-- Row-level security costs the same per row however many tools an agent has (issue 14).
--
-- An agent saw a tool when `id = ANY (<its assigned tool ids>)`: a linear search of that
-- array for every tools_registry row looked at, so an agent with 1,200 tools paid ~24 ms
-- for one scan of them (each MCP call scans them once, for its list stamp). Written
-- `id IN (SELECT unnest(...))` it is a hashed subplan: the array is hashed once per
-- statement. And `owner = auth.uid()` parsed request.jwt.claims for every row; written
-- `(SELECT auth.uid())` it is an InitPlan, evaluated once per statement (Supabase's own
-- advice for RLS): the same rewrite for every policy in schema agents, whatever migration
-- made it. The rules themselves do not change; tests/security/test_rls_per_row_cost.py
-- keeps both so.
ALTER POLICY tools_registry_owner_read ON agents.tools_registry
    USING (owner = auth.uid() AND ((SELECT agents.caller_agent_id()) IS NULL
                                   OR id IN (SELECT unnest(agents.caller_tool_ids()))));

DO $$
DECLARE
    p record;
    v_qual text;
    v_check text;
    v_sql text;
BEGIN
    FOR p IN SELECT schemaname, tablename, policyname, qual, with_check
               FROM pg_catalog.pg_policies WHERE schemaname = 'agents'
    LOOP
        v_qual := replace(p.qual, 'auth.uid()', '(SELECT auth.uid())');
        v_check := replace(p.with_check, 'auth.uid()', '(SELECT auth.uid())');
        CONTINUE WHEN v_qual IS NOT DISTINCT FROM p.qual
                  AND v_check IS NOT DISTINCT FROM p.with_check;
        v_sql := format('ALTER POLICY %I ON %I.%I', p.policyname, p.schemaname, p.tablename);
        IF v_qual IS NOT NULL THEN
            v_sql := v_sql || ' USING (' || v_qual || ')';
        END IF;
        IF v_check IS NOT NULL THEN
            v_sql := v_sql || ' WITH CHECK (' || v_check || ')';
        END IF;
        EXECUTE v_sql;
    END LOOP;
END
$$;

-- tool_is_gated is a pure expression of the row: without its SET clause the planner inlines
-- it (a function with SET is called row by row; the list stamp calls it for every tool).
-- Its body names only columns and literals, so the search path cannot change it.
ALTER FUNCTION agents.tool_is_gated(agents.tools_registry) RESET search_path;

-- The list stamp (0019) reads every tool the agent may call on each MCP call: as the
-- definer it checks the caller once, not every row through the policies (half its cost at
-- 1,200 tools). It tells only a digest, and only of the caller's own agent's tools (an
-- owner: any of its agents'; an agent: itself).
CREATE OR REPLACE FUNCTION agents.agent_tools_stamp(p_agent uuid) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_caller uuid := agents.caller_agent_id();
BEGIN
    IF v_owner IS NULL OR (v_caller IS NOT NULL AND v_caller IS DISTINCT FROM p_agent) THEN
        RETURN NULL;
    END IF;
    RETURN encode(sha256(convert_to(coalesce((
        SELECT string_agg(t.key || '|' || extract(epoch FROM t.updated_at)::text || '|'
                          || agents.tool_is_gated(t)::text, E'\n' ORDER BY t.key COLLATE "C")
          FROM agents.tool_assignments s
          JOIN agents.tools_registry t ON t.id = s.tool_id
         WHERE s.agent_id = p_agent AND s.owner = v_owner AND t.owner = v_owner
           AND s.allowed AND t.status = 'active'), ''), 'UTF8')), 'hex');
END
$$;
