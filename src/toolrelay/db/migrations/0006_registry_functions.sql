-- The owner-facing SQL functions (SPEC §1, §3). All SECURITY DEFINER with a fixed
-- search_path: they check the caller themselves, then write past RLS.
--
-- SQLSTATEs raised (the Python layer maps them to exceptions):
--   42501 not authenticated / an agent identity where an owner is required
--   P0002 no such agent, tool or invocation for this owner
--   22023 a bad argument value
--   TR001 tool not active       TR002 not assigned / assignment denied
--   TR003 invocation not pending TR004 approval window expired   TR005 tool has no endpoint

-- The agent identity in the JWT claims, when an agent (not a human owner) is calling.
CREATE FUNCTION agents.caller_agent_id() RETURNS uuid
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT nullif(nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'agent_id', '')::uuid
$$;

CREATE FUNCTION agents.require_owner() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
BEGIN
    IF v_owner IS NULL THEN
        RAISE EXCEPTION 'not authenticated: set request.jwt.claim.sub to the owner''s uuid'
            USING ERRCODE = '42501';
    END IF;
    RETURN v_owner;
END
$$;

CREATE FUNCTION agents.require_human_owner() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    IF agents.caller_agent_id() IS NOT NULL THEN
        RAISE EXCEPTION 'an agent identity cannot do this; only a human owner can'
            USING ERRCODE = '42501';
    END IF;
    RETURN agents.require_owner();
END
$$;

-- What an approval binds to: everything that decides where and how the request goes.
CREATE FUNCTION agents.tool_fingerprint(t agents.tools_registry) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT encode(sha256(convert_to(jsonb_build_array(
        t.endpoint_url, t.http_method, t.request_template, t.auth_method, t.auth_placement,
        t.auth_param_name, t.auth_param_prefix, t.credential_ref, t.response_pointer,
        t.idempotency_header)::text, 'UTF8')), 'hex')
$$;

-- Gated: requires_approval, a write, dangerous, or an endpoint whose egress is unknown.
CREATE FUNCTION agents.tool_is_gated(t agents.tools_registry) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT t.requires_approval OR t.is_dangerous OR t.egress_class = 'write'
        OR (t.egress_class = 'none' AND t.endpoint_url IS NOT NULL)
$$;

CREATE FUNCTION public.fn_register_tool(
    p_key                 text,
    p_name                text,
    p_description         text    DEFAULT NULL,
    p_category            text    DEFAULT 'general',
    p_schema_input        jsonb   DEFAULT '{}'::jsonb,
    p_schema_output       jsonb   DEFAULT '{}'::jsonb,
    p_auth_method         text    DEFAULT 'none',
    p_requires_approval   boolean DEFAULT false,
    p_is_dangerous        boolean DEFAULT false,
    p_endpoint_url        text    DEFAULT NULL,
    p_http_method         text    DEFAULT NULL,
    p_request_template    jsonb   DEFAULT NULL,
    p_auth_placement      text    DEFAULT NULL,
    p_auth_param_name     text    DEFAULT NULL,
    p_credential_ref      uuid    DEFAULT NULL,
    p_egress_class        text    DEFAULT NULL,
    p_auth_param_prefix   text    DEFAULT NULL,
    p_response_pointer    text    DEFAULT NULL
) RETURNS agents.tools_registry
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_row agents.tools_registry;
BEGIN
    -- Optional RFC-0006 parameters left NULL keep what an existing row has.
    INSERT INTO agents.tools_registry AS t (
        owner, key, name, description, category, schema_input, schema_output, auth_method,
        requires_approval, is_dangerous, endpoint_url, http_method, request_template,
        auth_placement, auth_param_name, credential_ref, egress_class, auth_param_prefix,
        response_pointer)
    VALUES (
        v_owner, p_key, p_name, p_description, coalesce(p_category, 'general'),
        coalesce(p_schema_input, '{}'), coalesce(p_schema_output, '{}'),
        coalesce(p_auth_method, 'none'), coalesce(p_requires_approval, false),
        coalesce(p_is_dangerous, false), p_endpoint_url, coalesce(p_http_method, 'POST'),
        coalesce(p_request_template, '{}'), coalesce(p_auth_placement, 'header'),
        coalesce(p_auth_param_name, 'Authorization'), p_credential_ref,
        coalesce(p_egress_class, CASE WHEN p_endpoint_url IS NULL THEN 'none' ELSE 'write' END),
        coalesce(p_auth_param_prefix, ''), p_response_pointer)
    ON CONFLICT (owner, key) DO UPDATE SET
        name              = EXCLUDED.name,
        description       = EXCLUDED.description,
        category          = EXCLUDED.category,
        schema_input      = EXCLUDED.schema_input,
        schema_output     = EXCLUDED.schema_output,
        auth_method       = EXCLUDED.auth_method,
        requires_approval = EXCLUDED.requires_approval,
        is_dangerous      = EXCLUDED.is_dangerous,
        endpoint_url      = coalesce(p_endpoint_url, t.endpoint_url),
        http_method       = coalesce(p_http_method, t.http_method),
        request_template  = coalesce(p_request_template, t.request_template),
        auth_placement    = coalesce(p_auth_placement, t.auth_placement),
        auth_param_name   = coalesce(p_auth_param_name, t.auth_param_name),
        credential_ref    = CASE WHEN EXCLUDED.auth_method = 'none' THEN NULL
                                 ELSE coalesce(p_credential_ref, t.credential_ref) END,
        egress_class      = coalesce(p_egress_class, t.egress_class),
        auth_param_prefix = coalesce(p_auth_param_prefix, t.auth_param_prefix),
        response_pointer  = coalesce(p_response_pointer, t.response_pointer)
    RETURNING * INTO v_row;
    RETURN v_row;
