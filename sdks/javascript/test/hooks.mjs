// Node module hooks for testing transforms outside a component: the WIT
// imports (`sluice:transform/state@...`, `sluice:transform/log@...`) resolve
// to the in-memory fakes in host.mjs, and a project's `./sluice.js` to the
// SDK in sdks/javascript (build.sh copies it there; in a plain checkout it is
// absent). Registered by register.mjs: `node --import ./register.mjs ...`.

const HOST = new URL("./host.mjs", import.meta.url).href;
const SDK = new URL("../sluice.js", import.meta.url).href;

export async function resolve(specifier, context, next) {
  const m = /^sluice:transform\/(state|log)(@[0-9.]+)?$/.exec(specifier);
  if (m) return { url: HOST, shortCircuit: true };
  if (specifier === "./sluice.js" && context.parentURL && context.parentURL !== SDK) {
    return { url: SDK, shortCircuit: true };
  }
  return next(specifier, context);
}
