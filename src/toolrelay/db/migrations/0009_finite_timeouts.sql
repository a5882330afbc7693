-- NaN and Infinity are "> 0" in PostgreSQL: bound the connect timeout from above too.
ALTER TABLE agents.tools_registry
    ADD CONSTRAINT tools_registry_connect_timeout_check
        CHECK (connect_timeout_seconds <= 600);
