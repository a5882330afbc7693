-- The dispatcher's side of 0016's sleep protocol (issue 14, goals 3 and 4).
--
-- 1. Workers that follow the protocol register (dispatch_workers, renewed every
--    lease/3, lapsing after a lease). While a registration is live, calls notify only
--    while some worker is asleep (0016's rule); while none is, every call notifies, as
--    before 0016. So the protocol is on exactly while a worker that follows it runs: stop
--    (or roll back to) workers that do not follow it and, within a lease, every call
--    notifies again. A worker that does not follow it, running beside one that does, loses
--    prompt wake-ups (never a call: it finds every call by its poll). dispatch_wake's
--    sleepers_only still forces the protocol on by hand (the invoke benchmark uses it).
-- 2. A worker about to wait calls fn_dispatch_try_sleep: 0016's fn_dispatch_sleep with a
--    lock timeout of its own (it returns false instead of waiting behind a long call's
--    open transaction; the worker then stays awake and polls soon). The worker's claim
--    wakes it (deletes its sleeper row) in the same statement.
-- 3. Sleeper rows and registrations are UNLOGGED: they are worth nothing after a crash (a
--    restarted server has no sleepers: every call notifies until a worker sleeps again,
--    and every worker's listener wakes it when it reconnects), and a transaction that
--    writes only them commits without waiting for a WAL flush.

ALTER TABLE agents.dispatch_sleepers SET UNLOGGED;

CREATE UNLOGGED TABLE agents.dispatch_workers (
    worker      text PRIMARY KEY,
    expires_at  timestamptz NOT NULL
);
REVOKE ALL ON agents.dispatch_workers FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON agents.dispatch_workers TO service_role;

-- 0016's rule, on while a protocol worker is registered (or forced on by sleepers_only).
CREATE OR REPLACE FUNCTION agents.wake_needed() RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog
AS $$
BEGIN
    IF NOT (SELECT w.sleepers_only FROM agents.dispatch_wake w)
       AND NOT EXISTS (SELECT 1 FROM agents.dispatch_workers r WHERE r.expires_at > now()) THEN
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

-- A worker that follows the protocol says so, and again every lease/3. Returns whether its
-- registration was still live (false: it lapsed, and a sleeper row of its own may have
-- been removed meanwhile: the worker must not count on being woken until it sleeps again).
-- Sleeper rows of workers whose registration lapsed go with it: a dead worker's row costs
-- extra notifications only until then. Rows of sleepers that never registered (0016's
-- protocol used on its own) are left alone.
CREATE FUNCTION agents.fn_dispatch_register(p_worker text, p_seconds double precision)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog
AS $$
BEGIN
    UPDATE agents.dispatch_workers SET expires_at = now() + make_interval(secs => p_seconds)
     WHERE worker = p_worker AND expires_at > now();
    IF FOUND THEN
        RETURN true;
    END IF;
    DELETE FROM agents.dispatch_sleepers s USING agents.dispatch_workers r
     WHERE r.worker = s.worker AND r.expires_at <= now();
    DELETE FROM agents.dispatch_workers r WHERE r.expires_at <= now();
    INSERT INTO agents.dispatch_workers (worker, expires_at)
    VALUES (p_worker, now() + make_interval(secs => p_seconds))
        ON CONFLICT (worker) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    RETURN false;
END
$$;

-- At shutdown: no longer asleep, no longer registered.
CREATE FUNCTION agents.fn_dispatch_unregister(p_worker text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog
AS $$
    DELETE FROM agents.dispatch_sleepers WHERE worker = p_worker;
    DELETE FROM agents.dispatch_workers WHERE worker = p_worker;
$$;

-- 0016's fn_dispatch_sleep, but giving up after a short lock wait: true when the worker is
-- registered asleep (every call that looked before has ended: claim once more, then
-- wait), false when a call's transaction held the lock too long (nothing registered).
CREATE FUNCTION agents.fn_dispatch_try_sleep(p_worker text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog SET lock_timeout = '100ms'
AS $$
BEGIN
    BEGIN
        PERFORM pg_advisory_xact_lock(7421066145082241); -- WAKE_LOCK
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    INSERT INTO agents.dispatch_sleepers (worker) VALUES (p_worker)
        ON CONFLICT (worker) DO NOTHING;
    RETURN true;
END
$$;

REVOKE EXECUTE ON FUNCTION agents.fn_dispatch_register(text, double precision),
    agents.fn_dispatch_unregister(text), agents.fn_dispatch_try_sleep(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION agents.fn_dispatch_register(text, double precision),
    agents.fn_dispatch_unregister(text), agents.fn_dispatch_try_sleep(text) TO service_role;

-- 4. Only rows that become runnable call the notify trigger's function: the worker's finish
--    changes status on every call, and for each of those rows the function was called to
--    do nothing. The function (0016's) decides as before; its name and INSERT trigger stay.
DROP TRIGGER tool_invocations_notify ON agents.tool_invocations;
CREATE TRIGGER tool_invocations_notify
    AFTER INSERT ON agents.tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'running')
    EXECUTE FUNCTION agents.tg_tool_invocations_notify();
CREATE TRIGGER tool_invocations_notify_runnable
    AFTER UPDATE OF status ON agents.tool_invocations
    FOR EACH ROW WHEN (NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running')
    EXECUTE FUNCTION agents.tg_tool_invocations_notify();
