-- An approval rule takes as many people as the calls it decides (docs/approvals.md).
-- A rule is an approval given in advance (0042, 0043). Until now one admin's rule approved
-- the calls of a tool that needs two approvers (is_dangerous in a team, or
-- approvals_required ≥ 2) alone: the quorum met by one person. Now:
--
-- 1. Each approval rule keeps who confirmed it and for which configuration of its tool
--    (agents.policy_confirmations): adding it is its adder's confirmation, and
--    fn_confirm_policy adds (or renews) the caller's.
-- 2. A rule is in force when the admins who confirmed it for the tool as it is now are at
--    least as many as a call to the tool needs approvers (agents.approvals_needed; the
--    tenant's own token counts only where approvers need not be told apart, 0040; a member
--    counts while an admin, not once removed or given another role), and, in
--    a team, one of them is not the tool's last editor (0026's rule for people, now also
--    checked when the rule decides, not only when it is written, 0043).
--    agents.policy_standing says so; toolrelay skips a rule not in force and
--    fn_policy_decide refuses it.
-- 3. Existing approval rules keep one confirmation: their adder's (from the audit log), for
--    the configuration they are bound to. On a tool needing two approvers they decide
--    nothing after this upgrade until a second admin confirms them.

CREATE TABLE agents.policy_confirmations (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    policy_id        uuid NOT NULL REFERENCES agents.tool_policies (id) ON DELETE CASCADE,
    owner            uuid NOT NULL,
    member_id        uuid NOT NULL,  -- the member, or the tenant (its own token; no members)
    tool_fingerprint text NOT NULL,  -- the tool's configuration they confirmed
    confirmed_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (policy_id, member_id)
);
ALTER TABLE agents.policy_confirmations ENABLE ROW LEVEL SECURITY;
CREATE POLICY policy_confirmations_owner_read ON agents.policy_confirmations FOR SELECT
    TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
REVOKE ALL ON agents.policy_confirmations FROM PUBLIC;
GRANT SELECT ON agents.policy_confirmations TO authenticated, service_role;
CREATE TRIGGER policy_confirmations_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.policy_confirmations
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('policy_confirmation', '');

INSERT INTO agents.policy_confirmations (policy_id, owner, member_id, tool_fingerprint)
SELECT p.id, p.owner,
       coalesce((SELECT coalesce(a.actor_member, a.actor) FROM agents.config_audit a
                  WHERE a.kind = 'policy' AND a.object_id = p.id AND a.action = 'insert'
                  ORDER BY a.id LIMIT 1), p.owner),
       p.tool_fingerprint
  FROM agents.tool_policies p
 WHERE p.action = 'approve' AND p.tool_fingerprint IS NOT NULL;

-- Who is confirming: the member, else the tenant (its own token, psql without a member).
CREATE FUNCTION agents.confirm_policy_as_caller(p_policy agents.tool_policies) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    INSERT INTO agents.policy_confirmations AS c (policy_id, owner, member_id, tool_fingerprint)
    SELECT p_policy.id, p_policy.owner,
           coalesce(agents.caller_member_id(), auth.uid(), p_policy.owner),
           agents.tool_fingerprint(t)
      FROM agents.tools_registry t WHERE t.id = p_policy.tool_id
    ON CONFLICT (policy_id, member_id) DO UPDATE
       SET tool_fingerprint = EXCLUDED.tool_fingerprint, confirmed_at = clock_timestamp()
     WHERE c.tool_fingerprint IS DISTINCT FROM EXCLUDED.tool_fingerprint;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.confirm_policy_as_caller(agents.tool_policies) FROM PUBLIC;

CREATE FUNCTION agents.tg_tool_policies_confirmed_by_adder() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    IF NEW.action = 'approve' THEN
        PERFORM agents.confirm_policy_as_caller(NEW);
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tool_policies_confirmed_by_adder() FROM PUBLIC;
CREATE TRIGGER tool_policies_confirmed_by_adder AFTER INSERT ON agents.tool_policies
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tool_policies_confirmed_by_adder();

