-- An update that changes nothing of a tool writes nothing (`tool apply` of the same file,
-- an import of the same document, a PATCH with the values it has). Before, every such
-- upsert bumped updated_at and renewed the tools version of every agent holding the tool,
-- so each of their MCP sessions was told its tool list changed when nothing had.
--
-- The last BEFORE UPDATE trigger on agents.tools_registry (triggers of one kind fire in
-- name order: the identity, credential and approval checks run first, so a write they
-- refuse is refused whether or not it changes anything) skips the row when nothing but
-- updated_at differs. INSERT ... ON CONFLICT DO UPDATE then returns no row: fn_register_tool
-- returns the row as it is.

CREATE FUNCTION agents.tg_tools_registry_unchanged() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    IF (to_jsonb(NEW) - 'updated_at') = (to_jsonb(OLD) - 'updated_at') THEN
        RETURN NULL;  -- nothing changed: no new row version, no AFTER trigger for it
    END IF;
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tools_registry_unchanged() FROM PUBLIC;

CREATE TRIGGER tools_registry_unchanged
    BEFORE UPDATE ON agents.tools_registry
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tools_registry_unchanged();

CREATE OR REPLACE FUNCTION public.fn_register_tool(
    p_key                 text,
    p_name                text,
    p_description         text    DEFAULT NULL,
    p_category            text    DEFAULT 'general',
    p_schema_input        jsonb   DEFAULT '{}'::jsonb,
    p_schema_output       jsonb   DEFAULT '{}'::jsonb,
    p_auth_method         text    DEFAULT 'none',
    p_requires_approval   boolean DEFAULT false,
    p_is_dangerous        boolean DEFAULT false,
    p_endpoint_url        text    DEFAULT NULL,
    p_http_method         text    DEFAULT NULL,
    p_request_template    jsonb   DEFAULT NULL,
    p_auth_placement      text    DEFAULT NULL,
    p_auth_param_name     text    DEFAULT NULL,
    p_credential_ref      uuid    DEFAULT NULL,
    p_egress_class        text    DEFAULT NULL,
    p_auth_param_prefix   text    DEFAULT NULL,
    p_response_pointer    text    DEFAULT NULL
) RETURNS agents.tools_registry
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_human_owner();
    v_row agents.tools_registry;
BEGIN
    -- Optional RFC-0006 parameters left NULL keep what an existing row has.
    INSERT INTO agents.tools_registry AS t (
        owner, key, name, description, category, schema_input, schema_output, auth_method,
        requires_approval, is_dangerous, endpoint_url, http_method, request_template,
        auth_placement, auth_param_name, credential_ref, egress_class, auth_param_prefix,
        response_pointer)
    VALUES (
        v_owner, p_key, p_name, p_description, coalesce(p_category, 'general'),
        coalesce(p_schema_input, '{}'), coalesce(p_schema_output, '{}'),
        coalesce(p_auth_method, 'none'), coalesce(p_requires_approval, false),
        coalesce(p_is_dangerous, false), p_endpoint_url, coalesce(p_http_method, 'POST'),
        coalesce(p_request_template, '{}'), coalesce(p_auth_placement, 'header'),
        coalesce(p_auth_param_name, 'Authorization'), p_credential_ref,
        coalesce(p_egress_class, CASE WHEN p_endpoint_url IS NULL THEN 'none' ELSE 'write' END),
        coalesce(p_auth_param_prefix, ''), p_response_pointer)
    ON CONFLICT (owner, key) DO UPDATE SET
        name              = EXCLUDED.name,
        description       = EXCLUDED.description,
        category          = EXCLUDED.category,
        schema_input      = EXCLUDED.schema_input,
        schema_output     = EXCLUDED.schema_output,
        auth_method       = EXCLUDED.auth_method,
        requires_approval = EXCLUDED.requires_approval,
        is_dangerous      = EXCLUDED.is_dangerous,
        endpoint_url      = coalesce(p_endpoint_url, t.endpoint_url),
        http_method       = coalesce(p_http_method, t.http_method),
        request_template  = coalesce(p_request_template, t.request_template),
        auth_placement    = coalesce(p_auth_placement, t.auth_placement),
        auth_param_name   = coalesce(p_auth_param_name, t.auth_param_name),
        credential_ref    = CASE WHEN EXCLUDED.auth_method = 'none' THEN NULL
                                 ELSE coalesce(p_credential_ref, t.credential_ref) END,
        egress_class      = coalesce(p_egress_class, t.egress_class),
        auth_param_prefix = coalesce(p_auth_param_prefix, t.auth_param_prefix),
        response_pointer  = coalesce(p_response_pointer, t.response_pointer)
    RETURNING * INTO v_row;
    IF v_row.id IS NULL THEN  -- the update changed nothing (the trigger above)
        SELECT * INTO v_row FROM agents.tools_registry t WHERE t.owner = v_owner AND t.key = p_key;
    END IF;
    RETURN v_row;
END
$$;
