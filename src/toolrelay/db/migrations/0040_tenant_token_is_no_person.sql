-- The tenant's own token is shared (any admin can make one, `toolrelay token create`), so it
-- names no person. Migration 0026 counted it as a member: one person holding it and their own
-- sign-in met a quorum of two alone, and an edit made with it named the tenant as the
-- editor, so that whoever made it could approve it alone (docs/approvals.md).
--
-- 1. People who may approve are the members other than the tenant's own row.
-- 2. In a team (two such people or more) or for a call needing two approvals or more, the
--    tenant's own token approves nothing: members approve as themselves. It still rejects.
-- 3. An edit made with the tenant's own token names no editor: in a team, a call to a tool
--    last changed that way needs two approvals, one of which may be the editor's.

CREATE OR REPLACE FUNCTION agents.approver_count(p_owner uuid) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT greatest(1, count(*)::integer) FROM agents.members m
     WHERE m.owner = p_owner AND m.id <> p_owner AND m.removed_at IS NULL
       AND m.role IN ('admin', 'approver')
$$;

CREATE OR REPLACE FUNCTION agents.approvals_needed(t agents.tools_registry) RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
DECLARE
    v_team integer := agents.approver_count(t.owner);
    v_needed integer := coalesce(t.approvals_required::integer,
                                 CASE WHEN t.is_dangerous AND v_team >= 2 THEN 2 ELSE 1 END);
BEGIN
    IF v_needed < 2 AND v_team >= 2 AND agents.tool_last_editor(t.id) = t.owner THEN
        RETURN 2;  -- 3. above
    END IF;
    RETURN v_needed;
END
$$;
-- Whether a call needing p_needed approvals in this tenant must tell its approvers apart, so
-- that the tenant's own token approves nothing (2. above). The approvals page asks it too.
CREATE FUNCTION agents.approvers_told_apart(p_owner uuid, p_needed integer) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT p_needed >= 2 OR agents.approver_count(p_owner) >= 2
$$;
GRANT EXECUTE ON FUNCTION agents.approvers_told_apart(uuid, integer) TO authenticated, service_role;

-- approvals_needed runs as its caller (an owner's read of a pending call): the audit log's
-- row-level security shows it only its own tenant's editors.
GRANT EXECUTE ON FUNCTION agents.tool_last_editor(uuid) TO authenticated, service_role;

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

    SELECT count(*) INTO v_count FROM agents.invocation_approvals a WHERE a.invocation_id = v.id;
    IF v_count < v_needed THEN
        RETURN;  -- pending: more approvers needed
    END IF;
    IF v_editor IS NOT NULL AND agents.approver_count(v_owner) >= 2 AND NOT EXISTS (
        SELECT 1 FROM agents.invocation_approvals a
         WHERE a.invocation_id = v.id AND a.member_id <> v_editor) THEN
        RETURN;  -- only the tool's last editor approved: pending for someone else
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'running', approval_status = 'approved', decided_by = v_me,
           decided_at = now(), run_after = now(), request_digest = p_request_digest,
           updated_at = now()
     WHERE id = p_invocation_id;
END
$$;
