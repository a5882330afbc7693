-- MCP authorization (issue 17, item 4): an agent acts for an identity at an OAuth
-- authorization server. An admin binds the agent to (issuer, subject): the issuer as
-- TOOLRELAY_MCP_AUTHORIZATION_SERVERS names it and the access token's `iss` says it, the
-- subject as the token's `sub`. An access token from that server, validated by toolrelay
-- (signature, issuer, audience = toolrelay's /mcp, expiry), then acts as that agent.
--
-- The rule: an (issuer, subject) pair maps to exactly one agent, in all tenants (a unique
-- index, not one per tenant): a token never has to choose between two agents, or between
-- two tenants. Binding a pair another agent holds is refused (unbind it there first); the
-- refusal says that it is bound, not to which agent or tenant. Unbinding is setting NULL.
--
-- Configuration, so admin-only like the rest of agents.agents: the setter below needs an
-- admin, and the statement trigger of 0012/0025 refuses a plain UPDATE by anyone else (an
-- agent identity included); the audit trigger of 0023 logs the change as kind 'agent'.
-- Finding the agent for a validated token runs before anyone is signed in: the dispatcher
-- role's (service_role) alone, as agents.authenticate_token is.

ALTER TABLE agents.agents
    ADD COLUMN oauth_issuer text,
    ADD COLUMN oauth_subject text,
    ADD CONSTRAINT agents_oauth_pair_check
        CHECK ((oauth_issuer IS NULL) = (oauth_subject IS NULL)),
    ADD CONSTRAINT agents_oauth_issuer_check
        CHECK (oauth_issuer IS NULL OR (length(oauth_issuer) <= 2000
               AND oauth_issuer ~ '^https?://[^/?#[:space:][:cntrl:]]+(/[^?#[:space:][:cntrl:]]*)?$')),
    ADD CONSTRAINT agents_oauth_subject_check
        CHECK (oauth_subject IS NULL OR (length(oauth_subject) BETWEEN 1 AND 1000
               AND oauth_subject !~ '[[:cntrl:]]'));

CREATE UNIQUE INDEX agents_oauth_subject_key ON agents.agents (oauth_issuer, oauth_subject)
    WHERE oauth_subject IS NOT NULL;

-- Binds an agent of the caller's tenant to (p_issuer, p_subject), or unbinds it (both NULL).
-- True when this changed the binding, false when it already was so.
CREATE FUNCTION public.fn_set_agent_oauth(p_agent_id uuid, p_issuer text, p_subject text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v agents.agents := agents.owned_agent(v_owner, p_agent_id);
BEGIN
    IF (p_issuer IS NULL) <> (p_subject IS NULL) THEN
        RAISE EXCEPTION 'an OAuth binding needs both the issuer and the subject (or neither, to unbind)'
            USING ERRCODE = '22023';
    END IF;
    IF p_issuer IS NOT DISTINCT FROM v.oauth_issuer AND p_subject IS NOT DISTINCT FROM v.oauth_subject THEN
        RETURN false;
    END IF;
    UPDATE agents.agents SET oauth_issuer = p_issuer, oauth_subject = p_subject
     WHERE id = v.id;
    RETURN true;
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_set_agent_oauth(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_set_agent_oauth(uuid, text, text)
    TO authenticated, service_role;

-- The agent bound to this identity, whatever its status (the caller refuses a disabled one,
-- saying so); no row when none is.
CREATE FUNCTION agents.oauth_agent(p_issuer text, p_subject text)
RETURNS TABLE (owner uuid, agent_id uuid, active boolean)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    SELECT a.owner, a.id, a.status = 'active'
      FROM agents.agents a
     WHERE a.oauth_issuer = p_issuer AND a.oauth_subject = p_subject
$$;
REVOKE EXECUTE ON FUNCTION agents.oauth_agent(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.oauth_agent(text, text) TO service_role;
