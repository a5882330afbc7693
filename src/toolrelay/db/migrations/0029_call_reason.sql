-- An agent's stated reason for a call (issue 16, item 5; docs/approvals.md), shown to the
-- people who decide it. Set for the transaction that makes the call, so no function's
-- signature changes and every door can pass it (toolrelay's: `Registry.invoke(reason=)`,
-- the API's `reason`, MCP's `_meta`; psql: SET LOCAL toolrelay.call_reason = '...'):
-- the column's default reads the setting when the row is inserted.
ALTER TABLE agents.tool_invocations
    ADD COLUMN reason text DEFAULT nullif(current_setting('toolrelay.call_reason', true), ''),
    ADD CONSTRAINT tool_invocations_reason_check
        CHECK (reason IS NULL OR (length(reason) <= 1000
                                  AND reason !~ '[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]'));
