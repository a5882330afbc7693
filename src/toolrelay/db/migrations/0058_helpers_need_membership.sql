-- The definer helpers an identity may call answer a caller who is not a member (a removed
-- member, another tenant's member id, the tenant's own token once its member row is gone)
-- as about an unknown id, as the read policies do since 0056: agent_tools_stamp told such a
-- caller an agent's tools version, tool_policed whether a tool is gated and has rules. An
-- agent identity is asked nothing more (its own checks stay as they were: 0054).
CREATE OR REPLACE FUNCTION agents.agent_tools_stamp(p_agent uuid) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_caller uuid := agents.caller_agent_id();
BEGIN
    IF v_owner IS NULL OR (v_caller IS NOT NULL AND v_caller IS DISTINCT FROM p_agent)
       OR (v_caller IS NULL AND agents.caller_member_role() IS NULL) THEN
        RETURN NULL;
    END IF;
    RETURN coalesce((SELECT v.version::text
                       FROM agents.agent_tools_versions v
                       JOIN agents.agents a ON a.id = v.agent_id
                      WHERE v.agent_id = p_agent AND a.owner = v_owner), '0');
END
$$;

CREATE OR REPLACE FUNCTION agents.tool_policed(p_tool uuid) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_agent uuid := agents.caller_agent_id();
    v_gated boolean;
BEGIN
    IF v_agent IS NULL AND agents.caller_member_role() IS NULL THEN
        RETURN NULL;
    END IF;
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
