// tool_choice naming a function on a model that reasons first (the router runs
// --reasoning-parser deepseek_r1, so the output starts inside reasoning), through the
// official OpenAI Node SDK: the reasoning comes back in reasoning_content, without its
// end tag, and the call after it in tool_calls, valid by Ajv against the tool's schema.
// The tiny random-weight model would reason past max_tokens before it wrote "</think>",
// so the tag's own tokens get a logit bias (the grammar masks them after the tag: the
// call still has to be written). Run by tests/integration/openai_tool_choice_test.cc:
//   node sdk_tool_choice_reasoning.mjs BASE_URL MODEL
// Exits non-zero naming the first check that failed; prints one JSON line of the outputs.
import assert from 'node:assert/strict';
import path from 'node:path';
import { OpenAI, check } from './sdk_common.mjs';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const require = (await import('node:module')).createRequire(import.meta.url);
const nodeModules = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../../tools/node/node_modules');
const Ajv2020 = require(path.join(nodeModules, 'ajv/dist/2020')).default;

const parameters = { type: 'object', properties: { city: { enum: ['Paris', 'Lima', 'Oslo'] },
                                                   days: { type: 'integer', minimum: 1, maximum: 14 } },
                     required: ['city', 'days'], additionalProperties: false };
const tools = [{ type: 'function', function: { name: 'get_weather', strict: true, parameters } }];
const validate = new Ajv2020({ strict: false }).compile(parameters);
const messages = [{ role: 'user', content: 'Think first, then get the weather in Lima for five days.' }];

const r = await fetch(baseURL.replace(/\/v1$/, '') + '/tokenize', {
  method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify({ model, prompt: '</think>', add_special_tokens: false }) });
assert.equal(r.status, 200);
const tagTokens = (await r.json()).tokens;
const logit_bias = Object.fromEntries(tagTokens.map((t) => [String(t), 100]));
const seen = [];

await check('a named function after the reasoning: reasoning_content without the tag, then one valid call', async () => {
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    const c = await client.chat.completions.create({
      model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 2000, temperature: 1, seed, logit_bias });
    const choice = c.choices[0];
    const m = choice.message;
    assert.equal(choice.finish_reason, 'tool_calls', `seed ${seed}: ${JSON.stringify(m)}`);
    // (No reasoning_content when the model closed the reasoning at once.)
    const reasoning = m.reasoning_content ?? '';
    assert.equal(m.reasoning ?? '', reasoning);
    assert.ok(!reasoning.includes('</think>'), reasoning);
    // At most the newlines between the reasoning's end and the call.
    assert.ok(m.content === null || /^\n{0,2}$/.test(m.content), JSON.stringify(m));
    assert.equal(m.tool_calls.length, 1, JSON.stringify(m));
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    const args = JSON.parse(m.tool_calls[0].function.arguments);
    assert.ok(validate(args), `${m.tool_calls[0].function.arguments}: ${JSON.stringify(validate.errors)}`);
    seen.push({ seed, reasoning_chars: reasoning.length, arguments: m.tool_calls[0].function.arguments });
  }
  assert.ok(seen.some((s) => s.reasoning_chars > 0), 'no request reasoned before its call');
});
console.log(JSON.stringify(seen));
