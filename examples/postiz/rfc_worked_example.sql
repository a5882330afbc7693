-- RFC-0006's worked example, verbatim but for the two placeholders, which a caller
-- supplies as psql variables: :postiz_host (host:port) and :postiz_api_key_secret_id
-- (the uuid printed by `toolrelay credential add`). Run as an owner:
--   SET ROLE authenticated;
--   SELECT set_config('request.jwt.claim.sub', '<owner uuid>', false);
SELECT fn_register_tool(
  p_key             => 'postiz.create_post',
  p_name            => 'Postiz: Create Post',
  p_description     => 'Create/schedule a post on a connected social channel via Postiz.',
  p_category        => 'social',
  p_schema_input    => '{"type":"object","required":["integrationId","content"],"properties":{"integrationId":{"type":"string"},"content":{"type":"string"}}}'::jsonb,
  p_schema_output   => '{"type":"object","properties":{"postId":{"type":"string"}}}'::jsonb,
  p_auth_method     => 'api_key',
  p_requires_approval => true,
  p_is_dangerous    => false
);
-- then, once the columns in this RFC exist:
UPDATE agents.tools_registry
   SET endpoint_url      = 'http://' || :'postiz_host' || '/api/public/v1/posts',
       http_method        = 'POST',
       auth_placement     = 'header',
       auth_param_name    = 'Authorization',
       egress_class       = 'write',
       credential_ref     = :'postiz_api_key_secret_id'  -- from issue #461
 WHERE key = 'postiz.create_post';
