-- The small helpers every statement calls, in PL/pgSQL (issue 14, goals 1 and 3).
--
-- A LANGUAGE sql function that PostgreSQL cannot inline (one with SET search_path, or
-- SECURITY DEFINER) is parsed, analyzed and planned again on every call from a new
-- statement, and, called from PL/pgSQL, once per transaction in each calling expression:
-- its plan is cached nowhere. A PL/pgSQL function's plans are cached for the session.
-- Measured with perf on the invoke path (BEGIN, the identity, invoke_seen, COMMIT; 8
-- connections): 18% of PostgreSQL's CPU was spent in such functions (fmgr_sql), most of it
-- parsing (caller_agent_id runs three times a call, tool_fingerprint once).
--
-- Same bodies, same volatility, same search_path and security: only the language changes.
-- auth.uid() and tool_is_gated() stay SQL: they have no SET clause, so they are inlined
-- into whatever calls them, which is cheaper still.

CREATE OR REPLACE FUNCTION agents.caller_agent_id() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN nullif(coalesce(
        nullif(current_setting('request.jwt.claim.agent_id', true), ''),
        nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'agent_id'), '')::uuid;
END
$$;

CREATE OR REPLACE FUNCTION agents.caller_member_id() RETURNS uuid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN nullif(coalesce(
        nullif(current_setting('request.jwt.claim.member_id', true), ''),
        nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'member_id'), '')::uuid;
END
$$;

CREATE OR REPLACE FUNCTION agents.caller_role() RETURNS name
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN CASE current_setting('role') WHEN 'none' THEN session_user
                ELSE current_setting('role')::name END;
END
$$;

CREATE OR REPLACE FUNCTION agents.caller_tool_ids() RETURNS uuid[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(s.tool_id), '{}') FROM agents.tool_assignments s
             WHERE s.agent_id = agents.caller_agent_id() AND s.owner = auth.uid());
END
$$;

CREATE OR REPLACE FUNCTION agents.tool_version(p_tool uuid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN (SELECT t.xmin::text || '/' || extract(epoch FROM t.updated_at)::text
              FROM agents.tools_registry t WHERE t.id = p_tool);
END
$$;

-- The formula of 0026, unchanged: calls made before keep matching.
CREATE OR REPLACE FUNCTION agents.tool_fingerprint(t agents.tools_registry) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    -- Everything but labels, lifecycle and gating flags (gating is decided at claim).
    RETURN encode(sha256(convert_to((to_jsonb(t) - ARRAY[
        'id', 'owner', 'key', 'name', 'description', 'category', 'status', 'created_at',
        'updated_at', 'requires_approval', 'is_dangerous', 'egress_class',
        'approval_ttl_seconds', 'max_concurrency', 'approvals_required'])::text, 'UTF8')), 'hex');
END
$$;

-- The configuration audit (0023): on the round trip too, when a token's last_used_at is
-- renewed (once a minute).
CREATE OR REPLACE FUNCTION agents.audit_secret_column(p_column text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog
AS $$
BEGIN
    RETURN p_column ~* '(ciphertext|wrapped_key|nonce|key_id$|hash|digest|sha256|password'
                       '|private_key|^secret$|_secret$|access_token|refresh_token)';
END
$$;

CREATE OR REPLACE FUNCTION agents.audit_logged(p_row jsonb, p_args text[]) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog
AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
              FROM jsonb_each(p_row) e
             WHERE NOT agents.audit_secret_column(e.key)
               AND CASE WHEN EXISTS (SELECT 1 FROM unnest(p_args) a WHERE a LIKE '+%')
                        THEN '+' || e.key = ANY (p_args) OR '~' || e.key = ANY (p_args)
                        ELSE NOT ('-' || e.key = ANY (p_args)) END);
END
$$;
