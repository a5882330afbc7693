-- The platform's base schema: agents, the tool registry, assignments and invocations.
CREATE SCHEMA IF NOT EXISTS agents;

CREATE TABLE agents.agents (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner       uuid NOT NULL,
    name        text NOT NULL,
    status      text NOT NULL DEFAULT 'active',
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT agents_name_check CHECK (length(btrim(name)) > 0),
    CONSTRAINT agents_status_check CHECK (status = ANY (ARRAY['active', 'disabled'])),
    CONSTRAINT agents_owner_name_key UNIQUE (owner, name)
);

CREATE TABLE agents.tools_registry (
    id                 uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner              uuid NOT NULL,
    key                text NOT NULL,
    name               text NOT NULL,
    description        text,
    category           text NOT NULL DEFAULT 'general',
    schema_input       jsonb NOT NULL DEFAULT '{}'::jsonb,
    schema_output      jsonb NOT NULL DEFAULT '{}'::jsonb,
    auth_method        text NOT NULL DEFAULT 'none',
    requires_approval  boolean NOT NULL DEFAULT false,
    is_dangerous       boolean NOT NULL DEFAULT false,
    status             text NOT NULL DEFAULT 'active',
    egress_class       text NOT NULL DEFAULT 'none',
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tools_registry_owner_key_key UNIQUE (owner, key),
    CONSTRAINT tools_registry_key_check CHECK (key ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    CONSTRAINT tools_registry_name_check CHECK (length(btrim(name)) > 0),
    CONSTRAINT tools_registry_auth_method_check
        CHECK (auth_method = ANY (ARRAY['none', 'api_key', 'oauth', 'service_account'])),
    CONSTRAINT tools_registry_status_check
        CHECK (status = ANY (ARRAY['active', 'disabled', 'deprecated'])),
    CONSTRAINT tools_registry_egress_class_check
        CHECK (egress_class = ANY (ARRAY['none', 'read_only', 'write'])),
    CONSTRAINT tools_registry_schema_input_check CHECK (jsonb_typeof(schema_input) = 'object'),
    CONSTRAINT tools_registry_schema_output_check CHECK (jsonb_typeof(schema_output) = 'object')
);

-- A write tool always needs approval, whatever the caller asked for.
CREATE FUNCTION agents.tg_tools_registry_force_approval() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.egress_class = 'write' THEN
        NEW.requires_approval := true;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER tools_registry_force_approval
    BEFORE INSERT OR UPDATE ON agents.tools_registry
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tools_registry_force_approval();

CREATE TABLE agents.tool_assignments (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner       uuid NOT NULL,
    agent_id    uuid NOT NULL REFERENCES agents.agents (id) ON DELETE CASCADE,
    tool_id     uuid NOT NULL REFERENCES agents.tools_registry (id) ON DELETE CASCADE,
    allowed     boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tool_assignments_agent_tool_key UNIQUE (agent_id, tool_id)
);

CREATE TABLE agents.tool_invocations (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner            uuid NOT NULL,
    tool_id          uuid NOT NULL REFERENCES agents.tools_registry (id) ON DELETE CASCADE,
    agent_id         uuid NOT NULL REFERENCES agents.agents (id) ON DELETE CASCADE,
    run_id           uuid,
    input            jsonb NOT NULL DEFAULT '{}'::jsonb,
    output           jsonb,
    status           text NOT NULL,
    approval_status  text NOT NULL,
    error            text,
    error_code       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tool_invocations_status_check CHECK (status = ANY (
        ARRAY['pending', 'running', 'completed', 'failed', 'rejected', 'expired'])),
    CONSTRAINT tool_invocations_approval_status_check CHECK (approval_status = ANY (
        ARRAY['pending', 'approved', 'rejected', 'expired', 'not_required']))
);

CREATE INDEX tool_invocations_owner_created_idx
    ON agents.tool_invocations (owner, created_at DESC, id DESC);
CREATE INDEX tool_invocations_tool_idx ON agents.tool_invocations (tool_id);
CREATE INDEX tool_invocations_agent_idx ON agents.tool_invocations (agent_id);
CREATE INDEX tool_assignments_tool_idx ON agents.tool_assignments (tool_id);
