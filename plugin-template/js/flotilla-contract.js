// Contract errors, and the guard that keeps every export's failure inside the contract.
//
// componentize-js raises a result's error case by throwing it, and it lowers the thrown value
// as the WIT variant `error`: it must be a plain `{tag, val}` with one of the tags below. A
// thrown `Error` (a bug, a TypeError, a JSON.parse failure) has no such tag, and the call
// traps with "invalid variant tag", so the host discards the instance and learns nothing.
// `guard` turns any such exception into `other` with its message and stack.

/** The cases of `flotilla:provider/types.error`, as componentize-js spells them. */
const TAGS = new Set([
  'invalid-config',
  'unauthorized',
  'quota-exceeded',
  'throttled',
  'not-found',
  'unsupported',
  'transient',
  'other',
]);

/** A contract error. `throttled` takes `{retryAfterSeconds, message}`, the rest a string. */
export function contractError(tag, val) {
  return { tag, val };
}

/** Whether `e` can be thrown from an export as it is. */
export function isContractError(e) {
  if (e === null || typeof e !== 'object' || e instanceof Error || !TAGS.has(e.tag)) {
    return false;
  }
  if (e.tag === 'throttled') {
    const t = e.val;
    return (
      t !== null &&
      typeof t === 'object' &&
      Number.isInteger(t.retryAfterSeconds) &&
      t.retryAfterSeconds >= 0 &&
      t.retryAfterSeconds <= 0xffffffff &&
      typeof t.message === 'string'
    );
  }
  return typeof e.val === 'string';
}

/** `other` with everything known about an exception that is not a contract error. */
export function asContractError(e) {
  if (isContractError(e)) return e;
  if (e instanceof Error) {
    return contractError('other', `${e.name}: ${e.message}\n${e.stack ?? ''}`.trimEnd());
  }
  let text;
  try {
    text = JSON.stringify(e, (_, v) => (typeof v === 'bigint' ? v.toString() : v));
  } catch {
    text = undefined;
  }
  return contractError('other', `uncaught ${typeof e}: ${text ?? String(e)}`);
}

/** The same functions, each throwing only contract errors. */
export function guard(functions) {
  const guarded = {};
  for (const [name, fn] of Object.entries(functions)) {
    guarded[name] = (...args) => {
      try {
        return fn(...args);
      } catch (e) {
        throw asContractError(e);
      }
    };
  }
  return guarded;
}
