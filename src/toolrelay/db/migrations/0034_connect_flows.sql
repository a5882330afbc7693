-- Connecting an account from the API and the page (issue 17): a connect flow an admin
-- starts (POST /v1/credentials/connect), continued in the browser of the same member (the
-- approvals page's session), finished by the provider's redirect to /v1/oauth/callback.
-- The OAuth app's client secret waits here sealed with the master key (as credentials are;
-- the associated data names this flow), the state only as a hash; each step happens once.
-- Service role only, but for fn_connect_begin, which is an admin's.

CREATE TABLE agents.connect_flows (
    id              uuid PRIMARY KEY,
    owner           uuid NOT NULL,
    member_id       uuid,          -- who started it; NULL: the tenant itself
    credential_id   uuid,          -- a reconnect: this credential keeps its id
    name            text NOT NULL,
    provider        text NOT NULL,
    issuer          text,
    parameters      jsonb NOT NULL DEFAULT '{}',
    scopes          text[] NOT NULL DEFAULT '{}',
    allowed_hosts   text[] NOT NULL DEFAULT '{}',
    client_id       text,
    secret_key_id   text,
    secret_wrapped  bytea,
    secret_nonce    bytea,
    secret_sealed   bytea,
    state_hash      bytea UNIQUE,  -- set when the person continues, in their browser
    nonce           text,
    code_verifier   text,
    redirect_uri    text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    continued_at    timestamptz,
    consumed_at     timestamptz,
    CONSTRAINT connect_flows_name_check CHECK (length(btrim(name)) BETWEEN 1 AND 200)
);
CREATE INDEX connect_flows_expires_idx ON agents.connect_flows (expires_at);
REVOKE ALL ON agents.connect_flows FROM PUBLIC;

CREATE FUNCTION public.fn_connect_begin(
    p_id uuid, p_credential_id uuid, p_name text, p_provider text, p_issuer text,
    p_parameters jsonb, p_scopes text[], p_allowed_hosts text[], p_client_id text,
    p_secret_key_id text, p_secret_wrapped bytea, p_secret_nonce bytea, p_secret_sealed bytea,
    p_ttl_seconds integer)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v_expires timestamptz := now() + make_interval(secs => p_ttl_seconds);
BEGIN
    IF p_credential_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM agents.credentials c
         WHERE c.id = p_credential_id AND c.owner = v_owner AND c.kind = 'oauth') THEN
        RAISE EXCEPTION 'oauth credential % not found', p_credential_id USING ERRCODE = 'P0002';
    END IF;
    DELETE FROM agents.connect_flows WHERE expires_at < now() - interval '1 hour';
    INSERT INTO agents.connect_flows
        (id, owner, member_id, credential_id, name, provider, issuer, parameters, scopes,
         allowed_hosts, client_id, secret_key_id, secret_wrapped, secret_nonce, secret_sealed,
         expires_at)
    VALUES (p_id, v_owner, agents.caller_member_id(), p_credential_id, btrim(p_name),
            p_provider, p_issuer, coalesce(p_parameters, '{}'), coalesce(p_scopes, '{}'),
            coalesce(p_allowed_hosts, '{}'), p_client_id, p_secret_key_id, p_secret_wrapped,
            p_secret_nonce, p_secret_sealed, v_expires);
    RETURN v_expires;
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_connect_begin(uuid, uuid, text, text, text, jsonb, text[],
    text[], text, text, bytea, bytea, bytea, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_connect_begin(uuid, uuid, text, text, text, jsonb, text[],
    text[], text, text, bytea, bytea, bytea, integer) TO authenticated;

-- The person continues in their browser: the flow gets its state, nonce and verifier once.
CREATE FUNCTION agents.fn_connect_continue(
    p_id uuid, p_state_hash bytea, p_nonce text, p_code_verifier text, p_redirect_uri text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    UPDATE agents.connect_flows f
       SET state_hash = p_state_hash, nonce = p_nonce, code_verifier = p_code_verifier,
           redirect_uri = p_redirect_uri, continued_at = now()
     WHERE f.id = p_id AND f.continued_at IS NULL AND f.expires_at > now();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this connect was already continued or has expired: start again'
            USING ERRCODE = 'TR010';
    END IF;
END
$$;

-- The provider's redirect: the flow for this state, used up; TR010 when unknown, used or
-- expired.
CREATE FUNCTION agents.fn_connect_consume(p_state_hash bytea)
RETURNS SETOF agents.connect_flows
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v agents.connect_flows;
BEGIN
    SELECT * INTO v FROM agents.connect_flows f WHERE f.state_hash = p_state_hash FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this connect was not started here (unknown state)' USING ERRCODE = 'TR010';
    END IF;
    IF v.consumed_at IS NOT NULL THEN
        RAISE EXCEPTION 'this connect was already used: start again' USING ERRCODE = 'TR010';
    END IF;
    IF v.expires_at <= now() THEN
        RAISE EXCEPTION 'this connect took too long and expired: start again' USING ERRCODE = 'TR010';
    END IF;
    UPDATE agents.connect_flows f SET consumed_at = now() WHERE f.id = v.id;
    RETURN NEXT v;
END
$$;

REVOKE EXECUTE ON FUNCTION agents.fn_connect_continue(uuid, bytea, text, text, text),
    agents.fn_connect_consume(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.fn_connect_continue(uuid, bytea, text, text, text),
    agents.fn_connect_consume(bytea) TO service_role;

-- How a connected credential was connected (provider preset, issuer, parameters), so a
-- reconnect needs nobody to remember it. Written by the connect itself (service role);
-- readable by the tenant's people, not by agents.
CREATE TABLE agents.credential_connections (
    credential_id  uuid PRIMARY KEY REFERENCES agents.credentials (id) ON DELETE CASCADE,
    owner          uuid NOT NULL,
    provider       text NOT NULL,
    issuer         text,
    parameters     jsonb NOT NULL DEFAULT '{}',
    connected_at   timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE agents.credential_connections ENABLE ROW LEVEL SECURITY;
CREATE POLICY credential_connections_owner_read ON agents.credential_connections
    FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
REVOKE ALL ON agents.credential_connections FROM PUBLIC;
GRANT SELECT ON agents.credential_connections TO authenticated;
GRANT SELECT, INSERT, UPDATE, DELETE ON agents.credential_connections TO service_role;
GRANT SELECT, UPDATE, DELETE ON agents.connect_flows TO service_role;
