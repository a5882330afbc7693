-- Separation of duties for approval rules (docs/approvals.md). An approval rule is an
-- approval given in advance, so the member who last changed a tool approving its calls by
-- adding (or confirming, 0042) a rule was the tool's editor approving alone, which 0026
-- refuses for a person's approval. Now, where another admin could do it instead, the
-- tool's last editor does not add or confirm its approval rules; nor does the tenant's own
-- token (shared: it names no person, 0040), and a tool last changed with that token has
-- no known editor, so its rules take an admin who can be told apart from whoever edited it:
-- a pipeline that edits tools uses a member's token so its edits name it. Rejection rules
-- are anyone's (an admin's): they only ever refuse more.

CREATE FUNCTION agents.require_not_the_editor(p_tool uuid) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_me uuid := coalesce(agents.caller_member_id(), auth.uid());
    v_editor uuid := agents.tool_last_editor(p_tool);
BEGIN
    IF v_owner IS NULL OR NOT EXISTS (
        SELECT 1 FROM agents.members m
         WHERE m.owner = v_owner AND m.removed_at IS NULL AND m.role = 'admin'
           AND m.id <> v_me AND m.id <> v_owner) THEN
        RETURN;  -- no other admin who could do it (or no identity: a migration, psql)
    END IF;
    IF v_me = v_owner THEN
        RAISE EXCEPTION 'the tenant''s own token cannot add or confirm an approval rule in a'
            ' team: it is shared, so it names no person; do it as a member (toolrelay login,'
            ' or a member''s token)' USING ERRCODE = '42501';
    END IF;
    IF v_editor = v_me THEN
        RAISE EXCEPTION 'you changed this tool last, so another admin adds or confirms its'
            ' approval rules (a rule approves its calls: editing a tool and approving them'
            ' takes two people)' USING ERRCODE = '42501';
    END IF;
    IF v_editor = v_owner THEN
        RAISE EXCEPTION 'you may have changed this tool last (it was changed with the'
            ' tenant''s own token, which names no person): its approval rules are added or'
            ' confirmed once a member has changed it as themselves, by another admin'
            USING ERRCODE = '42501';
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.require_not_the_editor(uuid) FROM PUBLIC;

CREATE FUNCTION agents.tg_tool_policies_not_the_editor() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    IF NEW.action = 'approve' THEN
        PERFORM agents.require_not_the_editor(NEW.tool_id);
    END IF;
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION agents.tg_tool_policies_not_the_editor() FROM PUBLIC;
CREATE TRIGGER tool_policies_not_the_editor BEFORE INSERT ON agents.tool_policies
    FOR EACH ROW EXECUTE FUNCTION agents.tg_tool_policies_not_the_editor();

CREATE OR REPLACE FUNCTION public.fn_confirm_policy(p_policy_id uuid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := agents.require_role('admin');
    v_rule agents.tool_policies;
BEGIN
    SELECT * INTO v_rule FROM agents.tool_policies p WHERE p.id = p_policy_id AND p.owner = v_owner;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'policy % not found', p_policy_id USING ERRCODE = 'P0002';
    END IF;
    IF v_rule.action = 'approve' THEN
        PERFORM agents.require_not_the_editor(v_rule.tool_id);
    END IF;
    UPDATE agents.tool_policies p SET tool_fingerprint = agents.tool_fingerprint(t)
      FROM agents.tools_registry t
     WHERE p.id = p_policy_id AND t.id = p.tool_id;
END
$$;
