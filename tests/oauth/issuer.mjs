// A real OAuth 2.1 / OpenID authorization server for tests/suite/oauth/: npm `oidc-provider`
// (installed under target/oidc-provider by scripts/test.sh) on loopback, configured as an
// MCP server's authorization server is: dynamic client registration, authorization code
// with PKCE (its development login and consent pages, which the tests post headlessly),
// client credentials, resource indicators (RFC 8707) giving JWT access tokens (RFC 9068)
// whose `aud` is the resource asked for, with the scopes `mcp` and `other`, and an `org`
// claim: the client's `org` for client credentials, the part of the login after `@` for a
// user (login `alice@acme` is in org `acme`).
//
// Usage: node issuer.mjs PORT KEYS_FILE [rotate]
//   KEYS_FILE holds its private signing keys (made on the first start); `rotate` puts a new
//   key first (tokens are then signed with it) and keeps the old ones.
// Prints `issuer listening at http://127.0.0.1:PORT` when it answers. Test helpers beside
// the real endpoints: POST /test/sign {header, payload} signs any claims with its current
// key (for the negative cases); GET /test/jwks-fetches counts the GETs of its JWKS.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = process.env.OIDC_PROVIDER_MODULES
  || path.join(here, '..', '..', 'target', 'oidc-provider', 'node_modules');
const require = createRequire(path.join(modules, 'x.js'));
const { default: Provider } = await import(require.resolve('oidc-provider'));
const jose = await import(require.resolve('jose'));

const [port, keysFile, mode] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

async function newKey() {
  const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
  const jwk = await jose.exportJWK(privateKey);
  return { ...jwk, kid: `k-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`, alg: 'RS256', use: 'sig' };
}

let keys = fs.existsSync(keysFile) ? JSON.parse(fs.readFileSync(keysFile, 'utf8')) : [];
if (keys.length === 0) keys = [await newKey()];
if (mode === 'rotate') keys = [await newKey(), ...keys];
fs.writeFileSync(keysFile, JSON.stringify(keys));

const ccClient = (id, org) => ({
  client_id: id,
  client_secret: `${id}-secret`,
  grant_types: ['client_credentials'],
  response_types: [],
  redirect_uris: [],
  token_endpoint_auth_method: 'client_secret_post',
  scope: 'mcp other',
  org,
});

let provider;
const configuration = {
  clients: [
    ccClient('acme-ci', 'acme'),
    ccClient('acme-ci-2', 'acme'),
    ccClient('globex-ci', 'globex'),
    ccClient('initech-ci', 'initech'),
  ],
  extraClientMetadata: { properties: ['org'] },
  jwks: { keys },
  scopes: ['openid', 'offline_access', 'mcp', 'other'],
  cookies: { keys: ['test-cookie-key'] },
  pkce: { required: () => true },
  clientBasedCORS: () => true,
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    registration: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (ctx, client, oneOf) => (oneOf ? oneOf[0] : undefined),
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resourceIndicator) => ({
        scope: 'mcp other',
        audience: resourceIndicator,
        accessTokenTTL: 600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  async extraTokenClaims(ctx, token) {
    if (token.accountId) {
      const org = String(token.accountId).split('@')[1];
      return org ? { org } : {};
    }
    const client = await provider.Client.find(token.clientId);
    return client && client.org ? { org: client.org } : {};
  },
};

provider = new Provider(issuer, configuration);
provider.proxy = false;

let jwksFetches = 0;
provider.use(async (ctx, next) => {
  if (ctx.method === 'GET' && ctx.path === '/jwks') jwksFetches += 1;
  if (ctx.path === '/test/jwks-fetches') {
    ctx.body = { fetches: jwksFetches };
    return;
  }
  if (ctx.path === '/test/sign' && ctx.method === 'POST') {
    const chunks = [];
    for await (const c of ctx.req) chunks.push(c);
    const { header = {}, payload } = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    const key = await jose.importJWK(keys[0], 'RS256');
    // A `crit` header is signed as given (jose checks its names are in the header).
    const crit = Array.isArray(header.crit)
      ? { crit: Object.fromEntries(header.crit.map((c) => [c, true])) }
      : undefined;
    // `typ: null` leaves the header without one.
    const protectedHeader = { alg: 'RS256', typ: 'at+jwt', kid: keys[0].kid, ...header };
    if (protectedHeader.typ === null) delete protectedHeader.typ;
    ctx.body = {
      token: await new jose.CompactSign(new TextEncoder().encode(JSON.stringify(payload)))
        .setProtectedHeader(protectedHeader)
        .sign(key, crit),
      public_jwk: (({ kty, n, e, kid }) => ({ kty, n, e, kid }))(keys[0]),
    };
    return;
  }
  await next();
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log(`issuer listening at ${issuer}`);
});
