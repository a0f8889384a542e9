// The smallest complete Flotilla provider plugin in JavaScript. Copy this directory to start
// your own.
//
// It drives a simple REST API (the "example cloud", documented in README.md) over
// wasi:http. Every request names the pool's credential in the `flotilla-credential` header;
// the host strips that header and adds the real authorisation, so this code never sees a
// secret. Scaling policy lives in the host: this plugin only translates calls.

import { emit } from 'flotilla:provider/log@0.1.4';
import { HttpError, request } from './flotilla-http.js';
import { contractError, guard } from './flotilla-contract.js';

const VERSION = '0.1.0';

/** The settings keys and their checks; each check returns a problem or undefined. */
const KEYS = {
  endpoint: {
    required: true,
    check: (v) => {
      if (typeof v !== 'string') return 'must be a string';
      if (!/^https?:\/\/[^/?#]+/.test(v)) return 'must start with https:// or http:// and a host';
      return undefined;
    },
  },
  group: {
    required: true,
    check: (v) => {
      if (typeof v !== 'string') return 'must be a string';
      if (v === '' || v.includes('/')) return "must be a non-empty name without '/'";
      return undefined;
    },
  },
  credential: {
    required: false,
    check: (v) => {
      if (typeof v !== 'string') return 'must be a string';
      if (v === '') return 'must not be empty when given';
      return undefined;
    },
  },
};

/** The settings of the last successful `init`; rebuilt by `init` on a fresh instance. */
let settings;

/** Every problem of the settings text at once, as one invalid-config error. */
function parseSettings(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw contractError('invalid-config', `settings are not JSON: ${e.message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw contractError('invalid-config', 'settings must be a JSON object');
  }
  const known = Object.keys(KEYS).join(', ');
  const problems = [];
  for (const key of Object.keys(value)) {
    if (!Object.hasOwn(KEYS, key)) problems.push(`${key}: unknown key (known: ${known})`);
  }
  for (const [key, { required, check }] of Object.entries(KEYS)) {
    if (!Object.hasOwn(value, key)) {
      if (required) problems.push(`${key}: missing`);
      continue;
    }
    const problem = check(value[key]);
    if (problem !== undefined) problems.push(`${key}: ${problem}`);
  }
  if (problems.length > 0) throw contractError('invalid-config', problems.join('; '));
  return {
    endpoint: value.endpoint.replace(/\/+$/, ''),
    group: value.group,
    credential: value.credential,
  };
}

/** Maps an HTTP status to the contract's error cases. */
function statusError(action, response) {
  const message = `${action}: HTTP ${response.status}: ${response.text.slice(0, 300)}`;
  const status = response.status;
  if (status === 401 || status === 403) return contractError('unauthorized', message);
  if (status === 404) return contractError('not-found', message);
  if (status === 429) {
    // Retry-After in seconds; an HTTP date (or nothing) means "use your own backoff".
    const seconds = Number.parseInt(response.header('retry-after') ?? '', 10);
    const retryAfterSeconds =
      Number.isInteger(seconds) && seconds >= 0 ? Math.min(seconds, 0xffffffff) : 0;
    return contractError('throttled', { retryAfterSeconds, message });
  }
  if (status === 400 || status === 422) return contractError('invalid-config', message);
  if (status >= 500) return contractError('transient', message);
  return contractError('other', message);
}

/** Sends one JSON request, authenticated by the host, and decodes the JSON answer. */
function call(action, method, path, body) {
  if (settings === undefined) throw contractError('other', 'init has not succeeded');
  const url = `${settings.endpoint}/v1/groups/${encodeURIComponent(settings.group)}${path}`;
  const headers = { accept: 'application/json' };
  if (settings.credential !== undefined) {
    // The host replaces this with real authorisation; the secret never reaches us.
    headers['flotilla-credential'] = settings.credential;
  }
  if (body !== undefined) headers['content-type'] = 'application/json';
  let response;
  try {
    response = request({
      method,
      url,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    // Denied by the sandbox, refused, reset, timed out: e.code.tag says which.
    if (e instanceof HttpError) throw contractError('transient', `${action}: ${e.message}`);
    throw e;
  }
  if (response.status < 200 || response.status > 299) throw statusError(action, response);
  try {
    return JSON.parse(response.text);
  } catch (e) {
    throw contractError('other', `${action}: unexpected response: ${e.message}`);
  }
}

/** A JSON field that must be a non-negative integer no larger than a u32. */
function count(action, value, field) {
  const n = value?.[field];
  if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) {
    throw contractError('other', `${action}: unexpected response: ${field} is not a count`);
  }
  return n;
}

function mapState(state) {
  switch (state) {
    case 'pending':
    case 'provisioning':
      return { tag: 'creating' };
    case 'running':
      return { tag: 'running' };
    case 'stopping':
    case 'terminating':
      return { tag: 'deleting' };
    case 'terminated':
      return { tag: 'deleted' };
    default:
      return { tag: 'failed', val: `cloud state ${JSON.stringify(state)}` };
  }
}

/** Every instance of the group, each id once (the first listing of an id wins). */
function listInstances() {
  const answer = call('ListInstances', 'GET', '/instances');
  if (!Array.isArray(answer?.instances)) {
    throw contractError('other', 'ListInstances: unexpected response: no instances list');
  }
  const byId = new Map();
  for (const i of answer.instances) {
    if (typeof i?.id !== 'string') {
      throw contractError('other', 'ListInstances: unexpected response: an instance without id');
    }
    if (!byId.has(i.id)) byId.set(i.id, { id: i.id, state: mapState(i.state) });
  }
  return [...byId.values()];
}

const instanceGroupFunctions = {
  init(text) {
    settings = undefined; // until this init succeeds, nothing else may run
    const parsed = parseSettings(text);
    settings = parsed;
    let maxSize;
    try {
      maxSize = count('GetGroup', call('GetGroup', 'GET', ''), 'max_size');
    } catch (e) {
      settings = undefined;
      throw e;
    }
    const id = `example/${parsed.group}`;
    emit('info', `managing ${id} (max size ${maxSize})`);
    return {
      id,
      version: VERSION,
      maxSize,
      capabilities: { heartbeat: false, expiringConnectInfo: false },
    };
  },

  update() {
    return listInstances();
  },

  increase(delta) {
    const answer = call('Increase', 'POST', '/increase', { delta });
    // Never report more than asked: the host would wait for instances that never come.
    return Math.min(count('Increase', answer, 'requested'), delta);
  },

  decrease(asked) {
    const ids = [...new Set(asked)];
    if (ids.length === 0) return [];
    const answer = call('Decrease', 'POST', '/decrease', { ids });
    if (!Array.isArray(answer?.accepted)) {
      throw contractError('other', 'Decrease: unexpected response: no accepted list');
    }
    // Never return an id that was not asked for.
    const accepted = new Set(answer.accepted.filter((id) => ids.includes(id)));
    if (accepted.size < ids.length) {
      // Idempotent: an id already deleting or gone counts as accepted, whatever the cloud said.
      const live = new Map(listInstances().map((i) => [i.id, i.state.tag]));
      for (const id of ids) {
        const state = live.get(id);
        if (state === undefined || state === 'deleting' || state === 'deleted') accepted.add(id);
      }
    }
    return ids.filter((id) => accepted.has(id));
  },

  connectInfo(id) {
    const i = call('GetInstance', 'GET', `/instances/${encodeURIComponent(id)}`);
    return {
      id,
      os: 'linux',
      arch: 'amd64',
      protocol: 'ssh',
      internalAddress: typeof i?.address === 'string' ? i.address : undefined,
      externalAddress: undefined,
      port: 22,
      username: 'ci',
      expires: undefined, // a u64: a BigInt (seconds) when set
      zone: typeof i?.zone === 'string' ? i.zone : undefined,
    };
  },

  heartbeat(_id) {
    throw contractError('unsupported', 'heartbeat');
  },

  shutdown() {},
};

/** The export `flotilla:provider/instance-group`: every function throws only contract errors. */
export const instanceGroup = guard(instanceGroupFunctions);
