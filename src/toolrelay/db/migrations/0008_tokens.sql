-- API tokens (#6): bearer tokens for owners and agents. Only a SHA-256 of each token is
-- stored; the token itself is shown once, when it is made. Owners read their tokens'
-- metadata (never the hash) and make or revoke them through the functions below, which
-- refuse an agent identity. Looking a token up by its hash is the dispatcher role's
-- (the API authenticates as service_role, then acts as the token's owner).
CREATE TABLE agents.api_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner         uuid NOT NULL DEFAULT auth.uid(),
    agent_id      uuid REFERENCES agents.agents (id) ON DELETE CASCADE,
    name          text,
    token_hash    bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    expires_at    timestamptz,
    revoked_at    timestamptz,
    CONSTRAINT api_tokens_token_hash_key UNIQUE (token_hash),
    CONSTRAINT api_tokens_token_hash_check CHECK (octet_length(token_hash) = 32),
    CONSTRAINT api_tokens_name_check CHECK (name IS NULL OR length(btrim(name)) > 0)
);
CREATE INDEX api_tokens_owner_idx ON agents.api_tokens (owner, created_at);
CREATE INDEX api_tokens_agent_idx ON agents.api_tokens (agent_id);

ALTER TABLE agents.api_tokens ENABLE ROW LEVEL SECURITY;
CREATE POLICY api_tokens_owner_read ON agents.api_tokens FOR SELECT TO authenticated
    USING (owner = auth.uid());

REVOKE ALL ON agents.api_tokens FROM PUBLIC;
GRANT SELECT (id, owner, agent_id, name, created_at, last_used_at, expires_at, revoked_at)
    ON agents.api_tokens TO authenticated;
GRANT SELECT, INSERT, UPDATE, DELETE ON agents.api_tokens TO service_role;

CREATE FUNCTION public.fn_create_api_token(
    p_token_hash  bytea,
    p_agent_id    uuid        DEFAULT NULL,
    p_name        text        DEFAULT NULL,
    p_expires_at  timestamptz DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_id uuid;
BEGIN
    IF p_agent_id IS NOT NULL THEN
        PERFORM agents.owned_agent(v_owner, p_agent_id);
    END IF;
    IF p_expires_at IS NOT NULL AND p_expires_at <= now() THEN
        RAISE EXCEPTION 'a token cannot expire in the past (%)', p_expires_at
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO agents.api_tokens (owner, agent_id, name, token_hash, expires_at)
    VALUES (v_owner, p_agent_id, p_name, p_token_hash, p_expires_at)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

-- True when this call revoked it; false when it already was. Not found raises P0002.
CREATE FUNCTION public.fn_revoke_api_token(p_token_id uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_revoked timestamptz;
BEGIN
    SELECT revoked_at INTO v_revoked FROM agents.api_tokens
     WHERE id = p_token_id AND owner = v_owner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'token % not found', p_token_id USING ERRCODE = 'P0002';
    END IF;
    IF v_revoked IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE agents.api_tokens SET revoked_at = now() WHERE id = p_token_id;
    RETURN true;
END
$$;

-- Who a live token belongs to: no row when it is unknown, revoked, expired, or its agent
-- is gone or disabled. Use is recorded at most once a minute (no write per request).
CREATE FUNCTION agents.authenticate_token(p_token_hash bytea)
RETURNS TABLE (token_id uuid, owner uuid, agent_id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT t.id, t.owner, t.agent_id
      FROM agents.api_tokens t LEFT JOIN agents.agents a ON a.id = t.agent_id
     WHERE t.token_hash = p_token_hash
       AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())
       AND (t.agent_id IS NULL OR a.status = 'active');
    IF FOUND THEN
        UPDATE agents.api_tokens t SET last_used_at = now()
         WHERE t.token_hash = p_token_hash
           AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute');
    END IF;
END
$$;

REVOKE EXECUTE ON FUNCTION
    public.fn_create_api_token(bytea, uuid, text, timestamptz),
    public.fn_revoke_api_token(uuid),
    agents.authenticate_token(bytea)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    public.fn_create_api_token(bytea, uuid, text, timestamptz),
    public.fn_revoke_api_token(uuid)
TO authenticated, service_role;
GRANT EXECUTE ON FUNCTION agents.authenticate_token(bytea) TO service_role;

-- Pure functions of a tool row the API shows: whether a call waits for approval (an agent's
-- tool list) and whether a tool changed since a call was made (the approvals page warns:
-- the dispatcher would fail it with tool_changed).
GRANT EXECUTE ON FUNCTION
    agents.tool_is_gated(agents.tools_registry),
    agents.tool_fingerprint(agents.tools_registry)
TO authenticated;
