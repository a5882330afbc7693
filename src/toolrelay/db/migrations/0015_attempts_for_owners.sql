-- Attempt rows carry what only owners may see: the egress guard's detail (addresses, the
-- allow-list entry that did not apply) and the request sent (the endpoint's host, headers).
-- An agent identity reads its own calls, never their attempts; the agent API shows it a
-- reduced view (number, times, status code, error code) read on the owner's behalf.
ALTER POLICY tool_invocation_attempts_owner_read ON agents.tool_invocation_attempts
    USING (owner = auth.uid() AND (SELECT agents.caller_agent_id()) IS NULL);
