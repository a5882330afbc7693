-- Several approvers for one call, and approvers other than the tool's last editor (issue 16,
-- item 3; docs/approvals.md).
--
-- 1. Quorum: a tool needs approvals_required distinct approvers (1-10), by default 2 for an
--    is_dangerous tool once the tenant has two members who may approve (admins and
--    approvers), else 1. A call stays pending until that many distinct members approved the
--    same request (the same request digest); one rejection rejects it. Each approval is a row
--    of agents.invocation_approvals; the last one moves the call to running and is its
--    decided_by.
-- 2. Separation of duties: the member who last changed the tool (the audit log's latest row
--    for it, migration 0023) is not enough on their own: when another member could approve,
--    a call approved only by the last editor stays pending for someone else.
-- Both only add approvals needed: what a single approval did before, it still does in a
-- tenant without members.

ALTER TABLE agents.tools_registry ADD COLUMN approvals_required smallint,
    ADD CONSTRAINT tools_registry_approvals_required_check
        CHECK (approvals_required IS NULL OR approvals_required BETWEEN 1 AND 10);

-- A gating setting, like requires_approval: it shapes no request, so it stays out of the
-- configuration fingerprint (and calls made before this migration keep theirs).
CREATE OR REPLACE FUNCTION agents.tool_fingerprint(t agents.tools_registry) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    -- Everything but labels, lifecycle and gating flags (gating is decided at claim).
    SELECT encode(sha256(convert_to((to_jsonb(t) - ARRAY[
        'id', 'owner', 'key', 'name', 'description', 'category', 'status', 'created_at',
        'updated_at', 'requires_approval', 'is_dangerous', 'egress_class',
        'approval_ttl_seconds', 'max_concurrency', 'approvals_required'])::text, 'UTF8')), 'hex')
$$;

CREATE TABLE agents.invocation_approvals (
    invocation_id   uuid NOT NULL REFERENCES agents.tool_invocations (id) ON DELETE CASCADE,
    owner           uuid NOT NULL,
    member_id       uuid NOT NULL,  -- the approver (the tenant's uuid: the tenant itself)
    request_digest  text,
    approved_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (invocation_id, member_id)
);
CREATE INDEX invocation_approvals_owner_idx ON agents.invocation_approvals (owner, approved_at);
ALTER TABLE agents.invocation_approvals ENABLE ROW LEVEL SECURITY;
CREATE POLICY invocation_approvals_owner_read ON agents.invocation_approvals
    FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
REVOKE ALL ON agents.invocation_approvals FROM PUBLIC;
GRANT SELECT ON agents.invocation_approvals TO authenticated, service_role;  -- writes: below

-- Members of the tenant who may approve (the tenant itself counts until it has members).
CREATE FUNCTION agents.approver_count(p_owner uuid) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT greatest(1, count(*)::integer) FROM agents.members m
     WHERE m.owner = p_owner AND m.removed_at IS NULL AND m.role IN ('admin', 'approver')
$$;

-- How many distinct approvers a call to this tool needs.
CREATE FUNCTION agents.approvals_needed(t agents.tools_registry) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT coalesce(t.approvals_required::integer,
                    CASE WHEN t.is_dangerous AND agents.approver_count(t.owner) >= 2 THEN 2
                         ELSE 1 END)
$$;

-- Who last changed the tool: its latest audit row's member (else the tenant), if any.
CREATE FUNCTION agents.tool_last_editor(p_tool_id uuid) RETURNS uuid
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT coalesce(a.actor_member, a.actor) FROM agents.config_audit a
     WHERE a.kind = 'tool' AND a.object_id = p_tool_id
     ORDER BY a.at DESC, a.id DESC LIMIT 1
$$;

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

    SELECT * INTO v_tool FROM agents.tools_registry t WHERE t.id = v.tool_id;
    IF FOUND THEN
        v_needed := agents.approvals_needed(v_tool);
        v_editor := agents.tool_last_editor(v_tool.id);
    END IF;
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

REVOKE EXECUTE ON FUNCTION agents.tool_last_editor(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.approver_count(uuid), agents.approvals_needed(agents.tools_registry)
    TO authenticated, service_role;  -- the API shows "1 of 2 approvals"

-- A call sent back to pending (gated again at claim: its tool changed) starts its quorum
-- over: approvals of another configuration do not count. The WHEN clause keeps the hot path
-- (running -> completed) from calling anything.
CREATE FUNCTION agents.tg_invocation_approvals_reset() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    DELETE FROM agents.invocation_approvals WHERE invocation_id = NEW.id;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_invocation_approvals_reset() FROM PUBLIC;
CREATE TRIGGER tool_invocations_approvals_reset
    AFTER UPDATE OF status ON agents.tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'pending' AND OLD.status IS DISTINCT FROM 'pending')
    EXECUTE FUNCTION agents.tg_invocation_approvals_reset();
