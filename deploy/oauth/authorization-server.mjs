// An authorization server for mcp-code-executor's sign-in, built on npm `oidc-provider`
// (OpenID-certified), configured the way an MCP server's authorization server must be.
// docs/hosting.md "Sign-in with OAuth" has the quick start; tests/oauth/issuer.mjs runs this
// very file in the suite (tests/suite/oauth/), so what ships here is what the tests sign in
// through.
//
// What an MCP client and this server need from an authorization server, and where each is
// set below (the three things oidc-provider does not do out of the box are marked (!)):
//   - (!) the scope `mcp`: the official SDKs register and ask for `mcp offline_access` (the
//     scope the server's 401 names, --oauth-scope); an unknown scope is refused. `scopes`.
//   - (!) JWT access tokens whose `aud` is the resource the client asked for (RFC 8707
//     `resource=`, RFC 9068 `typ: at+jwt`): oidc-provider issues opaque tokens unless a
//     resource server is described. `features.resourceIndicators`.
//   - (!) the tenant claim: the server maps a token to a tenant by a claim ([[oauth_rules]]
//     in deploy/tenants.oauth.example.toml, here `org`), which must be added to the token.
//     `extraTokenClaims`.
//   - dynamic client registration (RFC 7591; ChatGPT and Claude register themselves),
//     authorization code with PKCE, client credentials for machines, CORS for browser-based
//     clients. `features.registration`, `pkce`, `features.clientCredentials`.
//
// Run it (Node 20 or newer; `npm install --prefix deploy/oauth oidc-provider@9.13.3` first):
//
//   ISSUER=http://127.0.0.1:4000 MCP_RESOURCES=http://127.0.0.1:8080/mcp \
//     node deploy/oauth/authorization-server.mjs
//
// Environment:
//   ISSUER         this server's issuer URL, exactly as tokens' `iss` and the server's
//                  --oauth-issuer (default http://127.0.0.1:4000); it listens on its port
//                  (PORT to listen on another, e.g. behind a TLS proxy), on HOST (127.0.0.1).
//   MCP_RESOURCES  the MCP servers' resource URLs, comma-separated (PUBLIC_URL/mcp, and
//                  PUBLIC_URL/sse for legacy SSE clients): tokens are issued for these
//                  audiences only. Required.
//   KEYS_FILE      where its private signing keys are kept (made on the first start;
//                  default ./authorization-server-keys.json). Keep it secret.
//   CLIENTS_FILE   optional JSON list of pre-registered clients, e.g. a CI machine with
//                  client credentials: [{"client_id": "acme-ci", "client_secret": "...",
//                  "grant_types": ["client_credentials"], "redirect_uris": [],
//                  "response_types": [], "token_endpoint_auth_method": "client_secret_post",
//                  "scope": "mcp", "org": "acme"}] (`org`: that machine's organisation).
//
// Users: this example signs users in with oidc-provider's development pages (any login,
// any password), and a user's organisation is the part of the login after `@` (`alice@acme`
// is in `acme`). That is for trying sign-in out: in production replace `devInteractions`
// with your own login (oidc-provider's `interactions` and `findAccount`) and `orgOf` with a
// look-up in your directory; or use your identity provider and this file as the checklist.
import { createRequire } from 'node:module';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// oidc-provider from beside this file (npm install --prefix deploy/oauth), or from the
// node_modules directory OIDC_PROVIDER_MODULES names.
async function loadProvider() {
  const modules = process.env.OIDC_PROVIDER_MODULES;
  const name = modules ? createRequire(path.join(modules, 'x.js')).resolve('oidc-provider') : 'oidc-provider';
  const { default: Provider, errors } = await import(name);
  return { Provider, errors };
}

/// The signing keys in `keysFile` (an RS256 key made and saved when there is none);
/// `rotate` puts a new key first (tokens are signed with the first) and keeps the old ones
/// published, so that tokens already issued stay valid.
export function signingKeys(keysFile, { rotate = false } = {}) {
  const newKey = () => {
    const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
    const kid = `k-${Date.now()}-${crypto.randomBytes(4).toString('hex')}`;
    return { ...privateKey.export({ format: 'jwk' }), kid, alg: 'RS256', use: 'sig' };
  };
  let keys = fs.existsSync(keysFile) ? JSON.parse(fs.readFileSync(keysFile, 'utf8')) : [];
  if (keys.length === 0) keys = [newKey()];
  if (rotate) keys = [newKey(), ...keys];
  fs.writeFileSync(keysFile, JSON.stringify(keys), { mode: 0o600 });
  return keys;
}

