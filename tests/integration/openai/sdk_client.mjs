// The official OpenAI Node SDK (npm `openai`, tools/node) against Tandem's HTTP API: a
// real client written by others. Run by tests/integration/openai_api_test.cc, which starts
// the cluster and passes:
//   node sdk_client.mjs BASE_URL MODEL API_KEY RATE_LIMITED_KEY UNSERVED_BASE_URL
// (BASE_URL like http://127.0.0.1:PORT/v1; RATE_LIMITED_KEY allows one request then
// refuses; UNSERVED_BASE_URL is a router with no replicas). Exits non-zero naming the
// first check that failed; prints one JSON line of results for the C++ side to compare
// with the gRPC API.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { OpenAI, check } from './sdk_common.mjs';

const [baseURL, model, apiKey, rateLimitedKey, unservedURL] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
const results = {};

async function expectStatus(name, status, fn, more) {
  await check(name, async () => {
    let error = null;
    try {
      await fn();
    } catch (e) {
      error = e;
    }
    assert.ok(error, `${name}: no error`);
    assert.ok(error instanceof OpenAI.APIError, `${name}: not an APIError: ${error}`);
    assert.equal(error.status, status, `${name}: status ${error.status}: ${error.message}`);
    assert.equal(typeof error.error?.message, 'string', `${name}: no error.message`);
    if (more) more(error);
  });
}

const prompt = 'The router balances requests across replicas';
const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Name three colours.' },
];

await check('models.list', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, model);
  assert.equal(list.data[0].object, 'model');
});

await check('completions greedy, not streamed', async () => {
  const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  results.completion_greedy = r.choices[0].text;
  results.completion_prompt_tokens = r.usage.prompt_tokens;
});

await check('completions greedy, streamed = not streamed', async () => {
  const stream = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, ignore_eos: true,
                                                   stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) {
      usage = chunk.usage;
      assert.deepEqual(chunk.choices, []);
      continue;
    }
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(text, results.completion_greedy);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 12);
});

await check('completions seeded with logprobs', async () => {
  const r = await client.completions.create({ model, prompt, max_tokens: 10, temperature: 0.8, seed: 1234,
                                              logprobs: 2, ignore_eos: true });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 10);
  assert.equal(lp.token_logprobs.length, 10);
  assert.equal(lp.top_logprobs.length, 10);
  assert.equal(lp.text_offset.length, 10);
  for (let i = 0; i < 10; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    assert.equal(Object.keys(lp.top_logprobs[i]).length <= 2, true);
  }
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  results.completion_seeded = r.choices[0].text;
  results.completion_seeded_logprobs = lp.token_logprobs;
});

await check('chat greedy, not streamed and streamed', async () => {
  const r = await client.chat.completions.create({ model, messages, max_completion_tokens: 16, temperature: 0,
                                                   ignore_eos: true });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 16);
  results.chat_greedy = r.choices[0].message.content;
  const stream = await client.chat.completions.create({ model, messages, max_completion_tokens: 16, temperature: 0,
                                                        ignore_eos: true, stream: true,
                                                        stream_options: { include_usage: true } });
  let content = '';
  let role = null;
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      usage = chunk.usage;
      assert.deepEqual(chunk.choices, []);
      continue;
    }
    const delta = chunk.choices[0].delta;
    if (delta.role) role = delta.role;
    if (delta.content) content += delta.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(content, results.chat_greedy);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
  assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
});

await check('chat logprobs', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, logprobs: true,
                                                   top_logprobs: 3, ignore_eos: true });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 8);
  for (const t of content) {
    assert.equal(typeof t.token, 'string');
    assert.ok(Array.isArray(t.bytes) && t.bytes.length > 0);
    assert.equal(t.top_logprobs.length, 3);
    // Greedy: the chosen token is the most likely one.
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
  }
  // The tokens' bytes make up the content.
  assert.equal(Buffer.from(content.flatMap((t) => t.bytes)).toString('utf8'), r.choices[0].message.content);
});

// A conversation with tools, an earlier tool call and its result, as OpenAI clients send
// it (tests/goldens/chat_templates/conversations.json's tool_call_string_arguments). The
// prompt the model's template made of it, read back through /tokenize and /detokenize,
// must be what transformers' apply_chat_template renders from the same conversation with
// DeepSeek-V3's template, which the built-in model carries.
const repo = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../..');
const goldens = path.join(repo, 'tests/goldens/chat_templates');
const toolConversation = JSON.parse(fs.readFileSync(path.join(goldens, 'conversations.json'), 'utf8'))
  .conversations.find((c) => c.name === 'tool_call_string_arguments');
const toolRendering = JSON.parse(fs.readFileSync(path.join(goldens, 'transformers_renderings.json'), 'utf8'))
  .cases.find((c) => c.template === 'deepseek_v3' && c.conversation === 'tool_call_string_arguments');
