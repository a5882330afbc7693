-- An approval binds to the exact request (SPEC §3), and gating is decided again at claim.
--
-- 1. request_digest: the sha256 of the rendered request (method, URL, headers but the
--    credential's value, body) that the approver saw. The dispatcher renders again and
--    sends only when the digest matches. Approvers outside our doors (plain SQL) may leave
--    it NULL; the approval then binds to the configuration fingerprint alone.
-- 2. The configuration fingerprint covers the whole tool row except the columns that cannot
--    shape a request, so a column added later is covered without touching this function.

ALTER TABLE agents.tool_invocations ADD COLUMN request_digest text
    CONSTRAINT tool_invocations_request_digest_check CHECK (request_digest ~ '^[0-9a-f]{64}$');

-- In-flight invocations whose fingerprint matched under the old formula keep matching.
UPDATE agents.tool_invocations i
   SET config_fingerprint = encode(sha256(convert_to((to_jsonb(t) - ARRAY[
           'id', 'owner', 'key', 'name', 'description', 'category', 'status', 'created_at',
           'updated_at', 'requires_approval', 'is_dangerous', 'egress_class',
           'approval_ttl_seconds', 'max_concurrency'])::text, 'UTF8')), 'hex')
  FROM agents.tools_registry t
 WHERE t.id = i.tool_id AND i.status IN ('pending', 'running')
   AND i.config_fingerprint = encode(sha256(convert_to(jsonb_build_array(
        t.endpoint_url, t.http_method, t.request_template, t.auth_method, t.auth_placement,
        t.auth_param_name, t.auth_param_prefix, t.credential_ref, t.response_pointer,
        t.idempotency_header)::text, 'UTF8')), 'hex');

CREATE OR REPLACE FUNCTION agents.tool_fingerprint(t agents.tools_registry) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    -- Everything but labels, lifecycle and gating flags (gating is decided at claim).
    SELECT encode(sha256(convert_to((to_jsonb(t) - ARRAY[
        'id', 'owner', 'key', 'name', 'description', 'category', 'status', 'created_at',
        'updated_at', 'requires_approval', 'is_dangerous', 'egress_class',
        'approval_ttl_seconds', 'max_concurrency'])::text, 'UTF8')), 'hex')
$$;

DROP FUNCTION public.fn_approve_tool_invocation(uuid);

CREATE FUNCTION public.fn_approve_tool_invocation(
    p_invocation_id uuid, p_request_digest text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v agents.tool_invocations := agents.lock_pending(v_owner, p_invocation_id);
BEGIN
    IF p_request_digest IS NOT NULL AND p_request_digest !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'request digest must be 64 lowercase hex characters (sha256), got %',
            left(p_request_digest, 80) USING ERRCODE = '22023';
    END IF;
    IF v.approval_expires_at IS NOT NULL AND v.approval_expires_at <= now() THEN
        RAISE EXCEPTION 'invocation % can no longer be approved: its approval window closed at %',
            p_invocation_id, v.approval_expires_at USING ERRCODE = 'TR004';
    END IF;
    UPDATE agents.tool_invocations
       SET status = 'running', approval_status = 'approved', decided_by = v_owner,
           decided_at = now(), run_after = now(), request_digest = p_request_digest,
           updated_at = now()
     WHERE id = p_invocation_id;
END
$$;

REVOKE EXECUTE ON FUNCTION public.fn_approve_tool_invocation(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_approve_tool_invocation(uuid, text)
    TO authenticated, service_role;
