-- Owners see and change only their own rows. Invocations and attempts are read-only to
-- owners: they are written through the functions (approval cannot be skipped) and by
-- the dispatcher role. Credential ciphertext is readable by the dispatcher role alone.
ALTER TABLE agents.agents ALTER COLUMN owner SET DEFAULT auth.uid();
ALTER TABLE agents.tools_registry ALTER COLUMN owner SET DEFAULT auth.uid();
ALTER TABLE agents.credentials ALTER COLUMN owner SET DEFAULT auth.uid();
ALTER TABLE agents.tool_assignments ALTER COLUMN owner SET DEFAULT auth.uid();

ALTER TABLE agents.agents ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents.tools_registry ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents.tool_assignments ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents.tool_invocations ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents.tool_invocation_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents.credentials ENABLE ROW LEVEL SECURITY;

CREATE POLICY agents_owner ON agents.agents TO authenticated
    USING (owner = auth.uid()) WITH CHECK (owner = auth.uid());
CREATE POLICY tools_registry_owner ON agents.tools_registry TO authenticated
    USING (owner = auth.uid()) WITH CHECK (owner = auth.uid());
CREATE POLICY credentials_owner ON agents.credentials TO authenticated
    USING (owner = auth.uid()) WITH CHECK (owner = auth.uid());
CREATE POLICY tool_invocations_owner_read ON agents.tool_invocations FOR SELECT TO authenticated
    USING (owner = auth.uid());
CREATE POLICY tool_invocation_attempts_owner_read ON agents.tool_invocation_attempts
    FOR SELECT TO authenticated USING (owner = auth.uid());
-- Assigning needs the caller to own both the agent and the tool.
CREATE POLICY tool_assignments_owner ON agents.tool_assignments TO authenticated
    USING (owner = auth.uid())
    WITH CHECK (
        owner = auth.uid()
        AND EXISTS (SELECT 1 FROM agents.agents a WHERE a.id = agent_id AND a.owner = auth.uid())
        AND EXISTS (SELECT 1 FROM agents.tools_registry t WHERE t.id = tool_id AND t.owner = auth.uid())
    );

REVOKE ALL ON ALL TABLES IN SCHEMA agents FROM PUBLIC;
GRANT USAGE ON SCHEMA agents TO authenticated, service_role;

GRANT SELECT, INSERT, UPDATE, DELETE ON agents.agents, agents.tools_registry,
    agents.tool_assignments TO authenticated;
GRANT SELECT ON agents.tool_invocations, agents.tool_invocation_attempts TO authenticated;
GRANT SELECT (id, owner, name, kind, allowed_hosts, status, created_at, rotated_at,
              last_used_at, expires_at)
    ON agents.credentials TO authenticated;
GRANT INSERT (id, owner, name, kind, allowed_hosts, key_id, wrapped_key, nonce, ciphertext,
              expires_at)
    ON agents.credentials TO authenticated;
GRANT UPDATE (name, allowed_hosts, status, key_id, wrapped_key, nonce, ciphertext,
              rotated_at, expires_at)
    ON agents.credentials TO authenticated;
GRANT DELETE ON agents.credentials TO authenticated;

GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA agents TO service_role;

-- Functions: owners call the public fn_*; internals stay private.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA agents FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.url_host(text) TO authenticated, service_role;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA agents TO service_role;
REVOKE EXECUTE ON FUNCTION
    public.fn_register_tool(text, text, text, text, jsonb, jsonb, text, boolean, boolean, text,
                            text, jsonb, text, text, uuid, text, text, text),
    public.fn_create_agent(text),
    public.fn_assign_tool(uuid, uuid, boolean),
    public.fn_revoke_tool(uuid, uuid),
    public.fn_invoke_tool(uuid, uuid, jsonb, uuid),
    public.fn_approve_tool_invocation(uuid),
    public.fn_reject_tool_invocation(uuid, text),
    public.fn_expire_tool_invocations()
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    public.fn_register_tool(text, text, text, text, jsonb, jsonb, text, boolean, boolean, text,
                            text, jsonb, text, text, uuid, text, text, text),
    public.fn_create_agent(text),
    public.fn_assign_tool(uuid, uuid, boolean),
    public.fn_revoke_tool(uuid, uuid),
    public.fn_invoke_tool(uuid, uuid, jsonb, uuid),
    public.fn_approve_tool_invocation(uuid),
    public.fn_reject_tool_invocation(uuid, text),
    public.fn_expire_tool_invocations()
TO authenticated, service_role;
