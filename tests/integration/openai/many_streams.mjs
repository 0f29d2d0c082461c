// Holds N streamed chat completions open at once through the OpenAI Node SDK and
// checks that every one completes: a role delta first, content, one finish_reason, and
// its usage. Run by tests/integration/openai_api_test.cc:
//   node many_streams.mjs BASE_URL MODEL API_KEY N MAX_TOKENS
// Prints {"completed", "failed", "max_open"} as JSON; exits non-zero on any failure.
import { OpenAI } from './sdk_common.mjs';

const [baseURL, model, apiKey, nText, maxTokensText] = process.argv.slice(2);
const n = Number(nText);
const maxTokens = Number(maxTokensText);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 600000 });

let open = 0;
let maxOpen = 0;
const failures = [];
async function one(i) {
  open++;
  maxOpen = Math.max(maxOpen, open);
  try {
    const stream = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: `stream number ${i}` }], max_tokens: maxTokens, ignore_eos: true,
      temperature: 0.7, seed: i, stream: true, stream_options: { include_usage: true } });
    let role = null;
    let finishes = 0;
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (c.delta.role) role = c.delta.role;
        if (c.finish_reason) finishes++;
      }
    }
    if (role !== 'assistant' || finishes !== 1 || !usage || usage.completion_tokens !== maxTokens) {
      failures.push(`stream ${i}: role ${role}, ${finishes} finish reasons, usage ${JSON.stringify(usage)}`);
    }
  } catch (e) {
    failures.push(`stream ${i}: ${e}`);
  } finally {
    open--;
  }
}

await Promise.all(Array.from({ length: n }, (_, i) => one(i)));
console.log(JSON.stringify({ completed: n - failures.length, failed: failures.length, max_open: maxOpen }));
if (failures.length > 0) {
  console.error(failures.slice(0, 10).join('\n'));
  process.exit(1);
}
