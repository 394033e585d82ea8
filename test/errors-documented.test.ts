// Every error code the gateway can answer with is documented in the README's error table.

import t from 'tap';
import { readFileSync } from 'node:fs';
import { ERRORS } from '../server/errors.js';

t.test('README documents every error code with its status', async (t) => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  for (const [code, { status }] of Object.entries(ERRORS)) {
    t.match(readme, new RegExp(`\\| \`${code}\` \\| ${status} \\|`), `${code} (${status}) is in the README`);
  }
});
