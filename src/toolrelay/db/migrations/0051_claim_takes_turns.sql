-- Workers take turns between owners (docs/architecture.md, "Owners take turns"). The claim
-- read the oldest runnable calls, whoever's, through (run_after) WHERE status = 'running':
-- one owner's flood of slow calls took every slot of every worker, and another owner's
-- call waited for the whole flood. It now visits each owner with calls in that state (one
-- index probe an owner, in owner order) and takes each one's oldest: the same partial
-- index, keyed by owner first. A finished call still leaves it, so its size is the queue's.
CREATE INDEX tool_invocations_runnable_owner_idx ON agents.tool_invocations (owner, run_after)
    WHERE status = 'running';
DROP INDEX agents.tool_invocations_runnable_idx;
