// What `npm run embed` writes for each built module it copies into
// crates/idemgate-server/src/demo/idemgate-client/, and test/embedded.test.ts
// expects there: a banner, then the module without its source map comment (the
// server serves the modules, not their maps or the TypeScript they point at).

/**
 * The banner of the embedded copy of `dist/<file>`.
 * @param {string} file a built module's name, e.g. `client.js`
 * @returns {string}
 */
export function banner(file) {
  const source = `clients/js/src/${file.replace(/\.js$/, ".ts")}`;
  return (
    `// GENERATED FILE: do not edit. The browser build of ${source}\n` +
    "// (tsc, clients/js/tsconfig.json), copied here by `npm run embed` in clients/js;\n" +
    "// `idemgate serve` embeds it for the checkout page. clients/js's `npm test`\n" +
    "// (test/embedded.test.ts) fails while it differs from a fresh build.\n"
  );
}

/**
 * The embedded copy of the built `dist/<file>` whose text is `built`.
 * @param {string} file a built module's name, e.g. `client.js`
 * @param {string} built its text
 * @returns {string}
 */
export function embedded(file, built) {
  return banner(file) + built.replace(/\n\/\/# sourceMappingURL=[^\n]*\n?$/, "\n");
}
