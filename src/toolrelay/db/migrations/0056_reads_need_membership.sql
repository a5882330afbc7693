-- Reading a tenant takes one of its members (an audit's findings F1-F3).
--
-- F1. Every function refuses a caller who is not a member (require_role, 0025), but the
-- read policies asked only for the tenant's sub and no agent_id. With claims
-- {"sub": T, "member_id": M} where M was removed, is another tenant's member or is made
-- up, or with T's own token ({"sub": T}) once T's own member row was removed, a plain
-- SELECT returned the whole tenant: its tools, agents, calls, members, tokens' metadata,
-- credentials' metadata, rules. Every read (and ALL) policy for role authenticated now
-- also asks agents.caller_member_role() for a role: 'agent' for an agent identity, the
-- member's role, 'admin' for a tenant with no members yet, NULL for anyone else. Each
-- policy keeps its name and its conditions. (config_audit_owner_read and
-- webhook_subscriptions_owner already ask for 'admin'.) The role is read in an InitPlan,
-- once per statement, as the other conditions are (0021).
-- Removing the tenant's own member row now revokes the tenant's own tokens (no agent, no
-- member) as removing a member revokes theirs, and authenticate_token refuses such a token
-- while that row is removed (an admin may make one afterwards). agents.check_token accepts
-- only the token of the agent the transaction acts as, so never one of these.
--
-- F2. An agent identity calling fn_invoke_tool (or invoke_seen without a version) with a
-- tool of its tenant it is not assigned was told "tool notes.list is disabled, not active"
-- or "tool notes.list is not assigned to agent bot": the key and status of a tool it
-- cannot read. For an agent, such a tool is now refused as an unknown id is ("tool <the id
-- it gave> not found", P0002), the assignment checked before the status. Owners and
-- members are told as before. (registry/service.py reads again on P0002 as on TR002, and
-- its lookup says "not assigned" to the agent.)
--
-- F3. agents.policy_standing answered a caller without sub about any tenant's rule: any
-- role authenticated with claims lacking sub. Without sub it now answers only a role with
-- service_role's privileges (the dispatcher, applying rules: registry/policies.py, and
-- fn_policy_decide under it), as fn_expire_tool_invocations does (0012); with sub, only a
-- caller with a role in that tenant.

-- F1: the read policies -------------------------------------------------------------------

DROP POLICY agents_owner_read ON agents.agents;
CREATE POLICY agents_owner_read ON agents.agents FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid())
           AND ((SELECT agents.caller_agent_id()) IS NULL
                OR id = (SELECT agents.caller_agent_id()))
           AND (SELECT agents.caller_member_role()) IS NOT NULL);

DROP POLICY tools_registry_owner_read ON agents.tools_registry;
CREATE POLICY tools_registry_owner_read ON agents.tools_registry FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid())
           AND ((SELECT agents.caller_agent_id()) IS NULL
                OR id IN (SELECT unnest(agents.caller_tool_ids())))
           AND (SELECT agents.caller_member_role()) IS NOT NULL);

DROP POLICY tool_assignments_owner_read ON agents.tool_assignments;
CREATE POLICY tool_assignments_owner_read ON agents.tool_assignments FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid())
           AND ((SELECT agents.caller_agent_id()) IS NULL
                OR agent_id = (SELECT agents.caller_agent_id()))
           AND (SELECT agents.caller_member_role()) IS NOT NULL);

DROP POLICY tool_invocations_owner_read ON agents.tool_invocations;
CREATE POLICY tool_invocations_owner_read ON agents.tool_invocations FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid())
           AND ((SELECT agents.caller_agent_id()) IS NULL
                OR agent_id = (SELECT agents.caller_agent_id()))
           AND (SELECT agents.caller_member_role()) IS NOT NULL);

DROP POLICY credentials_owner ON agents.credentials;
CREATE POLICY credentials_owner ON agents.credentials FOR ALL TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL
           AND (SELECT agents.caller_member_role()) IS NOT NULL)
    WITH CHECK (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL
                AND (SELECT agents.caller_member_role()) IS NOT NULL);

-- The tables an agent identity does not read: the tenant's sub, no agent_id, a member.
DO $$
DECLARE
    v_policy record;
BEGIN
    FOR v_policy IN
        SELECT * FROM (VALUES
            ('tool_invocation_attempts', 'tool_invocation_attempts_owner_read'),
            ('api_tokens', 'api_tokens_owner_read'),
            ('members', 'members_owner_read'),
            ('invocation_approvals', 'invocation_approvals_owner_read'),
            ('webhook_deliveries', 'webhook_deliveries_owner_read'),
            ('credential_connections', 'credential_connections_owner_read'),
            ('tool_policies', 'tool_policies_owner_read'),
            ('policy_confirmations', 'policy_confirmations_owner_read')) AS p (tab, name)
    LOOP
        EXECUTE format('DROP POLICY %I ON agents.%I', v_policy.name, v_policy.tab);
        EXECUTE format(
            'CREATE POLICY %I ON agents.%I FOR SELECT TO authenticated'
            ' USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL'
            ' AND (SELECT agents.caller_member_role()) IS NOT NULL)',
            v_policy.name, v_policy.tab);
    END LOOP;
