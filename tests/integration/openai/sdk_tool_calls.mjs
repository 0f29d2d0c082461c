// The official OpenAI Node SDK reading tool calls from Tandem's HTTP API. Run by
// tests/integration/openai_tool_calls_test.cc, whose scripted replica answers every
// request with text, then a DeepSeek-V3 tool call (get_weather {"city": "Paris",
// "days": 3}), then, once it is sent the call's result, with plain text:
//   node sdk_tool_calls.mjs BASE_URL MODEL
// Exits non-zero naming the first check that failed.
import assert from 'node:assert/strict';
import { OpenAI, check } from './sdk_common.mjs';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60000 });

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
                  required: ['city'] },
  },
}];
const question = [{ role: 'user', content: 'Weather in Paris for three days?' }];
const wantArguments = { city: 'Paris', days: 3 };

let call = null;
await check('a tool call, not streamed', async () => {
  const r = await client.chat.completions.create({ model, messages: question, tools, tool_choice: 'auto' });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, 'Let me check.');
  assert.equal(choice.message.tool_calls.length, 1);
  call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), wantArguments);
});

await check('a tool call, streamed and put together by the SDK', async () => {
  // The SDK's stream helper accumulates the deltas itself and throws on a malformed one
  // (an index missing, arguments before the name).
  const stream = client.chat.completions.stream({ model, messages: question, tools, tool_choice: 'auto' });
  const names = [];
  stream.on('tool_calls.function.arguments.done', (e) => names.push(e.name));
  const done = await stream.finalChatCompletion();
  const choice = done.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, 'Let me check.');
  assert.equal(choice.message.tool_calls.length, 1);
  assert.equal(choice.message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(choice.message.tool_calls[0].function.arguments), wantArguments);
  assert.deepEqual(names, ['get_weather']);
});

await check('the call and its result sent back', async () => {
  const r = await client.chat.completions.create({
    model, tools,
    messages: [...question, { role: 'assistant', content: null, tool_calls: [call] },
               { role: 'tool', tool_call_id: call.id, content: '{"forecast": "sunny"}' }],
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.content, 'Sunny all three days.');
  assert.ok(!r.choices[0].message.tool_calls || r.choices[0].message.tool_calls.length === 0);
});

await check('tool_choice none leaves the call text as content', async () => {
  const r = await client.chat.completions.create({ model, messages: question, tools, tool_choice: 'none' });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.choices[0].message.content.includes('get_weather'), r.choices[0].message.content);
  assert.ok(!r.choices[0].message.tool_calls || r.choices[0].message.tool_calls.length === 0);
});