-- Whether an approval (or a rule's confirmation) by p_member counts toward p_needed: while
-- the member has one of p_roles in the tenant (not once removed or given another role); the
-- tenant's own, only where approvers need not be told apart (0040).
CREATE FUNCTION agents.approval_counts(
    p_owner uuid, p_member uuid, p_needed integer, p_roles text[] DEFAULT '{admin,approver}')
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT CASE WHEN p_member = p_owner THEN NOT agents.approvers_told_apart(p_owner, p_needed)
                ELSE EXISTS (SELECT 1 FROM agents.members m
                              WHERE m.id = p_member AND m.owner = p_owner
                                AND m.removed_at IS NULL AND m.role = ANY (p_roles)) END
$$;
GRANT EXECUTE ON FUNCTION agents.approval_counts(uuid, uuid, integer, text[])
    TO authenticated, service_role;  -- the approvals page's "1 of 2"

-- Where a rule stands: how many confirmations count for the tool as it is, how many its
-- calls need, and whether it decides calls now (a rejection rule always does). Runs as
-- definer so that every member reads the same answer (the editor is in the audit log,
-- which only admins read); a rule of another tenant, or asked by an agent, reads as NULLs.
CREATE FUNCTION agents.policy_standing(
    p_policy_id uuid, OUT confirmations integer, OUT needed integer, OUT in_force boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    p agents.tool_policies;
    t agents.tools_registry;
    v_counted uuid[];
    v_editor uuid;
BEGIN
    SELECT * INTO p FROM agents.tool_policies r
     WHERE r.id = p_policy_id AND (auth.uid() IS NULL OR r.owner = auth.uid())
       AND agents.caller_agent_id() IS NULL;  -- agents read no rules (0028's policies)
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
REVOKE EXECUTE ON FUNCTION agents.policy_standing(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.policy_standing(uuid) TO authenticated, service_role;

CREATE OR REPLACE FUNCTION public.fn_confirm_policy(p_policy_id uuid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v_rule agents.tool_policies;
BEGIN
    SELECT * INTO v_rule FROM agents.tool_policies p WHERE p.id = p_policy_id AND p.owner = v_owner;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'policy % not found', p_policy_id USING ERRCODE = 'P0002';
    END IF;
    IF v_rule.action = 'approve' THEN
        PERFORM agents.require_not_the_editor(v_rule.tool_id);
        PERFORM agents.confirm_policy_as_caller(v_rule);
    END IF;
    UPDATE agents.tool_policies p SET tool_fingerprint = agents.tool_fingerprint(t)
      FROM agents.tools_registry t
     WHERE p.id = p_policy_id AND t.id = p.tool_id
       AND p.tool_fingerprint IS DISTINCT FROM agents.tool_fingerprint(t);
END
$$;

CREATE OR REPLACE FUNCTION public.fn_policy_decide(
    p_invocation_id uuid, p_policy_id uuid, p_request_digest text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v agents.tool_invocations;
    p agents.tool_policies;
    s record;
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
    IF p.action = 'approve' THEN
        IF p.tool_fingerprint IS DISTINCT FROM (
                SELECT agents.tool_fingerprint(t) FROM agents.tools_registry t WHERE t.id = v.tool_id) THEN
            RAISE EXCEPTION 'policy %: the tool''s request changed since this rule was added or'
                ' confirmed; it approves nothing until an admin confirms it (toolrelay policy'
                ' confirm %)', p.name, p.id USING ERRCODE = 'TR003';
        END IF;
        SELECT * INTO s FROM agents.policy_standing(p.id);
        IF s.confirmations < s.needed THEN
            RAISE EXCEPTION 'policy %: calls to this tool need % approvers, so the rule needs % admins'
                ' to confirm it for the tool as it is (it has %); another admin confirms it'
                ' (toolrelay policy confirm %)', p.name, s.needed, s.needed, s.confirmations, p.id
                USING ERRCODE = 'TR003';
        END IF;
        IF NOT s.in_force THEN
            RAISE EXCEPTION 'policy %: only the tool''s last editor confirmed it; another admin'
                ' confirms it (toolrelay policy confirm %)', p.name, p.id USING ERRCODE = 'TR003';
        END IF;
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

-- 0042's carry-over for a migration that changes the fingerprint formula, for the
-- confirmations too: those of the tool as it was stay those of the tool as it is.
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
    UPDATE agents.policy_confirmations c SET tool_fingerprint = agents.tool_fingerprint(t)
      FROM agents.tool_policies p, agents.tools_registry t
      JOIN agents.tool_fingerprints f ON f.tool_id = t.id
     WHERE p.id = c.policy_id AND t.id = p.tool_id AND c.tool_fingerprint = f.fingerprint
       AND f.fingerprint IS DISTINCT FROM agents.tool_fingerprint(t);
    SELECT count(*) FILTER (WHERE agents.keep_tool_fingerprint(t))::integer INTO v_changed
      FROM agents.tools_registry t;
    RETURN v_changed;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.refresh_tool_fingerprints() FROM PUBLIC;
