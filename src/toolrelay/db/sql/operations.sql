-- Named queries for operators: what the worker checks at start and /metrics reports.
-- Run as the dispatcher (service_role): every owner's rows.

-- name: active_endpoints
-- Active tools that send somewhere: what the egress allow-list is checked against at start.
SELECT owner, key, endpoint_url, credential_ref
  FROM agents.tools_registry
 WHERE status = 'active' AND endpoint_url IS NOT NULL
 ORDER BY owner, key;

-- name: pending_approvals
-- Calls waiting for a human decision whose window has not closed (all owners).
SELECT count(*) AS pending
  FROM agents.tool_invocations
 WHERE status = 'pending' AND (approval_expires_at IS NULL OR approval_expires_at > now());
