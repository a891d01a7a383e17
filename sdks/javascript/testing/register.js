// `node --import sluice-guest/register` (or this file's path): registers
// the module hooks of hooks.js, so transforms run under Node against the
// simulated host.
import { register } from "node:module";

register("./hooks.js", import.meta.url);