END
$$;

CREATE FUNCTION public.fn_create_agent(p_name text) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_id uuid;
BEGIN
    INSERT INTO agents.agents (owner, name) VALUES (v_owner, p_name) RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

CREATE FUNCTION agents.owned_agent(p_owner uuid, p_agent_id uuid) RETURNS agents.agents
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
DECLARE
    v agents.agents;
BEGIN
    SELECT * INTO v FROM agents.agents WHERE id = p_agent_id AND owner = p_owner;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'agent % not found', p_agent_id USING ERRCODE = 'P0002';
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION agents.owned_tool(p_owner uuid, p_tool_id uuid) RETURNS agents.tools_registry
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
DECLARE
    v agents.tools_registry;
BEGIN
    SELECT * INTO v FROM agents.tools_registry WHERE id = p_tool_id AND owner = p_owner;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tool % not found', p_tool_id USING ERRCODE = 'P0002';
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION public.fn_assign_tool(p_agent_id uuid, p_tool_id uuid, p_allowed boolean DEFAULT true)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_id uuid;
BEGIN
    PERFORM agents.owned_agent(v_owner, p_agent_id);
    PERFORM agents.owned_tool(v_owner, p_tool_id);
    INSERT INTO agents.tool_assignments (owner, agent_id, tool_id, allowed)
    VALUES (v_owner, p_agent_id, p_tool_id, coalesce(p_allowed, true))
    ON CONFLICT (agent_id, tool_id) DO UPDATE SET allowed = EXCLUDED.allowed
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

