// A real OpenID Connect provider for the tests: oidc-provider (OpenID-certified), its
// development login and consent pages (any login, any password), on loopback.
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"clients": [client metadata...], "accounts": {"login": {claims}} (optional),
//          "ttl": {"AccessToken": s, ...}, "features": {...}}
// Listens on a free loopback port first, so the issuer names it; prints one line
// "ready <issuer>" once it serves.
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const server = createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;
const accounts = config.accounts ?? {};

const provider = new Provider(issuer, {
  clients: config.clients,
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  cookies: { keys: ['toolrelay-test-cookie-key-not-a-secret'] },
  features: { devInteractions: { enabled: true }, ...(config.features ?? {}) },
  ttl: config.ttl ?? {},
  async findAccount(_ctx, id) {
    // Anyone not named: LOGIN@example.test, verified unless the login starts "unverified".
    const claims = accounts[id]
      ?? { email: `${id}@example.test`, email_verified: !id.startsWith('unverified') };
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
});
provider.proxy = false;
provider.on('server_error', (_ctx, err) => console.error('server_error', err));

server.on('request', provider.callback());
console.log(`ready ${issuer}`);
process.on('SIGTERM', () => server.close(() => process.exit(0)));