/// The organisation of a signed-in user: the part of the login after `@`. Replace with a
/// look-up in your directory.
export function orgOf(accountId) {
  return String(accountId).split('@')[1];
}

/// An oidc-provider `Provider` for MCP servers. `resources`: the resource URLs tokens may
/// be issued for, or `(url) => boolean`; `clients`: pre-registered clients (an `org`
/// property each, for client credentials); `scopes`: extra scopes beside `mcp`.
export async function mcpAuthorizationServer({
  issuer,
  keys,
  resources,
  clients = [],
  scopes = [],
  orgOfAccount = orgOf,
  cookieKeys = [crypto.randomBytes(32).toString('hex')],
}) {
  const { Provider, errors } = await loadProvider();
  const allowed = typeof resources === 'function' ? resources : (url) => resources.includes(url);
  const tokenScopes = ['mcp', ...scopes].join(' ');
  let provider;
  const configuration = {
    clients,
    // A client's `org` (client credentials: the machine's organisation) is kept with it.
    extraClientMetadata: { properties: ['org'] },
    jwks: { keys },
    // (!) `mcp`: the scope MCP clients ask for. `offline_access`: refresh tokens.
    scopes: ['openid', 'offline_access', 'mcp', ...scopes],
    cookies: { keys: cookieKeys },
    // OAuth 2.1: every authorization code flow uses PKCE.
    pkce: { required: () => true },
    // Browser-based MCP clients call the token and registration endpoints cross-origin.
    clientBasedCORS: () => true,
    features: {
      // Development login and consent pages: replace in production (see the top).
      devInteractions: { enabled: true },
      clientCredentials: { enabled: true },
      // Dynamic client registration: ChatGPT, Claude and the SDKs register themselves.
      registration: { enabled: true },
      // (!) A JWT access token per resource, its `aud` the MCP server's resource URL.
      resourceIndicators: {
        enabled: true,
        // A client that names one resource at authorization gets its token for it.
        defaultResource: (ctx, client, oneOf) => (oneOf ? oneOf[0] : undefined),
        useGrantedResource: () => true,
        getResourceServerInfo: (ctx, resourceIndicator) => {
          if (!allowed(resourceIndicator)) {
            throw new errors.InvalidTarget(`unknown resource ${resourceIndicator}`);
          }
          return {
            scope: tokenScopes,
            audience: resourceIndicator,
            accessTokenTTL: 600,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    // (!) The tenant claim `org` ([[oauth_rules]] claim = "org"): a user's organisation, or
    // a client-credentials client's own `org`.
    async extraTokenClaims(ctx, token) {
      if (token.accountId) {
        const org = orgOfAccount(token.accountId);
        return org ? { org } : {};
      }
      const client = await provider.Client.find(token.clientId);
      return client && client.org ? { org: client.org } : {};
    },
  };
  provider = new Provider(issuer, configuration);
  return provider;
}

/// The command: configuration from the environment (see the top), then listen.
async function main() {
  const issuer = process.env.ISSUER || 'http://127.0.0.1:4000';
  const resources = (process.env.MCP_RESOURCES || '').split(',').map((s) => s.trim()).filter(Boolean);
  if (resources.length === 0) {
    console.error('authorization-server: set MCP_RESOURCES to the MCP server resource URLs, e.g. http://127.0.0.1:8080/mcp');
    process.exit(2);
  }
  const keys = signingKeys(process.env.KEYS_FILE || 'authorization-server-keys.json');
  const clients = process.env.CLIENTS_FILE ? JSON.parse(fs.readFileSync(process.env.CLIENTS_FILE, 'utf8')) : [];
  const provider = await mcpAuthorizationServer({ issuer, keys, resources, clients });
  const port = Number(process.env.PORT || new URL(issuer).port || 80);
  const host = process.env.HOST || '127.0.0.1';
  provider.listen(port, host, () => {
    console.log(`issuer listening at ${issuer} (on ${host}:${port}), resources ${resources.join(' ')}`);
  });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  await main();
}
