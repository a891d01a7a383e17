// Node module hooks for running transforms outside a component: the WIT
// imports (`sluice:transform/state@...`, `.../log@...`, `.../time@...`)
// resolve to the in-memory host of host.js, and the SDK's package name
// (`sluice-guest`, `sluice-guest/testing`) and a project's legacy
// `./sluice.js` to this folder's SDK, so a project needs no node_modules to
// be tested. Registered by register.js: `node --import ./register.js ...`.

const HOST = new URL("./host.js", import.meta.url).href;
const SDK = new URL("../sluice.js", import.meta.url).href;
const TESTING = new URL("../testing.js", import.meta.url).href;

export async function resolve(specifier, context, next) {
  if (/^sluice:transform\/(state|log|time)(@[0-9.]+)?$/.test(specifier)) return { url: HOST, shortCircuit: true };
  if (specifier === "sluice-guest") return { url: SDK, shortCircuit: true };
  if (specifier === "sluice-guest/testing") return { url: TESTING, shortCircuit: true };
  if (specifier === "./sluice.js" && context.parentURL && context.parentURL !== SDK) {
    return { url: SDK, shortCircuit: true };
  }
  return next(specifier, context);
}
