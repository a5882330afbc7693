-- The list stamp in one row read (issue 14, goal 1).
--
-- agents.agent_tools_stamp (0019, 0021) hashed every tool the agent may call on each MCP
-- tools/call and tools/list: 0.4 ms at 12 tools, 8-10 ms at 1,200. Now each agent has a
-- version, drawn from one sequence (never reused, by another agent either) and renewed in
-- the same transaction as every change that can alter what the agent may call or how:
--   * an assignment inserted, updated (allowed) or deleted, a tool's deletion (cascade)
--     and an agent's deletion included;
--   * any UPDATE of a tool (status, gating inputs, schemas, endpoint, anything): the
--     agents allowed it, in one UPDATE per statement. One that changes nothing
--     relevant renews them too (harmless: a needless tools/list);
--   * an agent's status or owner;
-- and nothing else: invocations, claims and results touch none of these tables.
-- The stamp is that version. It is kept in a table of its own, not a column of
-- agents.agents: a version is no configuration (no audit rows, no column in agent rows
-- and exports) and renewing it fires none of agents.agents' triggers.
--
-- Triggers are SECURITY DEFINER: whoever may change a tool or an assignment (any door:
-- the API, fn_* functions, an owner's plain SQL UPDATE) renews its agents' versions,
-- whatever row-level security lets them see. Nobody else reads or writes the table.
--
-- Locks: versions are locked in agent_id order (one statement: no deadlock between two
-- tool updates sharing agents). An assignment written also takes FOR SHARE on its tool
-- (a tool update in flight, which could not see the new assignment, commits first: the
-- assignment's renewal then follows it). Nothing on the invoke or claim path locks rows
-- of these tables beyond the foreign keys' KEY SHARE, which these locks do not conflict
-- with.

CREATE SEQUENCE agents.agent_tools_version_seq;

CREATE TABLE agents.agent_tools_versions (
    agent_id uuid PRIMARY KEY REFERENCES agents.agents (id) ON DELETE CASCADE ON UPDATE CASCADE,
    version  bigint NOT NULL DEFAULT nextval('agents.agent_tools_version_seq')
);
ALTER TABLE agents.agent_tools_versions ENABLE ROW LEVEL SECURITY;  -- and no policy
REVOKE ALL ON agents.agent_tools_versions FROM PUBLIC;
REVOKE ALL ON SEQUENCE agents.agent_tools_version_seq FROM PUBLIC;

INSERT INTO agents.agent_tools_versions (agent_id) SELECT id FROM agents.agents ORDER BY id;

-- Renew the versions of these agents: locked in id order, then updated, in one statement.
CREATE FUNCTION agents.renew_tools_versions(p_agents uuid[]) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog
AS $$
    UPDATE agents.agent_tools_versions v
       SET version = nextval('agents.agent_tools_version_seq')
      FROM (SELECT l.agent_id FROM agents.agent_tools_versions l
             WHERE l.agent_id = ANY (p_agents)
             ORDER BY l.agent_id FOR NO KEY UPDATE) locked
     WHERE v.agent_id = locked.agent_id
$$;

-- A new agent starts with a version of its own.
CREATE FUNCTION agents.tg_agents_tools_version_new() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    INSERT INTO agents.agent_tools_versions (agent_id) VALUES (NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER agents_tools_version_new AFTER INSERT ON agents.agents
    FOR EACH ROW EXECUTE FUNCTION agents.tg_agents_tools_version_new();

-- An agent's status or owner (who may ask for its stamp) changed.
CREATE FUNCTION agents.tg_agents_tools_version_renew() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    PERFORM agents.renew_tools_versions(ARRAY[NEW.id]);
    RETURN NULL;
END
$$;

CREATE TRIGGER agents_tools_version_renew AFTER UPDATE OF status, owner, id ON agents.agents
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.owner IS DISTINCT FROM NEW.owner
          OR OLD.id IS DISTINCT FROM NEW.id)
    EXECUTE FUNCTION agents.tg_agents_tools_version_renew();

-- Tools updated by one statement: the agents allowed any of them, once each (a denied
-- tool is in no agent's list; allowing it renews through the assignment).
CREATE FUNCTION agents.tg_tools_registry_tools_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    PERFORM agents.renew_tools_versions(ARRAY(
        SELECT DISTINCT s.agent_id FROM agents.tool_assignments s
         WHERE s.tool_id IN (SELECT n.id FROM new_tools n UNION SELECT o.id FROM old_tools o)
           AND s.allowed));
    RETURN NULL;
END
$$;

CREATE TRIGGER tools_registry_tools_version AFTER UPDATE ON agents.tools_registry
    REFERENCING OLD TABLE AS old_tools NEW TABLE AS new_tools
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_tools_registry_tools_version();

-- Assignments inserted, updated or deleted by one statement (a tool's or an agent's
-- deletion cascades here): their agents, once each. Written ones first wait for any tool
-- update in flight (FOR SHARE on their tools; see the header).
CREATE FUNCTION agents.tg_tool_assignments_tools_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM agents.renew_tools_versions(ARRAY(SELECT DISTINCT o.agent_id FROM changed o));
        RETURN NULL;
    END IF;
    PERFORM 1 FROM agents.tools_registry t
     WHERE t.id IN (SELECT n.tool_id FROM changed n) ORDER BY t.id FOR SHARE OF t;
    IF TG_OP = 'UPDATE' THEN
        PERFORM agents.renew_tools_versions(ARRAY(
            SELECT n.agent_id FROM changed n UNION SELECT o.agent_id FROM changed_before o));
    ELSE
        PERFORM agents.renew_tools_versions(ARRAY(SELECT DISTINCT n.agent_id FROM changed n));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tool_assignments_tools_version_insert AFTER INSERT ON agents.tool_assignments
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_tool_assignments_tools_version();
CREATE TRIGGER tool_assignments_tools_version_update AFTER UPDATE ON agents.tool_assignments
    REFERENCING OLD TABLE AS changed_before NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_tool_assignments_tools_version();
CREATE TRIGGER tool_assignments_tools_version_delete AFTER DELETE ON agents.tool_assignments
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_tool_assignments_tools_version();

-- TRUNCATE has no rows to tell: every agent.
CREATE FUNCTION agents.tg_tools_version_renew_all() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    PERFORM agents.renew_tools_versions(ARRAY(SELECT v.agent_id FROM agents.agent_tools_versions v));
    RETURN NULL;
END
$$;

CREATE TRIGGER tool_assignments_tools_version_truncate AFTER TRUNCATE ON agents.tool_assignments
    FOR EACH STATEMENT EXECUTE FUNCTION agents.tg_tools_version_renew_all();

REVOKE EXECUTE ON FUNCTION agents.renew_tools_versions(uuid[]),
    agents.tg_agents_tools_version_new(), agents.tg_agents_tools_version_renew(),
    agents.tg_tools_registry_tools_version(), agents.tg_tool_assignments_tools_version(),
    agents.tg_tools_version_renew_all() FROM PUBLIC;

-- The stamp: the agent's version, for the same callers as before (0021: an owner, any of
-- its agents'; an agent, itself). NULL for an agent asking of another; '0' (no version is
-- 0) for an agent that is not the caller's own or does not exist, which look the same.
CREATE OR REPLACE FUNCTION agents.agent_tools_stamp(p_agent uuid) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog
AS $$
DECLARE
    v_owner uuid := auth.uid();
    v_caller uuid := agents.caller_agent_id();
BEGIN
    IF v_owner IS NULL OR (v_caller IS NOT NULL AND v_caller IS DISTINCT FROM p_agent) THEN
        RETURN NULL;
    END IF;
    RETURN coalesce((SELECT v.version::text
                       FROM agents.agent_tools_versions v
                       JOIN agents.agents a ON a.id = v.agent_id
                      WHERE v.agent_id = p_agent AND a.owner = v_owner), '0');
END
$$;