CREATE FUNCTION public.fn_revoke_tool(p_agent_id uuid, p_tool_id uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
BEGIN
    PERFORM agents.owned_agent(v_owner, p_agent_id);
    DELETE FROM agents.tool_assignments
     WHERE agent_id = p_agent_id AND tool_id = p_tool_id AND owner = v_owner;
    RETURN FOUND;
END
$$;

-- Raises unless the agent may call the tool right now.
CREATE FUNCTION agents.check_callable(p_tool agents.tools_registry, p_agent agents.agents)
RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
DECLARE
    v_allowed boolean;
BEGIN
    IF p_agent.status <> 'active' THEN
        RAISE EXCEPTION 'agent % is %', p_agent.name, p_agent.status USING ERRCODE = 'TR001';
    END IF;
    IF p_tool.status <> 'active' THEN
        RAISE EXCEPTION 'tool % is %, not active', p_tool.key, p_tool.status USING ERRCODE = 'TR001';
    END IF;
    SELECT allowed INTO v_allowed FROM agents.tool_assignments
     WHERE agent_id = p_agent.id AND tool_id = p_tool.id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tool % is not assigned to agent %', p_tool.key, p_agent.name
            USING ERRCODE = 'TR002';
    ELSIF NOT v_allowed THEN
        RAISE EXCEPTION 'agent % is denied tool %', p_agent.name, p_tool.key USING ERRCODE = 'TR002';
    END IF;
END
$$;

CREATE FUNCTION public.fn_invoke_tool(
    p_agent_id uuid, p_tool_id uuid, p_input jsonb DEFAULT '{}'::jsonb, p_run_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_owner();
    v_caller_agent uuid := agents.caller_agent_id();
    v_agent agents.agents;
    v_tool agents.tools_registry;
    v_gated boolean;
    v_id uuid;
BEGIN
    IF v_caller_agent IS NOT NULL AND v_caller_agent IS DISTINCT FROM p_agent_id THEN
        RAISE EXCEPTION 'agent % cannot invoke as agent %', v_caller_agent, p_agent_id
            USING ERRCODE = '42501';
    END IF;
    v_agent := agents.owned_agent(v_owner, p_agent_id);
    v_tool := agents.owned_tool(v_owner, p_tool_id);
    PERFORM agents.check_callable(v_tool, v_agent);
    IF v_tool.endpoint_url IS NULL THEN
        RAISE EXCEPTION 'tool % has no endpoint_url; set one before invoking it', v_tool.key
            USING ERRCODE = 'TR005';
    END IF;
    IF p_input IS NULL OR jsonb_typeof(p_input) <> 'object' THEN
        RAISE EXCEPTION 'input must be a JSON object, got %', coalesce(jsonb_typeof(p_input), 'null')
            USING ERRCODE = '22023';
    END IF;
    v_gated := agents.tool_is_gated(v_tool);
    INSERT INTO agents.tool_invocations (
        owner, tool_id, agent_id, run_id, input, status, approval_status,
        approval_expires_at, config_fingerprint)
    VALUES (
        v_owner, v_tool.id, v_agent.id, p_run_id, p_input,
        CASE WHEN v_gated THEN 'pending' ELSE 'running' END,
        CASE WHEN v_gated THEN 'pending' ELSE 'not_required' END,
        CASE WHEN v_gated THEN now() + make_interval(secs => v_tool.approval_ttl_seconds) END,
        agents.tool_fingerprint(v_tool))
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

CREATE FUNCTION agents.lock_pending(p_owner uuid, p_invocation_id uuid)
RETURNS agents.tool_invocations
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
DECLARE
    v agents.tool_invocations;
BEGIN
    SELECT * INTO v FROM agents.tool_invocations
     WHERE id = p_invocation_id AND owner = p_owner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invocation % not found', p_invocation_id USING ERRCODE = 'P0002';
    END IF;
    IF v.status <> 'pending' THEN
        RAISE EXCEPTION 'invocation % is not pending (status %, approval %)',
            p_invocation_id, v.status, v.approval_status USING ERRCODE = 'TR003';
    END IF;
    RETURN v;
END
$$;

CREATE FUNCTION public.fn_approve_tool_invocation(p_invocation_id uuid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v agents.tool_invocations := agents.lock_pending(v_owner, p_invocation_id);
BEGIN
    IF v.approval_expires_at IS NOT NULL AND v.approval_expires_at <= now() THEN
        RAISE EXCEPTION 'invocation % can no longer be approved: its approval window closed at %',
            p_invocation_id, v.approval_expires_at USING ERRCODE = 'TR004';
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'running', approval_status = 'approved', decided_by = v_owner,
           decided_at = now(), run_after = now(), updated_at = now()
     WHERE id = p_invocation_id;
END
$$;

CREATE FUNCTION public.fn_reject_tool_invocation(p_invocation_id uuid, p_reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v agents.tool_invocations := agents.lock_pending(v_owner, p_invocation_id);
BEGIN
    UPDATE agents.tool_invocations
       SET status = 'rejected', approval_status = 'rejected', decided_by = v_owner,
           decided_at = now(), reject_reason = p_reason, finished_at = now(),
           error = 'rejected by owner' || coalesce(': ' || p_reason, ''), updated_at = now()
     WHERE id = v.id;
END
$$;

-- Pending approvals past their window become 'expired' (kept apart from 'rejected').
-- An owner expires their own; the dispatcher role (no uid) expires everyone's.
CREATE FUNCTION public.fn_expire_tool_invocations() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_count integer;
BEGIN
    IF v_owner IS NULL AND current_setting('role', true) IS DISTINCT FROM 'service_role'
       AND NOT pg_has_role(session_user, 'service_role', 'MEMBER') THEN
        RAISE EXCEPTION 'not authenticated' USING ERRCODE = '42501';
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'expired', approval_status = 'expired', finished_at = now(),
           error = 'approval window closed without a decision', error_code = 'approval_expired',
           updated_at = now()
     WHERE status = 'pending' AND approval_expires_at <= now()
       AND (v_owner IS NULL OR owner = v_owner);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
