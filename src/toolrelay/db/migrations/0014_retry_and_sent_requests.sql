-- Issue 13, items 6 and 7.
--
-- 1. Retry: a finished call that did not complete (failed, rejected, expired) is made again
--    by a human owner, as a new invocation with the same agent, tool, input and run, linked
--    to the first by retry_of. It goes through fn_invoke_tool, so every rule of a new call
--    applies (agent and tool active, assignment allowed, endpoint set, gated again if the
--    tool is gated now); the application validates the input against the current schema
--    first, and the dispatcher does again before sending. A completed call is not retried:
--    its side effect happened, and repeating it is a new decision (invoke again). Each call
--    is retried at most once, so a double click cannot send a write twice; retry the
--    latest of the chain instead.
-- 2. Each attempt records the request handed to the HTTP client: method, URL and headers
--    with the credential's value masked, and the body's size and sha256. NULL when the
--    attempt was refused before anything was sent.

-- 1. Retry ---------------------------------------------------------------------------------

ALTER TABLE agents.tool_invocations ADD COLUMN retry_of uuid
    CONSTRAINT tool_invocations_retry_of_fkey REFERENCES agents.tool_invocations (id)
        ON DELETE SET NULL;

COMMENT ON COLUMN agents.tool_invocations.retry_of IS
    'The invocation this one retries (fn_retry_tool_invocation); NULL for a call made anew.';

-- At most one retry per call; also the index deleting (pruning) an invocation needs to find
-- its retry. Partial: calls made anew, nearly all of them, add no index entry.
CREATE UNIQUE INDEX tool_invocations_retry_of_key
    ON agents.tool_invocations (retry_of) WHERE retry_of IS NOT NULL;

CREATE FUNCTION public.fn_retry_tool_invocation(p_invocation_id uuid) RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v agents.tool_invocations;
    v_retry uuid;
    v_new uuid;
BEGIN
    -- Locked: two retries of one call at the same moment make one new call, not two.
    SELECT * INTO v FROM agents.tool_invocations
     WHERE id = p_invocation_id AND owner = v_owner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invocation % not found', p_invocation_id USING ERRCODE = 'P0002';
    END IF;
    IF v.status NOT IN ('failed', 'rejected', 'expired') THEN
        RAISE EXCEPTION 'invocation % cannot be retried: it is %; only a failed, rejected or'
            ' expired call can be (a completed one happened: invoke again to repeat it)',
            p_invocation_id, v.status USING ERRCODE = 'TR003';
    END IF;
    SELECT id INTO v_retry FROM agents.tool_invocations WHERE retry_of = v.id;
    IF FOUND THEN
        RAISE EXCEPTION 'invocation % was already retried as %; retry that one instead',
            p_invocation_id, v_retry USING ERRCODE = 'TR003';
    END IF;
    IF v.tool_id IS NULL THEN
        RAISE EXCEPTION 'invocation % cannot be retried: its tool % was deleted',
            p_invocation_id, v.deleted_tool_key USING ERRCODE = 'TR001';
    END IF;
    IF v.agent_id IS NULL THEN
        RAISE EXCEPTION 'invocation % cannot be retried: its agent % was deleted',
            p_invocation_id, v.deleted_agent_name USING ERRCODE = 'TR001';
    END IF;
    -- Every check of a new call: ownership, agent and tool active, assignment, endpoint,
    -- gating as the tool is now.
    v_new := public.fn_invoke_tool(v.agent_id, v.tool_id, v.input, v.run_id);
    -- Not a status change: the runnable notification was sent by the insert.
    UPDATE agents.tool_invocations SET retry_of = v.id WHERE id = v_new;
    RETURN v_new;
END
$$;

REVOKE EXECUTE ON FUNCTION public.fn_retry_tool_invocation(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_retry_tool_invocation(uuid) TO authenticated, service_role;

-- 2. The request each attempt sent ---------------------------------------------------------

ALTER TABLE agents.tool_invocation_attempts
    ADD COLUMN request_method text,
    ADD COLUMN request_url text,
    ADD COLUMN request_headers jsonb,
    ADD COLUMN request_body_bytes bigint,
    ADD COLUMN request_body_sha256 text
        CONSTRAINT tool_invocation_attempts_request_body_sha256_check
        CHECK (request_body_sha256 ~ '^[0-9a-f]{64}$');

COMMENT ON COLUMN agents.tool_invocation_attempts.request_url IS
    'The URL sent, the credential''s query value (if placed there) as ••••; NULL: nothing sent.';
COMMENT ON COLUMN agents.tool_invocation_attempts.request_headers IS
    'The headers toolrelay set, the credential''s value as ••••; the HTTP client adds Host,'
    ' Content-Length, User-Agent, Accept and Accept-Encoding. NULL: nothing sent.';
COMMENT ON COLUMN agents.tool_invocation_attempts.request_body_sha256 IS
    'sha256 of the body bytes sent (of zero bytes when there was no body); NULL: nothing sent.';
