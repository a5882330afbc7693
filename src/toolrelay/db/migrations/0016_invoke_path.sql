-- Calls notify only when a worker may be asleep (issue 14, goal 3).
--
-- Every NOTIFY takes a cluster-wide lock at commit and holds it through the commit's WAL
-- flush, so notifying calls commit one at a time (2,400-2,700/s here, 4,400/s without).
-- A worker that follows the sleep protocol says when it is about to wait for a
-- notification (a row in dispatch_sleepers, through fn_dispatch_sleep); a call then
-- notifies only while such a row exists. Until a worker turns the protocol on
-- (dispatch_wake.sleepers_only), every call notifies as before: workers that do not follow
-- the protocol lose nothing.
--
-- The race a condition opens: a call looks (no sleeper); a worker registers, claims once
-- more (the call has not committed: it sees nothing) and waits; the call commits without
-- notifying, and sits until the poll. Closed by a lock: a call holds WAKE_LOCK shared from
-- its look until it ends, and a worker registers and takes WAKE_LOCK exclusive in one
-- transaction. When that commits, every call that looked before the registration has
-- ended (so the worker's next claim sees it) and every later call sees the registration.
--
-- The worker's side, in order: LISTEN (always on); when a claim leaves it with nothing to
-- do, in a transaction of its own SELECT agents.fn_dispatch_sleep(worker_id), commit,
-- claim once more, and only then wait; on waking, agents.fn_dispatch_wake(worker_id).
-- A sleeper row left by a worker that died costs extra notifications, never a lost one.

CREATE TABLE agents.dispatch_wake (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    sleepers_only boolean NOT NULL DEFAULT false  -- set by a worker that follows the protocol
);
INSERT INTO agents.dispatch_wake DEFAULT VALUES;

CREATE TABLE agents.dispatch_sleepers (
    worker text PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);

REVOKE ALL ON agents.dispatch_wake, agents.dispatch_sleepers FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON agents.dispatch_wake, agents.dispatch_sleepers
    TO service_role;

-- Whether this call must notify. The lock is the call's until it ends; the sleepers are
-- read after it is held, by a statement of their own (a fresh snapshot at read committed).
CREATE FUNCTION agents.wake_needed() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    IF NOT (SELECT w.sleepers_only FROM agents.dispatch_wake w) THEN
        RETURN true;
    END IF;
    -- A snapshot taken before the lock (repeatable read and above) could miss a sleeper.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(7421066145082241); -- WAKE_LOCK
    RETURN EXISTS (SELECT 1 FROM agents.dispatch_sleepers);
END
$$;

CREATE OR REPLACE FUNCTION agents.tg_tool_invocations_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status IS DISTINCT FROM 'running')
       AND agents.wake_needed() THEN
        PERFORM pg_notify('toolrelay_runnable', '');
    END IF;
    RETURN NULL;
END
$$;

-- A worker about to wait: run alone in a transaction, commit, then claim once more. Waits
-- for every call that looked before the row was there (run it with a lock_timeout; on a
-- timeout, stay awake and try again on the next turn).
CREATE FUNCTION agents.fn_dispatch_sleep(p_worker text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    INSERT INTO agents.dispatch_sleepers (worker) VALUES (p_worker)
        ON CONFLICT (worker) DO NOTHING;
    PERFORM pg_advisory_xact_lock(7421066145082241); -- WAKE_LOCK
END
$$;

-- A worker that woke (a notification, its poll, a finished call): calls stop notifying it.
CREATE FUNCTION agents.fn_dispatch_wake(p_worker text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog
AS $$
    DELETE FROM agents.dispatch_sleepers WHERE worker = p_worker;
$$;

REVOKE EXECUTE ON FUNCTION agents.wake_needed(), agents.fn_dispatch_sleep(text),
    agents.fn_dispatch_wake(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.wake_needed() TO authenticated, service_role;
GRANT EXECUTE ON FUNCTION agents.fn_dispatch_sleep(text), agents.fn_dispatch_wake(text)
    TO service_role;

-- Registry.invoke's lookup: the agent, and the tool with its schema_input (assigned to the
-- agent when p_assigned), NULL where not found. A function so that its plans are cached
-- per connection (a statement sent as text is planned, policies and all, on every call);
-- SECURITY INVOKER, so the caller's row-level security decides what it finds, as before.
CREATE FUNCTION agents.invoke_target(
    p_agent_id uuid, p_agent_name text, p_tool_id uuid, p_tool_key text, p_assigned boolean,
    OUT found_agent uuid, OUT found_tool uuid, OUT found_schema jsonb)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog
AS $$
BEGIN
    IF p_agent_id IS NOT NULL THEN
        SELECT a.id INTO found_agent FROM agents.agents a WHERE a.id = p_agent_id;
    ELSE
        SELECT a.id INTO found_agent FROM agents.agents a WHERE a.name = p_agent_name;
    END IF;
    IF found_agent IS NULL THEN
        RETURN;
    END IF;
    IF p_tool_id IS NOT NULL THEN
        SELECT t.id, t.schema_input INTO found_tool, found_schema
          FROM agents.tools_registry t WHERE t.id = p_tool_id;
    ELSE
        SELECT t.id, t.schema_input INTO found_tool, found_schema
          FROM agents.tools_registry t WHERE t.key = p_tool_key;
    END IF;
    IF p_assigned AND found_tool IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM agents.tool_assignments s
         WHERE s.tool_id = found_tool AND s.agent_id = found_agent) THEN
        found_tool := NULL;  -- whether it exists stays hidden
        found_schema := NULL;
    END IF;
END
$$;

REVOKE EXECUTE ON FUNCTION agents.invoke_target(uuid, text, uuid, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.invoke_target(uuid, text, uuid, text, boolean)
    TO authenticated, service_role;
