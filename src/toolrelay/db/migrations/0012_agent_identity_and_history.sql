-- Issue 12, findings 2, 8 and 11: who an identity is, decided by the database alone.
--
-- 1. An agent identity (an agent_id claim) invokes and reads its own rows, nothing else,
--    whichever door it comes through: RLS lets it see its own agent row, its own
--    assignments, the tools assigned to it, its own invocations and their attempts (no
--    credential, no token) and write nothing; a statement trigger on the configuration
--    tables says so out loud. Owners (no agent_id claim) keep what they had.
-- 2. History survives deleting a tool or an agent: the invocations' foreign keys set NULL
--    instead of cascading, a BEFORE DELETE trigger copies the tool key / agent name onto
--    them (nothing is added to the invoke path), and the calls not sent yet end `failed`.
-- 3. fn_expire_tool_invocations decides on the effective role and the claims, never on
--    session_user (on Supabase every request's session user, authenticator, is a member of
--    service_role). EXECUTE on public.fn_* is taken from anon by toolrelay.db.migrate after
--    every run, so functions that later migrations create are covered too.

-- 1. Agent identity ------------------------------------------------------------------------

-- Both forms PostgREST has used: one setting per claim (request.jwt.claim.agent_id, before
-- v9) and the JSON of all claims (request.jwt.claims, v9 and later).
CREATE OR REPLACE FUNCTION agents.caller_agent_id() RETURNS uuid
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT nullif(coalesce(
        nullif(current_setting('request.jwt.claim.agent_id', true), ''),
        nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'agent_id'), '')::uuid
$$;
-- Policies and triggers evaluate it as the caller.
GRANT EXECUTE ON FUNCTION agents.caller_agent_id() TO authenticated, service_role;

-- The tools assigned (allowed or not) to the calling agent. A SECURITY DEFINER function, so
-- that the tools_registry policy needs no subquery on tool_assignments: assigning checks
-- tools_registry, and the rewriter reports "infinite recursion detected in policy".
CREATE FUNCTION agents.caller_tool_ids() RETURNS uuid[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    SELECT coalesce(array_agg(s.tool_id), '{}') FROM agents.tool_assignments s
     WHERE s.agent_id = agents.caller_agent_id() AND s.owner = auth.uid()
$$;
REVOKE EXECUTE ON FUNCTION agents.caller_tool_ids() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.caller_tool_ids() TO authenticated, service_role;

-- The owner policies of 0007/0008, one per command now: reads say what an agent identity
-- sees, writes refuse it. (Not as restrictive policies: each of those is a security level
-- of its own, below which "owner = auth.uid()" - not leakproof, a cast - can no longer be
-- an index condition.) "(SELECT f())" is evaluated once per query, not once per row.
DROP POLICY agents_owner ON agents.agents;
CREATE POLICY agents_owner_read ON agents.agents FOR SELECT TO authenticated
    USING (owner = auth.uid() AND ((SELECT agents.caller_agent_id()) IS NULL
                                   OR id = (SELECT agents.caller_agent_id())));
CREATE POLICY agents_owner_insert ON agents.agents FOR INSERT TO authenticated
    WITH CHECK (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);
CREATE POLICY agents_owner_update ON agents.agents FOR UPDATE TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL)
    WITH CHECK (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);
CREATE POLICY agents_owner_delete ON agents.agents FOR DELETE TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);

DROP POLICY tools_registry_owner ON agents.tools_registry;
CREATE POLICY tools_registry_owner_read ON agents.tools_registry FOR SELECT TO authenticated
    USING (owner = auth.uid() AND ((SELECT agents.caller_agent_id()) IS NULL
                                   OR id = ANY ((SELECT agents.caller_tool_ids())::uuid[])));
CREATE POLICY tools_registry_owner_insert ON agents.tools_registry FOR INSERT TO authenticated
    WITH CHECK (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);
CREATE POLICY tools_registry_owner_update ON agents.tools_registry FOR UPDATE TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL)
    WITH CHECK (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);
CREATE POLICY tools_registry_owner_delete ON agents.tools_registry FOR DELETE TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);

