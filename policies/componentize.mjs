// Builds a JavaScript guest into a component with componentize-js's Node API (the
// `jco componentize` command fails to read WIT directories with jco 1.35, so it is not used).
// By default every WASI feature is disabled, so the component imports nothing from the host;
// with KEEP_FEATURES=stdio,random,clocks those stay enabled (and imported).
//
//   node componentize.mjs COMPONENTIZE_JS_DIR SOURCE.js WIT_DIR WORLD OUT.wasm
import { readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [toolDir, source, witPath, worldName, out] = process.argv.slice(2);
if (!out) {
  console.error('usage: componentize.mjs COMPONENTIZE_JS_DIR SOURCE.js WIT_DIR WORLD OUT.wasm');
  process.exit(2);
}

const packageDir = join(toolDir, 'node_modules', '@bytecodealliance', 'componentize-js');
const manifest = JSON.parse(await readFile(join(packageDir, 'package.json'), 'utf8'));
const entry = join(packageDir, manifest.exports.import);
const { componentize } = await import(pathToFileURL(entry).href);

const { component, imports } = await componentize({
  sourcePath: resolve(source),
  witPath: resolve(witPath),
  worldName,
  disableFeatures: ['random', 'stdio', 'clocks', 'http', 'fetch-event'].filter(
    (feature) => !(process.env.KEEP_FEATURES ?? '').split(',').includes(feature),
  ),
});
await writeFile(out, component);
console.error(`componentize-js: wrote ${out} (${component.length} bytes), imports: ${JSON.stringify(imports)}`);
