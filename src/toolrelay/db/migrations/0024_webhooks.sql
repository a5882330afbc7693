-- Notifications (issue 16, item 4): webhook subscriptions per tenant, and a durable outbox.
--
-- 1. agents.webhook_subscriptions: an owner's URL, its format (`standard`: Standard Webhooks,
--    signed; `slack`: a Slack-compatible incoming-webhook body), the events it wants and
--    whether it is enabled. The signing secret is sealed like a credential (envelope
--    encryption in the application, toolrelay.notify.secrets): owners can write the sealed
--    columns but never read them back; only the dispatcher role reads them, to sign.
-- 2. agents.webhook_deliveries: one row per (event, subscription), written by a trigger on
--    agents.tool_invocations in the same transaction as the status change that causes it,
--    whichever door made the change (fn_invoke_tool, an approval, a rejection, the expiry
--    sweep, the worker's finish, a tool or agent deleted). Only when the tenant has an
--    enabled subscription for that event: a tenant without one gets no row, and the cost
--    on its calls is one index probe per status change (the trigger's WHEN clauses keep
--    ungated invokes, claims and heartbeats from calling it at all).
-- 3. The deliverer (toolrelay.notify.deliver, inside `toolrelay worker`) claims due rows
--    with FOR UPDATE SKIP LOCKED; a claim pushes next_attempt_at forward by a lease, so a
--    deliverer that dies mid-send leaves the row due again later (at-least-once: receivers
--    deduplicate by webhook-id, which is the delivery's id). After max_attempts failures a
--    row is dead: the dead letter, listed by `toolrelay webhook deliveries --dead` and
--    sent again by fn_webhook_redeliver.
-- 4. RLS: an owner sees and manages only its own subscriptions and reads only its own
--    deliveries; an agent identity sees neither. Deliveries are written only by the
--    trigger, the dispatcher and fn_webhook_redeliver.

CREATE TABLE agents.webhook_subscriptions (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner               uuid NOT NULL DEFAULT auth.uid(),
    url                 text NOT NULL,
    format              text NOT NULL DEFAULT 'standard',
    events              text[] NOT NULL,
    enabled             boolean NOT NULL DEFAULT true,
    secret_key_id       text NOT NULL,
    secret_wrapped_key  bytea NOT NULL,
    secret_nonce        bytea NOT NULL,
    secret_ciphertext   bytea NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    secret_rotated_at   timestamptz,
    CONSTRAINT webhook_subscriptions_url_check
        CHECK (url ~ '^https?://[^/?#[:space:]]+' AND length(url) <= 2048),
    CONSTRAINT webhook_subscriptions_format_check CHECK (format = ANY (ARRAY['standard', 'slack'])),
    CONSTRAINT webhook_subscriptions_events_check CHECK (
        cardinality(events) > 0 AND events <@ ARRAY[
            'invocation.pending', 'invocation.approved', 'invocation.rejected',
            'invocation.completed', 'invocation.failed', 'invocation.expired'])
);

-- The trigger's probe: a tenant's enabled subscriptions.
CREATE INDEX webhook_subscriptions_owner_enabled_idx
    ON agents.webhook_subscriptions (owner) WHERE enabled;

CREATE TABLE agents.webhook_deliveries (
    id               uuid PRIMARY KEY DEFAULT agents.uuid_v7(),  -- the webhook-id header
    owner            uuid NOT NULL,
    subscription_id  uuid NOT NULL
        REFERENCES agents.webhook_subscriptions (id) ON DELETE CASCADE,
    invocation_id    uuid NOT NULL,  -- no foreign key: pruning a call keeps what was sent
    event            text NOT NULL,
    payload          jsonb NOT NULL,  -- the Standard Webhooks body but the link (added at send)
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 8,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_attempt_at  timestamptz,
    last_status      integer,  -- the receiver's HTTP status; NULL: no answer
    last_error       text,
    delivered_at     timestamptz,
    dead             boolean NOT NULL DEFAULT false,
    CONSTRAINT webhook_deliveries_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 100)
);

-- What the deliverer claims: rows not delivered and not dead, by when they are due.
CREATE INDEX webhook_deliveries_due_idx ON agents.webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND NOT dead;
CREATE INDEX webhook_deliveries_dead_idx ON agents.webhook_deliveries (created_at) WHERE dead;
CREATE INDEX webhook_deliveries_owner_created_idx
    ON agents.webhook_deliveries (owner, created_at DESC, id DESC);
CREATE INDEX webhook_deliveries_subscription_idx ON agents.webhook_deliveries (subscription_id);

-- The event a status change is, or NULL. Reached 'running' from 'pending' only by approval
-- (an ungated call is inserted 'running', a retry stays 'running': the WHEN clauses below
-- never call the trigger for those).
CREATE FUNCTION agents.webhook_event(p_status text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT 'invocation.' || CASE p_status WHEN 'running' THEN 'approved' ELSE p_status END
$$;

-- The event's body (Standard Webhooks: type, timestamp, data). What a receiver may see:
-- ids, names, states, times and the error code. Never the input or output (agent and
-- upstream data; the approvals page shows them to a signed-in owner), never the error
-- text (it may quote an upstream's body), never a credential or a secret of any kind.
CREATE FUNCTION agents.webhook_payload(p agents.tool_invocations, p_event text) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    SELECT jsonb_build_object(
        'type', p_event,
        'timestamp', to_char(p.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
            'invocation_id', p.id,
            'tool_id', p.tool_id,
            'tool_key', coalesce((SELECT t.key FROM agents.tools_registry t WHERE t.id = p.tool_id),
                                 p.deleted_tool_key),
            'agent_id', p.agent_id,
            'agent_name', coalesce((SELECT a.name FROM agents.agents a WHERE a.id = p.agent_id),
                                   p.deleted_agent_name),
            'run_id', p.run_id,
            'status', p.status,
            'approval_status', p.approval_status,
            'error_code', p.error_code,
            'http_status', p.http_status,
            'attempt', p.attempt,
            'created_at', p.created_at,
            'updated_at', p.updated_at,
            'approval_expires_at', p.approval_expires_at,
            'decided_at', p.decided_at,
            'finished_at', p.finished_at))
$$;

-- Enqueue one delivery per enabled subscription of the tenant that wants this event.
-- SECURITY DEFINER: whoever changed the row (the dispatcher, an owner's fn_*, a trigger),
-- the outbox is written. The first probe is the whole cost for a tenant without webhooks.
CREATE FUNCTION agents.tg_tool_invocations_webhooks() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_event text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agents.webhook_subscriptions s
                    WHERE s.owner = NEW.owner AND s.enabled) THEN
        RETURN NULL;
    END IF;
    v_event := agents.webhook_event(NEW.status);
    INSERT INTO agents.webhook_deliveries (owner, subscription_id, invocation_id, event, payload)
    SELECT NEW.owner, s.id, NEW.id, v_event, agents.webhook_payload(NEW, v_event)
      FROM agents.webhook_subscriptions s
     WHERE s.owner = NEW.owner AND s.enabled AND v_event = ANY (s.events);
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tool_invocations_webhooks(),
    agents.webhook_payload(agents.tool_invocations, text) FROM PUBLIC;

-- A gated call made (pending); any status change (approved, rejected, expired, completed,
-- failed, back to pending). Heartbeats, claims and retries change no status.
CREATE TRIGGER tool_invocations_webhooks_insert
    AFTER INSERT ON agents.tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'pending')
    EXECUTE FUNCTION agents.tg_tool_invocations_webhooks();
CREATE TRIGGER tool_invocations_webhooks_update
    AFTER UPDATE OF status ON agents.tool_invocations
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION agents.tg_tool_invocations_webhooks();

-- Send a delivery again (a dead letter, or one delivered that the receiver lost): due now,
-- with its attempts counted from zero. The same id, so a receiver can deduplicate.
CREATE FUNCTION public.fn_webhook_redeliver(p_delivery_id uuid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
BEGIN
    UPDATE agents.webhook_deliveries
       SET dead = false, delivered_at = NULL, attempts = 0, next_attempt_at = now(),
           last_error = NULL, last_status = NULL
     WHERE id = p_delivery_id AND owner = v_owner;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'webhook delivery % not found', p_delivery_id USING ERRCODE = 'P0002';
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION public.fn_webhook_redeliver(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.fn_webhook_redeliver(uuid) TO authenticated, service_role;

-- Row-level security -------------------------------------------------------------------------

ALTER TABLE agents.webhook_subscriptions ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents.webhook_deliveries ENABLE ROW LEVEL SECURITY;

CREATE POLICY webhook_subscriptions_owner ON agents.webhook_subscriptions TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL)
    WITH CHECK (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);
CREATE POLICY webhook_deliveries_owner_read ON agents.webhook_deliveries
    FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);

CREATE TRIGGER webhook_subscriptions_refuse_agent_identity
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON agents.webhook_subscriptions
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_refuse_agent_identity();

REVOKE ALL ON agents.webhook_subscriptions, agents.webhook_deliveries FROM PUBLIC;
-- Owners: the metadata, and the sealed secret write-only (as for credentials).
GRANT SELECT (id, owner, url, format, events, enabled, created_at, secret_rotated_at)
    ON agents.webhook_subscriptions TO authenticated;
GRANT INSERT (id, owner, url, format, events, enabled, secret_key_id, secret_wrapped_key,
              secret_nonce, secret_ciphertext)
    ON agents.webhook_subscriptions TO authenticated;
GRANT UPDATE (url, format, events, enabled, secret_key_id, secret_wrapped_key, secret_nonce,
              secret_ciphertext, secret_rotated_at)
    ON agents.webhook_subscriptions TO authenticated;
GRANT DELETE ON agents.webhook_subscriptions TO authenticated;
GRANT SELECT ON agents.webhook_deliveries TO authenticated;
GRANT SELECT, INSERT, UPDATE, DELETE ON agents.webhook_subscriptions, agents.webhook_deliveries
    TO service_role;
