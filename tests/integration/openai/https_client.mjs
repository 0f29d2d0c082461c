// The official OpenAI Node SDK against the router's HTTP API served as HTTPS
// (--http-listen with --public-tls-cert/--public-tls-key), driven by
// tests/integration/security_test.cc.
//   node https_client.mjs BASE_URL MODEL API_KEY trusted     (run with NODE_EXTRA_CA_CERTS=CA)
//   node https_client.mjs BASE_URL MODEL API_KEY untrusted   (without the CA: must be refused)
// Prints a JSON object of what it got on stdout; a failed check exits 1 naming it.
import { OpenAI, check } from './sdk_common.mjs';

const [baseURL, model, apiKey, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const out = {};

if (mode === 'untrusted') {
  await check('a client that does not trust the CA is refused by its TLS stack', async () => {
    let error = null;
    try {
      await client.models.list();
    } catch (e) {
      error = e;
    }
    if (error === null) throw new Error('the request succeeded without the CA');
    // The SDK wraps the fetch failure; the TLS reason is in the cause chain.
    let reason = '';
    for (let e = error; e; e = e.cause) reason += ` ${e.code ?? ''} ${e.message ?? ''}`;
    out.untrusted_error = reason.trim();
    if (!/certificate|self[- ]signed|UNABLE_TO_VERIFY|SELF_SIGNED|CERT_/i.test(reason)) {
      throw new Error(`not a certificate error: ${reason}`);
    }
  });
} else {
  await check('models over HTTPS', async () => {
    const models = await client.models.list();
    out.models = models.data.map((m) => m.id);
    if (!out.models.includes(model)) throw new Error(`model ${model} not listed: ${out.models}`);
  });
  await check('a chat completion over HTTPS', async () => {
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'The router balances requests' }],
      max_tokens: 8,
      temperature: 0,
    });
    out.chat_text = r.choices[0].message.content;
    out.chat_completion_tokens = r.usage.completion_tokens;
    if (r.usage.completion_tokens < 1) throw new Error('no tokens');
  });
  await check('a streamed completion over HTTPS', async () => {
    const stream = await client.completions.create({
      model,
      prompt: 'The router balances requests',
      max_tokens: 8,
      temperature: 0,
      stream: true,
    });
    let text = '';
    let chunks = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.text ?? '';
      ++chunks;
    }
    out.stream_text = text;
    out.stream_chunks = chunks;
    if (chunks < 2) throw new Error(`only ${chunks} chunks`);
  });
  await check('a wrong key over HTTPS is 401', async () => {
    const wrong = new OpenAI({ baseURL, apiKey: 'not-a-key-of-this-cluster', maxRetries: 0 });
    try {
      await wrong.models.list();
    } catch (e) {
      out.wrong_key_status = e.status;
      if (e.status !== 401) throw e;
      return;
    }
    throw new Error('a wrong key was accepted');
  });
}
console.log(JSON.stringify(out));