-- Assigning still needs the caller to own both the agent and the tool.
DROP POLICY tool_assignments_owner ON agents.tool_assignments;
CREATE POLICY tool_assignments_owner_read ON agents.tool_assignments FOR SELECT TO authenticated
    USING (owner = auth.uid() AND ((SELECT agents.caller_agent_id()) IS NULL
                                   OR agent_id = (SELECT agents.caller_agent_id())));
CREATE POLICY tool_assignments_owner_insert ON agents.tool_assignments FOR INSERT TO authenticated
    WITH CHECK (
        owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL
        AND EXISTS (SELECT 1 FROM agents.agents a WHERE a.id = agent_id AND a.owner = auth.uid())
        AND EXISTS (SELECT 1 FROM agents.tools_registry t
                     WHERE t.id = tool_id AND t.owner = auth.uid()));
CREATE POLICY tool_assignments_owner_update ON agents.tool_assignments FOR UPDATE TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL)
    WITH CHECK (
        owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL
        AND EXISTS (SELECT 1 FROM agents.agents a WHERE a.id = agent_id AND a.owner = auth.uid())
        AND EXISTS (SELECT 1 FROM agents.tools_registry t
                     WHERE t.id = tool_id AND t.owner = auth.uid()));
CREATE POLICY tool_assignments_owner_delete ON agents.tool_assignments FOR DELETE TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);

-- Credentials: nothing at all for an agent identity, not even the metadata.
DROP POLICY credentials_owner ON agents.credentials;
CREATE POLICY credentials_owner ON agents.credentials TO authenticated
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL)
    WITH CHECK (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);

-- Read-only tables (no write grant to authenticated): an agent reads its own calls, their
-- attempts, and no token.
ALTER POLICY tool_invocations_owner_read ON agents.tool_invocations
    USING (owner = auth.uid() AND ((SELECT agents.caller_agent_id()) IS NULL
                                   OR agent_id = (SELECT agents.caller_agent_id())));
ALTER POLICY tool_invocation_attempts_owner_read ON agents.tool_invocation_attempts
    USING (owner = auth.uid() AND ((SELECT agents.caller_agent_id()) IS NULL OR EXISTS (
        SELECT 1 FROM agents.tool_invocations i
         WHERE i.id = invocation_id AND i.agent_id = (SELECT agents.caller_agent_id()))));
ALTER POLICY api_tokens_owner_read ON agents.api_tokens
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);

-- RLS skips rows it hides without a word; the agent should hear why nothing changed. Once
-- per statement, for every role (service_role bypasses RLS, not this), whatever the rows.
CREATE FUNCTION agents.tg_refuse_agent_identity() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    IF agents.caller_agent_id() IS NOT NULL THEN
        RAISE EXCEPTION 'an agent identity cannot % %.%; only a human owner changes configuration',
            lower(TG_OP), TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = '42501';
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_refuse_agent_identity() FROM PUBLIC;

CREATE TRIGGER agents_refuse_agent_identity
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON agents.agents
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_refuse_agent_identity();
CREATE TRIGGER tools_registry_refuse_agent_identity
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON agents.tools_registry
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_refuse_agent_identity();
CREATE TRIGGER tool_assignments_refuse_agent_identity
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON agents.tool_assignments
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_refuse_agent_identity();
CREATE TRIGGER credentials_refuse_agent_identity
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON agents.credentials
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_refuse_agent_identity();

-- 2. History survives deletion -------------------------------------------------------------

ALTER TABLE agents.tool_invocations
    ADD COLUMN deleted_tool_key text,
    ADD COLUMN deleted_agent_name text,
    ALTER COLUMN tool_id DROP NOT NULL,
    ALTER COLUMN agent_id DROP NOT NULL,
    DROP CONSTRAINT tool_invocations_tool_id_fkey,
    DROP CONSTRAINT tool_invocations_agent_id_fkey,
    ADD CONSTRAINT tool_invocations_tool_id_fkey FOREIGN KEY (tool_id)
        REFERENCES agents.tools_registry (id) ON DELETE SET NULL,
    ADD CONSTRAINT tool_invocations_agent_id_fkey FOREIGN KEY (agent_id)
        REFERENCES agents.agents (id) ON DELETE SET NULL;

