-- A call made while its tool was ungated goes back to pending approval when a worker finds
-- the tool gated since (SPEC §3). That claim sent nothing, but it had taken an attempt
-- number (the fencing token), and the retry budget was counted from it: a tool allowed one
-- attempt failed every such call "gave up after 1 attempts" once approved, unsent. The
-- budget now counts attempt - approval_returns.
ALTER TABLE agents.tool_invocations
    ADD COLUMN approval_returns integer NOT NULL DEFAULT 0
        CONSTRAINT tool_invocations_approval_returns_check CHECK (approval_returns >= 0);

COMMENT ON COLUMN agents.tool_invocations.approval_returns IS
    'Claims that ended with the call back at pending approval (its tool gated since it was'
    ' made). They sent nothing and count no attempt against the tool''s max_attempts.';