END
$$;

-- F1: the tenant's own tokens -------------------------------------------------------------

CREATE OR REPLACE FUNCTION public.fn_remove_member(p_member_id uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v agents.members;
BEGIN
    SELECT * INTO v FROM agents.members m
     WHERE m.id = p_member_id AND m.owner = v_owner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'member % not found', p_member_id USING ERRCODE = 'P0002';
    END IF;
    IF v.removed_at IS NOT NULL THEN
        RETURN false;
    END IF;
    IF v.role = 'admin' THEN
        PERFORM agents.keep_an_admin(v_owner, p_member_id);
    END IF;
    UPDATE agents.members SET removed_at = now() WHERE id = p_member_id;
    UPDATE agents.api_tokens SET revoked_at = now()
     WHERE revoked_at IS NULL
       AND (member_id = p_member_id
            -- the tenant's own row: its own tokens too (no member, no agent)
            OR (p_member_id = v_owner AND owner = v_owner
                AND member_id IS NULL AND agent_id IS NULL));
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION agents.authenticate_token(p_token_hash bytea)
RETURNS TABLE (token_id uuid, owner uuid, agent_id uuid, member_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT t.id, t.owner, t.agent_id, t.member_id
      FROM agents.api_tokens t
      LEFT JOIN agents.agents a ON a.id = t.agent_id
      LEFT JOIN agents.members m ON m.id = t.member_id
     WHERE t.token_hash = p_token_hash
       AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())
       AND (t.agent_id IS NULL OR a.status = 'active')
       AND (t.member_id IS NULL OR m.removed_at IS NULL)
       -- the tenant's own token, while the tenant's own member row is removed: refused
       AND (t.agent_id IS NOT NULL OR t.member_id IS NOT NULL
            OR NOT EXISTS (SELECT 1 FROM agents.members r
                            WHERE r.id = t.owner AND r.owner = t.owner
                              AND r.removed_at IS NOT NULL));
    IF FOUND THEN
        UPDATE agents.api_tokens t SET last_used_at = now()
         WHERE t.token_hash = p_token_hash
           AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute');
    END IF;
END
$$;

-- F2: an agent's unassigned tool is an unknown id -----------------------------------------

CREATE OR REPLACE FUNCTION agents.invoke_seen(
    p_agent_id uuid, p_agent_name text, p_tool_id uuid, p_input jsonb, p_run_id uuid,
    p_version text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_owner();
    v_caller_agent uuid := agents.caller_agent_id();
    v_found record;
    v_agent agents.agents;
    v_tool agents.tools_registry;
    v_gated boolean;
    v_claim text := nullif(current_setting('toolrelay.claim_worker', true), '');
    v_lease double precision;
    v_id uuid;
BEGIN
    IF v_caller_agent IS NULL THEN
        PERFORM agents.require_role('admin');
    ELSIF v_caller_agent IS DISTINCT FROM p_agent_id THEN
        RAISE EXCEPTION 'agent % cannot invoke as agent %', v_caller_agent, p_agent_id
            USING ERRCODE = '42501';
    END IF;
    SELECT a AS agent, t AS tool, s.agent_id IS NOT NULL AS assigned, s.allowed,
           t.xmin::text || '/' || extract(epoch FROM t.updated_at)::text AS version,
           coalesce(f.fingerprint, agents.tool_fingerprint(t)) AS fingerprint
      INTO v_found
      FROM (SELECT) AS one
      LEFT JOIN agents.agents a ON a.id = p_agent_id AND a.owner = v_owner
      LEFT JOIN agents.tools_registry t ON t.id = p_tool_id AND t.owner = v_owner
      LEFT JOIN agents.tool_fingerprints f ON f.tool_id = t.id
      LEFT JOIN agents.tool_assignments s ON s.agent_id = a.id AND s.tool_id = t.id;
    IF p_version IS NOT NULL AND (
           v_found.version IS DISTINCT FROM p_version
           OR (v_caller_agent IS NOT NULL AND NOT v_found.assigned)
           OR (p_agent_name IS NOT NULL
               AND (v_found.agent).name IS DISTINCT FROM p_agent_name)) THEN
        RETURN NULL;
    END IF;
    v_agent := v_found.agent;
    v_tool := v_found.tool;
    IF v_agent.id IS NULL THEN
        RAISE EXCEPTION 'agent % not found', p_agent_id USING ERRCODE = 'P0002';
    END IF;
    -- An agent reads only the tools assigned to it (0012): any other is an unknown id.
    IF v_tool.id IS NULL OR (v_caller_agent IS NOT NULL AND NOT v_found.assigned) THEN
        RAISE EXCEPTION 'tool % not found', p_tool_id USING ERRCODE = 'P0002';
    END IF;
    -- agents.check_callable's checks, on the assignment read above
    IF v_agent.status <> 'active' THEN
        RAISE EXCEPTION 'agent % is %', v_agent.name, v_agent.status USING ERRCODE = 'TR001';
    END IF;
    IF v_tool.status <> 'active' THEN
        RAISE EXCEPTION 'tool % is %, not active', v_tool.key, v_tool.status USING ERRCODE = 'TR001';
    END IF;
    IF NOT v_found.assigned THEN
        RAISE EXCEPTION 'tool % is not assigned to agent %', v_tool.key, v_agent.name
            USING ERRCODE = 'TR002';
    ELSIF NOT v_found.allowed THEN
        RAISE EXCEPTION 'agent % is denied tool %', v_agent.name, v_tool.key USING ERRCODE = 'TR002';
    END IF;
    IF v_tool.endpoint_url IS NULL THEN
        RAISE EXCEPTION 'tool % has no endpoint_url; set one before invoking it', v_tool.key
            USING ERRCODE = 'TR005';
    END IF;
    IF p_input IS NULL OR jsonb_typeof(p_input) <> 'object' THEN
        RAISE EXCEPTION 'input must be a JSON object, got %', coalesce(jsonb_typeof(p_input), 'null')
            USING ERRCODE = '22023';
    END IF;
    v_gated := agents.tool_is_gated(v_tool);
    IF v_gated OR length(v_claim) > 200 THEN
        v_claim := NULL;  -- a worker id is short; anything else claims nothing
    END IF;
    IF v_claim IS NOT NULL THEN
        BEGIN
            v_lease := current_setting('toolrelay.claim_lease', true)::double precision;
        EXCEPTION WHEN invalid_text_representation THEN
            RAISE EXCEPTION 'toolrelay.claim_lease must be a number of seconds, got %',
                current_setting('toolrelay.claim_lease', true) USING ERRCODE = '22023';
        END;
        -- MAX_CLAIM_LEASE: 300 s; no lease given (or a non-positive one): 30 s
        v_lease := least(coalesce(nullif(greatest(v_lease, 0), 0), 30), 300);
    END IF;
    INSERT INTO agents.tool_invocations (
        owner, tool_id, agent_id, run_id, input, status, approval_status,
        approval_expires_at, config_fingerprint, attempt, lease_owner, lease_expires_at)
    VALUES (
        v_owner, v_tool.id, v_agent.id, p_run_id, p_input,
        CASE WHEN v_gated THEN 'pending' ELSE 'running' END,
        CASE WHEN v_gated THEN 'pending' ELSE 'not_required' END,
        CASE WHEN v_gated THEN now() + make_interval(secs => v_tool.approval_ttl_seconds) END,
        v_found.fingerprint,
        CASE WHEN v_claim IS NULL THEN 0 ELSE 1 END,
        v_claim,
        CASE WHEN v_claim IS NOT NULL THEN now() + make_interval(secs => v_lease) END)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

-- F3: policy_standing without sub, the dispatcher's only ----------------------------------

CREATE OR REPLACE FUNCTION agents.policy_standing(
    p_policy_id uuid, OUT confirmations integer, OUT needed integer, OUT in_force boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    p agents.tool_policies;
    t agents.tools_registry;
    v_counted uuid[];
    v_editor uuid;
    v_owner uuid := auth.uid();
BEGIN
    IF v_owner IS NULL THEN
        IF NOT pg_has_role(agents.caller_role(), 'service_role', 'USAGE') THEN
            RETURN;  -- no tenant, not the dispatcher: as for an unknown id
        END IF;
    ELSIF agents.caller_agent_id() IS NOT NULL  -- agents read no rules (0028's policies)
          OR agents.caller_member_role() IS NULL THEN  -- nor does a non-member
        RETURN;
    END IF;
    SELECT * INTO p FROM agents.tool_policies r
     WHERE r.id = p_policy_id AND (v_owner IS NULL OR r.owner = v_owner);
    SELECT * INTO t FROM agents.tools_registry r WHERE r.id = p.tool_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    needed := agents.approvals_needed(t);
    IF p.action <> 'approve' THEN
        confirmations := 0;  -- only approval rules are confirmed
        in_force := true;
        RETURN;
    END IF;
    -- Confirmations of admins who still are (a rule outlives its confirmers' roles)
    v_counted := ARRAY(
        SELECT c.member_id FROM agents.policy_confirmations c
         WHERE c.policy_id = p.id AND c.tool_fingerprint = agents.tool_fingerprint(t)
           AND agents.approval_counts(t.owner, c.member_id, needed, '{admin}'));
    confirmations := cardinality(v_counted);
    v_editor := agents.tool_last_editor(t.id);
    in_force := confirmations >= needed
        AND (v_editor IS NULL OR agents.approver_count(t.owner) < 2
             OR EXISTS (SELECT 1 FROM unnest(v_counted) m WHERE m <> v_editor));
END
$$;
