-- Policies for the obvious cases (issue 16, item 5; docs/approvals.md): rules an admin
-- attaches to a tool that approve or reject a call waiting for approval when its input
-- matches a JSON Schema ("amount <= 100", "channel in an allow-list").
--
-- JSON Schema is evaluated by toolrelay (jsonschema, as every input is), not by PostgreSQL,
-- so a rule's decision is made by toolrelay's own trusted code acting as the dispatcher
-- role: fn_policy_decide is granted to service_role only. An agent identity, or an owner,
-- can never decide by "a rule" themselves; a call made where no rule is applied (plain SQL)
-- simply waits for a person. The decision is recorded as the rule's (decided_by_policy,
-- decided_by NULL), and an approval binds to the digest of the request rendered when the
-- rule matched, as a person's does.

CREATE TABLE agents.tool_policies (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner         uuid NOT NULL DEFAULT auth.uid(),
    tool_id       uuid NOT NULL REFERENCES agents.tools_registry (id) ON DELETE CASCADE,
    name          text NOT NULL,
    action        text NOT NULL,
    input_schema  jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT tool_policies_name_check CHECK (length(btrim(name)) BETWEEN 1 AND 200
                                               AND name !~ '[[:cntrl:]]'),
    CONSTRAINT tool_policies_action_check CHECK (action = ANY (ARRAY['approve', 'reject'])),
    CONSTRAINT tool_policies_input_schema_check CHECK (jsonb_typeof(input_schema) = 'object'),
    CONSTRAINT tool_policies_tool_name_key UNIQUE (tool_id, name)
);
CREATE INDEX tool_policies_owner_idx ON agents.tool_policies (owner, tool_id);

ALTER TABLE agents.tool_policies ENABLE ROW LEVEL SECURITY;
CREATE POLICY tool_policies_owner_read ON agents.tool_policies FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
CREATE POLICY tool_policies_owner_insert ON agents.tool_policies FOR INSERT TO authenticated
    WITH CHECK (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL
                AND EXISTS (SELECT 1 FROM agents.tools_registry t
                             WHERE t.id = tool_id AND t.owner = (SELECT auth.uid())));
CREATE POLICY tool_policies_owner_delete ON agents.tool_policies FOR DELETE TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
REVOKE ALL ON agents.tool_policies FROM PUBLIC;
GRANT SELECT, INSERT, DELETE ON agents.tool_policies TO authenticated;
GRANT SELECT ON agents.tool_policies TO service_role;

-- Writes: an admin's (0025's statement trigger), logged (0023).
CREATE TRIGGER tool_policies_refuse_agent_identity
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON agents.tool_policies
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_refuse_agent_identity();
CREATE TRIGGER tool_policies_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.tool_policies
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('policy', 'name');

ALTER TABLE agents.tool_invocations ADD COLUMN decided_by_policy uuid;  -- the rule; NULL: a person

-- A rule's decision, made by toolrelay as the dispatcher once it has checked the call's
-- input against the rule's schema. Returns the status the call now has.
CREATE FUNCTION public.fn_policy_decide(
    p_invocation_id uuid, p_policy_id uuid, p_request_digest text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v agents.tool_invocations;
    p agents.tool_policies;
BEGIN
    IF agents.caller_agent_id() IS NOT NULL OR auth.uid() IS NOT NULL THEN
        RAISE EXCEPTION 'only toolrelay''s dispatcher role applies a policy' USING ERRCODE = '42501';
    END IF;
    IF p_request_digest IS NOT NULL AND p_request_digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'request digest must be 64 lowercase hex characters (sha256), got %',
            left(p_request_digest, 80) USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v FROM agents.tool_invocations WHERE id = p_invocation_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invocation % not found', p_invocation_id USING ERRCODE = 'P0002';
    END IF;
    SELECT * INTO p FROM agents.tool_policies
     WHERE id = p_policy_id AND tool_id = v.tool_id AND owner = v.owner;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'policy % is not one of this call''s tool', p_policy_id
            USING ERRCODE = 'P0002';
    END IF;
    IF v.status <> 'pending' THEN
        RETURN v.status;  -- a person (or another rule) decided first
    END IF;
    IF v.approval_expires_at IS NOT NULL AND v.approval_expires_at <= now() THEN
        RETURN v.status;  -- expired: left to the expiry
    END IF;
    IF p.action = 'reject' THEN
        UPDATE agents.tool_invocations
           SET status = 'rejected', approval_status = 'rejected', decided_by = NULL,
               decided_by_policy = p.id, decided_at = now(), finished_at = now(),
               reject_reason = 'policy ' || p.name,
               error = 'rejected by policy ' || p.name, updated_at = now()
         WHERE id = v.id;
        RETURN 'rejected';
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'running', approval_status = 'approved', decided_by = NULL,
           decided_by_policy = p.id, decided_at = now(), run_after = now(),
           request_digest = p_request_digest, updated_at = now()
     WHERE id = v.id;
    RETURN 'running';
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_policy_decide(uuid, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_policy_decide(uuid, uuid, text) TO service_role;

-- Answered beside an invoke that may wait for approval (Registry): NULL when a call to this
-- tool does not wait, else whether the tool has rules to apply. As the definer, an index
-- lookup or two, not the agent's tools policy (its assigned-tools array is built per
-- statement); only the caller's own tenant's tools. Registry asks it only when the tool it
-- read is gated, so an ungated call pays nothing for policies.
CREATE FUNCTION agents.tool_policed(p_tool uuid) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_gated boolean;
BEGIN
    SELECT agents.tool_is_gated(t) INTO v_gated FROM agents.tools_registry t
     WHERE t.id = p_tool AND t.owner = auth.uid();
    IF v_gated IS NOT TRUE THEN
        RETURN NULL;
    END IF;
    RETURN EXISTS (SELECT 1 FROM agents.tool_policies p WHERE p.tool_id = p_tool);
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tool_policed(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.tool_policed(uuid) TO authenticated, service_role;
