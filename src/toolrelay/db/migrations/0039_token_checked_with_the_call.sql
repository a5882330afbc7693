-- The token checked in the call's own transaction (issue 14, goal 1).
--
-- An agent's call (MCP tools/call, POST /v1/agent/invocations) cost two round trips before
-- anything was sent: the token's lookup (authenticate_token, as the dispatcher), then the
-- call (as the agent). serve now remembers which agent a token it has seen stands for, and
-- a call made with such a remembered token runs this check first in the call's own
-- transaction instead: the same conditions as authenticate_token, for the agent the
-- transaction acts as. A token revoked or expired, an agent disabled, a member removed: the
-- check raises TR006, the transaction (and the call in it) is rolled back, and the door
-- answers 401 as the lookup would have. Checked in the same transaction as the insert, a
-- token revoked before the call committed can no longer make it (the lookup's answer could
-- be a round trip old).
--
-- SECURITY DEFINER: the agent's identity cannot read agents.api_tokens. It answers only
-- "this hash is a live token of the agent I act as", nothing else, and only to a caller
-- that already acts as that agent.

CREATE FUNCTION agents.check_token(p_token_hash bytea) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_agent uuid := agents.caller_agent_id();
BEGIN
    PERFORM 1
      FROM agents.api_tokens t
      JOIN agents.agents a ON a.id = t.agent_id
     WHERE t.token_hash = p_token_hash AND v_agent IS NOT NULL AND t.agent_id = v_agent
       AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())
       AND a.status = 'active'
       AND (t.member_id IS NULL
            OR EXISTS (SELECT 1 FROM agents.members m
                        WHERE m.id = t.member_id AND m.removed_at IS NULL));
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the token is unknown, revoked or expired' USING ERRCODE = 'TR006';
    END IF;
    UPDATE agents.api_tokens t SET last_used_at = now()
     WHERE t.token_hash = p_token_hash
       AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute');
END
$$;
REVOKE EXECUTE ON FUNCTION agents.check_token(bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.check_token(bytea) TO authenticated;
