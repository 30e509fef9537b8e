// The banner `npm run embed` puts at the top of each generated module it copies
// into crates/idemgate-server/src/demo/idemgate-client/, and that
// test/embedded.test.ts expects there.

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
