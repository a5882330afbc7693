-- An invoke in one lookup, its fingerprint kept with the tool (issue 14, goal 3).
--
-- Measured with callgrind on the invoke transaction (BEGIN, the identity, invoke_seen,
-- COMMIT; bench/instructions.py), after 0037: 1.77 M instructions, of which ~210 k were the
-- configuration fingerprint (to_jsonb of the whole tool row, fifteen keys removed, sha256)
-- and ~190 k the layers of the call: invoke_seen read the tool's version, the assignment
-- and the agent, then called fn_invoke_tool, which read the agent, the tool and the
-- assignment again, each through a function of its own.
--
-- 1. The fingerprint is computed when a tool is written, not when it is called. Kept in a
--    table of its own, as the agents' versions are (0035): no column in tool rows, API
--    answers, exports or audit rows. Renewed by a trigger in the same transaction as every
--    insert and update of a tool, whatever door wrote it. The insert here and the claim
--    (db/sql/dispatch.sql) read this table, with the formula as the fallback for a tool
--    that has no row; the review queue's tool_changed (registry/service.py, as the
--    owner, who does not read this table) computes the formula: the same value. Every
--    migrate run ends with agents.refresh_tool_fingerprints() (db/migrate.py), so a later
--    migration that adds a column the formula covers changes every tool's kept value, as
--    it changed the computed one. (One that changes the formula itself must still carry
--    the calls in flight over, as 0013 did.)
-- 2. invoke_seen makes the call itself, reading the agent, the tool, its fingerprint and
--    the assignment in one query; without a version it is fn_invoke_tool, which now calls
--    it. Every check, error and code is the same, in the same order.

CREATE TABLE agents.tool_fingerprints (
    tool_id     uuid PRIMARY KEY
                REFERENCES agents.tools_registry (id) ON DELETE CASCADE ON UPDATE CASCADE,
    fingerprint text NOT NULL
);
ALTER TABLE agents.tool_fingerprints ENABLE ROW LEVEL SECURITY;  -- and no policy
REVOKE ALL ON agents.tool_fingerprints FROM PUBLIC;
GRANT SELECT ON agents.tool_fingerprints TO service_role;  -- the claim (it bypasses RLS)

-- One tool's kept value made to agree with the formula; whether it changed.
CREATE FUNCTION agents.keep_tool_fingerprint(p_tool agents.tools_registry) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    INSERT INTO agents.tool_fingerprints AS f (tool_id, fingerprint)
    VALUES (p_tool.id, agents.tool_fingerprint(p_tool))
    ON CONFLICT (tool_id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint
     WHERE f.fingerprint IS DISTINCT FROM EXCLUDED.fingerprint;
    RETURN FOUND;
END
$$;

-- Every tool's (db/migrate.py, after every run); how many changed.
CREATE FUNCTION agents.refresh_tool_fingerprints() RETURNS integer
LANGUAGE sql SET search_path = pg_catalog
AS $$
    SELECT count(*) FILTER (WHERE agents.keep_tool_fingerprint(t))::integer
      FROM agents.tools_registry t
$$;
REVOKE EXECUTE ON FUNCTION agents.keep_tool_fingerprint(agents.tools_registry),
    agents.refresh_tool_fingerprints() FROM PUBLIC;
SELECT agents.refresh_tool_fingerprints();

CREATE FUNCTION agents.tg_tools_registry_fingerprint() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    PERFORM agents.keep_tool_fingerprint(NEW);
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tools_registry_fingerprint() FROM PUBLIC;

CREATE TRIGGER tools_registry_fingerprint AFTER INSERT OR UPDATE ON agents.tools_registry
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tools_registry_fingerprint();

-- fn_invoke_tool's body (0036), its lookups in one query. With p_version: NULL, and nothing
-- written, when the tool is no longer that version (or is gone), when an agent calling has
-- no assignment of it, or when the agent is no longer named p_agent_name: read it again.
-- It runs as definer, reading only the caller's own tenant (auth.uid()): what it tells is
-- no more than the caller may read.
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
    IF v_tool.id IS NULL THEN
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

CREATE OR REPLACE FUNCTION public.fn_invoke_tool(
    p_agent_id uuid, p_tool_id uuid, p_input jsonb DEFAULT '{}'::jsonb,
    p_run_id uuid DEFAULT NULL::uuid)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    RETURN agents.invoke_seen(p_agent_id, NULL, p_tool_id, p_input, p_run_id, NULL);
END
$$;
