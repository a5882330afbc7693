-- A webhook's URL is sealed like its signing secret (docs/notifications.md).
--
-- A Slack incoming webhook's path is its credential, and a signed receiver's URL may carry a
-- token in its path or query; it was stored in plain text in webhook_subscriptions.url, so
-- pg_dump held it. Now the whole URL is sealed (envelope encryption in the application,
-- kind 'webhook_url' in the associated data) with its own data key wrapped under the SAME
-- master key as the subscription's signing secret (secret_key_id names both; the start
-- check and `credential keys` count each subscription under that one key id, and `webhook
-- rewrap` moves both together). The plain `url` column keeps only what is safe to show:
-- scheme://host[:port] followed by "/…" when the URL had a path or query (or "/"), for
-- listings, the audit-free metadata and the egress guard's host.
--
-- A migration has no master key, so rows written before this one keep their full URL in
-- `url` (url_ciphertext NULL) and are delivered from it until `toolrelay webhook rewrap`
-- seals them (it does every unsealed row, whatever key its secret is under).
--
-- Owners write the sealed columns and never read them back, as for the secret; they may
-- read secret_key_id (a key's name, not a secret), so that `rotate-secret` seals the new
-- secret under the key the URL is wrapped under.

ALTER TABLE agents.webhook_subscriptions
    ADD COLUMN url_wrapped_key bytea,
    ADD COLUMN url_nonce bytea,
    ADD COLUMN url_ciphertext bytea,
    ADD CONSTRAINT webhook_subscriptions_url_sealed_check CHECK (
        (url_wrapped_key IS NULL) = (url_ciphertext IS NULL)
        AND (url_nonce IS NULL) = (url_ciphertext IS NULL)),
    -- Beside a sealed URL, the plain column holds the shown form only, never a path.
    ADD CONSTRAINT webhook_subscriptions_url_shown_check CHECK (
        url_ciphertext IS NULL OR url ~ '^https?://[^/?#[:space:]]+/(…)?$');

GRANT SELECT (secret_key_id) ON agents.webhook_subscriptions TO authenticated;
GRANT INSERT (url_wrapped_key, url_nonce, url_ciphertext)
    ON agents.webhook_subscriptions TO authenticated;
GRANT UPDATE (url_wrapped_key, url_nonce, url_ciphertext)
    ON agents.webhook_subscriptions TO authenticated;
