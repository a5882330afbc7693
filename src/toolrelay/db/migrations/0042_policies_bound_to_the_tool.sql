-- An approval rule approves calls to the tool as it was when the rule was added (issue 16's
-- policies, docs/approvals.md). A person's approval binds to the request they saw; a rule is
-- an approval written in advance, reviewed against the tool's endpoint and template of that
-- moment. Before, a rule went on approving after the tool's request changed (a re-import,
-- an endpoint pointed elsewhere) without anyone seeing the new request.
--
-- Each rule keeps the tool's configuration fingerprint (agents.tool_fingerprint: every
-- column that shapes a request, not labels or gating) from when it was added, or last
-- confirmed by an admin (fn_confirm_policy). An approval rule whose fingerprint is not the
-- tool's decides nothing: toolrelay skips it (the call waits for a person, or a later
-- rule), and fn_policy_decide refuses it. Rejection rules apply as before: they only ever
-- refuse more. Existing rules are bound to their tool as it is now.

ALTER TABLE agents.tool_policies ADD COLUMN tool_fingerprint text;
ALTER TABLE agents.tool_policies DISABLE TRIGGER tool_policies_audit;  -- a migration, not an edit
UPDATE agents.tool_policies p SET tool_fingerprint = agents.tool_fingerprint(t)
  FROM agents.tools_registry t WHERE t.id = p.tool_id;
ALTER TABLE agents.tool_policies ENABLE TRIGGER tool_policies_audit;

-- Bound when added, whoever adds it (plain SQL too): a value given in the INSERT is replaced.
CREATE FUNCTION agents.tg_tool_policies_bind() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    SELECT agents.tool_fingerprint(t) INTO NEW.tool_fingerprint
      FROM agents.tools_registry t WHERE t.id = NEW.tool_id;
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tool_policies_bind() FROM PUBLIC;
CREATE TRIGGER tool_policies_bind BEFORE INSERT ON agents.tool_policies
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tool_policies_bind();

-- A migration that changes the formula (a column added to tools_registry) changes every
-- tool's fingerprint without changing any request: every migrate run ends here
-- (db/migrate.py), and a rule bound to its tool's kept value (current until the run)
-- follows the tool's new value. Between runs the trigger keeps the kept value equal to
-- the formula, so this moves nothing; a rule already stale stays stale.
CREATE OR REPLACE FUNCTION agents.refresh_tool_fingerprints() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
DECLARE
    v_changed integer;
BEGIN
    UPDATE agents.tool_policies p SET tool_fingerprint = agents.tool_fingerprint(t)
      FROM agents.tools_registry t JOIN agents.tool_fingerprints f ON f.tool_id = t.id
     WHERE p.tool_id = t.id AND p.tool_fingerprint = f.fingerprint
       AND f.fingerprint IS DISTINCT FROM agents.tool_fingerprint(t);
    SELECT count(*) FILTER (WHERE agents.keep_tool_fingerprint(t))::integer INTO v_changed
      FROM agents.tools_registry t;
    RETURN v_changed;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.refresh_tool_fingerprints() FROM PUBLIC;

-- An admin confirms a rule for the tool as it is now (after reviewing its request).
CREATE FUNCTION public.fn_confirm_policy(p_policy_id uuid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
BEGIN
    UPDATE agents.tool_policies p SET tool_fingerprint = agents.tool_fingerprint(t)
      FROM agents.tools_registry t
     WHERE p.id = p_policy_id AND p.owner = v_owner AND t.id = p.tool_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'policy % not found', p_policy_id USING ERRCODE = 'P0002';
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_confirm_policy(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_confirm_policy(uuid) TO authenticated;

CREATE OR REPLACE FUNCTION public.fn_policy_decide(
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
    IF p.action = 'approve' AND p.tool_fingerprint IS DISTINCT FROM (
            SELECT agents.tool_fingerprint(t) FROM agents.tools_registry t WHERE t.id = v.tool_id) THEN
        RAISE EXCEPTION 'policy %: the tool''s request changed since this rule was added or'
            ' confirmed; it approves nothing until an admin confirms it (toolrelay policy'
            ' confirm %)', p.name, p.id USING ERRCODE = 'TR003';
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
