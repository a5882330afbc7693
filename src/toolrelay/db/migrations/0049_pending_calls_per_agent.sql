-- An agent keeps at most 1,000 calls waiting for approval (docs/security.md). An agent runs
-- model output; each call to a gated tool is stored with its input (up to 1 MiB) until a
-- person decides or it expires (24 h by default), so one looping on such a tool could store
-- 20 a second, 1.7 million a day, filling the database and burying every other call on the
-- approvals page. Past the cap its next call that would wait is refused (TR007, the API's
-- 429 too_many_pending) until people decide some. Calls that need no approval are not
-- counted. Checked on insert, whoever inserts (an admin invoking on the agent's behalf
-- too); two calls inserted at the same moment may both pass at 999: a bound, not a count.

CREATE INDEX tool_invocations_agent_pending_idx ON agents.tool_invocations (agent_id)
    WHERE status = 'pending';

CREATE FUNCTION agents.tg_pending_per_agent() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_max CONSTANT integer := 1000;
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM agents.tool_invocations i
                               WHERE i.agent_id = NEW.agent_id AND i.status = 'pending'
                               LIMIT v_max) waiting) >= v_max THEN
        RAISE EXCEPTION 'this agent has % calls waiting for approval, the most it may have;'
            ' its next call that needs approval can be made once people have approved or'
            ' rejected some (or they expire)', v_max USING ERRCODE = 'TR007';
    END IF;
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_pending_per_agent() FROM PUBLIC;
CREATE TRIGGER tool_invocations_pending_per_agent BEFORE INSERT ON agents.tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION agents.tg_pending_per_agent();
