-- Credential store (#461): envelope-encrypted secrets. Owners see metadata only;
-- the ciphertext columns are readable by the dispatcher role alone.
CREATE TABLE agents.credentials (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner          uuid NOT NULL,
    name           text NOT NULL,
    kind           text NOT NULL,
    allowed_hosts  text[] NOT NULL DEFAULT '{}',
    status         text NOT NULL DEFAULT 'active',
    key_id         text NOT NULL,
    wrapped_key    bytea NOT NULL,
    nonce          bytea NOT NULL,
    ciphertext     bytea NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    rotated_at     timestamptz,
    last_used_at   timestamptz,
    expires_at     timestamptz,
    CONSTRAINT credentials_owner_name_key UNIQUE (owner, name),
    CONSTRAINT credentials_name_check CHECK (length(btrim(name)) > 0),
    CONSTRAINT credentials_kind_check
        CHECK (kind = ANY (ARRAY['api_key', 'oauth', 'service_account'])),
    CONSTRAINT credentials_status_check
        CHECK (status = ANY (ARRAY['active', 'needs_reauth', 'revoked']))
);

ALTER TABLE agents.tools_registry
    ADD CONSTRAINT tools_registry_credential_ref_fkey
    FOREIGN KEY (credential_ref) REFERENCES agents.credentials (id) ON DELETE RESTRICT;

CREATE INDEX tools_registry_credential_ref_idx ON agents.tools_registry (credential_ref);

-- The host part of an absolute URL, lower-cased, without port or brackets' contents changed.
CREATE FUNCTION agents.url_host(p_url text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT
AS $$
    SELECT lower(substring(p_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#@]*@)?(\[[^\]]*\]|[^:/?#]*)'))
$$;

-- credential_ref may only point at a credential of the same owner whose kind fits
-- auth_method, whoever writes it (function or plain UPDATE). Runs as definer so that
-- the lookup is not hidden by RLS; the message never reveals another owner's rows.
CREATE FUNCTION agents.tg_tools_registry_check_credential() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, agents
AS $$
DECLARE
    v_cred agents.credentials%ROWTYPE;
BEGIN
    IF NEW.credential_ref IS NULL THEN
        RETURN NEW;
    END IF;
    IF NEW.auth_method = 'none' THEN
        RAISE EXCEPTION 'tool %: auth_method ''none'' cannot have a credential_ref', NEW.key
            USING ERRCODE = '23514', HINT = 'set auth_method to api_key, oauth or service_account, or credential_ref to NULL';
    END IF;
    SELECT * INTO v_cred FROM agents.credentials WHERE id = NEW.credential_ref;
    IF NOT FOUND OR v_cred.owner IS DISTINCT FROM NEW.owner THEN
        RAISE EXCEPTION 'tool %: credential % not found for this owner', NEW.key, NEW.credential_ref
            USING ERRCODE = '23503';
    END IF;
    IF v_cred.kind <> NEW.auth_method THEN
        RAISE EXCEPTION 'tool %: credential % is of kind %, but auth_method is %',
            NEW.key, NEW.credential_ref, v_cred.kind, NEW.auth_method
            USING ERRCODE = '23514';
    END IF;
    -- Default host binding: the host of the first tool the credential is bound to.
    IF cardinality(v_cred.allowed_hosts) = 0 AND NEW.endpoint_url IS NOT NULL
       AND agents.url_host(NEW.endpoint_url) <> '' THEN
        UPDATE agents.credentials
           SET allowed_hosts = ARRAY[agents.url_host(NEW.endpoint_url)]
         WHERE id = v_cred.id;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER tools_registry_check_credential
    BEFORE INSERT OR UPDATE OF credential_ref, auth_method, owner, endpoint_url
    ON agents.tools_registry
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tools_registry_check_credential();