async function postJson(route, body) {
  const r = await fetch(baseURL.replace(/\/v1$/, '') + route, {
    method: 'POST', headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  assert.equal(r.status, 200, `${route}: ${r.status} ${await r.clone().text()}`);
  return r.json();
}
await check('chat with tools, a tool call and its result', async () => {
  const { messages: history, tools } = toolConversation;
  const r = await client.chat.completions.create({ model, messages: history, tools, tool_choice: 'auto',
                                                   max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(r.choices[0].message.role, 'assistant');
  results.tools_chat = r.choices[0].message.content ?? '';
  results.tools_prompt_tokens = r.usage.prompt_tokens;
  const tokenized = await postJson('/tokenize', { model, messages: history, tools });
  assert.equal(tokenized.count, r.usage.prompt_tokens);
  const text = await postJson('/detokenize', { model, tokens: tokenized.tokens });
  assert.ok(toolRendering && toolRendering.ok, 'the golden rendering is missing');
  assert.equal(text.prompt, toolRendering.text);
});

await check('n = 3 seeded, not streamed and streamed', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 1.0, seed: 7, n: 3,
                                                   ignore_eos: true });
  assert.equal(r.choices.length, 3);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 24);
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 1.0, seed: 7,
                                                        n: 3, ignore_eos: true, stream: true });
  const texts = ['', '', ''];
  for await (const chunk of stream) {
    for (const c of chunk.choices) texts[c.index] += c.delta.content ?? '';
  }
  assert.deepEqual(texts, r.choices.map((c) => c.message.content));
  results.chat_n3 = texts;
});

// Structured output as the SDK sends it, each output checked by Ajv (npm ajv, tools/node)
// or a regex, not by anything of ours.
const require = (await import('node:module')).createRequire(import.meta.url);
const nodeModules = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../../tools/node/node_modules');
const Ajv2020 = require(path.join(nodeModules, 'ajv/dist/2020')).default;
const weatherSchema = {
  type: 'object',
  properties: { city: { enum: ['Paris', 'Lima', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 14 },
                unit: { enum: ['C', 'F'] } },
  required: ['city', 'days', 'unit'], additionalProperties: false,
};
await check('chat response_format json_schema (strict), greedy and seeded, valid by Ajv', async () => {
  const validate = new Ajv2020({ strict: false }).compile(weatherSchema);
  const outputs = [];
  for (const seed of [undefined, 3, 4]) {
    const r = await client.chat.completions.create({
      model, messages, max_tokens: 80, temperature: seed === undefined ? 0 : 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', schema: weatherSchema, strict: true } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const doc = JSON.parse(r.choices[0].message.content);
    assert.ok(validate(doc), `${r.choices[0].message.content}: ${JSON.stringify(validate.errors)}`);
    outputs.push(r.choices[0].message.content);
  }
  results.structured_chat = outputs;
});
await check('completions response_format json_object, streamed', async () => {
  const stream = await client.completions.create({ model, prompt, max_tokens: 200, temperature: 1, seed: 5,
                                                   stream: true, response_format: { type: 'json_object' } });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.text ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  if (finish === 'stop') assert.equal(typeof JSON.parse(text), 'object', text);
  else assert.equal(finish, 'length');
});
await check('vLLM structured_outputs choice and regex', async () => {
  const choice = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 1, seed: 9,
                                                        structured_outputs: { choice: ['red', 'green', 'blue (dark)'] } });
  assert.ok(['red', 'green', 'blue (dark)'].includes(choice.choices[0].message.content), choice.choices[0].message.content);
  const regex = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 0,
                                                  structured_outputs: { regex: '[0-9]{3}-[a-z]{2}' } });
  assert.match(regex.choices[0].text, /^[0-9]{3}-[a-z]{2}$/);
});
await expectStatus('400 for an unsupported schema keyword, naming it', 400,
  () => client.chat.completions.create({ model, messages, max_tokens: 4, response_format: {
    type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: { a: {} } } } } }),
  (e) => assert.match(e.error.message, /patternProperties/));
await expectStatus('400 for two constraints at once', 400,
  () => client.chat.completions.create({ model, messages, max_tokens: 4, response_format: { type: 'json_object' },
                                         structured_outputs: { regex: 'a' } }),
  (e) => assert.equal(e.error.param, 'response_format'));

await expectStatus('400 naming the field (temperature)', 400,
  () => client.completions.create({ model, prompt, max_tokens: 4, temperature: -1 }),
  (e) => assert.equal(e.error.param, 'temperature'));
await expectStatus('400 for a wrong type (max_tokens)', 400,
  () => client.completions.create({ model, prompt, max_tokens: 'many' }),
  (e) => assert.equal(e.param ?? e.error.param, 'max_tokens'));
await expectStatus('400 for n over --max-n', 400,
  () => client.chat.completions.create({ model, messages, max_tokens: 4, n: 100000 }),
  (e) => assert.equal(e.error.param, 'n'));
await expectStatus('404 for a model not served', 404,
  () => client.completions.create({ model: 'no-such-model', prompt, max_tokens: 4 }));
await expectStatus('401 for a wrong key', 401,
  () => new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 }).models.list());
await check('429 with Retry-After once a key is over its rate', async () => {
  const limited = new OpenAI({ baseURL, apiKey: rateLimitedKey, maxRetries: 0 });
  await limited.completions.create({ model, prompt, max_tokens: 2 });
  let error = null;
  try {
    await limited.completions.create({ model, prompt, max_tokens: 2 });
  } catch (e) {
    error = e;
  }
  assert.ok(error instanceof OpenAI.RateLimitError, `not a RateLimitError: ${error}`);
  assert.equal(error.status, 429);
  assert.ok(Number(error.headers.get('retry-after')) >= 1);
});
await expectStatus('503 when no replica is up', 503,
  () => new OpenAI({ baseURL: unservedURL, apiKey, maxRetries: 0, timeout: 60000 })
    .completions.create({ model, prompt, max_tokens: 2 }));

console.log(JSON.stringify(results));
