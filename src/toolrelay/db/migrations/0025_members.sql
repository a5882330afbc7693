-- Members and roles (issue 16, item 1): a tenant (an owner uuid, the row-level security
-- boundary as before) has members, each a person with a role:
--   admin    - manage tools, credentials, agents, assignments, tokens, members; decide calls
--   approver - decide (approve, reject) invocations; read everything a viewer reads
--   viewer   - read
-- Roles are decided here, in the database, so every door obeys them: the SQL functions
-- check the caller's role, and the statement triggers on the configuration tables (0012)
-- refuse a write by anyone but an admin, a plain UPDATE as the owner included.
--
-- Who the caller is: the claims as before (sub = the tenant, agent_id for an agent) plus
-- member_id for a member (the API sets it from the member's token). The role is read from
-- agents.members on every check, never from a claim: a role changed or a member removed
-- takes effect on the next statement, whatever token or session they hold.
-- The tenant itself (no member_id claim: its own owner token, the CLI, psql) is its first
-- admin: until it has members it is an admin by definition; adding the first member makes
-- it a member row of its own (id = the tenant's uuid, name 'owner', role admin), which can
-- then be demoted or removed like any other, as long as one admin remains.

CREATE TABLE agents.members (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner         uuid NOT NULL DEFAULT auth.uid(),
    name          text NOT NULL,
    email         text,
    oidc_subject  text,
    role          text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),  -- the tenant's row first
    removed_at    timestamptz,
    CONSTRAINT members_name_check CHECK (length(btrim(name)) BETWEEN 1 AND 200
                                         AND name !~ '[[:cntrl:]]'),
    CONSTRAINT members_email_check CHECK (email IS NULL OR email ~ '^[^@[:space:][:cntrl:]]+@[^@[:space:][:cntrl:]]+$'),
    CONSTRAINT members_role_check CHECK (role = ANY (ARRAY['admin', 'approver', 'viewer']))
);
CREATE INDEX members_owner_idx ON agents.members (owner, created_at, id);
CREATE UNIQUE INDEX members_email_key ON agents.members (owner, lower(email))
    WHERE removed_at IS NULL AND email IS NOT NULL;
CREATE UNIQUE INDEX members_oidc_subject_key ON agents.members (owner, oidc_subject)
    WHERE removed_at IS NULL AND oidc_subject IS NOT NULL;

ALTER TABLE agents.members ENABLE ROW LEVEL SECURITY;
CREATE POLICY members_owner_read ON agents.members FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
REVOKE ALL ON agents.members FROM PUBLIC;
GRANT SELECT ON agents.members TO authenticated, service_role;  -- writes: the fn_* below

CREATE TRIGGER members_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.members
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('member', 'name');

-- Who the caller is -----------------------------------------------------------------------

CREATE FUNCTION agents.caller_member_id() RETURNS uuid
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT nullif(coalesce(
        nullif(current_setting('request.jwt.claim.member_id', true), ''),
        nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'member_id'), '')::uuid
$$;
GRANT EXECUTE ON FUNCTION agents.caller_member_id() TO authenticated, service_role;

-- 'admin', 'approver' or 'viewer'; 'agent' for an agent identity; NULL for no identity, a
-- removed member or one of another tenant (no rights at all).
CREATE FUNCTION agents.caller_member_role() RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_member uuid := agents.caller_member_id();
    v_role text;
BEGIN
    IF v_owner IS NULL THEN
        RETURN NULL;
    END IF;
    IF agents.caller_agent_id() IS NOT NULL THEN
        RETURN 'agent';
    END IF;
    SELECT m.role INTO v_role FROM agents.members m
     WHERE m.id = coalesce(v_member, v_owner) AND m.owner = v_owner AND m.removed_at IS NULL;
    IF FOUND THEN
        RETURN v_role;
    END IF;
    IF v_member IS NULL AND NOT EXISTS (
        SELECT 1 FROM agents.members m WHERE m.id = v_owner AND m.owner = v_owner) THEN
        RETURN 'admin';  -- the tenant itself, before it has members: its first admin
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.caller_member_role() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.caller_member_role() TO authenticated, service_role;

-- How a refusal names the caller's role.
CREATE FUNCTION agents.role_phrase(p_role text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog
AS $$
    SELECT CASE p_role WHEN 'admin' THEN 'an admin' WHEN 'approver' THEN 'an approver'
                       WHEN 'viewer' THEN 'a viewer' ELSE 'not a member' END
$$;

-- The tenant, when the caller has one of these roles; else 42501 naming what was needed.
CREATE FUNCTION agents.require_role(VARIADIC p_roles text[]) RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_owner();
    v_role text := agents.caller_member_role();
BEGIN
    IF v_role = 'agent' THEN
        RAISE EXCEPTION 'an agent identity cannot do this; only a human owner can'
            USING ERRCODE = '42501';
    END IF;
    IF v_role IS NULL THEN
        RAISE EXCEPTION 'not a member of this tenant (removed, or never added)'
            USING ERRCODE = '42501';
    END IF;
    IF NOT v_role = ANY (p_roles) THEN
        RAISE EXCEPTION 'this needs the % role; this member is %',
            array_to_string(p_roles, ' or '), agents.role_phrase(v_role)
            USING ERRCODE = '42501';
    END IF;
    RETURN v_owner;
END
$$;
GRANT EXECUTE ON FUNCTION agents.require_role(text[]) TO authenticated, service_role;

-- Every function that managed configuration as "a human owner" now needs an admin
-- (fn_register_tool, fn_create_agent, fn_assign_tool, fn_revoke_tool, the token functions,
-- fn_retry_tool_invocation, fn_webhook_redeliver, ...).
CREATE OR REPLACE FUNCTION agents.require_human_owner() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN agents.require_role('admin');
END
$$;

-- A write to a configuration table by anyone but an admin is refused, whichever door it
-- came through (a plain UPDATE as the owner too). The dispatcher (no tenant in its claims)
-- is not a member and keeps writing what it writes (an OAuth refresh).
CREATE OR REPLACE FUNCTION agents.tg_refuse_agent_identity() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
DECLARE
    v_role text;
BEGIN
    IF agents.caller_agent_id() IS NOT NULL THEN
        RAISE EXCEPTION 'an agent identity cannot % %.%; only a human owner changes configuration',
            lower(TG_OP), TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = '42501';
    END IF;
    IF auth.uid() IS NOT NULL THEN
        v_role := agents.caller_member_role();
        IF v_role IS DISTINCT FROM 'admin' THEN
            RAISE EXCEPTION '% %.% needs the admin role; this member is %',
                lower(TG_OP), TG_TABLE_SCHEMA, TG_TABLE_NAME, agents.role_phrase(v_role)
                USING ERRCODE = '42501';
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- Deciding a call: an approver or an admin; decided_by names the member (the tenant's uuid
-- when the tenant itself decides: it is its own first admin). Approving is replaced whole by
-- migration 0026 (quorum); rejecting is here.
CREATE OR REPLACE FUNCTION public.fn_reject_tool_invocation(
    p_invocation_id uuid, p_reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin', 'approver');
    v agents.tool_invocations := agents.lock_pending(v_owner, p_invocation_id);
BEGIN
    UPDATE agents.tool_invocations
       SET status = 'rejected', approval_status = 'rejected',
           decided_by = coalesce(agents.caller_member_id(), v_owner),
           decided_at = now(), reject_reason = p_reason, finished_at = now(),
           error = 'rejected by owner' || coalesce(': ' || p_reason, ''), updated_at = now()
     WHERE id = v.id;
END
$$;

-- Invoking on an agent's behalf is an admin's (an agent identity invokes as itself, as before).
CREATE OR REPLACE FUNCTION public.fn_invoke_tool(
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
    IF v_caller_agent IS NULL THEN
        PERFORM agents.require_role('admin');
    ELSIF v_caller_agent IS DISTINCT FROM p_agent_id THEN
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

-- Tokens belong to a member (or an agent, or the tenant itself) ---------------------------

ALTER TABLE agents.api_tokens
    ADD COLUMN member_id uuid REFERENCES agents.members (id) ON DELETE CASCADE,
    ADD CONSTRAINT api_tokens_agent_or_member_check CHECK (agent_id IS NULL OR member_id IS NULL);
CREATE INDEX api_tokens_member_idx ON agents.api_tokens (member_id);
GRANT SELECT (member_id) ON agents.api_tokens TO authenticated;

DROP TRIGGER api_tokens_audit ON agents.api_tokens;
CREATE TRIGGER api_tokens_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.api_tokens
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('token', 'name', '+id', '+owner',
        '+agent_id', '+member_id', '+name', '+created_at', '+expires_at', '+revoked_at');

DROP FUNCTION public.fn_create_api_token(bytea, uuid, text, timestamptz);
CREATE FUNCTION public.fn_create_api_token(
    p_token_hash  bytea,
    p_agent_id    uuid        DEFAULT NULL,
    p_name        text        DEFAULT NULL,
    p_expires_at  timestamptz DEFAULT NULL,
    p_member_id   uuid        DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_id uuid;
BEGIN
    IF p_agent_id IS NOT NULL AND p_member_id IS NOT NULL THEN
        RAISE EXCEPTION 'a token is an agent''s or a member''s, not both' USING ERRCODE = '22023';
    END IF;
    IF p_agent_id IS NOT NULL THEN
        PERFORM agents.owned_agent(v_owner, p_agent_id);
    END IF;
    IF p_member_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM agents.members m
         WHERE m.id = p_member_id AND m.owner = v_owner AND m.removed_at IS NULL) THEN
        RAISE EXCEPTION 'member % not found', p_member_id USING ERRCODE = 'P0002';
    END IF;
    IF p_expires_at IS NOT NULL AND p_expires_at <= now() THEN
        RAISE EXCEPTION 'a token cannot expire in the past (%)', p_expires_at
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO agents.api_tokens (owner, agent_id, member_id, name, token_hash, expires_at)
    VALUES (v_owner, p_agent_id, p_member_id, p_name, p_token_hash, p_expires_at)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_create_api_token(bytea, uuid, text, timestamptz, uuid)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_create_api_token(bytea, uuid, text, timestamptz, uuid)
    TO authenticated, service_role;

-- A removed member's tokens no longer authenticate (removing also revokes them).
DROP FUNCTION agents.authenticate_token(bytea);
CREATE FUNCTION agents.authenticate_token(p_token_hash bytea)
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
       AND (t.member_id IS NULL OR m.removed_at IS NULL);
    IF FOUND THEN
        UPDATE agents.api_tokens t SET last_used_at = now()
         WHERE t.token_hash = p_token_hash
           AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute');
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.authenticate_token(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.authenticate_token(bytea) TO service_role;

-- Managing members: admins only; one admin always remains --------------------------------

CREATE FUNCTION agents.check_role(p_role text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog
AS $$
BEGIN
    IF p_role IS NULL OR NOT p_role = ANY (ARRAY['admin', 'approver', 'viewer']) THEN
        RAISE EXCEPTION 'role must be admin, approver or viewer, got %', coalesce(p_role, 'null')
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- Raises unless another admin than p_member remains (the admins are locked first, so two
-- admins demoting each other at once cannot both succeed).
CREATE FUNCTION agents.keep_an_admin(p_owner uuid, p_member uuid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    PERFORM 1 FROM agents.members m
      WHERE m.owner = p_owner AND m.role = 'admin' AND m.removed_at IS NULL
      ORDER BY m.id FOR UPDATE;
    IF NOT EXISTS (SELECT 1 FROM agents.members m
                    WHERE m.owner = p_owner AND m.role = 'admin' AND m.removed_at IS NULL
                      AND m.id <> p_member) THEN
        RAISE EXCEPTION 'member % is the last admin: make another member admin first', p_member
            USING ERRCODE = 'TR003';
    END IF;
END
$$;

CREATE FUNCTION public.fn_add_member(
    p_name text, p_role text, p_email text DEFAULT NULL, p_oidc_subject text DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v_id uuid;
BEGIN
    PERFORM agents.check_role(p_role);
    -- The tenant becomes a member of its own, its first admin, with its first member.
    INSERT INTO agents.members (id, owner, name, role)
    VALUES (v_owner, v_owner, 'owner', 'admin')
    ON CONFLICT (id) DO NOTHING;
    INSERT INTO agents.members (owner, name, role, email, oidc_subject)
    VALUES (v_owner, btrim(p_name), p_role, nullif(btrim(p_email), ''), p_oidc_subject)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

CREATE FUNCTION public.fn_set_member_role(p_member_id uuid, p_role text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v agents.members;
BEGIN
    PERFORM agents.check_role(p_role);
    SELECT * INTO v FROM agents.members m
     WHERE m.id = p_member_id AND m.owner = v_owner AND m.removed_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'member % not found', p_member_id USING ERRCODE = 'P0002';
    END IF;
    IF v.role = 'admin' AND p_role <> 'admin' THEN
        PERFORM agents.keep_an_admin(v_owner, p_member_id);
    END IF;
    UPDATE agents.members SET role = p_role WHERE id = p_member_id AND role <> p_role;
END
$$;

-- True when this call removed the member, false when it already was. Its tokens are revoked.
CREATE FUNCTION public.fn_remove_member(p_member_id uuid) RETURNS boolean
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
     WHERE member_id = p_member_id AND revoked_at IS NULL;
    RETURN true;
END
$$;

REVOKE EXECUTE ON FUNCTION
    public.fn_add_member(text, text, text, text),
    public.fn_set_member_role(uuid, text),
    public.fn_remove_member(uuid),
    agents.check_role(text),
    agents.keep_an_admin(uuid, uuid)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    public.fn_add_member(text, text, text, text),
    public.fn_set_member_role(uuid, text),
    public.fn_remove_member(uuid)
TO authenticated, service_role;

-- The audit log (0023) names the member who made each change, beside the tenant (actor).
ALTER TABLE agents.config_audit ADD COLUMN actor_member uuid;
COMMENT ON COLUMN agents.config_audit.actor_member IS
    'The member who made the change (their member_id claim); NULL: the tenant itself, or'
    ' no member (the dispatcher, psql).';
CREATE FUNCTION agents.tg_config_audit_member() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    NEW.actor_member := agents.caller_member_id();
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_config_audit_member() FROM PUBLIC;
CREATE TRIGGER config_audit_member
    BEFORE INSERT ON agents.config_audit
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit_member();
