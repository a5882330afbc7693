-- Waiters (MCP tools/call, the API's ?wait) wake on NOTIFY toolrelay_done, whose payload is
-- the invocation ids (comma-separated) that changed in a way a waiter cares about. The
-- worker's `finish` query sends one per batch for the outcomes it records; this trigger
-- covers the rest: a human's decision or an expiry moving a call out of 'pending'
-- (approved calls go on to 'running', rejected and expired ones are final), and a call made
-- at 'pending' (gated: its answer is "awaiting approval"), so that a waiter who made the
-- call need not read it first (toolrelay.dispatch.outcomes). AFTER ROW with WHEN clauses:
-- ungated calls and the worker's updates (claim, heartbeat, finish) never even call it.
CREATE FUNCTION agents.tg_tool_invocations_decided() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('toolrelay_done', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER tool_invocations_decided
    AFTER UPDATE OF status ON agents.tool_invocations
    FOR EACH ROW
    WHEN (OLD.status = 'pending' AND NEW.status IS DISTINCT FROM 'pending')
    EXECUTE FUNCTION agents.tg_tool_invocations_decided();

CREATE TRIGGER tool_invocations_gated
    AFTER INSERT ON agents.tool_invocations
    FOR EACH ROW
    WHEN (NEW.status = 'pending')
    EXECUTE FUNCTION agents.tg_tool_invocations_decided();
