-- Named queries for webhooks (migration 0024). Owner queries run as the owner (RLS);
-- the deliverer's run as the dispatcher (service_role).

-- name: add
-- url: the shown form; the URL itself is sealed (migration 0057).
INSERT INTO agents.webhook_subscriptions (id, owner, url, format, events, enabled,
    secret_key_id, secret_wrapped_key, secret_nonce, secret_ciphertext,
    url_wrapped_key, url_nonce, url_ciphertext)
VALUES (%(id)s, %(owner)s, %(url)s, %(format)s, %(events)s, true,
    %(key_id)s, %(wrapped_key)s, %(nonce)s, %(ciphertext)s,
    %(url_wrapped_key)s, %(url_nonce)s, %(url_ciphertext)s)
RETURNING id, url, format, events, enabled, created_at, secret_rotated_at;

-- name: list
SELECT s.id, s.url, s.format, s.events, s.enabled, s.created_at, s.secret_rotated_at,
       (SELECT count(*) FROM agents.webhook_deliveries d
         WHERE d.subscription_id = s.id AND d.delivered_at IS NULL AND NOT d.dead) AS pending,
       (SELECT count(*) FROM agents.webhook_deliveries d
         WHERE d.subscription_id = s.id AND d.dead) AS dead
  FROM agents.webhook_subscriptions s
 ORDER BY s.created_at, s.id;

-- name: get
SELECT id, url, format, events, enabled, created_at, secret_rotated_at
  FROM agents.webhook_subscriptions WHERE id = %(id)s;

-- name: remove
DELETE FROM agents.webhook_subscriptions WHERE id = %(id)s RETURNING id;

-- name: set_enabled
UPDATE agents.webhook_subscriptions SET enabled = %(enabled)s WHERE id = %(id)s
RETURNING id, url, format, events, enabled, created_at, secret_rotated_at;

-- name: key_of
-- The master key a subscription's secret and URL are sealed under (locked: a rewrap waits).
SELECT secret_key_id FROM agents.webhook_subscriptions WHERE id = %(id)s FOR UPDATE;

-- name: rotate
UPDATE agents.webhook_subscriptions
   SET secret_key_id = %(key_id)s, secret_wrapped_key = %(wrapped_key)s,
       secret_nonce = %(nonce)s, secret_ciphertext = %(ciphertext)s, secret_rotated_at = now()
 WHERE id = %(id)s
RETURNING id, url, format, events, enabled, created_at, secret_rotated_at;

-- name: deliveries
-- Newest first; the payload as stored (the link is added when sent).
SELECT d.id, d.subscription_id, d.invocation_id, d.event, d.payload, d.created_at,
       d.attempts, d.max_attempts, d.next_attempt_at, d.last_attempt_at, d.last_status,
       d.last_error, d.delivered_at, d.dead
  FROM agents.webhook_deliveries d
 WHERE (NOT %(dead)s OR d.dead)
   AND (%(subscription)s::uuid IS NULL OR d.subscription_id = %(subscription)s::uuid)
 ORDER BY d.created_at DESC, d.id DESC
 LIMIT %(limit)s;

-- name: delivery
SELECT d.id, d.subscription_id, d.invocation_id, d.event, d.payload, d.created_at,
       d.attempts, d.max_attempts, d.next_attempt_at, d.last_attempt_at, d.last_status,
       d.last_error, d.delivered_at, d.dead
  FROM agents.webhook_deliveries d WHERE d.id = %(id)s;

-- name: redeliver
SELECT public.fn_webhook_redeliver(%(id)s);