COMMENT ON COLUMN agents.tool_invocations.deleted_tool_key IS
    'The key of the tool when it was deleted (tool_id is NULL then); NULL while it exists.';
COMMENT ON COLUMN agents.tool_invocations.deleted_agent_name IS
    'The name of the agent when it was deleted (agent_id is NULL then); NULL while it exists.';

-- Before the row goes: calls not sent yet (waiting for approval, or runnable and held by no
-- worker) end failed; every call keeps the tool's key. Rows under a lease are the worker's:
-- its claim finds the tool gone (tool_id NULL) and fails them without sending.
-- The foreign key's SET NULL then finds nothing left to change.
CREATE FUNCTION agents.tg_tools_registry_keep_history() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    UPDATE agents.tool_invocations
       SET status = 'failed', error_code = 'tool_inactive',
           error = format('tool %s was deleted; the call was not sent', OLD.key),
           finished_at = now(), updated_at = now(), tool_id = NULL, deleted_tool_key = OLD.key
     WHERE tool_id = OLD.id
       AND (status = 'pending' OR (status = 'running' AND lease_owner IS NULL));
    UPDATE agents.tool_invocations SET tool_id = NULL, deleted_tool_key = OLD.key
     WHERE tool_id = OLD.id;
    RETURN OLD;
END
$$;

CREATE FUNCTION agents.tg_agents_keep_history() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    UPDATE agents.tool_invocations
       SET status = 'failed', error_code = 'not_assigned',
           error = format('agent %s was deleted; the call was not sent', OLD.name),
           finished_at = now(), updated_at = now(), agent_id = NULL, deleted_agent_name = OLD.name
     WHERE agent_id = OLD.id
       AND (status = 'pending' OR (status = 'running' AND lease_owner IS NULL));
    UPDATE agents.tool_invocations SET agent_id = NULL, deleted_agent_name = OLD.name
     WHERE agent_id = OLD.id;
    RETURN OLD;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tools_registry_keep_history(), agents.tg_agents_keep_history()
    FROM PUBLIC;

CREATE TRIGGER tools_registry_keep_history
    BEFORE DELETE ON agents.tools_registry
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tools_registry_keep_history();
CREATE TRIGGER agents_keep_history
    BEFORE DELETE ON agents.agents
    FOR EACH ROW EXECUTE FUNCTION agents.tg_agents_keep_history();

-- 3. Expiry on the effective role ----------------------------------------------------------

-- The role the caller acts as. Inside SECURITY DEFINER current_user is the definer, but the
-- caller's SET ROLE (PostgREST: set_config('role', ...)) stays in the setting 'role'; 'none'
-- means there was none, and then the session user acts as itself.
CREATE FUNCTION agents.caller_role() RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT CASE current_setting('role') WHEN 'none' THEN session_user
                ELSE current_setting('role')::name END
$$;
REVOKE EXECUTE ON FUNCTION agents.caller_role() FROM PUBLIC;  -- only fn_* (as definer) call it

-- An owner expires their own, an agent identity its own; with no owner in the claims only
-- a role with service_role's privileges (the dispatcher; a superuser) expires everyone's.
-- USAGE, not MEMBER: authenticator (NOINHERIT) is a member without the privileges.
CREATE OR REPLACE FUNCTION public.fn_expire_tool_invocations() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_agent uuid := agents.caller_agent_id();
    v_count integer;
BEGIN
    IF v_owner IS NULL
       AND (v_agent IS NOT NULL OR NOT pg_has_role(agents.caller_role(), 'service_role', 'USAGE'))
    THEN
        RAISE EXCEPTION 'not authenticated: expiring needs an owner''s sub claim or service_role'
            USING ERRCODE = '42501';
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'expired', approval_status = 'expired', finished_at = now(),
           error = 'approval window closed without a decision', error_code = 'approval_expired',
           updated_at = now()
     WHERE status = 'pending' AND approval_expires_at <= now()
       AND (v_owner IS NULL OR owner = v_owner)
       AND (v_agent IS NULL OR agent_id = v_agent);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;
