-- The approvals page kept the token an owner pasted in its cookie: a long-lived owner or
-- member token, sent to every port of the host (cookies are not kept apart by port) and
-- left valid by signing out. The page now trades the pasted token for a session token of
-- its own, like a sign-in through an identity provider (0031): at most 8 hours, never
-- past the pasted token's own expiry, revoked by signing out and by revoking the token it
-- came from (parent_id).
ALTER TABLE agents.api_tokens
    ADD COLUMN parent_id uuid REFERENCES agents.api_tokens (id) ON DELETE CASCADE;
CREATE INDEX api_tokens_parent_idx ON agents.api_tokens (parent_id) WHERE parent_id IS NOT NULL;

-- A session may now stand for the tenant itself (its owner token pasted): member_id NULL.
ALTER TABLE agents.api_tokens DROP CONSTRAINT api_tokens_session_check;
ALTER TABLE agents.api_tokens ADD CONSTRAINT api_tokens_session_check
    CHECK (session IS NULL OR (session = ANY (ARRAY['page', 'cli']) AND agent_id IS NULL
                               AND expires_at IS NOT NULL));

-- The pasted token's hash → a page session for the same tenant and member. Runs as the
-- dispatcher (the page checked the token first); NULL row when the token is not one that
-- authenticates now, or is an agent's.
CREATE FUNCTION agents.fn_page_session(
    p_token_hash bytea, p_session_hash bytea, p_ttl_seconds integer)
RETURNS TABLE (token_id uuid, owner uuid, member_id uuid, expires_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
#variable_conflict use_column
DECLARE
    v_parent agents.api_tokens;
BEGIN
    SELECT t.* INTO v_parent
      FROM agents.api_tokens t
      LEFT JOIN agents.members m ON m.id = t.member_id
     WHERE t.token_hash = p_token_hash AND t.agent_id IS NULL
       AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())
       AND (t.member_id IS NULL OR m.removed_at IS NULL);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    INSERT INTO agents.api_tokens (owner, member_id, name, token_hash, expires_at, session,
                                   parent_id)
    VALUES (v_parent.owner, v_parent.member_id, 'signed in (page)', p_session_hash,
            least(now() + make_interval(secs => p_ttl_seconds), v_parent.expires_at), 'page',
            coalesce(v_parent.parent_id, v_parent.id))  -- a session's session: the root
    RETURNING id, owner, member_id, expires_at;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.fn_page_session(bytea, bytea, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.fn_page_session(bytea, bytea, integer) TO service_role;

-- Revoking a token ends the page sessions made from it.
CREATE OR REPLACE FUNCTION public.fn_revoke_api_token(p_token_id uuid) RETURNS boolean
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
    UPDATE agents.api_tokens SET revoked_at = now()
     WHERE parent_id = p_token_id AND revoked_at IS NULL;
    IF v_revoked IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE agents.api_tokens SET revoked_at = now() WHERE id = p_token_id;
    RETURN true;
END
$$;
