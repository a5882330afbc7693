-- An audit log of configuration (issue 16, item 7): who created, changed or deleted a tool,
-- a credential (metadata only), an assignment, an agent or a token, when, and what changed.
--
-- 1. agents.config_audit: one row per row changed, written by AFTER ROW triggers
--    (SECURITY DEFINER), so every door - the fn_* functions, a plain UPDATE as an owner
--    (the RFC's worked example), the CLI, the API, psql as anyone - is logged in the same
--    transaction as the change: a change rolled back leaves no row, and no code path can
--    skip it (short of a superuser's session_replication_role = replica or a table owner's
--    ALTER TABLE ... DISABLE TRIGGER).
-- 2. The change is a diff of the columns that are not secret: an insert lists the new
--    values, a delete the old ones (both but id and owner, which are columns of the log),
--    an update only the columns that changed, old and new.
--    Secrets never enter it: credentials and tokens are logged by an allow-list of their
--    metadata columns, and whatever a trigger says, no column named like a secret or a
--    digest (ciphertext, wrapped_key, nonce, key_id, token_hash, ..._sha256, ...) is ever
--    copied. Bookkeeping columns (last_used_at, updated_at) are left out, so the
--    dispatcher's and the token check's touches write nothing; an update that changes no
--    logged column (the OAuth refresh: only ciphertext and the token's expiry) writes
--    nothing either.
-- 3. Append-only for everyone: owners read their own tenant's rows (an agent identity reads
--    none), service_role reads all; nobody is granted INSERT, UPDATE, DELETE or TRUNCATE,
--    and statement triggers refuse UPDATE, DELETE and TRUNCATE, and an INSERT not made by
--    the audit trigger, even for the table's owner.
--    A superuser can always do anything (docs/audit.md).
--
-- A later table is one trigger line (see the end of this file for the five of today):
--   CREATE TRIGGER <table>_audit AFTER INSERT OR UPDATE OR DELETE ON agents.<table>
--       FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('<kind>', '<label column>', ...);
-- The table needs an `id` and an `owner` (the tenant) column.

CREATE TABLE agents.config_audit (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner         uuid,                 -- the tenant whose object changed
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor         uuid,                 -- auth.uid() of who did it; NULL: no sub claim
    actor_role    text NOT NULL,        -- the effective role: authenticated, service_role, ...
    session_role  text NOT NULL,        -- the login role (Supabase: authenticator)
    xact_id       bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    kind          text NOT NULL,        -- tool, credential, assignment, agent, token, ...
    object_id     uuid,
    object_label  text,                 -- the tool's key, the agent's name, ... at the time
    action        text NOT NULL,
    changes       jsonb NOT NULL,
    CONSTRAINT config_audit_action_check CHECK (action = ANY (ARRAY['insert', 'update', 'delete'])),
    CONSTRAINT config_audit_changes_check CHECK (jsonb_typeof(changes) = 'object')
);

COMMENT ON TABLE agents.config_audit IS
    'Who created, changed or deleted configuration, when, and what changed (non-secret'
    ' columns only). Append-only: written by triggers, never updated or deleted.';
COMMENT ON COLUMN agents.config_audit.changes IS
    '{"<column>": {"old": <value>, "new": <value>}}: an insert has only "new", a delete only'
    ' "old", an update only the columns that changed.';

CREATE INDEX config_audit_owner_at_idx ON agents.config_audit (owner, at DESC, id DESC);
CREATE INDEX config_audit_object_idx ON agents.config_audit (object_id, at DESC, id DESC);

-- Whether a column holds a secret, or anything derived from one, by its name: never logged,
-- whatever a trigger's arguments say (credentials' key_id, wrapped_key, nonce, ciphertext;
-- tokens' token_hash; a later table's secret_ciphertext, password, ..._sha256 alike).
CREATE FUNCTION agents.audit_secret_column(p_column text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog
AS $$
    SELECT p_column ~* '(ciphertext|wrapped_key|nonce|key_id$|hash|digest|sha256|password'
                       '|private_key|^secret$|_secret$|access_token|refresh_token)'
$$;

-- The logged columns of a row: with any '+column' argument only those and the '~column'
-- ones (an allow-list), else every column but the '-column' ones; never a secret's.
CREATE FUNCTION agents.audit_logged(p_row jsonb, p_args text[]) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog
AS $$
    SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
      FROM jsonb_each(p_row) e
     WHERE NOT agents.audit_secret_column(e.key)
       AND CASE WHEN EXISTS (SELECT 1 FROM unnest(p_args) a WHERE a LIKE '+%')
                THEN '+' || e.key = ANY (p_args) OR '~' || e.key = ANY (p_args)
                ELSE NOT ('-' || e.key = ANY (p_args)) END
$$;

-- AFTER INSERT OR UPDATE OR DELETE, FOR EACH ROW. Arguments: the kind ('tool'), the column
-- that names the object for people ('key'; '' for none), then column rules: '-col' never
-- logged; '+col' logged (with any '+', only those and the '~' ones are); '~col' logged, but
-- an update that changes nothing else is not worth a row (a bookkeeping column).
CREATE FUNCTION agents.tg_config_audit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_args text[] := CASE WHEN TG_NARGS > 2 THEN TG_ARGV[2:TG_NARGS - 1] ELSE '{}' END;
    v_label text := nullif(TG_ARGV[1], '');
    v_old_row jsonb := CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END;
    v_new_row jsonb := CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END;
    v_old jsonb := agents.audit_logged(v_old_row, v_args);
    v_new jsonb := agents.audit_logged(v_new_row, v_args);
    v_changes jsonb;
    v_row jsonb := coalesce(v_new_row, v_old_row);
    v_owners uuid[];
BEGIN
    IF TG_OP = 'UPDATE' THEN
        SELECT coalesce(jsonb_object_agg(k.key, jsonb_build_object(
                   'old', v_old -> k.key, 'new', v_new -> k.key)), '{}'::jsonb)
          INTO v_changes
          FROM (SELECT jsonb_object_keys(v_old) UNION SELECT jsonb_object_keys(v_new)) k (key)
         WHERE (v_old -> k.key) IS DISTINCT FROM (v_new -> k.key);
        IF NOT EXISTS (SELECT 1 FROM jsonb_object_keys(v_changes) c
                        WHERE NOT ('~' || c = ANY (v_args))) THEN
            RETURN NULL;  -- nothing logged changed (or only bookkeeping)
        END IF;
    ELSE
        SELECT coalesce(jsonb_object_agg(e.key, jsonb_build_object(
                   CASE TG_OP WHEN 'INSERT' THEN 'new' ELSE 'old' END, e.value)), '{}'::jsonb)
          INTO v_changes
          FROM jsonb_each(CASE TG_OP WHEN 'INSERT' THEN v_new ELSE v_old END
                          - ARRAY['id', 'owner']) e;  -- columns of the log itself
    END IF;
    -- An object moved between tenants is in both tenants' logs.
    v_owners := ARRAY(SELECT DISTINCT o FROM unnest(ARRAY[(v_old_row ->> 'owner')::uuid,
                                                          (v_new_row ->> 'owner')::uuid]) o
                       WHERE o IS NOT NULL);
    IF cardinality(v_owners) = 0 THEN
        v_owners := ARRAY[NULL::uuid];
    END IF;
    INSERT INTO agents.config_audit (owner, actor, actor_role, session_role, kind, object_id,
                                     object_label, action, changes)
    -- The effective role (0012's rule, spelled out so that this stays the database role):
    -- inside SECURITY DEFINER current_user is the definer, but the caller's SET ROLE stays
    -- in the setting 'role'; 'none' means there was none, and the session user acts.
    SELECT o, auth.uid(), CASE current_setting('role') WHEN 'none' THEN session_user::text
                               ELSE current_setting('role') END,
           session_user, TG_ARGV[0], (v_row ->> 'id')::uuid, v_row ->> v_label, lower(TG_OP),
           v_changes
      FROM unnest(v_owners) o;
    RETURN NULL;
END
$$;

-- Append-only, even for the table's owner: UPDATE, DELETE and TRUNCATE are refused by
-- statement, whatever the rows (no grant allows them to anyone else in the first place).
CREATE FUNCTION agents.tg_config_audit_append_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    RAISE EXCEPTION 'agents.config_audit is append-only: % is refused for everyone', TG_OP
        USING ERRCODE = '42501',
              HINT = 'the audit log is written by triggers on the configuration tables only';
END
$$;

CREATE TRIGGER config_audit_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON agents.config_audit
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_config_audit_append_only();

-- Nor is a row written but by the triggers above: a direct INSERT, even the table owner's,
-- is refused (the audit trigger's own insert runs a trigger level down).
CREATE FUNCTION agents.tg_config_audit_from_triggers() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'agents.config_audit is written by the configuration tables'' triggers'
            ' only: INSERT is refused' USING ERRCODE = '42501';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER config_audit_from_triggers
    BEFORE INSERT ON agents.config_audit
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_config_audit_from_triggers();

REVOKE EXECUTE ON FUNCTION agents.tg_config_audit(), agents.tg_config_audit_append_only(),
    agents.tg_config_audit_from_triggers(),
    agents.audit_logged(jsonb, text[]), agents.audit_secret_column(text) FROM PUBLIC;

-- Owners read their own tenant's rows, an agent identity none; service_role (BYPASSRLS)
-- reads all. Nobody is granted a write: only the triggers (as the table's owner) insert.
ALTER TABLE agents.config_audit ENABLE ROW LEVEL SECURITY;
CREATE POLICY config_audit_owner_read ON agents.config_audit FOR SELECT TO authenticated
    USING (owner = (SELECT auth.uid()) AND (SELECT agents.caller_agent_id()) IS NULL);

REVOKE ALL ON agents.config_audit FROM PUBLIC;
DO $$
DECLARE
    v_role text;
BEGIN
    -- Default privileges (Supabase's) may have granted more to the API roles.
    FOREACH v_role IN ARRAY ARRAY['anon', 'authenticated', 'service_role'] LOOP
        IF to_regrole(v_role) IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON agents.config_audit FROM %I', v_role);
        END IF;
    END LOOP;
END
$$;
GRANT SELECT ON agents.config_audit TO authenticated, service_role;

-- The five configuration tables of today. Credentials and tokens by allow-list: their
-- metadata only. An OAuth credential's expires_at follows its access token (the dispatcher
-- refreshes it): logged with other changes, never alone.
CREATE TRIGGER tools_registry_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.tools_registry
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('tool', 'key', '-updated_at');
CREATE TRIGGER agents_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.agents
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('agent', 'name');
CREATE TRIGGER tool_assignments_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.tool_assignments
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('assignment', '');
CREATE TRIGGER credentials_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.credentials
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('credential', 'name', '+id', '+owner',
        '+name', '+kind', '+allowed_hosts', '+status', '+created_at', '+rotated_at', '~expires_at');
CREATE TRIGGER api_tokens_audit
    AFTER INSERT OR UPDATE OR DELETE ON agents.api_tokens
    FOR EACH ROW EXECUTE FUNCTION agents.tg_config_audit('token', 'name', '+id', '+owner',
        '+agent_id', '+name', '+created_at', '+expires_at', '+revoked_at');
