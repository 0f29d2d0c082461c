// What the OpenAI SDK scripts share: the SDK from tools/node (the project's npm
// packages, scripts/install-deps.sh) and a named check that stops the run at the first
// failure, naming it.
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(import.meta.url);
const nodeModules = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../../tools/node/node_modules');
export const OpenAI = require(path.join(nodeModules, 'openai')).default ?? require(path.join(nodeModules, 'openai'));

export async function check(name, fn) {
  try {
    await fn();
  } catch (e) {
    console.error(`FAILED: ${name}: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  }
  console.error(`ok: ${name}`);
}
