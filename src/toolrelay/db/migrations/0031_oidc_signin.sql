-- Sign-in for people through OpenID Connect (issue 16, item 2).
--
-- A member is found by the ID token's subject once it is bound (oidc_subject, and the issuer
-- that vouched for it), or, before that, by an email the provider says it verified; the
-- first such sign-in binds the subject, so a later change of address at the provider keeps
-- the member, and another person given the same address later does not become them.
-- Everything here runs before anyone is signed in, so it is the dispatcher role's
-- (service_role) alone, as agents.authenticate_token is.

ALTER TABLE agents.members ADD COLUMN oidc_issuer text;

-- A sign-in in progress: the random state the browser carries (only its hash here), the
-- nonce the ID token must repeat, the PKCE verifier for the code exchange. Used once.
CREATE TABLE agents.signin_flows (
    state_hash     bytea PRIMARY KEY,
    purpose        text NOT NULL,
    owner          uuid,          -- the organization the sign-in was started for, if named
    nonce          text NOT NULL,
    code_verifier  text NOT NULL,
    redirect_uri   text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    consumed_at    timestamptz,
    CONSTRAINT signin_flows_purpose_check CHECK (purpose = ANY (ARRAY['page']))
);
CREATE INDEX signin_flows_expires_idx ON agents.signin_flows (expires_at);
REVOKE ALL ON agents.signin_flows FROM PUBLIC;

