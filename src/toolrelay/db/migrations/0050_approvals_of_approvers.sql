-- An approval counts while its approver may approve (docs/approvals.md). A removal or a
-- role change takes effect on the member's next statement (0025), but the approvals they
-- had given to calls still waiting went on counting: Ann approves a dangerous call, leaves
-- the team (or is made a viewer, her account suspected), and Bob's approval completed a
-- quorum of two. Now an approval counts toward a quorum, and toward separation of duties,
-- only while its member is an admin or approver of the tenant (the tenant's own, only where
-- approvers need not be told apart, 0040): agents.approval_counts, as for approval rules'
-- confirmations by admins (0048). The rows stay, naming who approved when.

CREATE OR REPLACE FUNCTION public.fn_approve_tool_invocation(
    p_invocation_id uuid, p_request_digest text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin', 'approver');
    v agents.tool_invocations := agents.lock_pending(v_owner, p_invocation_id);
    v_me uuid := coalesce(agents.caller_member_id(), v_owner);
    v_tool agents.tools_registry;
    v_needed integer := 1;
    v_count integer;
    v_editor uuid;
BEGIN
    IF p_request_digest IS NOT NULL AND p_request_digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'request digest must be 64 lowercase hex characters (sha256), got %',
            left(p_request_digest, 80) USING ERRCODE = '22023';
    END IF;
    IF v.approval_expires_at IS NOT NULL AND v.approval_expires_at <= now() THEN
        RAISE EXCEPTION 'invocation % can no longer be approved: its approval window closed at %',
            p_invocation_id, v.approval_expires_at USING ERRCODE = 'TR004';
    END IF;
    SELECT * INTO v_tool FROM agents.tools_registry t WHERE t.id = v.tool_id;
    IF FOUND THEN
        v_needed := agents.approvals_needed(v_tool);
        v_editor := agents.tool_last_editor(v_tool.id);
    END IF;
    IF v_me = v_owner AND agents.approvers_told_apart(v_owner, v_needed) THEN
        RAISE EXCEPTION 'invocation %: the tenant''s own token cannot approve here: it is shared,'
            ' so it names no person, and this call needs its approvers to be told apart; approve'
            ' as a member (toolrelay login, or a member''s token)', p_invocation_id
            USING ERRCODE = '42501';
    END IF;
    IF EXISTS (SELECT 1 FROM agents.invocation_approvals a
                WHERE a.invocation_id = v.id AND a.member_id = v_me) THEN
        RAISE EXCEPTION 'invocation %: you approved it already; it waits for another approver',
            p_invocation_id USING ERRCODE = 'TR003';
    END IF;
    IF EXISTS (SELECT 1 FROM agents.invocation_approvals a
                WHERE a.invocation_id = v.id
                  AND a.request_digest IS DISTINCT FROM p_request_digest) THEN
        RAISE EXCEPTION 'invocation %: other approvers approved another request than this one'
            ' (the tool changed since); reject it and invoke again', p_invocation_id
            USING ERRCODE = 'TR003';
    END IF;
    INSERT INTO agents.invocation_approvals (invocation_id, owner, member_id, request_digest)
    VALUES (v.id, v_owner, v_me, p_request_digest);

    SELECT count(*) INTO v_count FROM agents.invocation_approvals a
     WHERE a.invocation_id = v.id AND agents.approval_counts(v_owner, a.member_id, v_needed);
    IF v_count < v_needed THEN
        RETURN;  -- pending: more approvers needed
    END IF;
    IF v_editor IS NOT NULL AND agents.approver_count(v_owner) >= 2 AND NOT EXISTS (
        SELECT 1 FROM agents.invocation_approvals a
         WHERE a.invocation_id = v.id AND a.member_id <> v_editor
           AND agents.approval_counts(v_owner, a.member_id, v_needed)) THEN
        RETURN;  -- only the tool's last editor approved: pending for someone else
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'running', approval_status = 'approved', decided_by = v_me,
           decided_at = now(), run_after = now(), request_digest = p_request_digest,
           updated_at = now()
     WHERE id = p_invocation_id;
END
$$;
