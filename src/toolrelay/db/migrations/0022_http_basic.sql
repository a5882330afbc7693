-- HTTP basic authentication (issue 15): a credential kind holding a username and a
-- password, and an auth_method that places them as `Authorization: Basic base64(u:p)`
-- (RFC 7617). A header scheme: a tool using it places its credential in a header.
ALTER TABLE agents.tools_registry DROP CONSTRAINT tools_registry_auth_method_check;
ALTER TABLE agents.tools_registry ADD CONSTRAINT tools_registry_auth_method_check
    CHECK (auth_method = ANY (ARRAY['none', 'api_key', 'oauth', 'service_account', 'basic']));
ALTER TABLE agents.tools_registry ADD CONSTRAINT tools_registry_basic_in_a_header_check
    CHECK (auth_method <> 'basic' OR auth_placement = 'header');

ALTER TABLE agents.credentials DROP CONSTRAINT credentials_kind_check;
ALTER TABLE agents.credentials ADD CONSTRAINT credentials_kind_check
    CHECK (kind = ANY (ARRAY['api_key', 'oauth', 'service_account', 'basic']));