CREATE FUNCTION agents.fn_signin_begin(
    p_state_hash bytea, p_purpose text, p_owner uuid, p_nonce text, p_code_verifier text,
    p_redirect_uri text, p_ttl_seconds integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    -- Flows nobody finished are kept an hour past their expiry (to say "expired"), no longer.
    DELETE FROM agents.signin_flows WHERE expires_at < now() - interval '1 hour';
    INSERT INTO agents.signin_flows
        (state_hash, purpose, owner, nonce, code_verifier, redirect_uri, expires_at)
    VALUES (p_state_hash, p_purpose, p_owner, p_nonce, p_code_verifier, p_redirect_uri,
            now() + make_interval(secs => p_ttl_seconds));
END
$$;

-- The flow for this state, marked used; raises (TR010) when it is unknown, used or expired.
CREATE FUNCTION agents.fn_signin_consume(p_state_hash bytea, p_purpose text)
RETURNS TABLE (owner uuid, nonce text, code_verifier text, redirect_uri text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v agents.signin_flows;
BEGIN
    SELECT * INTO v FROM agents.signin_flows f
     WHERE f.state_hash = p_state_hash AND f.purpose = p_purpose FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this sign-in was not started here (unknown state)' USING ERRCODE = 'TR010';
    END IF;
    IF v.consumed_at IS NOT NULL THEN
        RAISE EXCEPTION 'this sign-in was already used: start again' USING ERRCODE = 'TR010';
    END IF;
    IF v.expires_at <= now() THEN
        RAISE EXCEPTION 'this sign-in took too long and expired: start again' USING ERRCODE = 'TR010';
    END IF;
    UPDATE agents.signin_flows f SET consumed_at = now() WHERE f.state_hash = p_state_hash;
    RETURN QUERY SELECT v.owner, v.nonce, v.code_verifier, v.redirect_uri;
END
$$;

-- The members (of every tenant, or of p_owner) this verified identity may sign in as: bound
-- to this issuer's subject, or (unbound, or bound without an issuer) holding the email the
-- provider verified. A member bound to another subject is never matched by email.
CREATE FUNCTION agents.fn_oidc_members(
    p_issuer text, p_subject text, p_email text, p_email_verified boolean, p_owner uuid)
RETURNS TABLE (owner uuid, member_id uuid, name text, role text, bound boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    SELECT m.owner, m.id, m.name, m.role, m.oidc_subject IS NOT NULL
      FROM agents.members m
     WHERE m.removed_at IS NULL
       AND (p_owner IS NULL OR m.owner = p_owner)
       AND ((m.oidc_subject = p_subject AND coalesce(m.oidc_issuer, p_issuer) = p_issuer)
            OR (m.oidc_subject IS NULL AND p_email_verified AND p_email IS NOT NULL
                AND lower(m.email) = lower(p_email)))
     ORDER BY m.owner, m.id
$$;

-- Binds the subject (and issuer) to a member on its first sign-in; false when it was bound
-- meanwhile to someone else, or the member is gone.
CREATE FUNCTION agents.fn_oidc_bind(p_member_id uuid, p_issuer text, p_subject text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    UPDATE agents.members m
       SET oidc_subject = p_subject, oidc_issuer = p_issuer
     WHERE m.id = p_member_id AND m.removed_at IS NULL
       AND (m.oidc_subject IS NULL OR (m.oidc_subject = p_subject AND m.oidc_issuer IS NULL));
    RETURN FOUND OR EXISTS (SELECT 1 FROM agents.members m
                             WHERE m.id = p_member_id AND m.removed_at IS NULL
                               AND m.oidc_subject = p_subject AND m.oidc_issuer = p_issuer);
END
$$;

-- A signed-in session is a member token that says how it was made (api_tokens.session), so
-- signing out revokes it (a pasted token, a script's, stays valid) and `token list` tells
-- sessions apart. It lasts p_ttl_seconds.
ALTER TABLE agents.api_tokens ADD COLUMN session text;
ALTER TABLE agents.api_tokens ADD CONSTRAINT api_tokens_session_check
    CHECK (session IS NULL OR (session = ANY (ARRAY['page', 'cli']) AND member_id IS NOT NULL
                               AND expires_at IS NOT NULL));

CREATE FUNCTION agents.fn_signin_session(
    p_member_id uuid, p_token_hash bytea, p_session text, p_ttl_seconds integer)
RETURNS TABLE (token_id uuid, owner uuid, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
#variable_conflict use_column
DECLARE
    v_owner uuid;
BEGIN
    SELECT m.owner INTO v_owner FROM agents.members m
     WHERE m.id = p_member_id AND m.removed_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'member % not found', p_member_id USING ERRCODE = 'P0002';
    END IF;
    RETURN QUERY
    INSERT INTO agents.api_tokens (owner, member_id, name, token_hash, expires_at, session)
    VALUES (v_owner, p_member_id, 'signed in (' || p_session || ')', p_token_hash,
            now() + make_interval(secs => p_ttl_seconds), p_session)
    RETURNING id, owner, expires_at;
END
$$;

-- Signing out: the session's own token revoked (nothing else; a pasted token is left alone).
CREATE FUNCTION agents.fn_signout(p_token_hash bytea) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog
AS $$
    WITH done AS (
        UPDATE agents.api_tokens t SET revoked_at = now()
         WHERE t.token_hash = p_token_hash AND t.session IS NOT NULL AND t.revoked_at IS NULL
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM done)
$$;

REVOKE EXECUTE ON FUNCTION agents.fn_signin_begin(bytea, text, uuid, text, text, text, integer),
    agents.fn_signin_consume(bytea, text),
    agents.fn_oidc_members(text, text, text, boolean, uuid),
    agents.fn_oidc_bind(uuid, text, text),
    agents.fn_signin_session(uuid, bytea, text, integer),
    agents.fn_signout(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.fn_signin_begin(bytea, text, uuid, text, text, text, integer),
    agents.fn_signin_consume(bytea, text),
    agents.fn_oidc_members(text, text, text, boolean, uuid),
    agents.fn_oidc_bind(uuid, text, text),
    agents.fn_signin_session(uuid, bytea, text, integer),
    agents.fn_signout(bytea) TO service_role;

-- An admin changes who may sign in as a member: a new email, and the bound subject cleared
-- (the next sign-in with that verified address binds again). NULL removes the email.
CREATE FUNCTION public.fn_set_member_email(p_member_id uuid, p_email text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
BEGIN
    UPDATE agents.members m
       SET email = nullif(btrim(p_email), ''), oidc_subject = NULL, oidc_issuer = NULL
     WHERE m.id = p_member_id AND m.owner = v_owner AND m.removed_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'member % not found', p_member_id USING ERRCODE = 'P0002';
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_set_member_email(uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_set_member_email(uuid, text) TO authenticated;
