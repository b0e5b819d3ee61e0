/**
 * @tp/llm/testing: test helpers other packages' tests may use (not part of the library's API).
 * - {@link tinyEagle3} / {@link writeTinyEagle3}: random-weight or target-copying EAGLE-3 heads in
 *   the AngelSlim tensor names, for a given target's shapes.
 */
export { tinyEagle3, writeTinyEagle3 } from "./eagle3.ts";
