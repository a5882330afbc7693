// A real OpenID Connect provider for the tests: oidc-provider (OpenID-certified), its
// development login and consent pages (any login, any password), on loopback.
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"clients": [client metadata...], "accounts": {"login": {claims}} (optional),
//          "ttl": {"AccessToken": s, ...}, "features": {...},
//          "refresh": "always" (a refresh token for every client allowed the grant; default:
//                     only with the offline_access scope), "rotate": true (a new refresh
//                     token at every use, the old one dead),
//          "resource_servers": {"<resource URL>": {"scope": "...", "accessTokenFormat":
//                     "jwt", ...}} (RFC 8707 resource indicators: JWT access tokens whose
//                     aud is that resource; the first is the default),
//          "registration": true (dynamic client registration, RFC 7591)}
// Listens on a free loopback port first, so the issuer names it; prints one line
// "ready <issuer>" once it serves.
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import Provider, { errors } from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const server = createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;
const accounts = config.accounts ?? {};
const resources = config.resource_servers ?? {};
const features = {
  devInteractions: { enabled: true },
  revocation: { enabled: true },
  introspection: { enabled: true },
  ...(config.registration ? { registration: { enabled: true } } : {}),
  ...(Object.keys(resources).length ? {
    resourceIndicators: {
      enabled: true,
      defaultResource: (_ctx, _client, oneOf) => oneOf ?? Object.keys(resources)[0],
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, indicator) => {
        if (!resources[indicator]) throw new errors.InvalidTarget();
        return { audience: indicator, ...resources[indicator] };
      },
    },
  } : {}),
  ...(config.features ?? {}),
};

const provider = new Provider(issuer, {
  clients: config.clients,
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  cookies: { keys: ['toolrelay-test-cookie-key-not-a-secret'] },
  features,
  ttl: config.ttl ?? {},
  ...(config.refresh === 'always'
    ? { issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token') }
    : {}),
  ...(config.rotate ? { rotateRefreshToken: () => true } : {}),
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
