// tool_choice "required" and a named function through the official OpenAI Node SDK,
// served by a real router and worker on the tiny random-weight model (whose tokenizer is
// DeepSeek-V3's, tool-call markers included) with --tool-call-parser deepseek_v3. A
// random model writes no calls by itself: every call here exists because the constraint
// made the model write one. Each call's arguments are checked by Ajv (npm ajv, tools/node)
// against the tool's own parameters. Run by tests/integration/openai_tool_choice_test.cc:
//   node sdk_tool_choice.mjs BASE_URL MODEL
// Exits non-zero naming the first check that failed; prints one JSON line of what the
// calls were.
import assert from 'node:assert/strict';
import path from 'node:path';
import { OpenAI, check } from './sdk_common.mjs';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
const require = (await import('node:module')).createRequire(import.meta.url);
const nodeModules = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../../tools/node/node_modules');
const Ajv2020 = require(path.join(nodeModules, 'ajv/dist/2020')).default;

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city.', strict: true,
    parameters: { type: 'object',
                  properties: { city: { enum: ['Paris', 'Lima', 'Oslo'] },
                                days: { type: 'integer', minimum: 1, maximum: 14 } },
                  required: ['city', 'days'], additionalProperties: false } } },
  { type: 'function', function: { name: 'set_alarm',
    parameters: { type: 'object', properties: { hour: { type: 'integer', minimum: 0, maximum: 23 },
                                                label: { type: 'string', maxLength: 8 } },
                  required: ['hour'], additionalProperties: false } } },
  { type: 'function', function: { name: 'stop_music' } },
];
// Bounded schemas end every walk well within max_tokens; stop_music's any-object is only
// named, with room to finish.
const bounded = tools.slice(0, 2);
const ajv = new Ajv2020({ strict: false });
const validators = Object.fromEntries(tools.map((t) => [t.function.name,
  ajv.compile(t.function.parameters ?? { type: 'object' })]));
const messages = [{ role: 'user', content: 'Weather in Paris for three days, then wake me at seven.' }];
const seen = { required: [], named: [], streamed: [] };

// Every call is to a declared tool (or to `only`), with arguments valid by its schema.
function checkCalls(choice, only) {
  assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice.message));
  const calls = choice.message.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length >= 1, JSON.stringify(choice.message));
  assert.ok(choice.message.content === null || choice.message.content === '', JSON.stringify(choice.message));
  for (const call of calls) {
    assert.equal(call.type, 'function');
    assert.match(call.id, /^call_/);
    const validate = validators[call.function.name];
    assert.ok(validate, `call to an undeclared tool: ${call.function.name}`);
    if (only) assert.equal(call.function.name, only);
    const args = JSON.parse(call.function.arguments);
    assert.ok(validate(args), `${call.function.name}(${call.function.arguments}): ${JSON.stringify(validate.errors)}`);
  }
  return calls.map((c) => `${c.function.name} ${c.function.arguments}`);
}

await check('tool_choice required, greedy and seeded: only calls, each valid by its tool\'s schema', async () => {
  for (const seed of [undefined, 1, 2, 3, 4, 5]) {
    const r = await client.chat.completions.create({
      model, messages, tools: bounded, tool_choice: 'required', max_tokens: 400,
      temperature: seed === undefined ? 0 : 1, seed,
    });
    seen.required.push(checkCalls(r.choices[0]));
  }
});

await check('tool_choice naming each function: exactly one call, to it', async () => {
  for (const t of tools) {
    const name = t.function.name;
    const r = await client.chat.completions.create({
      model, messages, tools, tool_choice: { type: 'function', function: { name } }, max_tokens: 1500,
      temperature: 1, seed: 11,
    });
    const calls = checkCalls(r.choices[0], name);
    assert.equal(calls.length, 1, JSON.stringify(calls));
    seen.named.push(calls);
  }
});

await check('tool_choice required with parallel_tool_calls false: one call', async () => {
  for (const seed of [6, 7, 8]) {
    const r = await client.chat.completions.create({
      model, messages, tools: bounded, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 400,
      temperature: 1, seed,
    });
    assert.equal(checkCalls(r.choices[0]).length, 1);
  }
});

await check('tool_choice required, streamed and put together by the SDK, equal to the whole body', async () => {
  const body = { model, messages, tools: bounded, tool_choice: 'required', max_tokens: 400, temperature: 1, seed: 3 };
  const whole = await client.chat.completions.create(body);
  const stream = client.chat.completions.stream(body);
  const names = [];
  stream.on('tool_calls.function.arguments.done', (e) => names.push(e.name));
  const done = await stream.finalChatCompletion();
  const calls = checkCalls(done.choices[0]);
  assert.deepEqual(calls, checkCalls(whole.choices[0]));
  assert.deepEqual(names, done.choices[0].message.tool_calls.map((c) => c.function.name));
  seen.streamed.push(calls);
});

async function expect400(name, body, param) {
  await check(name, async () => {
    let error = null;
    try {
      await client.chat.completions.create(body);
    } catch (e) {
      error = e;
    }
    assert.ok(error instanceof OpenAI.APIError, `${name}: ${error}`);
    assert.equal(error.status, 400, error.message);
    assert.equal(error.error?.param, param, error.message);
  });
}
await expect400('tool_choice required with response_format: 400',
  { model, messages, tools, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice');
await expect400('tool_choice naming a function no tool has: 400',
  { model, messages, tools, tool_choice: { type: 'function', function: { name: 'nope' } } },
  'tool_choice.function.name');
await expect400('tool_choice required with a tool whose parameters are not an object: 400',
  { model, messages, tool_choice: 'required',
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'string' } } }] },
  'tools[0].function.parameters');

console.log(JSON.stringify(seen));
