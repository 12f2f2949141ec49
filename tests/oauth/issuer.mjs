// The authorization server of tests/suite/oauth/: the shipped example
// deploy/oauth/authorization-server.mjs (npm `oidc-provider`, installed under
// target/oidc-provider by scripts/test.sh) on loopback, so that the tests sign in through the
// very configuration the docs give an operator: dynamic client registration, authorization
// code with PKCE (its development login and consent pages, which the tests post headlessly),
// client credentials, resource indicators (RFC 8707) giving JWT access tokens (RFC 9068)
// whose `aud` is the resource asked for, the scopes `mcp` and (here) `other`, and an `org`
// claim: the client's `org` for client credentials, the part of the login after `@` for a
// user (login `alice@acme` is in org `acme`). The tests' own additions: four
// client-credentials clients, any resource accepted (the tests ask for tokens of other
// audiences, which the server must refuse), and two helpers.
//
// Usage: node issuer.mjs PORT KEYS_FILE [rotate]
//   KEYS_FILE holds its private signing keys (made on the first start); `rotate` puts a new
//   key first (tokens are then signed with it) and keeps the old ones.
// Prints `issuer listening at http://127.0.0.1:PORT` when it answers. Test helpers beside
// the real endpoints: POST /test/sign {header, payload} signs any claims with its current
// key (for the negative cases); GET /test/jwks-fetches counts the GETs of its JWKS.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = process.env.OIDC_PROVIDER_MODULES
  || path.join(here, '..', '..', 'target', 'oidc-provider', 'node_modules');
process.env.OIDC_PROVIDER_MODULES = modules;
const require = createRequire(path.join(modules, 'x.js'));
const jose = await import(require.resolve('jose'));
const { mcpAuthorizationServer, signingKeys } = await import(
  path.join(here, '..', '..', 'deploy', 'oauth', 'authorization-server.mjs'));

const [port, keysFile, mode] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const keys = signingKeys(keysFile, { rotate: mode === 'rotate' });

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

const provider = await mcpAuthorizationServer({
  issuer,
  keys,
  resources: () => true,
  clients: [
    ccClient('acme-ci', 'acme'),
    ccClient('acme-ci-2', 'acme'),
    ccClient('globex-ci', 'globex'),
    ccClient('initech-ci', 'initech'),
  ],
  scopes: ['other'],
  cookieKeys: ['test-cookie-key'],
});
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
