-- Leave room in each page so that the claim and the "sent" mark (which change no indexed
-- column) can be HOT updates: no new index entries, less WAL and bloat per invocation.
ALTER TABLE agents.tool_invocations SET (fillfactor = 70);
