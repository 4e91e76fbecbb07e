// A real OpenID Connect provider for llmgw's sign-in tests: panva's oidc-provider (8.x, which
// runs on Node 18 and 20) with the device flow on, PKCE (S256) required of every client, one
// confidential client, and accounts with a `groups` claim. The test plays the person through
// plain form posts: POST /interaction/UID {sub} signs in and consents at once (or {deny: 1}
// refuses); the device pages (/device) are the provider's own. Test-only additions, outside
// the provider: PUT /accounts/SUB sets an account's claims, and RFC 8628's `interval` (with
// `slow_down` for a device code polled sooner) which this provider does not send itself.
// Env: CLIENT_ID, CLIENT_SECRET_FILE, DEVICE_TTL_S, INTERVAL_S, REDIRECT_URIS (more redirect
// URIs, space-separated: the console's callback). Prints "listening PORT".
import * as http from 'node:http';
import * as fs from 'node:fs';
import Provider from 'oidc-provider';

const env = process.env;
const interval = Number(env.INTERVAL_S || '1');
const accounts = new Map();
const lastPoll = new Map();

function body(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.on('data', (chunk) => { data += chunk; });
    req.on('end', () => resolve(data));
    req.on('error', reject);
  });
}

function send(res, status, text, type = 'text/html') {
  res.writeHead(status, { 'Content-Type': type });
  res.end(text);
}

function make(issuer) {
  const provider = new Provider(issuer, {
    clients: [{
      client_id: env.CLIENT_ID || 'llmgw',
      client_secret: fs.readFileSync(env.CLIENT_SECRET_FILE, 'utf8').trim(),
      application_type: 'native',
      redirect_uris: [
        'http://127.0.0.1/callback',
        ...(env.REDIRECT_URIS || '').split(' ').filter(Boolean),
      ],
      grant_types: ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code'],
      token_endpoint_auth_method: 'client_secret_post',
    }],
    pkce: { required: () => true, methods: ['S256'] },
    features: { devInteractions: { enabled: false }, deviceFlow: { enabled: true } },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    claims: {
      openid: ['sub'],
      email: ['email'],
      profile: ['preferred_username'],
      groups: ['groups'],
    },
    conformIdTokenClaims: false, // the groups in the ID token, where llmgwd reads them
    ttl: { DeviceCode: Number(env.DEVICE_TTL_S || '600') },
    cookies: { keys: ['llmgw-test-cookie-key'] },
    findAccount: (ctx, sub) => (accounts.has(sub)
      ? { accountId: sub, claims: () => ({ sub, ...accounts.get(sub) }) } : undefined),
  });
  provider.use(async (ctx, next) => {
    await next();
    if (ctx.path === '/device/auth' && ctx.status === 200) ctx.body.interval = interval;
    const code = ctx.oidc?.params?.device_code;
    if (ctx.path !== '/token' || !code || ctx.body?.error !== 'authorization_pending') return;
    const now = Date.now() / 1000;
    if (now - (lastPoll.get(code) ?? 0) < interval) ctx.body.error = 'slow_down';
    lastPoll.set(code, now);
  });
  return provider;
}

async function interaction(provider, req, res) {
  const details = await provider.interactionDetails(req, res);
  if (req.method === 'GET') {
    send(res, 200, `<form method="post"><input name="sub"><button>sign in</button></form>`);
    return;
  }
  const form = new URLSearchParams(await body(req));
  if (form.get('deny')) {
    const result = { error: 'access_denied', error_description: 'the person refused' };
    await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
    return;
  }
  const sub = form.get('sub');
  if (!accounts.has(sub)) {
    send(res, 400, 'no such account');
    return;
  }
  const grant = new provider.Grant({ accountId: sub, clientId: details.params.client_id });
  grant.addOIDCScope(details.params.scope);
  const result = { login: { accountId: sub }, consent: { grantId: await grant.save() } };
  await provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
}

const server = http.createServer();
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address();
  const provider = make(`http://127.0.0.1:${port}`);
  const callback = provider.callback();
  server.on('request', async (req, res) => {
    try {
      const url = new URL(req.url, `http://127.0.0.1:${port}`);
      if (req.method === 'PUT' && url.pathname.startsWith('/accounts/')) {
        accounts.set(decodeURIComponent(url.pathname.slice(10)), JSON.parse(await body(req)));
        send(res, 204, '');
      } else if (url.pathname.startsWith('/interaction/')) {
        await interaction(provider, req, res);
      } else {
        callback(req, res);
      }
    } catch (e) {
      send(res, 500, String(e.message || e), 'text/plain');
    }
  });
  process.stdout.write(`listening ${port}\n`);
});
