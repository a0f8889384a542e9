// Builds plugin.wasm, a component of the world flotilla:provider/provider, from plugin.js.
//
// componentize-js embeds the SpiderMonkey engine and pre-initialises it with the module.
// Every engine feature this plugin does not use is disabled so that it adds no import; HTTP
// goes through the world's own wasi:http import (see flotilla-http.js), logs through
// flotilla:provider/log.

import { componentize } from '@bytecodealliance/componentize-js';
import { writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, 'plugin.wasm');
const started = Date.now();

const { component } = await componentize({
  sourcePath: join(here, 'plugin.js'),
  witPath: join(here, 'wit'),
  worldName: 'flotilla:provider/provider',
  // stdio: console.* (use the log import), random: Math.random / crypto, clocks: Date.now /
  // performance.now, http and fetch-event: fetch() and an incoming-handler export.
  disableFeatures: ['stdio', 'random', 'clocks', 'http', 'fetch-event'],
});
await writeFile(out, component);
console.log(`wrote ${out}: ${component.length} bytes in ${(Date.now() - started) / 1000} s`);
