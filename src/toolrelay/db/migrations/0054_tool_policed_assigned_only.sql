-- agents.tool_policed (0028) answered an agent identity about any tool of its tenant: given
-- a tool id it was not assigned, it learned whether that tool exists, is gated and has
-- rules. An agent reads only its assigned tools (0012); the helper now answers it only
-- about those, and about any other id as about an unknown one (NULL). An owner or member
-- is answered as before.
CREATE OR REPLACE FUNCTION agents.tool_policed(p_tool uuid) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_agent uuid := agents.caller_agent_id();
    v_gated boolean;
BEGIN
    SELECT agents.tool_is_gated(t) INTO v_gated FROM agents.tools_registry t
     WHERE t.id = p_tool AND t.owner = auth.uid()
       AND (v_agent IS NULL OR EXISTS (
               SELECT 1 FROM agents.tool_assignments s
                WHERE s.agent_id = v_agent AND s.tool_id = t.id));
    IF v_gated IS NOT TRUE THEN
        RETURN NULL;
    END IF;
    RETURN EXISTS (SELECT 1 FROM agents.tool_policies p WHERE p.tool_id = p_tool);
END
$$;