-- name: claim
-- Due rows of enabled subscriptions, each with what sending needs. The claim is a lease:
-- next_attempt_at moves past it, so a deliverer that dies leaves the row due again then.
-- A subscription gets no more than its room in this deliverer: %(per_subscription)s less
-- %(busy)s (subscription id -> deliveries of it in flight here), none when it is in
-- %(full)s (its rows are not even looked at). Rows locked beyond a subscription's room
-- are not claimed (their locks end with the statement): a slow receiver holds no more
-- of the deliverer than its share.
WITH due AS (
    SELECT l.id
      FROM (SELECT c.id, c.subscription_id,
                   row_number() OVER (PARTITION BY c.subscription_id
                                      ORDER BY c.next_attempt_at) AS nth
              FROM (SELECT d.id, d.subscription_id, d.next_attempt_at
                      FROM agents.webhook_deliveries d
                      JOIN agents.webhook_subscriptions s
                        ON s.id = d.subscription_id AND s.enabled
                     WHERE d.delivered_at IS NULL AND NOT d.dead
                       AND d.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
                       AND d.subscription_id <> ALL (%(full)s::uuid[])
                     ORDER BY d.next_attempt_at
                     LIMIT %(limit)s
                       FOR UPDATE OF d SKIP LOCKED) c) l
     WHERE l.nth <= %(per_subscription)s
                    - coalesce((%(busy)s::jsonb ->> l.subscription_id::text)::int, 0)
)
UPDATE agents.webhook_deliveries d
   SET attempts = d.attempts + 1, last_attempt_at = now(),
       next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease)s)
  FROM due, agents.webhook_subscriptions s
 WHERE d.id = due.id AND s.id = d.subscription_id
RETURNING d.id, d.owner, d.event, d.payload, d.attempts, d.max_attempts,
          s.id AS subscription_id, s.url, s.format, s.secret_key_id, s.secret_wrapped_key,
          s.secret_nonce, s.secret_ciphertext, s.url_wrapped_key, s.url_nonce, s.url_ciphertext;

-- name: record
-- Results of one batch; a row claimed again since (its lease ran out) is not overwritten.
-- An uncounted try (this process lacks the master key the secret is sealed with) gives its
-- attempt back and never makes the row dead.
UPDATE agents.webhook_deliveries d
   SET last_status = r.status,
       last_error = r.error,
       attempts = CASE WHEN r.uncounted THEN d.attempts - 1 ELSE d.attempts END,
       delivered_at = CASE WHEN r.ok THEN now() END,
       dead = NOT r.ok AND NOT r.uncounted AND d.attempts >= d.max_attempts,
       next_attempt_at = CASE WHEN r.ok OR (NOT r.uncounted AND d.attempts >= d.max_attempts)
                              THEN d.next_attempt_at
                              ELSE coalesce(%(now)s::timestamptz, now())
                                   + make_interval(secs => r.retry_in) END
  FROM jsonb_to_recordset(%(results)s) AS r(
      id uuid, attempts integer, ok boolean, status integer, error text,
      retry_in double precision, uncounted boolean)
 WHERE d.id = r.id AND d.attempts = r.attempts AND d.delivered_at IS NULL AND NOT d.dead
RETURNING d.id, d.dead;

-- name: counts
-- For the metrics: deliveries waiting (not delivered, not dead) and dead, all owners.
SELECT (SELECT count(*) FROM agents.webhook_deliveries
          WHERE delivered_at IS NULL AND NOT dead) AS pending,
       (SELECT count(*) FROM agents.webhook_deliveries WHERE dead) AS dead;

-- name: prune
-- Delivered rows older than the retention; dead letters stay until redelivered or removed.
DELETE FROM agents.webhook_deliveries
 WHERE delivered_at IS NOT NULL AND delivered_at < now() - make_interval(secs => %(seconds)s);

-- name: to_rewrap
-- Webhooks sealed under an older master key, or whose URL is not sealed yet (written before
-- migration 0057): toolrelay webhook rewrap. Locked.
SELECT id, owner, url, secret_key_id, secret_wrapped_key, url_wrapped_key, url_nonce,
       url_ciphertext
  FROM agents.webhook_subscriptions
 WHERE secret_key_id <> %(newest)s OR url_ciphertext IS NULL
 ORDER BY id FOR UPDATE;

-- name: rewrapped
UPDATE agents.webhook_subscriptions
   SET secret_key_id = %(key_id)s, secret_wrapped_key = %(wrapped_key)s, url = %(url)s,
       url_wrapped_key = %(url_wrapped_key)s, url_nonce = %(url_nonce)s,
       url_ciphertext = %(url_ciphertext)s
 WHERE id = %(id)s;
