-- RFC-0006: Tool Registry Endpoint & Credential Schema (issue #460), exactly as the RFC writes it.
ALTER TABLE "agents"."tools_registry"
  ADD COLUMN "endpoint_url" "text",
  ADD COLUMN "http_method" "text" DEFAULT 'POST'::"text" NOT NULL,
  ADD COLUMN "request_template" "jsonb" DEFAULT '{}'::"jsonb" NOT NULL,
  ADD COLUMN "auth_placement" "text" DEFAULT 'header'::"text" NOT NULL,
  ADD COLUMN "auth_param_name" "text" DEFAULT 'Authorization'::"text" NOT NULL,
  ADD COLUMN "credential_ref" "uuid",
  ADD CONSTRAINT "tools_registry_http_method_check"
    CHECK (("http_method" = ANY (ARRAY['GET'::"text", 'POST'::"text", 'PUT'::"text", 'PATCH'::"text", 'DELETE'::"text"]))),
  ADD CONSTRAINT "tools_registry_auth_placement_check"
    CHECK (("auth_placement" = ANY (ARRAY['header'::"text", 'query'::"text"]))),
  ADD CONSTRAINT "tools_registry_endpoint_required_unless_none_check"
    CHECK (("egress_class" = 'none'::"text") OR ("endpoint_url" IS NOT NULL));
