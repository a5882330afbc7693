-- What SPEC adds to the registry for dispatch, and the bookkeeping the dispatcher needs.
ALTER TABLE agents.tools_registry
    ADD COLUMN auth_param_prefix text NOT NULL DEFAULT '',
    ADD COLUMN response_pointer text,
    ADD COLUMN connect_timeout_seconds real NOT NULL DEFAULT 5,
    ADD COLUMN timeout_seconds real NOT NULL DEFAULT 30,
    ADD COLUMN max_response_bytes integer NOT NULL DEFAULT 5242880,
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 3,
    ADD COLUMN max_concurrency integer,
    ADD COLUMN idempotency_header text,
    ADD COLUMN approval_ttl_seconds integer NOT NULL DEFAULT 86400,
    ADD CONSTRAINT tools_registry_response_pointer_check
        CHECK (response_pointer IS NULL OR response_pointer = '' OR response_pointer LIKE '/%'),
    ADD CONSTRAINT tools_registry_timeouts_check
        CHECK (connect_timeout_seconds > 0 AND timeout_seconds > 0 AND timeout_seconds <= 3600),
    ADD CONSTRAINT tools_registry_max_response_bytes_check
        CHECK (max_response_bytes BETWEEN 1 AND 1073741824),
    ADD CONSTRAINT tools_registry_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 20),
    ADD CONSTRAINT tools_registry_max_concurrency_check
        CHECK (max_concurrency IS NULL OR max_concurrency > 0),
    ADD CONSTRAINT tools_registry_approval_ttl_check CHECK (approval_ttl_seconds > 0),
    ADD CONSTRAINT tools_registry_auth_param_prefix_check
        CHECK (auth_param_prefix !~ '[\r\n]'),
    ADD CONSTRAINT tools_registry_endpoint_url_scheme_check
        CHECK (endpoint_url IS NULL OR endpoint_url ~* '^https?://[^/?#]+'),
    ADD CONSTRAINT tools_registry_request_template_shape_check
        CHECK (jsonb_typeof(request_template) = 'object'
               AND request_template - ARRAY['headers', 'query', 'body'] = '{}'::jsonb);

ALTER TABLE agents.tool_invocations
    ADD COLUMN approval_expires_at timestamptz,
    ADD COLUMN config_fingerprint text,
    ADD COLUMN decided_by uuid,
    ADD COLUMN decided_at timestamptz,
    ADD COLUMN reject_reason text,
    ADD COLUMN attempt integer NOT NULL DEFAULT 0,
    ADD COLUMN lease_owner text,
    ADD COLUMN lease_expires_at timestamptz,
    ADD COLUMN run_after timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN sent_at timestamptz,
    ADD COLUMN http_status integer,
    ADD COLUMN output_mismatch text,
    ADD COLUMN finished_at timestamptz;

-- The claim query's only index: runnable rows. Finished history never enters it.
CREATE INDEX tool_invocations_runnable_idx
    ON agents.tool_invocations (run_after) WHERE status = 'running';
CREATE INDEX tool_invocations_pending_expiry_idx
    ON agents.tool_invocations (approval_expires_at) WHERE status = 'pending';

-- One row per attempt to send, so the history of an invocation is visible.
CREATE TABLE agents.tool_invocation_attempts (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    invocation_id  uuid NOT NULL REFERENCES agents.tool_invocations (id) ON DELETE CASCADE,
    owner          uuid NOT NULL,
    attempt        integer NOT NULL,
    worker         text NOT NULL,
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz,
    status_code    integer,
    duration_ms    double precision,
    error_code     text,
    error          text
);
CREATE INDEX tool_invocation_attempts_invocation_idx
    ON agents.tool_invocation_attempts (invocation_id, attempt);

-- Wake workers when something becomes runnable; identical payloads fold per transaction.
CREATE FUNCTION agents.tg_tool_invocations_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'running') THEN
        PERFORM pg_notify('toolrelay_runnable', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tool_invocations_notify
    AFTER INSERT OR UPDATE OF status ON agents.tool_invocations
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tool_invocations_notify();
