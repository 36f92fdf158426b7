// Builds web/assets/{ops,track}.{js,css} from src/ with esbuild (pinned in package-lock.json).
// Each output's first line records the sha256 of the sources and the lockfile it was built
// from; a Rust test (web/tests/bundle.rs) recomputes it, so a change to the UI that was not
// rebuilt fails the suite without npm. Run through `./dev web` (npm ci, then this).
import { build } from 'esbuild';
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, '..', 'assets');

// The same walk as sources_sha256() in web/tests/bundle.rs: these files, sorted by path,
// each as "<path>\n<length>\n<bytes>".
export function sourcesSha256() {
  const files = ['build.mjs', 'package-lock.json', 'package.json'];
  for (const f of readdirSync(join(here, 'src'))) files.push(`src/${f}`);
  files.sort();
  const h = createHash('sha256');
  for (const f of files) {
    const bytes = readFileSync(join(here, f));
    h.update(`${f}\n${bytes.length}\n`);
    h.update(bytes);
  }
  return h.digest('hex');
}

const banner = `/* sources-sha256: ${sourcesSha256()} */`;
for (const page of ['ops', 'track']) {
  await build({
    entryPoints: [join(here, 'src', `${page}.js`)],
    bundle: true,
    minify: true,
    format: 'iife',
    platform: 'browser',
    target: ['es2020'],
    legalComments: 'eof',
    charset: 'utf8',
    // Leaflet's few control images (4 KiB) go inline: one file less to serve.
    loader: { '.png': 'dataurl' },
    banner: { js: banner, css: banner },
    outfile: join(out, `${page}.js`),
    logLevel: 'warning',
  });
}
for (const page of ['ops', 'track']) {
  const html = readFileSync(join(here, 'src', `${page}.html`));
  writeFileSync(join(out, `${page}.html`), html);
}
console.log(`built web/assets (${banner})`);
