-- A webhook's URL can be its credential (a Slack incoming webhook's path is the secret), so
-- webhook subscriptions are an admin's to read as well as to change (migration 0025's
-- roles), and the audit log (0023) records their changes without the URL.
ALTER POLICY webhook_subscriptions_owner ON agents.webhook_subscriptions
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL
           AND (SELECT agents.caller_member_role()) = 'admin')
    WITH CHECK (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL
                AND (SELECT agents.caller_member_role()) = 'admin');

CREATE TRIGGER webhook_subscriptions_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.webhook_subscriptions
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('webhook', '', '+id', '+owner',
        '+format', '+events', '+enabled', '+created_at', '+secret_rotated_at');
