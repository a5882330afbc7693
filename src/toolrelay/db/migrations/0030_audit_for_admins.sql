-- The audit log of configuration is an admin's to read (issue 16, item 7: "readable by
-- admins"): approvers and viewers see no row of it, as agents see none (migration 0025's
-- roles; the tenant itself is its first admin).
ALTER POLICY config_audit_owner_read ON agents.config_audit
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL
           AND (SELECT agents.caller_member_role()) = 'admin');
