-- A call made in the process that runs a worker is claimed for that worker as it is
-- inserted (issue 14, goals 1 and 3): `serve` hands it to its in-process worker directly,
-- so the call costs no NOTIFY (the cluster-wide lock at commit), no wake-up, and no claim
-- scan. The claim is as durable as one the worker makes: lease owner, lease expiry and
-- attempt 1 are in the inserted row, so if that process dies the lease runs out and any
-- worker claims the call again (attempt 2), exactly as after a worker that died holding it.
--
-- Asked for per transaction, like the call's reason (0029), so no signature changes:
-- SET LOCAL toolrelay.claim_worker = '<worker id>', toolrelay.claim_lease = '<seconds>'.
-- Only a call that is runnable now (not waiting for approval) is claimed. Anyone who may
-- make the call may ask (an agent with a database connection, too): the most it can do is
-- hold its own call until the lease runs out, so the lease is capped at MAX_CLAIM_LEASE.
CREATE OR REPLACE FUNCTION public.fn_invoke_tool(
    p_agent_id uuid, p_tool_id uuid, p_input jsonb DEFAULT '{}'::jsonb,
    p_run_id uuid DEFAULT NULL::uuid)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_owner();
    v_caller_agent uuid := agents.caller_agent_id();
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
        agents.tool_fingerprint(v_tool),
        CASE WHEN v_claim IS NULL THEN 0 ELSE 1 END,
        v_claim,
        CASE WHEN v_claim IS NOT NULL THEN now() + make_interval(secs => v_lease) END)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

-- A claimed call has its worker already: nobody is to be woken for it.
DROP TRIGGER tool_invocations_notify ON agents.tool_invocations;
CREATE TRIGGER tool_invocations_notify AFTER INSERT ON agents.tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'running' AND NEW.lease_owner IS NULL)
    EXECUTE FUNCTION agents.tg_tool_invocations_notify();

-- The insert against what the caller read before (0020), at a third of its cost: the
-- version check read the tool through row-level security, whose policy for an agent costs
-- ~190 µs a statement here, and then fn_invoke_tool ran below an invoker's function (~550
-- to 750 µs in all, the largest part of an agent's call in PostgreSQL; ~250 µs now). It
-- runs as definer, reading only the caller's own tenant (auth.uid()), and for an agent only
-- a tool assigned to it: what it tells (NULL: read again) is no more than the caller may
-- read. fn_invoke_tool decides, as before, everything about whether the call may be made.
CREATE OR REPLACE FUNCTION agents.invoke_seen(
    p_agent_id uuid, p_agent_name text, p_tool_id uuid, p_input jsonb, p_run_id uuid,
    p_version text)
RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_caller_agent uuid := agents.caller_agent_id();
BEGIN
    IF NOT EXISTS (
           SELECT 1 FROM agents.tools_registry t
            WHERE t.id = p_tool_id AND t.owner = v_owner
              AND t.xmin::text || '/' || extract(epoch FROM t.updated_at)::text = p_version)
       OR (v_caller_agent IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM agents.tool_assignments s
                WHERE s.agent_id = v_caller_agent AND s.tool_id = p_tool_id
                  AND s.owner = v_owner))
       OR (p_agent_name IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM agents.agents a
                WHERE a.id = p_agent_id AND a.owner = v_owner AND a.name = p_agent_name))
    THEN
        RETURN NULL;
    END IF;
    RETURN public.fn_invoke_tool(p_agent_id, p_tool_id, p_input, p_run_id);
END
$$;
