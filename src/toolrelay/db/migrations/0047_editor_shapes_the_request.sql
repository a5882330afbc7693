-- Separation of duties (0026, 0040, 0043) asked who changed a tool last, whatever they
-- changed. So a label edit moved the tool to a new editor: Alice points a tool at her own
-- server, Bob then fixes a typo in its description, and Alice's approval alone ran its
-- calls (docs/approvals.md). Now the tool's editor is who last changed what its calls do or
-- how they are gated: an update that only touches labels (key, name, description,
-- category) or switches it on and off (status) names no new editor. Creating or deleting a
-- tool always does.

CREATE OR REPLACE FUNCTION agents.tool_last_editor(p_tool_id uuid) RETURNS uuid
LANGUAGE sql STABLE SET search_path = pg_catalog
AS $$
    SELECT coalesce(a.actor_member, a.actor) FROM agents.config_audit a
     WHERE a.kind = 'tool' AND a.object_id = p_tool_id
       AND (a.action <> 'update' OR EXISTS (
            SELECT 1 FROM jsonb_object_keys(a.changes) c
             WHERE c NOT IN ('key', 'name', 'description', 'category', 'status')))
     ORDER BY a.at DESC, a.id DESC LIMIT 1
$$;
